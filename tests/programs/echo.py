"""A child that obeys its stdin, one command a line, until its end (then exits 0).

``out TEXT`` prints TEXT; ``err TEXT`` prints it on stderr; ``log LEVEL TEXT`` logs it
(through ``corral.child.connect``, logger ``app``); ``exit N`` exits with N.
"""

from __future__ import annotations

import logging
import sys

from corral.child import connect

connect(logging.DEBUG)
log = logging.getLogger("app")
for line in sys.stdin:
    kind, _, text = line.rstrip("\n").partition(" ")
    if kind == "out":
        print(text, flush=True)
    elif kind == "err":
        print(text, file=sys.stderr, flush=True)
    elif kind == "log":
        level, _, message = text.partition(" ")
        log.log(logging.getLevelName(level), message)
    elif kind == "exit":
        sys.exit(int(text))
