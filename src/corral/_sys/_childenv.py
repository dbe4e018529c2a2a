"""The environment contract between a launcher and the children it starts.

Everything a child learns from corral arrives in environment variables named
here, and nowhere else.  This module is imported by the child side
(:mod:`corral.child`), so it must stay free of anything heavier than the
standard library: a Python child pays for every import it triggers.

``CORRAL_STARTED_FD`` and ``CORRAL_STARTED_PIPE``
    The start-up handshake (see :mod:`corral._core._handshake`): the descriptor
    number the child writes its one line of JSON to (always ``3``: one digit,
    so that ``dash`` accepts ``>&$CORRAL_STARTED_FD``), and the identity of
    the pipe behind it (``<st_dev>:<st_ino>``), so that a grandchild which
    inherited the variable but not the pipe does not write into whatever its
    own descriptor 3 happens to be.

``CORRAL_LOG_SOCKET``, ``CORRAL_LOG_SECRET`` and ``CORRAL_SOURCE``
    The log stream (see :mod:`corral._logs._wire`): the launcher's Unix socket, the
    secret a connection must present, and the source name the launcher knows
    the child by.

``CORRAL_LIFELINE``
    A marker, ``<runner token>.<spawn number>``, that lets the lifeline find a
    child in ``/proc`` even if the launcher died before it could register the
    child's process group (see :mod:`corral._sys._lifeline`).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "HANDSHAKE_FD",
    "LIFELINE",
    "LOG_SECRET",
    "LOG_SOCKET",
    "SOURCE",
    "STARTED_FD",
    "STARTED_PIPE",
]

STARTED_FD: Final = "CORRAL_STARTED_FD"
STARTED_PIPE: Final = "CORRAL_STARTED_PIPE"
HANDSHAKE_FD: Final = 3
"""The descriptor number of the handshake pipe in the child (3-9, for dash)."""

LOG_SOCKET: Final = "CORRAL_LOG_SOCKET"
LOG_SECRET: Final = "CORRAL_LOG_SECRET"
SOURCE: Final = "CORRAL_SOURCE"

LIFELINE: Final = "CORRAL_LIFELINE"
