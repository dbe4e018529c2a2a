"""The child side of corral: what a program launched by a runner can call.

Everything here is a harmless no-op when the program was not started by
corral (or not asked for the feature), so a script can call it
unconditionally and still run on its own.

This module is light on purpose, because every Python child that reports
its start or sends its records pays for it: importing it loads a few modules
of the standard library and nothing of the launcher (no AnyIO, no event
loop).  The ``msgspec`` encoder that :func:`connect` sends records with is
loaded by the first call that finds a launcher to connect to.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from typing import TYPE_CHECKING, Any

from ._sys import _childenv

if TYPE_CHECKING:
    from ._logs._child_logging import CorralLogHandler

__all__ = ["CorralLogHandler", "connect", "started"]


def connect(
    level: int = logging.NOTSET, *, logger: logging.Logger | None = None
) -> CorralLogHandler | None:
    """Send this process's log records to the corral launcher that started it.

    If the environment names a launcher's log socket (``CORRAL_LOG_SOCKET`` and
    ``CORRAL_LOG_SECRET``), connect to it, add a :class:`CorralLogHandler` at
    ``level`` to ``logger`` (the root logger by default) and return the
    handler.  Otherwise do nothing and return ``None``.

    Calling it again does not add a second handler: it returns the one already
    on that logger, with its level set to ``level``.

    The logger's own level still filters records before any handler sees them;
    the root logger's default is ``WARNING``.  So if ``level`` is given and is
    below the logger's effective level, the logger's level is lowered to
    ``level``: ``connect(logging.INFO)`` makes ``logging.info(...)`` reach the
    launcher.  With the default ``NOTSET`` the logger's level is left alone.

    If the socket cannot be reached, a :exc:`RuntimeWarning` says so and
    ``None`` is returned: losing the logs is no reason to stop the program.
    """
    if not os.environ.get(_childenv.LOG_SOCKET) or _childenv.LOG_SECRET not in os.environ:
        return None
    from ._logs._child_logging import connect as connect_now

    return connect_now(level, logger=logger, stacklevel=3)


def __getattr__(name: str) -> Any:
    if name == "CorralLogHandler":
        from ._logs._child_logging import CorralLogHandler

        return CorralLogHandler
    raise AttributeError(f"module 'corral.child' has no attribute {name!r}")


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
