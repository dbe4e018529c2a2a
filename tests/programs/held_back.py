"""A child that writes 64 KiB lines and exits 3 as soon as its output blocks for a second.

``held_back.py KIND COUNT``: COUNT lines on stdout (KIND ``stdout``) or as logging records
through ``corral.child.connect`` (KIND ``logging``).  Exit status 3 says it was held back.
"""

from __future__ import annotations

import logging
import os
import select
import sys

import corral.child

kind, count = sys.argv[1], int(sys.argv[2])
text = "x" * 65535
log = logging.getLogger("held")
if kind == "logging":
    handler = corral.child.connect(logging.INFO)
    assert handler is not None and handler._sock is not None
    fd = handler._sock.fileno()  # its socket: to see when a send would block
else:
    fd = 1
    os.set_blocking(1, False)
for _ in range(count):
    if not select.select([], [fd], [], 0)[1] and not select.select([], [fd], [], 1.0)[1]:
        sys.exit(3)
    if kind == "logging":
        log.info(text)
    else:
        data = (text + "\n").encode()
        while data:
            try:
                data = data[os.write(1, data) :]
            except BlockingIOError:
                if not select.select([], [1], [], 1.0)[1]:
                    sys.exit(3)
