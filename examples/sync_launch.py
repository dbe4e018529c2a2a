"""One blocking call launches N workers: ``corral.launch`` from a script.

What torchrunx's ``launch(func, hostnames=..., workers_per_host=...)`` does,
with no ``async`` anywhere: ``corral.launch`` opens a runner, runs
``func(*args)`` on every worker with torchrun's environment (``RANK``,
``WORLD_SIZE``...), streams their output to the console, and returns their
results in rank order.  The first worker that fails stops the others and its
exception is raised here; Ctrl-C stops every worker within the grace period
plus a second.  The same call works in a Jupyter cell and in a synchronous
function called from async code, where ``anyio.run`` would refuse to start.

Run it::

    python examples/sync_launch.py
"""

from __future__ import annotations

import asyncio
import os
import time

import corral


def train(steps: int) -> float:
    """Each worker "trains" and returns its loss."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"rank {rank} of {world}: {steps} steps")
    return round(1.0 / (1 + rank + steps), 3)


def diverge() -> None:
    """Rank 1 fails; the others would run for 1000 s, but are stopped at once."""
    if os.environ["RANK"] == "1":
        raise FloatingPointError("rank 1: the loss is NaN")
    time.sleep(1000)


def library_function() -> list[float]:
    """Synchronous code that does not know an event loop runs above it."""
    return list(corral.launch(train, 5, workers_per_host=2, name="lib"))


async def application() -> list[float]:
    asyncio.get_running_loop()  # an asyncio loop runs in this thread
    return library_function()


def main() -> None:
    losses = corral.launch(train, 10, workers_per_host=4, name="train")
    print(f"losses in rank order: {list(losses)}")

    print(f"from inside asyncio.run: {asyncio.run(application())}")

    started = time.monotonic()
    try:
        corral.launch(diverge, workers_per_host=3, name="diverge")
    except FloatingPointError as error:
        print(f"caught FloatingPointError: {error}")
        print(f"  the other workers were stopped: {time.monotonic() - started < 30}")
    print("done: every worker has exited")


if __name__ == "__main__":
    main()
