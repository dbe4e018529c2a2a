"""A worker of ``corral run``: says who it is, works a little, and reports.

Run four of them with::

    corral run -n 4 -- python examples/hello_workers.py

Each copy gets torchrun's environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``...), so a real training
script would call ``torch.distributed.init_process_group()`` here.  Every
line each worker prints appears once, prefixed with its source
(``agent-0.worker-<rank>``), and the command exits 0 once all four have.
"""

import os
import socket
import time

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"

print(f"hello from rank {rank} of {world} on {socket.gethostname()} (master {master})")
started = time.monotonic()
total = sum(i * i for i in range(rank * 100_000, (rank + 1) * 100_000))
print(f"rank {rank}: my share of the sum is {total} ({time.monotonic() - started:.3f} s)")
