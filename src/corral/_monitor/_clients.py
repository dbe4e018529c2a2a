"""The monitor's one queue of log events, and its clients' places in it: :class:`MonitorSink`."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol

import anyio

from .._logs._records import format_message, source_of
from .._logs._sinks import BlockSink
from .._logs._sources import Source
from .._logs._wire import Record
from ._rows import (
    JSON,
    MESSAGE_ROWS,
    ROW_BYTES,
    ROW_FRAMING,
    Entry,
    Filter,
    Held,
    logs_message,
    make_rows,
    to_held,
)

if TYPE_CHECKING:
    from .._sys._backend import LoopHandle

__all__ = ["Client", "MonitorSink"]

# Every bound below is in docs/howto/limits.rst, each with its test.

#: The newest log records the monitor keeps for its clients, all of them
#: together: a client that falls further behind loses its oldest.
QUEUE_RECORDS: Final = 20_000
#: ... and at most this many bytes of output (plus the newest read, if it alone is more).
QUEUE_BYTES: Final = 8 * 1024 * 1024
#: Log records a client gets on connecting, from before it came, at most; as
#: many as fit in about :data:`RECENT_MESSAGE` bytes (its first message).
RECENT_RECORDS: Final = 500
RECENT_MESSAGE: Final = 48 * 1024
#: While no client is connected, only that much is kept, and at most this many
#: bytes (plus the newest read, if it alone is more).
RECENT_BYTES: Final = 1024 * 1024
#: ... and at most this many bytes, fewer when many clients are being sent
#: messages at once: those messages hold at most :data:`SEND_BUDGET` bytes
#: together, yet each client may have one of :data:`MIN_MESSAGE` on its way.
MESSAGE_BYTES: Final = 256 * 1024
SEND_BUDGET: Final = 4 * 1024 * 1024
MIN_MESSAGE: Final = 32 * 1024
#: State messages kept for the clients; a client further behind gets the
#: newest state of each process instead.
STATE_QUEUE: Final = 1000


class Owner(Protocol):
    """What a :class:`MonitorSink` feeds: the :class:`~corral._monitor._server.Monitor`."""

    sink: MonitorSink


class Client:
    """One connected client: what it follows and where it is in the monitor's queue.

    Every client reads the one queue of the :class:`MonitorSink`; a client
    costs it nothing per read of output, whether it reads or not.
    """

    def __init__(self, source: str, level: int) -> None:
        self.wanted = (source, level)
        self.filter = Filter(source, level)
        self.entry = 0  # the number of the entry it reads next...
        self.offset = 0  # ... and how many of that entry's rows it has read
        self.base = 0  # rows its filter matched before that place (see Filter)
        self.dropped = 0  # rows it lost, not told yet
        self.state = 0  # the number of the state message it gets next
        self.resync: list[bytes] = []  # the newest states, for one that fell far behind
        self.usage = 0  # the number of the last usage message it has
        self.busy = threading.Lock()  # a take or a filter change at a time

    @property
    def source(self) -> str:
        """The glob of the sources this client wants."""
        return self.filter.pattern

    @property
    def level(self) -> int:
        """The lowest level this client wants."""
        return self.filter.level


class MonitorSink(BlockSink):
    """A destination of the runner's log service that feeds the monitor's clients.

    It keeps one queue of entries (reads of output, batches of records) for
    every client: the newest :data:`QUEUE_RECORDS` records, at most
    :data:`QUEUE_BYTES` bytes (:data:`RECENT_RECORDS` and
    :data:`RECENT_BYTES` while no client is connected).  Each client has a
    place in it; one that falls behind the queue's start loses what went
    and is told how much.  Adding an entry costs the same however many
    clients there are, and however slow.
    """

    def __init__(self, monitor: Owner) -> None:
        super().__init__(logging.NOTSET)
        self._monitor = monitor
        monitor.sink = self
        self._lock = threading.Lock()
        self._held: deque[Held] = deque()
        self._first = 0  # the number of the oldest entry held
        self._rows = 0
        self._bytes = 0
        self._filters: dict[tuple[str, int], Filter] = {}
        self._clients: list[Client] = []
        self._states: deque[bytes] = deque()
        self._states_first = 0  # the number of the oldest state message held
        self._newest: dict[str, bytes] = {}  # each process's newest state message
        self._usage: tuple[int, bytes] = (0, b"")  # the newest usage message, and its number
        self._in_flight = 0  # bytes of the messages being sent
        self._loop: LoopHandle | None = None
        self._waiting = False  # a client waits for an entry
        self._data: anyio.Event | None = None
        self._ended = False

    @property
    def clients(self) -> list[Client]:
        """The connected clients (a list that is replaced, never changed: safe to iterate)."""
        return self._clients

    @property
    def held(self) -> tuple[int, int]:
        """The records and bytes of output held for clients now."""
        return self._rows, self._bytes

    def start(self, loop: LoopHandle) -> None:
        """The monitor serves (on the loop): clients may come."""
        self._loop = loop
        self._data = anyio.Event()

    # -- the log service's side (its worker thread) ------------------------------------------

    def _add(self, entry: Entry) -> None:
        held = to_held(entry)
        with self._lock:
            self._held.append(held)
            self._rows += held[1]
            self._bytes += held[2]
            if self._clients:
                self._trim(QUEUE_RECORDS, QUEUE_BYTES)
            else:
                self._trim(RECENT_RECORDS, RECENT_BYTES)
            poke, self._waiting = self._waiting, False
        if poke:
            self._poke()

    def _trim(self, records: int, nbytes: int) -> None:
        held = self._held
        while len(held) > 1 and (self._rows - held[0][1] >= records or self._bytes > nbytes):
            entry, rows, size = held.popleft()
            self._first += 1
            self._rows -= rows
            self._bytes -= size
            for wanted in self._filters.values():
                wanted.evicted += wanted.count(entry, rows)

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        self._add(("lines", source.name, stream, level, created, text))

    def write_wire(self, source: Source, records: list[Record]) -> None:
        self._add(("wire", source.name, records))

    def emit(self, record: logging.LogRecord) -> None:
        stream = getattr(record, "corral_stream", None)
        message = format_message(record) if stream == "logging" else record.getMessage()
        self._add(
            (
                "row",
                [source_of(record), stream, record.levelno, record.created, record.name, message],
            )
        )

    # -- the loop's side ----------------------------------------------------------------------

    def _poke(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._fire)
        except anyio.RunFinishedError:
            pass

    def _fire(self) -> None:
        """Wake every waiting client (on the loop)."""
        event, self._data = self._data, anyio.Event()
        if event is not None:
            event.set()

    def push_state(self, name: str, message: bytes) -> None:
        """A process changed state (on the loop)."""
        with self._lock:
            self._states.append(message)
            self._newest[name] = message
            if len(self._states) > STATE_QUEUE:
                self._states.popleft()
                self._states_first += 1
            poke, self._waiting = self._waiting, False
        if poke:
            self._fire()

    def push_usage(self, message: bytes) -> None:
        """What each process costs now (on the loop): a client gets only the newest."""
        with self._lock:
            self._usage = (self._usage[0] + 1, message)
            poke, self._waiting = self._waiting, False
        if poke:
            self._fire()

    def usage_position(self) -> int:
        """The number of the newest usage message (a client that joins has it in its hello)."""
        with self._lock:
            return self._usage[0]

    def end(self) -> None:
        """The runner has ended (on the loop): every client is woken to say so."""
        self._ended = True
        self._fire()

    async def wait(self, client: Client) -> None:
        """Wait until there is something for ``client``, or the runner has ended."""
        with self._lock:
            if self._ended or self._has_more(client):
                return
            self._waiting = True
            event = self._data
        assert event is not None
        await event.wait()

    def _has_more(self, client: Client) -> bool:
        return (
            client.entry < self._first + len(self._held)
            or client.state < self._states_first + len(self._states)
            or bool(client.resync)
            or client.usage < self._usage[0]
        )

    # -- a client's own (in a worker thread) -------------------------------------------------

    def _use_filter(self, client: Client, source: str, level: int) -> None:
        wanted = self._filters.get((source, level))
        if wanted is None:
            wanted = self._filters[(source, level)] = Filter(source, level)
        wanted.users += 1
        client.filter = wanted

    def _drop_filter(self, client: Client) -> None:
        wanted = client.filter
        wanted.users -= 1
        if not wanted.users:
            self._filters.pop((wanted.pattern, wanted.level), None)

    def _matched_from(self, client: Client, entry: int, offset: int) -> int:
        """Rows ``client``'s filter matches from the ``offset``-th row of entry ``entry`` on."""
        wanted = client.filter
        held = list(self._held)[entry - self._first :]
        total = sum(wanted.count(e, rows) for e, rows, _ in held)
        if held and offset:
            e, rows, _ = held[0]
            total -= wanted.count(e, rows, offset)
        return total

    def attach(self, client: Client) -> None:
        """Add ``client``: it starts with the last :data:`RECENT_RECORDS` rows it wants."""
        source, level = client.wanted
        with self._lock:
            self._use_filter(client, source, level)
            wanted = client.filter
            held = list(self._held)
            counts = [wanted.count(e, rows) for e, rows, _ in held]
            # The newest rows it wants, as many as fit in a first message.
            entry, offset = self._first + len(held), 0
            missing, nbytes, taken = RECENT_RECORDS, RECENT_MESSAGE, 0
            for index in range(len(held) - 1, -1, -1):
                count = counts[index]
                if not count:
                    continue
                e, rows, size = held[index]
                if count <= missing and size + ROW_FRAMING * rows <= nbytes:
                    entry, offset = self._first + index, 0
                    missing, taken = missing - count, taken + count
                    nbytes -= size + ROW_FRAMING * rows
                    continue
                start, count = wanted.recent(e, rows, missing, nbytes)
                if count:
                    entry, offset, taken = self._first + index, start, taken + count
                break
            client.entry, client.offset = entry, offset
            client.base = wanted.evicted + sum(counts) - taken
            self._clients = [*self._clients, client]

    def join(self, client: Client) -> tuple[list[bytes], int, bool]:
        """:meth:`attach` ``client``, and :meth:`take` its first messages (the recent
        records all in one, whatever the budget)."""
        self.attach(client)
        return self.take(client, RECENT_MESSAGE + ROW_BYTES)

    def state_position(self) -> int:
        """The number of the next state message (a client that joins gets it and those after)."""
        with self._lock:
            return self._states_first + len(self._states)

    def detach(self, client: Client) -> None:
        with self._lock:
            if client not in self._clients:
                return
            self._clients = [c for c in self._clients if c is not client]
            self._drop_filter(client)
            if not self._clients:
                self._trim(RECENT_RECORDS, RECENT_BYTES)

    def set_filter(self, client: Client, source: str, level: int) -> None:
        """``client`` now wants other rows: from where it is on."""
        with client.busy, self._lock:
            self._catch_up(client)
            self._drop_filter(client)
            self._use_filter(client, source, level)
            wanted = client.filter
            client.base = wanted.evicted
            client.base += sum(wanted.count(e, rows) for e, rows, _ in self._held)
            client.base -= self._matched_from(client, client.entry, client.offset)

    def _catch_up(self, client: Client) -> None:
        """If ``client``'s place in the queue is gone, count what it lost: on from the start."""
        if client.entry < self._first:
            client.dropped += client.filter.evicted - client.base
            client.entry, client.offset = self._first, 0
            client.base = client.filter.evicted

    def sent(self, size: int) -> None:
        """Messages of ``size`` bytes that :meth:`take` made were sent (or given up)."""
        with self._lock:
            self._in_flight -= size

    def take(self, client: Client, least: int = MIN_MESSAGE) -> tuple[list[bytes], int, bool]:
        """The next messages for ``client``, their size, and whether more is waiting.

        At most one ``logs`` message, of at most :data:`MESSAGE_ROWS` rows
        and as many bytes as the budget allows (:data:`MESSAGE_BYTES`, less
        when many clients are being sent messages).  Rows are made here, off
        the loop, from where the client is in the queue; :meth:`sent`
        must be called with the size once the messages are sent.  The
        message may be ``least`` bytes whatever the budget.
        """
        with client.busy:
            messages: list[bytes] = []
            with self._lock:
                self._catch_up(client)
                limit = max(least, min(MESSAGE_BYTES, SEND_BUDGET - self._in_flight))
                if client.state < self._states_first:
                    # Far behind: the newest state of each process instead.
                    client.resync = list(self._newest.values())
                    client.state = self._states_first + len(self._states)
                states: list[bytes] = []
                size = 0
                while size < limit and client.resync:
                    states.append(client.resync.pop())
                    size += len(states[-1])
                while size < limit and client.state < self._states_first + len(self._states):
                    states.append(self._states[client.state - self._states_first])
                    client.state += 1
                    size += len(states[-1])
                # The entries to make rows of: enough to fill one message.
                entries: list[Held] = []
                rows = -client.offset
                nbytes = 0
                index = client.entry - self._first
                while index < len(self._held) and rows < MESSAGE_ROWS and nbytes < limit - size:
                    entries.append(self._held[index])
                    rows += entries[-1][1]
                    nbytes += entries[-1][2]
                    index += 1
                dropped, client.dropped = client.dropped, 0
                entry, offset, wanted = client.entry, client.offset, client.filter
                usage = b""
                if client.usage < self._usage[0]:
                    client.usage, usage = self._usage
                    size += len(usage)
            if dropped:
                messages.append(JSON.encode({"type": "dropped", "count": dropped}))
            messages.extend(states)
            made, entry, offset = make_rows(entries, entry, offset, wanted, limit - size)
            if made:
                messages.append(logs_message(made))
            if usage:
                messages.append(usage)
            size = sum(map(len, messages))
            with self._lock:
                client.entry, client.offset = entry, offset
                client.base += len(made)
                self._in_flight += size
                return messages, size, self._has_more(client)
