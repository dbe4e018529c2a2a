"""Reading a child's stdout and stderr, line by line, without blocking the loop.

Each captured stream is a pipe whose read end the runner sets non-blocking.
A :class:`PipeReader` waits until the pipe is readable (an ordinary
readiness wait on the event loop: no thread, no polling), reads what is
there in chunks, splits it into lines and hands the lines to the collector
as :class:`logging.LogRecord` objects.  Three details matter:

* **No starvation.** A pipe that always has data would never let the loop
  run anything else, so the reader yields to the loop after every chunk.
* **No deadlock, no unbounded memory.** The reader keeps reading while the
  child writes, so the child never blocks on a full pipe — unless the
  collector is full, in which case the reader waits and the child blocks:
  backpressure, not loss.
* **Nothing lost at exit.** When the child's process has exited the
  runner calls :meth:`PipeReader.finish`: the reader stops waiting and reads
  everything still in the pipe, including a last line without a newline.
  It does not wait for end-of-file then, because a process that escaped the
  child's process group may hold the pipe open forever.
"""

from __future__ import annotations

import logging
import os
import time

import anyio
import anyio.lowlevel

from ._collector import Collector

__all__ = ["PipeReader", "make_record"]

#: Bytes read from a pipe at a time.  A pipe holds 64 KiB; smaller reads
#: keep each turn on the loop short during a burst.
CHUNK = 32 * 1024

#: A "line" longer than this is cut and delivered in pieces.
MAX_LINE = 1024 * 1024

_TEMPLATE = logging.LogRecord("corral", logging.INFO, "", 0, "", None, None).__dict__.copy()
_TEMPLATE.update(pathname="", filename="", module="", lineno=0, funcName=None)
_START = logging.LogRecord("corral", logging.INFO, "", 0, "", None, None).relativeCreated


def make_record(
    name: str,
    level: int,
    msg: str,
    *,
    created: float | None = None,
    source: str | None = None,
    stream: str | None = None,
    pid: int | None = None,
) -> logging.LogRecord:
    """Build a :class:`logging.LogRecord` quickly (a dictionary copy, not ``__init__``).

    ``logging.LogRecord.__init__`` looks up the thread, the process and more
    on every call; for a line of child output those are fixed, so a copy of
    a template is several times cheaper.
    """
    record = logging.LogRecord.__new__(logging.LogRecord)
    fields = record.__dict__
    fields.update(_TEMPLATE)
    if created is None:
        created = time.time()
    fields["name"] = name
    fields["msg"] = msg
    fields["levelno"] = level
    fields["levelname"] = logging.getLevelName(level)
    fields["created"] = created
    fields["msecs"] = (created - int(created)) * 1000
    fields["relativeCreated"] = (created - logging._startTime) * 1000  # type: ignore[attr-defined]
    fields["corral_source"] = source if source is not None else name
    fields["corral_stream"] = stream
    if pid is not None:
        fields["process"] = pid
    return record


class PipeReader:
    """Reads one captured stream of one child into the collector."""

    def __init__(
        self,
        fd: int,
        *,
        source: str,
        stream: str,
        level: int,
        collector: Collector,
        pid: int,
        tail_bytes: int = 0,
    ) -> None:
        self.fd = fd
        self.source = source
        self.stream = stream
        self.level = level
        self._collector = collector
        self._pid = pid
        self._tail_bytes = tail_bytes
        self.tail = bytearray()
        self._pending = b""
        self._finishing = False
        self._wait_scope: anyio.CancelScope | None = None
        self.lines = 0
        os.set_blocking(fd, False)

    def finish(self) -> None:
        """The child has exited: read what is left in the pipe, then stop."""
        self._finishing = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    async def run(self) -> None:
        """Read until end-of-file, or until :meth:`finish` and the pipe is empty."""
        try:
            while not self._finishing:
                with anyio.CancelScope() as scope:
                    self._wait_scope = scope
                    await anyio.wait_readable(self.fd)
                self._wait_scope = None
                if scope.cancelled_caught:
                    break
                if await self._read_available():
                    return
            await self._read_available()
        finally:
            if self._pending:
                await self._emit([self._pending], len(self._pending))
                self._pending = b""

    async def _read_available(self) -> bool:
        """Read until the pipe is empty; ``True`` at end-of-file."""
        while True:
            try:
                data = os.read(self.fd, CHUNK)
            except BlockingIOError:
                return False
            if not data:
                return True
            await self._feed(data)
            await anyio.lowlevel.checkpoint()

    async def _feed(self, data: bytes) -> None:
        if self._tail_bytes:
            tail = self.tail
            tail += data
            if len(tail) > self._tail_bytes:
                del tail[: len(tail) - self._tail_bytes]
        if self._pending:
            data = self._pending + data
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_LINE:
            lines.append(self._pending)
            self._pending = b""
        if lines:
            await self._emit(lines, len(data) - len(self._pending))

    async def _emit(self, lines: list[bytes], size: int) -> None:
        now = time.time()
        source, stream, level, pid = self.source, self.stream, self.level, self._pid
        records = [
            make_record(
                source,
                level,
                line.removesuffix(b"\r").decode("utf-8", "replace"),
                created=now,
                source=source,
                stream=stream,
                pid=pid,
            )
            for line in lines
        ]
        self.lines += len(records)
        await self._collector.put(records, size)
