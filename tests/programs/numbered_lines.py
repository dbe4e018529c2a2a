"""A child that prints numbered lines on demand: for each ``START COUNT`` line read on its
stdin, the lines ``line 000042`` from START, COUNT of them, in one write."""

from __future__ import annotations

import sys

for command in sys.stdin:
    start, count = map(int, command.split())
    sys.stdout.write("".join(f"line {i:06d}\n" for i in range(start, start + count)))
    sys.stdout.flush()
