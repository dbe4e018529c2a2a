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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

__all__ = ["ConsoleHandler", "LogFiles", "Route", "Router", "source_of"]


def source_of(record: logging.LogRecord) -> str:
    """The source a record came from (its logger name when it has none)."""
    source = getattr(record, "corral_source", None)
    return source if isinstance(source, str) else record.name


@dataclass(frozen=True)
class Route:
    """Send the records of some sources to a :class:`logging.Handler`.

    ``pattern`` is a shell-style glob matched against the source *within
    the runner*: the process name (``"web"``, ``"train-*"``) or, for workers
    of a launch, ``"agent-<i>.worker-<j>"`` (``"agent-*.worker-0"``).  The
    runner's own lifecycle records have the empty name, which only ``"*"``
    matches.  ``level`` overrides the handler's own level; with neither set,
    the root logger's level applies, as it would for a handler on the root.
    """

    handler: logging.Handler
    pattern: str = "*"
    level: int | None = None


class Router:
    """Calls the matching handlers for each record of a batch (on a worker thread)."""

    def __init__(
        self, runner_name: str, routes: Sequence[Route], *, propagate: bool = False
    ) -> None:
        self._prefix = runner_name + "."
        self._runner_name = runner_name
        root_level = logging.getLogger().getEffectiveLevel()
        self._routes = [
            (route.handler, route.pattern, _effective_level(route, root_level)) for route in routes
        ]
        self._propagate = propagate

    @property
    def handlers(self) -> list[logging.Handler]:
        return [handler for handler, _, _ in self._routes]

    @property
    def min_level(self) -> float:
        """The lowest level any destination takes: producers skip records below it."""
        if self._propagate:
            return 0
        return min((level for _, _, level in self._routes), default=float("inf"))

    def relative(self, source: str) -> str:
        if source.startswith(self._prefix):
            return source[len(self._prefix) :]
        return "" if source == self._runner_name else source

    def dispatch(self, batch: list[logging.LogRecord]) -> None:
        routes = self._routes
        for record in batch:
            level = record.levelno
            rel: str | None = None
            for handler, pattern, min_level in routes:
                if level < min_level:
                    continue
                if pattern != "*":
                    if rel is None:
                        rel = self.relative(source_of(record))
                    if not fnmatch.fnmatchcase(rel, pattern):
                        continue
                try:
                    handler.handle(record)
                except Exception:
                    # One broken handler must not cost the others their records.
                    handler.handleError(record)
            if self._propagate:
                logger = logging.getLogger(source_of(record))
                if logger.isEnabledFor(record.levelno):
                    logger.handle(record)
        for handler, _, _ in routes:
            handler.flush()

    def close(self, owned: Sequence[logging.Handler]) -> None:
        """Flush every handler; close only ``owned`` ones (those the runner made).

        Handlers the application passed in stay open: it may use them again.
        """
        for handler, _, _ in self._routes:
            handler.flush()
        for handler in owned:
            handler.close()


def _effective_level(route: Route, root_level: int) -> int:
    if route.level is not None:
        return route.level
    if route.handler.level != logging.NOTSET:
        return route.handler.level
    return root_level


def _format_message(record: logging.LogRecord) -> str:
    message = record.getMessage()
    if getattr(record, "corral_stream", None) == "logging":
        message = f"{record.name}: {message}"
    if record.exc_text:
        message = f"{message}\n{record.exc_text}"
    elif record.exc_info:
        message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
    if record.stack_info:
        message = f"{message}\n{record.stack_info}"
    return message


_stamp_cache: tuple[int, str] = (-1, "")


def _timestamp(record: logging.LogRecord) -> str:
    # strftime(localtime()) costs about 2 us; records come many per second, so the
    # text of the current second is kept (one tuple, replaced atomically).
    global _stamp_cache
    created = record.created
    second = int(created)
    cached_second, stamp = _stamp_cache
    if second != cached_second:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
        _stamp_cache = (second, stamp)
    return f"{stamp}.{int(record.msecs):03d}"


class LogFiles(logging.Handler):
    """One file per source plus ``combined.log``, in one folder.

    Files are named after the full source (``corral.web.log``; the runner's
    own records go to ``corral.log``) and opened on their first record.  At
    most ``max_open`` files are open at once; the least recently written is
    closed (and reopened for appending when needed), so a thousand sources
    cost no more than ``max_open`` descriptors.  Lines look like::

        2026-11-30 10:33:01.123 INFO     [stdout] listening on port 8080

    and, in ``combined.log``, carry the source::

        2026-11-30 10:33:01.123 INFO     corral.web [stdout] listening on port 8080
    """

    def __init__(self, folder: str | os.PathLike[str], *, max_open: int = 64) -> None:
        super().__init__(logging.DEBUG)
        self.folder = os.fspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self._max_open = max_open
        self._files: OrderedDict[str, TextIO] = OrderedDict()
        self._combined = open(  # noqa: SIM115 - closed in close()
            os.path.join(self.folder, "combined.log"), "a", encoding="utf-8"
        )

    def _file_for(self, source: str) -> TextIO:
        file = self._files.get(source)
        if file is not None:
            self._files.move_to_end(source)
            return file
        if len(self._files) >= self._max_open:
            _, oldest = self._files.popitem(last=False)
            oldest.close()
        safe = source.replace(os.sep, "_")
        file = open(  # noqa: SIM115 - kept open, closed in close()
            os.path.join(self.folder, f"{safe}.log"), "a", encoding="utf-8"
        )
        self._files[source] = file
        return file

    def emit(self, record: logging.LogRecord) -> None:
        try:
            source = source_of(record)
            stream = getattr(record, "corral_stream", None)
            head = f"{_timestamp(record)} {record.levelname:<8} "
            tail = f"[{stream}] " if stream in ("stdout", "stderr") else ""
            message = _format_message(record)
            self._file_for(source).write(f"{head}{tail}{message}\n")
            self._combined.write(f"{head}{source} {tail}{message}\n")
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self.lock if self.lock is not None else _NO_LOCK:
            for file in self._files.values():
                file.flush()
            self._combined.flush()

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()
        self._combined.close()
        super().close()


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


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
        message = _format_message(record)
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
