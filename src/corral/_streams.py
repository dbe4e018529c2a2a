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
from collections import deque

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._collector import Collector

__all__ = ["PipeReader", "Tails", "make_record"]

#: Bytes read from a pipe at a time.  A pipe holds 64 KiB; smaller reads
#: keep each turn on the loop short during a burst.
CHUNK = 32 * 1024

#: Records of each process kept for tails opened after they were written.
TAIL_BACKLOG = 256

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
        tails: Tails | None = None,
    ) -> None:
        self.fd = fd
        self.tails = tails if tails is not None else Tails(0)
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
            if self._pending and (self.level >= self._collector.min_level or self.tails.wanted):
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
        if lines and (self.level >= self._collector.min_level or self.tails.wanted):
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
        if self.level >= self._collector.min_level:
            await self._collector.put(records, size)
        if self.tails.wanted:
            await self.tails.publish(records)


class Tails:
    """The live tails of one source (see :meth:`Process.logs`), and a short backlog.

    The backlog keeps the last ``backlog`` records, so that a tail opened a
    moment after the child started (or after its start-up handshake) still
    sees what the child wrote in between.
    """

    def __init__(self, backlog: int) -> None:
        self._backlog: deque[logging.LogRecord] = deque(maxlen=backlog)
        self._subscribers: list[MemoryObjectSendStream[logging.LogRecord]] = []
        self._closed = False

    @property
    def wanted(self) -> bool:
        """Whether records should be built for the tails at all."""
        return bool(self._backlog.maxlen) or bool(self._subscribers)

    def open(self, buffer: int) -> MemoryObjectReceiveStream[logging.LogRecord]:
        send, receive = anyio.create_memory_object_stream[logging.LogRecord](
            max(buffer, len(self._backlog))
        )
        for record in self._backlog:
            send.send_nowait(record)
        if self._closed:
            send.close()
        else:
            self._subscribers.append(send)
        return receive

    async def publish(self, records: list[logging.LogRecord]) -> None:
        """Hand ``records`` to every open tail, waiting for slow ones (backpressure)."""
        self._backlog.extend(records)
        for stream in list(self._subscribers):
            try:
                for record in records:
                    await stream.send(record)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._subscribers.remove(stream)

    def close(self) -> None:
        """The source has ended: every tail ends after what it has received."""
        self._closed = True
        for stream in self._subscribers:
            stream.close()
        self._subscribers.clear()
