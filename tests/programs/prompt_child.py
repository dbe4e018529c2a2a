"""A child of ``tests/logs/test_prompt.py``: prints, block-buffered, as ``argv[1]`` says.

``crash HOW``
    prints ``line 0`` ... ``line 499`` and ``ready``, waits for a line on stdin, prints
    ``line 500`` ... ``line 999`` and ends as ``HOW`` says: ``raise`` (an uncaught
    exception), ``exit`` (``os._exit(3)``) or ``abort`` (``os.abort()``).
``ticks N EVERY``
    ``N`` lines ``tick <i> <time.time()>``, ``EVERY`` seconds apart, then waits for stdin
    to close.
``fork``
    prints ``parent`` (not flushed), forks; the child prints ``child`` and leaves with
    ``os._exit(0)``; the parent waits for it.
``path``
    prints its ``sys.path`` and its ``PYTHONPATH`` as JSON.
``sigwait``
    blocks SIGUSR1, prints ``ready``, and 1 s later waits for the signal with ``sigwait``
    (it comes meanwhile: the kernel keeps it pending) and prints ``got it``.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    mode = sys.argv[1]
    if mode == "crash":
        for i in range(500):
            print("line", i)
        print("ready")
        sys.stdin.readline()
        for i in range(500, 1000):
            print("line", i)
        how = sys.argv[2]
        if how == "exit":
            os._exit(3)
        if how == "abort":
            os.abort()
        raise RuntimeError("the child crashes here")
    if mode == "ticks":
        for i in range(int(sys.argv[2])):
            print("tick", i, repr(time.time()))
            time.sleep(float(sys.argv[3]))
        sys.stdin.read()
    elif mode == "fork":
        print("parent")
        pid = os.fork()
        if pid == 0:
            print("child")
            os._exit(0)
        os.waitpid(pid, 0)
    elif mode == "sigwait":
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        print("ready")
        time.sleep(1)
        signal.sigwait({signal.SIGUSR1})
        print("got it")
    elif mode == "path":
        print(json.dumps({"path": sys.path, "PYTHONPATH": os.environ.get("PYTHONPATH")}))


if __name__ == "__main__":
    main()
