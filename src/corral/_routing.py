"""Routing log records to standard :class:`logging.Handler` objects.

Every record the collector hands over carries its *source*, the dotted
name of who produced it: ``<runner>.<process>`` for a child, ``<runner>``
for the runner's own lifecycle records.  The router calls each handler
whose level and source pattern match.  It runs on the collector's worker
thread, never on the event loop, so handlers may block on disk or terminal
I/O freely.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

__all__ = ["ConsoleHandler", "Route", "Router", "source_of"]


def source_of(record: logging.LogRecord) -> str:
    """The source a record came from (its logger name when it has none)."""
    source = getattr(record, "corral_source", None)
    return source if isinstance(source, str) else record.name


@dataclass(frozen=True)
class Route:
    """A handler and the sources it receives (shell-style glob on the source name)."""

    handler: logging.Handler
    pattern: str = "*"

    def matches(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.handler.level:
            return False
        return self.pattern == "*" or fnmatch.fnmatchcase(source_of(record), self.pattern)


class Router:
    """Calls the matching handlers for each record of a batch."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = list(routes)

    def dispatch(self, batch: list[logging.LogRecord]) -> None:
        routes = self.routes
        for record in batch:
            for route in routes:
                if route.matches(record):
                    route.handler.handle(record)
        for route in routes:
            route.handler.flush()

    def close(self) -> None:
        for route in self.routes:
            route.handler.close()


# ANSI colours for source prefixes, chosen to read on dark and light terminals.
_COLOURS = (36, 33, 32, 35, 34, 96, 93, 92, 95, 94)
_LEVEL_COLOURS = {logging.WARNING: 33, logging.ERROR: 31, logging.CRITICAL: 31}


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes ``HH:MM:SS source | message`` lines, with a coloured prefix on a terminal.

    Colour is used only when the stream is a terminal and ``NO_COLOR`` is not
    set, so files and pipes get plain text.
    """

    def __init__(self, stream: TextIO | None = None, *, colour: bool | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        if colour is None:
            isatty = getattr(self.stream, "isatty", None)
            colour = bool(isatty and isatty()) and "NO_COLOR" not in os.environ
        self.colour = colour
        self._colour_of: dict[str, int] = {}

    def format(self, record: logging.LogRecord) -> str:
        source = source_of(record)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        message = record.getMessage()
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        elif record.exc_info:
            message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
        if not self.colour:
            return f"{stamp} {source} | {message}"
        code = self._colour_of.get(source)
        if code is None:
            code = _COLOURS[len(self._colour_of) % len(_COLOURS)]
            self._colour_of[source] = code
        level_code = _LEVEL_COLOURS.get(record.levelno)
        if level_code is not None and getattr(record, "corral_stream", None) != "stderr":
            message = f"\x1b[{level_code}m{message}\x1b[0m"
        return f"\x1b[2m{stamp}\x1b[0m \x1b[{code}m{source}\x1b[0m | {message}"
