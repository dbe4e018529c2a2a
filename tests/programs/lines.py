"""A child that prints COUNT lines of LENGTH bytes (newline included) in big writes, fast.

``lines.py COUNT LENGTH``
"""

from __future__ import annotations

import os
import sys

count, length = int(sys.argv[1]), int(sys.argv[2])
line = b"x" * (length - 1) + b"\n"
per_write = max(1, 65536 // length)
block = line * per_write
written = 0
while written < count:
    n = min(per_write, count - written)
    os.write(1, block if n == per_write else line * n)
    written += n
