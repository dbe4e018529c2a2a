"""A child that writes bytes with carriage returns as a scenario says, in raw writes.

``raw_output.py SCENARIO``:

``frames``
    5 MB of progress frames (``\\rframe 0000042 ``) and never a newline, in 64 KiB writes;
    then ``\\rframe final`` on its own.
``crlf``
    3,000 lines ``crlf line 0042`` ended by CRLF on stdout, two on stderr, then ``last``.
``crlf-split``
    ``one``, ``two``, ``three`` ended by CRLF, with a pause of 0.3 s between the ``\\r`` and
    the ``\\n`` of ``two`` (they arrive in two reads).
``same-state``
    ``\\rdownload 100%``, a pause of 0.3 s, then the line ends, and ``next line``.
``one-frame-bar``
    on stderr, ``\\rcopied 100%``, a pause of 0.3 s, then the end of the line (in a read of
    its own).
"""

from __future__ import annotations

import os
import sys
import time

scenario = sys.argv[1]
if scenario == "frames":
    data = b"".join(b"\rframe %07d " % i for i in range(5 * 1024 * 1024 // 14 + 1))
    view = memoryview(data)
    while view:
        view = view[os.write(1, view[:65536]) :]
    os.write(1, b"\rframe final")
elif scenario == "crlf":
    os.write(1, b"".join(b"crlf line %04d\r\n" % i for i in range(3000)))
    os.write(2, b"an error\r\nanother error\r\n")
    os.write(1, b"last\r\n")
elif scenario == "crlf-split":
    os.write(1, b"one\r\n")
    os.write(1, b"two\r")
    time.sleep(0.3)
    os.write(1, b"\nthree\r\n")
elif scenario == "same-state":
    os.write(1, b"\rdownload 100%")
    time.sleep(0.3)
    os.write(1, b"\nnext line\n")
elif scenario == "one-frame-bar":
    os.write(2, b"\rcopied 100%")
    time.sleep(0.3)
    os.write(2, b"\n")
else:
    sys.exit(f"no scenario {scenario!r}")
