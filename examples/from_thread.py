"""Using a runner from another thread, through its loop token.

A runner belongs to the event loop it was opened in.  Code on another thread
(a blocking library, a thread pool, a GUI callback) reaches it through
``r.token``: ``r.token.run(async_fn, *args)`` and ``r.token.run_sync(fn, *args)``
run the call on the runner's loop and block the thread until it returns.
Calling the runner directly from the thread raises ``WrongLoopError`` at once,
instead of hanging or corrupting anything.

Run it with ``python examples/from_thread.py``.  It uses the Trio backend,
corral's ``trio`` extra (``pip install -e '.[trio]'`` in a checkout, which
the README's set-up does; without it the example says so);
``backend="asyncio"`` works the same.
"""

import functools
import importlib.util
import sys

import anyio
import anyio.to_thread

import corral

PYTHON = sys.executable


def blocking_job(r: corral.Runner, server: corral.Process) -> None:
    """Synchronous code running on a worker thread, not on the event loop."""
    try:
        r.cancel()  # wrong: a direct call from a foreign thread
    except corral.WrongLoopError:
        print("calling r.cancel() from a thread raised WrongLoopError")

    # Right: hand the call to the loop.  token.run takes positional arguments,
    # so keyword arguments go in through functools.partial.
    step = functools.partial(r.run, [PYTHON, "-c", "print('step output')"], name="step")
    done = r.token.run(step)
    print(f"r.token.run(r.run, ...) finished {done.name!r} with code {done.returncode}")

    names = r.token.run_sync(lambda: [p.name for p in r.processes])
    print(f"r.token.run_sync sees these children running: {names}")

    code = r.token.run(server.stop)
    print(f"r.token.run(server.stop) stopped the server, return code {code}")


async def main() -> None:
    async with corral.open_runner(name="threads", grace=2.0) as r:
        server = await r.start(["sleep", "30"], name="server")
        await anyio.to_thread.run_sync(blocking_job, r, server)
    print("done: every child has exited")


if __name__ == "__main__":
    if importlib.util.find_spec("trio") is None:
        sys.exit("this example runs on Trio: install corral[trio] (pip install -e '.[trio]')")
    anyio.run(main, backend="trio")
