"""A worker of ``corral run`` that says ``up RANK``; rank 1 then reads the file (a FIFO) named
by its argument, says ``ValueError: rank 1 broke`` on stderr and exits 3; the others sleep."""

from __future__ import annotations

import os
import sys

rank = os.environ["RANK"]
print("up", rank, flush=True)
if rank == "1":
    with open(sys.argv[1]) as go:
        go.read()
    print("ValueError: rank 1 broke", file=sys.stderr, flush=True)
    sys.exit(3)
os.execvp("sleep", ["sleep", "30"])
