"""The child side of corral: what a program launched by a runner can call.

Everything here is a harmless no-op when the program was not started by
corral (or not asked for the feature), so a script can call it
unconditionally and still run on its own.
"""

from __future__ import annotations

import json
import os

from ._child_logging import CorralLogHandler, connect

__all__ = ["CorralLogHandler", "connect", "started"]

_STARTED_FD = "CORRAL_STARTED_FD"


def started(value: object = None) -> bool:
    """Tell the launcher that this process has started, with a JSON-serialisable ``value``.

    ``await r.start(..., wait_started=True)`` in the launcher returns as soon
    as this call has written the value; ``proc.started_value`` holds it.
    Returns ``True`` if a launcher was told, ``False`` when there is none
    (not started by corral, or not with ``wait_started=True``), and on every
    call after the first.

    Raises :class:`TypeError` or :class:`ValueError` if ``value`` cannot be
    encoded as JSON (before anything is written).
    """
    if not os.environ.get(_STARTED_FD):
        return False
    line = (json.dumps(value, separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd_text = os.environ.pop(_STARTED_FD)
    fd = int(fd_text)
    try:
        view = memoryview(line)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except BrokenPipeError:
        return False
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return True
