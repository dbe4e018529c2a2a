"""corral's own destinations of records: :class:`BlockSink` and the run's files, :class:`LogFiles`.

A block sink takes a whole block of lines at once (see :mod:`corral._logs._router`);
the console (:mod:`corral._logs._console`), the monitor's feed and an agent's
forwarder are block sinks too.
"""

from __future__ import annotations

import io
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ._records import MAX_ABS_CREATED, believable, format_message, source_of, wire_message
from ._sources import Source

if TYPE_CHECKING:
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


#: A log file that could not be written is tried again after this many seconds.
RETRY_INTERVAL: Final = 5.0
#: A log file's own buffer: written out beyond this, and after every batch.
_FILE_BUFFER: Final = 1 << 16


class _File:
    """One file of the folder, with its own buffer and what it missed.

    A write error (a full disk, a quota, an I/O error) suspends it: the
    lines it held and those that come until it is tried again, every
    :data:`RETRY_INTERVAL` seconds, are counted in :attr:`missed`.
    """

    __slots__ = ("_buffer", "_file", "_size", "error", "missed", "path", "retry_at", "said")

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: io.FileIO | None = io.FileIO(path, "ab")  # opening may raise: the caller's
        self._buffer: list[bytes] = []
        self._size = 0
        self.missed = 0  # lines it could not write, in all
        self.said = 0  # ... of which a warning told already
        self.error: OSError | None = None  # why it is suspended
        self.retry_at = 0.0

    def write(self, data: bytes) -> None:
        """Write ``data``, whole lines (at the latest on :meth:`flush`)."""
        if self.error is not None and not self._resumed():
            self.missed += data.count(b"\n")
            return
        self._buffer.append(data)
        self._size += len(data)
        if self._size >= _FILE_BUFFER:
            self.flush()

    def flush(self) -> None:
        if not self._buffer or self._file is None:
            return
        data = b"".join(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        self._buffer.clear()
        self._size = 0
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view) or 0 :]
        except OSError as exc:
            self.missed += view.tobytes().count(b"\n")
            self.error = exc
            self.retry_at = time.monotonic() + RETRY_INTERVAL
            self._close()

    def _resumed(self) -> bool:
        """Whether a suspended file can be written again (tried once its time has come)."""
        if time.monotonic() < self.retry_at:
            return False
        assert self.error is not None
        missed, why = self.missed - self.said, self.error.strerror or str(self.error)
        try:
            self._file = io.FileIO(self.path, "ab")
            self._file.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}.000 WARNING  corral [log files] "
                f"{missed} lines missed here: {why}\n".encode()
            )
        except OSError as exc:
            self.error = exc
            self.retry_at = time.monotonic() + RETRY_INTERVAL
            self._close()
            return False
        self.error = None
        return True

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass

    def close(self) -> None:
        self.flush()
        self._close()


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

    A file that cannot be written (a full disk) is suspended: ``warn`` is
    called once with its name and the error, the lines it misses are
    counted (:attr:`missed`) while the other files and destinations go on,
    and it is tried again every :data:`RETRY_INTERVAL` seconds; written
    again, it says there how many lines it missed, and ``warn`` says so too.
    ``warn`` is called after a batch (from :meth:`flush`), never while a
    line is being written.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        max_open: int = 64,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(logging.DEBUG)
        self.folder = os.fspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self._max_open = max_open
        self.warn = warn
        self._files: OrderedDict[str, _File | None] = OrderedDict()
        self._combined = _File(os.path.join(self.folder, "combined.log"))
        #: Files that missed lines, closed since (their count is kept).
        self._gone: list[_File] = []
        self._told: set[int] = set()  # files suspended that a warning named (by id)
        self._stamps = Stamps("%Y-%m-%d %H:%M:%S")
        self._prefixes: dict[tuple[str, int, str, int], tuple[bytes, bytes]] = {}
        self._heads: dict[tuple[int, int, str], str] = {}  # by second, millisecond, level
        self._write_lock = threading.Lock()

    def _file_for(self, source: str) -> _File | None:
        if source in self._files:
            self._files.move_to_end(source)
            return self._files[source]
        if len(self._files) >= self._max_open:
            for name, oldest in list(self._files.items()):
                if oldest is not None:
                    oldest.close()
                    if oldest.missed or oldest.error is not None:
                        self._gone.append(oldest)
                    del self._files[name]
                    break
            else:
                self._files.popitem(last=False)
        safe = source.replace(os.sep, "_").replace("\0", "_") + ".log"
        try:
            file: _File | None = _File(os.path.join(self.folder, safe))
        except OSError as exc:
            # Not a possible file name (too long, say): combined.log only.
            self._combined.write(
                f"{self._stamps(time.time())}.000 WARNING  corral [log files] records of "
                f"source {source[:200]!r} go to combined.log only: {exc.strerror}\n".encode()
            )
            file = None
        self._files[source] = file
        return file

    @property
    def missed(self) -> int:
        """The lines (and records) that some file of the folder could not write, in all.

        Without the lock (the loop may ask): :meth:`_all` copies in C, under the GIL.
        """
        return sum(file.missed for file in self._all())

    def _all(self) -> list[_File]:
        files = list(self._files.values())
        return [self._combined, *list(self._gone), *(f for f in files if f is not None)]

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
        # Each record is formatted once, for both files: its head (time stamp and
        # level, cached by the millisecond) and its text are joined twice, in C.
        heads = self._heads
        stamps = self._stamps
        floor = math.floor
        own: list[str] = []
        combined: list[str] = []
        name = source.name + " "
        for rec in records:
            created = rec.created
            if not -MAX_ABS_CREATED < created < MAX_ABS_CREATED:
                created = believable(created)
            second = floor(created)
            key = (second, floor((created - second) * 1000), rec.levelname)
            head = heads.get(key)
            if head is None:
                head = f"{stamps(created)}.{key[1]:03d} {rec.levelname:<8} "
                if len(heads) >= 4096:
                    heads.clear()
                heads[key] = head
            if rec.name and not rec.exc_text and not rec.stack_info:
                text = f"{rec.name}: {rec.msg}\n"
            else:
                text = wire_message(rec) + "\n"
            own += (head, text)
            combined += (head, name, text)
        with self._write_lock:
            file = self._file_for(source.name)
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
            for file in self._all():
                file.flush()
            said = self._news()
        if self.warn is not None:
            for message in said:
                self.warn(message)

    def _news(self) -> list[str]:
        """What to warn about since the last time: files suspended, files written again."""
        said = []
        for file in self._all():
            if file.error is not None and id(file) not in self._told:
                self._told.add(id(file))
                said.append(
                    f"log file {file.path}: {file.error.strerror or file.error}; its lines "
                    f"are counted and dropped until it can be written again (tried every "
                    f"{RETRY_INTERVAL:g} s; the console and the other destinations go on)"
                )
            elif file.error is None and id(file) in self._told:
                self._told.discard(id(file))
                said.append(
                    f"log file {file.path} is written again; it missed {file.missed - file.said} "
                    "lines"
                )
                file.said = file.missed
        return said

    def losses(self) -> str | None:
        """What the files missed in all, as the runner says at its end (``None``: nothing)."""
        with self._write_lock:
            files = [file for file in self._all() if file.missed]
        if not files:
            return None
        files.sort(key=lambda file: -file.missed)
        each = ", ".join(f"{os.path.basename(f.path)} {f.missed}" for f in files[:5])
        more = f" and {len(files) - 5} more files" if len(files) > 5 else ""
        total = sum(file.missed for file in files)
        return (
            f"the log files in {self.folder} missed {total} lines ({each}{more}): "
            "they could not be written"
        )

    def close(self) -> None:
        with self._write_lock:
            for file in self._files.values():
                if file is not None:
                    file.close()
                    if file.missed:
                        self._gone.append(file)
            self._files.clear()
            self._combined.close()
        super().close()
