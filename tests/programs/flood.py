"""A child that prints numbered lines as fast as it can, then exits.

``flood.py COUNT LENGTH [PAUSE]``: COUNT lines ``000042 xxx...`` of LENGTH characters, with a
pause of PAUSE seconds after every hundred if given.
"""

from __future__ import annotations

import sys
import time

count, length = int(sys.argv[1]), int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
pad = "x" * max(0, length - 7)
out = sys.stdout
for i in range(count):
    out.write(f"{i:06d} {pad}\n")
    if pause and i % 100 == 99:
        out.flush()
        time.sleep(pause)
