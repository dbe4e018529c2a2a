"""The child side of corral: what a program launched by a runner can call.

Everything here is a harmless no-op when the program was not started by
corral (or not asked for the feature), so a script can call it
unconditionally and still run on its own.

This module is light on purpose: importing it loads the standard library's
:mod:`logging`, :mod:`json` and :mod:`socket` and the ``msgspec`` encoder,
and nothing of the launcher (no AnyIO, no event loop), because every Python
child that reports its start or sends its records pays for it.
"""

from __future__ import annotations

import json
import os
import stat

from . import _childenv
from ._child_logging import CorralLogHandler, connect

__all__ = ["CorralLogHandler", "connect", "started"]


def _handshake_fd() -> int | None:
    """The handshake descriptor, if the environment names one and it is that pipe.

    The environment is inherited by grandchildren, the descriptor usually is
    not: a grandchild's descriptor 3 may be a log file or a socket of its own.
    So the variable carries the pipe's identity too, and the descriptor counts
    only if it is that very pipe.
    """
    fd_text = os.environ.pop(_childenv.STARTED_FD, None)
    identity = os.environ.pop(_childenv.STARTED_PIPE, None)
    if not fd_text or not identity:
        return None
    try:
        fd = int(fd_text)
        info = os.fstat(fd)
    except (ValueError, OSError):
        return None
    if not stat.S_ISFIFO(info.st_mode) or identity != f"{info.st_dev}:{info.st_ino}":
        return None
    return fd


def started(value: object = None) -> bool:
    """Tell the launcher that this process has started, with a JSON-serialisable ``value``.

    ``await r.start(..., wait_started=True)`` in the launcher returns as soon
    as this call has written the value; ``proc.started_value`` holds it.
    Returns ``True`` if a launcher was told, ``False`` when there is none
    (not started by corral, not with ``wait_started=True``, or the variables
    were inherited from a parent whose pipe this process does not hold), and
    on every call after the first.

    Raises :class:`TypeError` or :class:`ValueError` if ``value`` cannot be
    encoded as JSON (before anything is written).
    """
    if not os.environ.get(_childenv.STARTED_FD):
        return False
    line = (json.dumps(value, separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd = _handshake_fd()
    if fd is None:
        return False
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
