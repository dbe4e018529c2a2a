"""A blocking runner for scripts: ``with corral.open_runner_sync() as r:``.

The runner of ``async with corral.open_runner()``, for code that is not
async: it runs its event loop on a helper thread, and its methods block.
``r.run()`` returns a ``CompletedProcess``, ``r.start()`` a handle that reads
like ``subprocess.Popen`` (``wait``, ``poll``, ``terminate``, ``kill``) plus
a graceful ``stop()`` and ``logs()`` to follow the child's lines.  As with
``async with``, the end of the block waits for the children, a child that
fails (``check=True``) stops the others and raises, and Ctrl-C stops them
all.

Run it with ``python examples/sync_runner.py`` (on asyncio; pass
``backend="trio"`` to ``open_runner_sync`` for Trio).
"""

from __future__ import annotations

import subprocess
import sys
import threading

import corral

PYTHON = sys.executable

SERVER = """
import time
print("listening on port 8080", flush=True)
for n in range(1, 1000):
    print(f"request {n} served", flush=True)
    time.sleep(0.05)
"""


def main() -> None:
    with corral.open_runner_sync(name="script", grace=2.0) as r:
        build = r.run(["sh", "-c", "echo compiling; echo build ok"], stdout=corral.PIPE)
        print(f"build: exited with code {build.returncode}, said {build.stdout!r}")

        server = r.start([PYTHON, "-c", SERVER], name="server")
        with server.logs() as lines:
            for record in lines:
                print(f"server said: {record.getMessage()}")
                if record.getMessage() == "request 3 served":
                    break
        try:
            server.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            print("server: still running after 0.1 s, as subprocess.Popen.wait would say")
        print(f"server: poll() is {server.poll()}; stop() returns {server.stop()}")

        def from_another_thread() -> None:
            try:
                r.run(["true"])
            except corral.WrongLoopError:
                print("another thread got WrongLoopError: the runner is its opener's")

        thread = threading.Thread(target=from_another_thread)
        thread.start()
        thread.join()

        try:
            r.run(["sh", "-c", "echo 'error: out of coffee' >&2; exit 2"], name="step")
        except corral.ProcessFailed as failure:
            print(f"caught ProcessFailed: {failure.name} exited with code {failure.returncode}")

    try:
        server.stop()
    except corral.CorralError:
        print("after the block, the handle says the runner is closed")
    print(f"done: every child has exited (server's code: {server.returncode})")


if __name__ == "__main__":
    main()
