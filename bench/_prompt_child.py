"""The child of ``bench/prompt.py``: prints, in the way its first argument says.

``print N RESULT``
    ``N`` prints of a short line in a tight loop; the loop's wall and CPU
    seconds go to the JSON file ``RESULT``.
``tick N EVERY``
    ``N`` lines ``tick <i> <time.time()>``, one every ``EVERY`` seconds.
``crash N``
    ``N`` lines ``line <i>``, then an uncaught exception.
``exit N``
    ``N`` lines ``line <i>``, then ``os._exit(3)``.
``flood``
    ``tick <i> <time.time()>`` every millisecond until it is killed.

With ``BENCH_LINE_BUFFERED=1`` in its environment it makes its stdout
line-buffered first (``sys.stdout.reconfigure(line_buffering=True)``).
Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    if os.environ.get("BENCH_LINE_BUFFERED") == "1":
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    mode = sys.argv[1]
    if mode == "print":
        n, result = int(sys.argv[2]), sys.argv[3]
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):
            print("line", i, "of a print-heavy child")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        with open(result, "w") as f:
            json.dump({"wall": wall, "cpu": cpu, "n": n}, f)
    elif mode == "tick":
        n, every = int(sys.argv[2]), float(sys.argv[3])
        for i in range(n):
            print("tick", i, repr(time.time()))
            time.sleep(every)
    elif mode in ("crash", "exit"):
        for i in range(int(sys.argv[2])):
            print("line", i)
        if mode == "exit":
            os._exit(3)
        raise RuntimeError("the child crashes here")
    elif mode == "flood":
        i = 0
        while True:
            print("tick", i, repr(time.time()))
            i += 1
            time.sleep(0.001)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
