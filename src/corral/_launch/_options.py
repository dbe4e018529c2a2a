"""The options of a launch, and their defaults."""

from __future__ import annotations

from . import _link

__all__ = ["DEFAULT_LINK_TIMEOUT", "DEFAULT_START_TIMEOUT"]

#: Seconds agents get to start and dial back, unless ``start_timeout`` says otherwise.
DEFAULT_START_TIMEOUT = 60.0
#: Seconds a link may stay silent before it counts as cut, unless ``link_timeout`` says otherwise.
DEFAULT_LINK_TIMEOUT = _link.DEFAULT_LINK_TIMEOUT
