"""A route: the records of some sources, to a :class:`logging.Handler`.

:func:`open_runner`'s ``handlers=`` takes them (a bare handler is a route of
every source); the router (:mod:`corral._logs._router`) applies them.  A light
record of its own, so that naming it (the runner's keywords do) loads none of
the log path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["Route"]


@dataclass(frozen=True)
class Route:
    """Send the records of some sources to a :class:`logging.Handler`.

    ``pattern`` is a shell-style glob matched against the source *within
    the runner*: the process name (``"web"``, ``"train-*"``) or, for workers
    of a launch, ``"agent-<i>.worker-<j>"`` (``"agent-*.worker-0"``).  The
    runner's own lifecycle records have the empty name, which only ``"*"``
    matches.  ``level`` overrides the handler's own level; with neither set,
    the handler gets every record (the root logger's level does not apply:
    it governs only ``propagate=True``).
    """

    handler: logging.Handler
    pattern: str = "*"
    level: int | None = None
