"""Run one function on several workers with ``Runner.launch``, on this machine.

``r.launch(func, *args, workers_per_host=N)`` starts N fresh Python processes,
calls ``func(*args)`` in each with torchrun's environment (``RANK``,
``WORLD_SIZE``...), and returns their return values in rank order.  What the
workers print or log reaches the runner under ``<runner>.agent-0.worker-<j>``
(here: the console, on stderr).  The first worker that fails stops all the
others at once, and ``launch`` raises its exception here.

Run it::

    python examples/launch.py

Give ``hosts=["node1", "node2"]`` (over ssh) or ``hosts="slurm"`` (inside an
allocation) to spread the same workers over several machines.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import anyio

import corral


def square() -> int:
    """Each worker returns its rank squared (and says so on its stdout)."""
    rank = int(os.environ["RANK"])
    print("working")
    return rank * rank


def greet(greeting: str, *, punctuation: str = ".") -> str:
    """Keyword arguments travel in a functools.partial."""
    return f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: {greeting}{punctuation}"


def divide() -> float:
    """Rank 2 raises; the others would sleep for 1000 s, but are stopped at once."""
    rank = int(os.environ["RANK"])
    if rank == 2:
        raise ValueError(f"rank {rank} cannot divide by zero")
    time.sleep(1000)
    return 1 / rank


def crash() -> None:
    """Rank 1 dies without an exception (think: the OOM killer); its stderr tail comes along."""
    if os.environ["RANK"] == "1":
        print("rank 1: allocating 1 TiB", file=sys.stderr)
        os._exit(3)
    time.sleep(1000)


async def main() -> None:
    async with corral.open_runner(name="example") as r:
        results = await r.launch(square, workers_per_host=4)
        print(f"results in rank order: {list(results)}")
        print(f"by host: {results.by_host}")

        greetings = await r.launch(
            functools.partial(greet, punctuation="!"), "hello", workers_per_host=3
        )
        print(f"partial with keywords: {list(greetings)}")

        started = time.monotonic()
        try:
            await r.launch(divide, workers_per_host=4)
        except ValueError as exc:  # the worker's own exception type, rebuilt here
            rank, host = getattr(exc, "rank", "?"), getattr(exc, "host", "?")
            print(f"caught ValueError from rank {rank} on {host}: {exc}")
            remote = str(exc.__cause__).strip().splitlines()
            print(f"  remote traceback ends with: {remote[-1]}")
            print(f"  the sleeping siblings were stopped: {time.monotonic() - started < 5}")

        try:
            await r.launch(crash, workers_per_host=2)
        except corral.WorkerFailed as exc:
            print(f"caught WorkerFailed: {str(exc).splitlines()[0]}")
            print(f"  rank {exc.rank}, host {exc.host}, exit code {exc.returncode}")
            print(f"  stderr tail: {exc.stderr.decode().strip()!r}")
    print("done: every worker has exited")


if __name__ == "__main__":
    anyio.run(main)
