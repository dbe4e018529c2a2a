"""Sources of log records, their live tails and their short backlogs.

A *source* is whoever speaks in the logs: a child process (``<runner>.web``,
the same source across restarts), a worker of a launch, the runner itself.
Each has a :class:`Source` object shared by the two sides of the log path:

* the **loop side** (pipe readers, log connections, :meth:`Process.logs`
  tails) runs on the event loop;
* the **worker side** (the router, see :mod:`corral._routing`) runs on the
  collector's worker thread and turns bytes into lines, files and records.

A :class:`LogTail` is one live reader of a source.  Records reach it from
the worker side only while it exists (records are built only for consumers
that exist), and a short backlog — the last few hundred records, at most
:data:`BACKLOG_BYTES` of text — lets a tail opened a moment after the child
started see what it wrote in between.  The backlog keeps raw lines, and
records are made from them only when a tail asks.

A tail that is not read applies backpressure while the child runs: once it
holds ``buffer`` records, the source's readers stop reading, so the child
blocks in its own ``write``.  It never holds up a stop: a child that is
stopping or has exited is read to the end whatever its tails hold, and tails
end when the child is done (or the runner stops).  A tail that is dropped
without being closed stops counting at once (tails are held weakly).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType

import anyio
import anyio.lowlevel

from ._records import make_record

__all__ = [
    "BACKLOG_BYTES",
    "BACKLOG_RECORDS",
    "Block",
    "LogTail",
    "Source",
    "line_block",
    "record_block",
]

#: The most records a source's backlog keeps for tails opened later.
BACKLOG_RECORDS = 256
#: The most bytes of text a source's backlog keeps.
BACKLOG_BYTES = 256 * 1024


class Block:
    """Records kept in a backlog in whatever form they arrived (lines, wire records...).

    ``make`` turns one item into a :class:`logging.LogRecord`; it is called only
    when a tail asks for the records, so a backlog nobody reads costs no records.
    """

    __slots__ = ("items", "make", "size")

    def __init__(
        self,
        items: Sequence[object],
        make: Callable[[object], logging.LogRecord] | None,
        size: int,
    ) -> None:
        self.items = items
        self.make = make
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def newest(self, keep: int) -> Block:
        items = self.items[len(self.items) - keep :]
        size = self.size * len(items) // max(len(self.items), 1)
        return Block(items, self.make, size)

    def records(self) -> list[logging.LogRecord]:
        make = self.make
        if make is None:
            return list(self.items)  # type: ignore[arg-type]
        return [make(item) for item in self.items]


def line_block(
    source: str, created: float, level: int, stream: str, pid: int, lines: list[bytes]
) -> Block:
    """A block of raw lines read from a pipe at one moment."""

    def make(line: object) -> logging.LogRecord:
        assert isinstance(line, bytes)
        return make_record(
            source, level, line.decode("utf-8", "replace"), created=created, stream=stream, pid=pid
        )

    return Block(lines, make, sum(map(len, lines)))


def record_block(records: list[logging.LogRecord]) -> Block:
    """A block of records that exist already."""
    return Block(records, None, sum(len(str(r.msg)) for r in records))


_Entry = tuple[int, Block]


class Source:
    """One source of records (see the module's docs)."""

    def __init__(self, name: str, relative: str) -> None:
        #: The full dotted name, ``<runner>.<process>``.
        self.name = name
        #: The name within the runner (``""`` for the runner itself).
        self.relative = relative
        #: Read by the worker side: whether to build records for tails.
        self.tail_count = 0
        self._tails: list[weakref.ref[LogTail]] = []
        self._room = anyio.Event()
        self._room.set()
        self._lock = threading.Lock()
        self._backlog: deque[_Entry] = deque()
        self._backlog_records = 0
        self._backlog_bytes = 0
        self._seq = 0  # worker side: records ever numbered
        self._ended = False

    # -- worker side ---------------------------------------------------------------------

    def number(self, count: int) -> int:
        """Number ``count`` new records; returns the first number (worker side)."""
        first = self._seq + 1
        self._seq += count
        return first

    def remember(self, first: int, block: Block) -> None:
        """Keep ``block`` (numbered from ``first``) in the backlog, trimmed to its bounds."""
        count = len(block)
        if count > BACKLOG_RECORDS:
            first += count - BACKLOG_RECORDS
            block = block.newest(BACKLOG_RECORDS)
            count = BACKLOG_RECORDS
        with self._lock:
            self._backlog.append((first, block))
            self._backlog_records += count
            self._backlog_bytes += block.size
            while len(self._backlog) > 1 and (
                self._backlog_records > BACKLOG_RECORDS or self._backlog_bytes > BACKLOG_BYTES
            ):
                old_first, old = self._backlog.popleft()
                self._backlog_records -= len(old)
                self._backlog_bytes -= old.size
                excess = self._backlog_records - BACKLOG_RECORDS
                if excess < 0 and self._backlog_bytes <= BACKLOG_BYTES:
                    # Dropping the whole block went too far: keep its newest part.
                    part = old.newest(min(-excess, len(old)))
                    self._backlog.appendleft((old_first + len(old) - len(part), part))
                    self._backlog_records += len(part)
                    self._backlog_bytes += part.size
                    break

    # -- loop side ----------------------------------------------------------------------

    def open_tail(self, buffer: int) -> LogTail:
        if buffer < 1:
            raise ValueError("buffer must be at least 1 record")
        tail = LogTail(self, buffer)
        with self._lock:
            backlog = list(self._backlog)
        for first, block in backlog:
            tail._push(first, block.records())
        if self._ended:
            tail._end()
        else:
            self._tails.append(weakref.ref(tail))
            self.tail_count = len(self._tails)
        return tail

    def publish(self, first: int, records: list[logging.LogRecord]) -> None:
        """Hand records from the worker side to every live tail (on the loop)."""
        for tail in self._live_tails():
            tail._push(first, records)

    def _live_tails(self) -> list[LogTail]:
        tails = [tail for ref in self._tails if (tail := ref()) is not None and not tail._closed]
        if len(tails) != len(self._tails):
            self._tails = [weakref.ref(tail) for tail in tails]
            self.tail_count = len(tails)
            self._update_room(tails)
        return tails

    def _update_room(self, tails: list[LogTail] | None = None) -> None:
        if tails is None:
            tails = self._live_tails()
        full = any(len(tail._records) >= tail._buffer for tail in tails)
        if full and self._room.is_set():
            self._room = anyio.Event()
        elif not full:
            self._room.set()

    def room_event(self) -> anyio.Event:
        """Set while no tail is full."""
        self._live_tails()
        return self._room

    def end(self) -> None:
        """The source has ended: every tail ends after what it received (on the loop)."""
        self._ended = True
        for tail in self._live_tails():
            tail._end()
        self._tails.clear()
        self.tail_count = 0
        self._room.set()

    def restart(self) -> None:
        """The source speaks again (a restarted process): new tails may follow it."""
        self._ended = False

    def __repr__(self) -> str:
        return f"<Source {self.name!r}>"


class LogTail:
    """A live tail of one source: ``async for record in proc.logs(): ...``.

    Yields :class:`logging.LogRecord` objects, starting with the source's
    backlog, then live, and ends once the source has ended (the process has
    exited for good, or the runner stopped).  Use it as an async context
    manager, or call :meth:`aclose`, when done before that: an open tail
    that is not read holds the child back once ``buffer`` records are
    waiting (backpressure), although it never holds up a stop.
    """

    def __init__(self, source: Source, buffer: int) -> None:
        self._source = source
        self._buffer = buffer
        self._records: deque[logging.LogRecord] = deque()
        self._last = 0
        self._data = anyio.Event()
        self._ended = False
        self._closed = False

    @property
    def source(self) -> str:
        """The full dotted source this tail follows."""
        return self._source.name

    def _push(self, first: int, records: list[logging.LogRecord]) -> None:
        if self._closed or self._ended:
            return
        skip = self._last - first + 1
        if skip >= len(records):
            return
        if skip > 0:
            records = records[skip:]
            first += skip
        self._records.extend(records)
        self._last = first + len(records) - 1
        self._data.set()
        if len(self._records) >= self._buffer:
            self._source._update_room()

    def _end(self) -> None:
        self._ended = True
        self._data.set()

    def __aiter__(self) -> AsyncIterator[logging.LogRecord]:
        return self

    async def __anext__(self) -> logging.LogRecord:
        while not self._records:
            if self._ended or self._closed:
                await anyio.lowlevel.checkpoint()
                raise StopAsyncIteration
            self._data = anyio.Event()
            await self._data.wait()
        record = self._records.popleft()
        if len(self._records) == self._buffer - 1:
            self._source._update_room()
        await anyio.lowlevel.checkpoint()
        return record

    async def receive(self) -> logging.LogRecord:
        """The next record; raises :class:`anyio.EndOfStream` once the tail has ended."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise anyio.EndOfStream from None

    def close(self) -> None:
        """Stop following the source (idempotent); iteration ends."""
        if self._closed:
            return
        self._closed = True
        self._records.clear()
        self._data.set()
        self._source._update_room()

    async def aclose(self) -> None:
        self.close()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> LogTail:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "closed" if self._closed else "live"
        return f"<LogTail {self._source.name!r} {state}, {len(self._records)} waiting>"
