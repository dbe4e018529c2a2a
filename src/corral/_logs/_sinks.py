"""corral's own destinations of records: :class:`BlockSink` and the run's files, :class:`LogFiles`.

A block sink takes a whole block of lines at once (see :mod:`corral._logs._router`);
the console (:mod:`corral._logs._console`), the monitor's feed and an agent's
forwarder are block sinks too.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict
from typing import IO

from ._records import believable, format_message, source_of, wire_message
from ._sources import Source
from ._wire import Record

__all__ = ["BlockSink", "LogFiles", "Stamps"]


class Stamps:
    """Time stamps by the second, cached: ``strftime`` per line would cost ~2 µs."""

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._second = -1
        self._text = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._text = time.strftime(self._fmt, time.localtime(created))
            self._second = second
        return self._text


class BlockSink(logging.Handler):
    """A destination that can write a whole block of lines at once (corral's own)."""

    #: Whether it draws progress bars live (a console on a terminal).
    live_progress = False

    @property
    def fast(self) -> bool:
        """Whether the block path applies (not when a subclass or filters change records)."""
        return not self.filters and self._plain()

    def _plain(self) -> bool:
        return True

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        raise NotImplementedError

    def write_progress(self, source: Source, stream: str | None, frame: bytes | None) -> None:
        """Draw (``frame``) or end (``None``) a live progress bar of ``source``."""

    def write_wire(self, source: Source, records: list[Record]) -> None:
        """Write records from a child's log connection (all of this sink's level)."""
        raise NotImplementedError

    def flush_block(self) -> None:
        self.flush()


class LogFiles(BlockSink):
    """One file per source plus ``combined.log``, in one folder.

    Files are named after the full source (``corral.web.log``; the runner's
    own records go to ``corral.log``) and opened on their first record.  At
    most ``max_open`` files are open at once; the least recently written is
    closed (and reopened for appending when needed), so a thousand sources
    cost no more than ``max_open`` descriptors.  A source whose name cannot
    be a file name (too long, say) still reaches ``combined.log``.  Lines
    look like::

        2026-11-30 10:33:01.123 INFO     [stdout] listening on port 8080

    and, in ``combined.log``, carry the source::

        2026-11-30 10:33:01.123 INFO     corral.web [stdout] listening on port 8080
    """

    def __init__(self, folder: str | os.PathLike[str], *, max_open: int = 64) -> None:
        super().__init__(logging.DEBUG)
        self.folder = os.fspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self._max_open = max_open
        self._files: OrderedDict[str, IO[bytes] | None] = OrderedDict()
        self._combined = open(  # noqa: SIM115 - closed in close()
            os.path.join(self.folder, "combined.log"), "ab", buffering=1 << 16
        )
        self._stamps = Stamps("%Y-%m-%d %H:%M:%S")
        self._prefixes: dict[tuple[str, int, str, int], tuple[bytes, bytes]] = {}
        self._write_lock = threading.Lock()

    def _file_for(self, source: str) -> IO[bytes] | None:
        if source in self._files:
            self._files.move_to_end(source)
            return self._files[source]
        if len(self._files) >= self._max_open:
            for name, oldest in list(self._files.items()):
                if oldest is not None:
                    oldest.close()
                    del self._files[name]
                    break
            else:
                self._files.popitem(last=False)
        safe = source.replace(os.sep, "_").replace("\0", "_") + ".log"
        try:
            file: IO[bytes] | None = open(  # noqa: SIM115 - closed in close()
                os.path.join(self.folder, safe), "ab", buffering=1 << 16
            )
        except OSError as exc:
            # Not a possible file name (too long, say): combined.log only.
            self._combined.write(
                f"{self._stamps(time.time())}.000 WARNING  corral [log files] records of "
                f"source {source[:200]!r} go to combined.log only: {exc.strerror}\n".encode()
            )
            file = None
        self._files[source] = file
        return file

    def _prefix(self, source: str, level: int, stream: str, created: float) -> tuple[bytes, bytes]:
        millis = int((created - int(created)) * 1000)
        key = (source, level, stream, int(created) * 1000 + millis)
        cached = self._prefixes.get(key)
        if cached is None:
            head = f"{self._stamps(created)}.{millis:03d} {logging.getLevelName(level):<8} "
            cached = (f"{head}[{stream}] ".encode(), f"{head}{source} [{stream}] ".encode())
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            self._prefixes[key] = cached
        return cached

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        own, combined = self._prefix(source.name, level, stream, created)
        with self._write_lock:
            file = self._file_for(source.name)
            if file is not None:
                file.write(own + text.replace(b"\n", b"\n" + own) + b"\n")
            self._combined.write(combined + text.replace(b"\n", b"\n" + combined) + b"\n")

    def write_wire(self, source: Source, records: list[Record]) -> None:
        name = source.name
        stamps = self._stamps
        own: list[str] = []
        combined: list[str] = []
        for rec in records:
            created = believable(rec.created)
            millis = math.floor((created - math.floor(created)) * 1000)
            head = f"{stamps(created)}.{millis:03d} {rec.levelname:<8} "
            message = wire_message(rec)
            own.append(f"{head}{message}\n")
            combined.append(f"{head}{name} {message}\n")
        with self._write_lock:
            file = self._file_for(name)
            if file is not None:
                file.write("".join(own).encode("utf-8", "backslashreplace"))
            self._combined.write("".join(combined).encode("utf-8", "backslashreplace"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            source = source_of(record)
            stream = getattr(record, "corral_stream", None)
            head = f"{self._stamps(record.created)}.{int(record.msecs):03d} {record.levelname:<8} "
            tail = f"[{stream}] " if stream in ("stdout", "stderr") else ""
            message = format_message(record)
            with self._write_lock:
                file = self._file_for(source)
                if file is not None:
                    file.write(f"{head}{tail}{message}\n".encode("utf-8", "backslashreplace"))
                self._combined.write(
                    f"{head}{source} {tail}{message}\n".encode("utf-8", "backslashreplace")
                )
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self._write_lock:
            for file in self._files.values():
                if file is not None:
                    file.flush()
            self._combined.flush()

    def close(self) -> None:
        with self._write_lock:
            for file in self._files.values():
                if file is not None:
                    file.close()
            self._files.clear()
            self._combined.close()
        super().close()
