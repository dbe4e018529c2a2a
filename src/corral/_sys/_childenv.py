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

``CORRAL_FLUSH_EVERY`` (and the first entry of ``PYTHONPATH``)
    Prompt lines from a block-buffered Python child (see
    :func:`prompt_lines`): the folder of corral's start-up hook
    (``corral/_startup/sitecustomize.py``), and how often, in seconds, the
    hook's thread flushes the child's ``sys.stdout`` and ``sys.stderr``.

``CORRAL_LIFELINE``
    A marker, ``<runner token>.<spawn number>``, that lets the lifeline find a
    child in ``/proc`` even if the launcher died before it could register the
    child's process group (see :mod:`corral._sys._lifeline`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Final

__all__ = [
    "FLUSH_EVERY",
    "FLUSH_INTERVAL",
    "HANDSHAKE_FD",
    "HOOK_DIR",
    "LIFELINE",
    "LOG_SECRET",
    "LOG_SOCKET",
    "SOURCE",
    "STARTED_FD",
    "STARTED_PIPE",
    "prompt_lines",
]

STARTED_FD: Final = "CORRAL_STARTED_FD"
STARTED_PIPE: Final = "CORRAL_STARTED_PIPE"
HANDSHAKE_FD: Final = 3
"""The descriptor number of the handshake pipe in the child (3-9, for dash)."""

LOG_SOCKET: Final = "CORRAL_LOG_SOCKET"
LOG_SECRET: Final = "CORRAL_LOG_SECRET"
SOURCE: Final = "CORRAL_SOURCE"

LIFELINE: Final = "CORRAL_LIFELINE"

FLUSH_EVERY: Final = "CORRAL_FLUSH_EVERY"
#: How often the start-up hook flushes a Python child's stdout and stderr (seconds).
FLUSH_INTERVAL: Final = 0.02
#: The folder of the start-up hook: ``sitecustomize.py`` alone.
HOOK_DIR: Final = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_startup"
)


def prompt_lines(env: MutableMapping[bytes, bytes]) -> None:
    """Give a child's environment ``env`` corral's prompt lines (what it does instead of
    ``PYTHONUNBUFFERED=1``): the start-up hook first on ``PYTHONPATH`` (once: a child of a
    child does not get it twice), and the hook's flush interval.

    A Python child then stays block-buffered, and its lines still come within
    :data:`FLUSH_INTERVAL` seconds of their ``print`` (see ``corral/_startup/sitecustomize.py``
    for what it keeps and loses).  Other programs ignore both variables.
    """
    hook = os.fsencode(HOOK_DIR)
    entries = [entry for entry in env.get(b"PYTHONPATH", b"").split(b":") if entry != hook]
    env[b"PYTHONPATH"] = b":".join([hook, *entries]) if any(entries) else hook
    env[FLUSH_EVERY.encode()] = str(FLUSH_INTERVAL).encode()
