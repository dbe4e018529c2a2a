"""A gloo all-reduce over four local workers, with no torchrun and no arguments.

``Runner.launch`` gives every worker the environment torchrun would
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR`` and a free ``MASTER_PORT``), so
``torch.distributed.init_process_group("gloo")`` needs no arguments at all.
Each rank contributes ``rank + 1``; the sum over four ranks is 10.

Run it (torch is optional for corral; this example needs it)::

    pip install torch
    python examples/launch_torch.py

For several machines, the same call takes ``hosts=["node1", "node2"]`` (or
``hosts="slurm"``) and ``workers_per_host=`` the number of GPUs per node; use
``"nccl"`` on GPUs.
"""

from __future__ import annotations

import importlib.util
import os

import anyio

import corral

WORKERS = 4


def all_reduce() -> float:
    """Runs in every worker: join the group, sum one tensor across ranks."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # everything it needs is in the environment
    try:
        rank = dist.get_rank()
        assert rank == int(os.environ["RANK"]) and dist.get_world_size() == WORKERS
        tensor = torch.tensor([float(rank + 1)])
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        print(f"rank {rank}: {dist.get_backend()} all_reduce done")
        return float(tensor.item())
    finally:
        dist.destroy_process_group()


async def main() -> None:
    async with corral.open_runner(name="torch") as r:
        sums = await r.launch(all_reduce, workers_per_host=WORKERS)
    for rank, total in enumerate(sums):
        print(f"rank {rank} of {len(sums)}: all_reduce(sum) = {total} (gloo)")
    agreed = set(sums)
    if agreed != {float(sum(range(1, WORKERS + 1)))}:
        raise SystemExit(f"the ranks disagree: {list(sums)}")
    print(f"every rank agrees: {agreed.pop()}")


if __name__ == "__main__":
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed (pip install torch): nothing to run")
    else:
        anyio.run(main)
