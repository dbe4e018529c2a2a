"""A Slurm task that says where it runs (``up NODE PID STEP``), then reports the first SIGTERM,
SIGINT or SIGUSR1 it gets (``got SIGNAME NODE``) and exits 0."""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

node = os.environ["SLURMD_NODENAME"]


def report(signum: int, frame: FrameType | None) -> None:
    print("got", signal.Signals(signum).name, node, flush=True)
    sys.exit(0)


for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(signum, report)
step = os.environ["SLURM_JOB_ID"] + "." + os.environ["SLURM_STEP_ID"]
print("up", node, os.getpid(), step, flush=True)
time.sleep(300)
