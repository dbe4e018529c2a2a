"""Sources of log records, their live tails and their short backlogs.

A *source* is whoever speaks in the logs: a child process (``<runner>.web``,
the same source across restarts), a worker of a launch, the runner itself.
Each has a :class:`Source` object shared by the two sides of the log path:

* the **loop side** (pipe readers, log connections, :meth:`Process.logs`
  tails) runs on the event loop;
* the **worker side** (the router, see :mod:`corral._logs._router`) runs on the
  collector's worker thread and turns bytes into lines, files and records.

A :class:`LogTail` is one live reader of a source.  Records reach it from
the worker side only while it exists (records are built only for consumers
that exist), and a short backlog lets a tail opened a moment after the child
started see what it wrote in between.  The backlog keeps raw lines, and
records are made from them only when a tail asks.  It is bounded for each
source — the newest :data:`BACKLOG_RECORDS` records, :data:`BACKLOG_BYTES`
bytes of their text at most (a record that alone is longer is kept cut to
its end, as ``tail -c`` would) — and for all the sources of a runner
together (:class:`Backlogs`): at most :data:`BACKLOG_TOTAL_BYTES`, the oldest
output going first whatever its source.  So a tail opened right after
:meth:`Runner.start` misses nothing unless the child wrote more than that
in between (or the other children together more than the total).

A tail that is not read applies backpressure while the child runs: once it
holds ``buffer`` records or :data:`TAIL_BYTES` bytes of their text, the
source's readers stop reading, so the child blocks in its own ``write``
(or ``send``).  It never holds up a stop: a child that is stopping or has
exited is read to the end whatever its tails hold, and tails end when the
child is done (or the runner stops).  A tail that is dropped without being
closed stops counting at once (tails are held weakly).
"""

from __future__ import annotations

import copy
import logging
import operator
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Final

import anyio
import anyio.lowlevel

from ._records import make_record

__all__ = [
    "BACKLOG_BYTES",
    "BACKLOG_RECORDS",
    "BACKLOG_TOTAL_BYTES",
    "TAIL_BYTES",
    "Backlogs",
    "Block",
    "LogTail",
    "Source",
    "line_block",
    "record_block",
    "wire_block",
]

#: The most records a source's backlog keeps for tails opened later.
BACKLOG_RECORDS = 256
#: The most bytes of text a source's backlog keeps.
BACKLOG_BYTES = 256 * 1024
#: The most bytes of text the backlogs of all a runner's sources keep together.
BACKLOG_TOTAL_BYTES = 8 * 1024 * 1024
#: A tail that is not read holds back its source's readers once it holds
#: this many bytes of text (or its ``buffer`` of records).
TAIL_BYTES = 1024 * 1024

#: What a record cut for the backlog starts with.
_CUT = "[...] "


class Block:
    """Records kept in a backlog in whatever form they arrived (lines, wire records...).

    ``make`` turns one item into a :class:`logging.LogRecord`; it is called only
    when a tail asks for the records, so a backlog nobody reads costs no records.
    ``measure`` tells an item's size (bytes of text) and ``cut`` keeps the end of
    one, so that the backlog can keep to its bounds exactly.
    """

    __slots__ = ("cut", "items", "make", "measure", "size")

    def __init__(
        self,
        items: Sequence[object],
        make: Callable[[object], logging.LogRecord] | None,
        size: int,
        measure: Callable[[object], int],
        cut: Callable[[object, int], object],
    ) -> None:
        self.items = items
        self.make = make
        self.size = size
        self.measure = measure
        self.cut = cut

    def __len__(self) -> int:
        return len(self.items)

    def newest(self, records: int, nbytes: int) -> Block:
        """Its newest items, at most ``records`` of them and ``nbytes`` bytes (one at least,
        cut if it alone is longer)."""
        kept: list[object] = []
        size = 0
        for item in reversed(self.items[len(self.items) - records :]):
            length = self.measure(item)
            if size + length > nbytes:
                if not kept:
                    item = self.cut(item, nbytes)
                    kept.append(item)
                    size = self.measure(item)
                break
            kept.append(item)
            size += length
        kept.reverse()
        return Block(kept, self.make, size, self.measure, self.cut)

    def records(self) -> list[logging.LogRecord]:
        make = self.make
        if make is None:
            return list(self.items)  # type: ignore[arg-type]
        return [make(item) for item in self.items]


def _cut_text(text: str, nbytes: int) -> str:
    return _CUT + text[len(text) - max(nbytes - len(_CUT), 0) :]


def _measure_line(line: object) -> int:
    assert isinstance(line, bytes)
    return len(line)


def _cut_line(line: object, nbytes: int) -> object:
    assert isinstance(line, bytes)
    keep = max(nbytes - len(_CUT), 0)
    return _CUT.encode() + line[len(line) - keep :]


def line_block(
    source: str, created: float, level: int, stream: str, pid: int, lines: list[bytes]
) -> Block:
    """A block of raw lines read from a pipe at one moment."""

    def make(line: object) -> logging.LogRecord:
        assert isinstance(line, bytes)
        return make_record(
            source, level, line.decode("utf-8", "replace"), created=created, stream=stream, pid=pid
        )

    return Block(lines, make, sum(map(len, lines)), _measure_line, _cut_line)


def _measure_wire(rec: object) -> int:
    return len(rec.msg) + len(rec.exc_text or "") + len(rec.stack_info or "")  # type: ignore[attr-defined]


def _cut_wire(rec: object, nbytes: int) -> object:
    """The end of a record's text (message, traceback, stack: in that order), ``nbytes`` of it."""
    room = max(nbytes - len(_CUT), 0)
    fields: dict[str, str | None] = {}
    for name in ("stack_info", "exc_text", "msg"):
        text: str = getattr(rec, name) or ""
        keep = text[len(text) - room :] if room else ""
        room -= len(keep)
        fields[name] = keep if keep or name == "msg" else None
    fields["msg"] = _CUT + (fields["msg"] or "")
    import msgspec  # (loaded: the record is one of its structs)

    return msgspec.structs.replace(rec, **fields)  # type: ignore[type-var]


_msg: Final = operator.attrgetter("msg")
_exc_text: Final = operator.attrgetter("exc_text")
_stack_info: Final = operator.attrgetter("stack_info")


def wire_block(records: Sequence[object], make: Callable[[object], logging.LogRecord]) -> Block:
    """A block of records as they came from a log connection (``msgspec`` structs)."""
    # _measure_wire summed, in C: this runs for every batch of records.
    size = sum(map(len, map(_msg, records)))
    size += sum(map(len, filter(None, map(_exc_text, records))))
    size += sum(map(len, filter(None, map(_stack_info, records))))
    return Block(records, make, size, _measure_wire, _cut_wire)


def _measure_record(record: object) -> int:
    assert isinstance(record, logging.LogRecord)
    return len(str(record.msg)) + len(record.exc_text or "")


def _cut_record(record: object, nbytes: int) -> object:
    assert isinstance(record, logging.LogRecord)
    cut = copy.copy(record)
    cut.msg, cut.args = _cut_text(record.getMessage(), nbytes), None
    cut.exc_info = cut.exc_text = None
    return cut


def record_block(records: list[logging.LogRecord]) -> Block:
    """A block of records that exist already."""
    return Block(records, None, sum(map(_measure_record, records)), _measure_record, _cut_record)


class Backlogs:
    """The backlogs of all the sources of a runner, bounded together (worker side).

    Every block a source keeps is listed here in the order it came; once
    they add up to more than ``limit`` bytes, the oldest go, whatever their
    source.  Blocks a source let go itself are skipped when they come up.
    """

    def __init__(self, limit: int = BACKLOG_TOTAL_BYTES) -> None:
        self.limit = limit
        self.bytes = 0
        self._order: deque[tuple[Source, int]] = deque()
        self._stale = 0  # entries of _order whose block went already
        self._key = 0

    def key(self) -> int:
        self._key += 1
        return self._key

    def added(self, source: Source, key: int, size: int) -> None:
        self._order.append((source, key))
        self.bytes += size
        while self.bytes > self.limit and self._order:
            oldest, old_key = self._order.popleft()
            if not oldest._forget(old_key):
                self._stale -= 1
        if self._stale > len(self._order) // 2 + 64:
            self._order = deque((src, key) for src, key in self._order if src._holds(key))
            self._stale = 0

    def gone(self, size: int, *, stale: bool = True) -> None:
        """A source let go of a block (or part of one) of ``size`` bytes."""
        self.bytes -= size
        if stale:
            self._stale += 1


class _Kept:
    """A block in a backlog: its key in :class:`Backlogs`, the number of its first record."""

    __slots__ = ("block", "first", "key")

    def __init__(self, key: int, first: int, block: Block) -> None:
        self.key = key
        self.first = first
        self.block = block


class Source:
    """One source of records (see the module's docs)."""

    def __init__(self, name: str, relative: str, backlogs: Backlogs | None = None) -> None:
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
        self._backlogs = backlogs if backlogs is not None else Backlogs()
        self._backlog: deque[_Kept] = deque()  # oldest first
        self._keys: set[int] = set()
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
        if count > BACKLOG_RECORDS or block.size > BACKLOG_BYTES:
            block = block.newest(BACKLOG_RECORDS, BACKLOG_BYTES)
            first += count - len(block)
        backlogs = self._backlogs
        key = backlogs.key()
        with self._lock:
            self._backlog.append(_Kept(key, first, block))
            self._keys.add(key)
            self._backlog_records += len(block)
            self._backlog_bytes += block.size
            while self._backlog_records > BACKLOG_RECORDS or self._backlog_bytes > BACKLOG_BYTES:
                oldest = self._backlog[0]
                old = oldest.block
                records = self._backlog_records - len(old)
                nbytes = self._backlog_bytes - old.size
                if records >= BACKLOG_RECORDS or nbytes >= BACKLOG_BYTES:
                    self._backlog.popleft()
                    self._keys.discard(oldest.key)
                    self._backlog_records, self._backlog_bytes = records, nbytes
                    backlogs.gone(old.size)
                    continue
                # Dropping the whole block would go too far: keep its newest part.
                part = old.newest(BACKLOG_RECORDS - records, BACKLOG_BYTES - nbytes)
                oldest.first += len(old) - len(part)
                oldest.block = part
                self._backlog_records = records + len(part)
                self._backlog_bytes = nbytes + part.size
                backlogs.gone(old.size - part.size, stale=False)
                break
        backlogs.added(self, key, block.size)

    def _forget(self, key: int) -> bool:
        """Let go of the oldest block if it is ``key`` (for :class:`Backlogs`)."""
        with self._lock:
            if not self._backlog or self._backlog[0].key != key:
                return False
            block = self._backlog.popleft().block
            self._keys.discard(key)
            self._backlog_records -= len(block)
            self._backlog_bytes -= block.size
        self._backlogs.gone(block.size, stale=False)
        return True

    def _holds(self, key: int) -> bool:
        return key in self._keys

    # -- loop side ----------------------------------------------------------------------

    def open_tail(self, buffer: int) -> LogTail:
        if buffer < 1:
            raise ValueError("buffer must be at least 1 record")
        tail = LogTail(self, buffer)
        with self._lock:
            backlog = [(kept.first, kept.block) for kept in self._backlog]
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
        full = any(tail._is_full() for tail in tails)
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
    that is not read holds the child back once ``buffer`` records, or
    1 MiB of their text, are waiting (backpressure), although it never
    holds up a stop (see :ref:`buffers`).
    """

    def __init__(self, source: Source, buffer: int) -> None:
        self._source = source
        self._buffer = buffer
        self._records: deque[logging.LogRecord] = deque()
        self._bytes = 0  # of the text of the records waiting
        self._full = False
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
        self._bytes += sum(len(str(record.msg)) for record in records)
        self._last = first + len(records) - 1
        self._data.set()
        if not self._full and self._is_full():
            self._full = True
            self._source._update_room()

    def _is_full(self) -> bool:
        return len(self._records) >= self._buffer or self._bytes >= TAIL_BYTES

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
        self._bytes -= len(str(record.msg))
        if self._full and not self._is_full():
            self._full = False
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
        self._bytes = 0
        self._full = False
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
