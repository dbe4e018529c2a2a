"""A child that prints 15 lines ``talk 00 xxx...`` (68 characters), one every 80 ms."""

from __future__ import annotations

import time

for i in range(15):
    print(f"talk {i:02d} " + "x" * 60, flush=True)
    time.sleep(0.08)
