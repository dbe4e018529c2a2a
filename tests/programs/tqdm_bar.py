"""A child that draws a tqdm bar on stderr, redrawn at every step, with lines around it.

``tqdm_bar.py STEPS DESC AROUND``: STEPS steps of 1 ms each, ``desc=DESC``, ``ncols=80``.
AROUND ``both``: ``out before`` and ``out after`` on stdout, ``err before`` and ``err after``
on stderr; AROUND ``stderr``: ``before the bar`` and ``after the bar`` on stderr.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

steps, desc, around = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if around == "both":
    print("out before", flush=True)
    sys.stderr.write("err before\n")
else:
    sys.stderr.write("before the bar\n")
sys.stderr.flush()
for _ in tqdm(range(steps), file=sys.stderr, mininterval=0, miniters=1, desc=desc, ncols=80):
    time.sleep(0.001)
sys.stderr.write("err after\n" if around == "both" else "after the bar\n")
sys.stderr.flush()
if around == "both":
    print("out after", flush=True)
