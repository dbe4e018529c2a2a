"""A worker that costs: local rank 0 holds 100 MiB and burns a CPU; the others sleep 60 s."""

from __future__ import annotations

import os
import time

if os.environ["LOCAL_RANK"] == "0":
    held = b"x" * (100 << 20)
    while True:
        pass
time.sleep(60)
