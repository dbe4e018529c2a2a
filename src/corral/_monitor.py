"""Watch a runner live: a WebSocket monitor, a page for a browser, ``corral tail``.

``open_runner(monitor="127.0.0.1:0")`` starts a :class:`Monitor` in the
runner's task group, stopped with it.  :attr:`Runner.monitor_url` is
``http://HOST:PORT/?token=...``: opened in a browser it is a live page (the
process table and a filterable log tail); the same address with ``ws://`` is
the WebSocket endpoint, which speaks the JSON protocol below.  The server is
the WebSocket library of the running loop: trio-websocket on Trio, the
``websockets`` package's asyncio server on asyncio.

**Security.**  The monitor binds to loopback unless told otherwise
(``monitor=True`` or a port alone).  Every
connection — the page, the WebSocket — must carry the access token
(``?token=``, compared in constant time); a missing or wrong one is refused
with ``403`` and no data.  A browser's ``Origin`` must be the monitor's own
page: its port, and a name that cannot be made to point elsewhere.  Before
its token is checked a connection costs next to nothing: it may send a
request of at most :data:`MAX_REQUEST` bytes within
:data:`HANDSHAKE_TIMEOUT` seconds, and of :data:`MAX_HANDSHAKES` such
connections the oldest is closed when another comes.

**Never in the way.**  The monitor keeps one queue of log events for all
its clients, bounded in records and bytes (:data:`QUEUE_RECORDS`,
:data:`QUEUE_BYTES`; only the few hundred a client gets on connecting while
none is connected); each client has its place in it.  A client that reads
slowly (or not at all) loses its *oldest* log events, and the next message
it gets says how many (``{"type": "dropped"}``).  The runner, the other
clients, the log files and handlers lose nothing and wait for nobody, and
adding to the queue costs the same whatever the clients.  The queue holds
output as it was read; it is split into records only to be sent, in a
worker thread, one message of at most :data:`MESSAGE_ROWS` records and
:data:`MESSAGE_BYTES` bytes at a time (the messages on their way to all
clients hold at most :data:`SEND_BUDGET` bytes, or :data:`MIN_MESSAGE` each),
and the kernel holds at most :data:`SEND_BUFFER` bytes for a connection: a
client that stops reading is prepared one message for, not everything that
follows.

The protocol (version 1), JSON text messages, server to client:

``{"type": "hello", "v": 1, "runner": NAME, "log_path": PATH|null, "processes": [PROCESS...]}``
    first, a snapshot of every process; then, in a ``logs`` message, the last
    few hundred log records from before the client came.
``{"type": "process", ...PROCESS}``
    a process changed state.  PROCESS is ``{"name", "source", "pid", "state"
    ("running", "restarting", "exited", "failed"), "returncode", "started"
    (Unix time), "restarts"}``.
``{"type": "logs", "records": [[SOURCE, STREAM, LEVEL, TIME, LOGGER, MESSAGE], ...]}``
    log records, in order.  STREAM is ``"stdout"``, ``"stderr"``,
    ``"logging"`` or ``null`` (the runner's own); LEVEL a number.
``{"type": "dropped", "count": N}``
    N log events were dropped because this client fell behind.
``{"type": "end"}``
    the runner has ended; the server closes the connection.

Client to server, at any time: ``{"type": "filter", "source": GLOB, "level":
N}`` keeps only the log records of sources matching the glob (the full
source, ``<runner>.<process>``) at level N or above.  The same filter can be
given as ``source=`` and ``level=`` query parameters of the URL.
"""

from __future__ import annotations

import fnmatch
import functools
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.to_thread
import msgspec

from ._routing import _BlockSink, _format_message, _wire_message, source_of
from ._sources import Source
from ._wire import Record

if TYPE_CHECKING:
    import asyncio

    from ._backend import LoopHandle
    from ._process import Process

__all__ = ["PROTOCOL_VERSION", "Monitor", "MonitorSink", "parse_address"]

PROTOCOL_VERSION: Final = 1

# Every bound below is in docs/howto/limits.rst, each with its test.

#: The newest log records the monitor keeps for its clients, all of them
#: together: a client that falls further behind loses its oldest.
QUEUE_RECORDS: Final = 20_000
#: ... and at most this many bytes of output (plus the newest read, if it alone is more).
QUEUE_BYTES: Final = 8 * 1024 * 1024
#: Log records a client can fall behind by and lose none, if the records it
#: follows are at least half of all (the page and ``corral tail`` follow all).
CLIENT_QUEUE: Final = QUEUE_RECORDS // 2
#: Log records a client gets on connecting, from before it came, at most; as
#: many as fit in about :data:`RECENT_MESSAGE` bytes (its first message).
RECENT_RECORDS: Final = 500
RECENT_MESSAGE: Final = 48 * 1024
#: While no client is connected, only that much is kept, and at most this many
#: bytes (plus the newest read, if it alone is more).
RECENT_BYTES: Final = 1024 * 1024
#: A record's text longer than this (characters) is sent cut in the middle;
#: files, handlers and tails have it whole.
ROW_TEXT: Final = 16 * 1024
#: Logger names longer than this (characters) are sent cut.
ROW_NAME: Final = 256
#: A record is at most this long in JSON (a text of control characters, each
#: escaped in six bytes, is cut further).
ROW_BYTES: Final = 32 * 1024
#: A ``logs`` message holds at most this many records...
MESSAGE_ROWS: Final = 2000
#: ... and at most this many bytes, fewer when many clients are being sent
#: messages at once: those messages hold at most :data:`SEND_BUDGET` bytes
#: together, yet each client may have one of :data:`MIN_MESSAGE` on its way.
MESSAGE_BYTES: Final = 256 * 1024
SEND_BUDGET: Final = 4 * 1024 * 1024
MIN_MESSAGE: Final = 32 * 1024
#: Clients at once; the next is refused (``503``) until one leaves.
MAX_CLIENTS: Final = 256
#: State messages kept for the clients; a client further behind gets the
#: newest state of each process instead.
STATE_QUEUE: Final = 1000
#: Batches of events sent to a client per second, at most.
SEND_RATE: Final = 20
#: Worker threads that make messages for clients, at most, all clients
#: together (they hold the GIL: more would only contend with the log service).
TAKE_THREADS: Final = 2
#: Before its token is checked, a connection may send a request of at most
#: this many bytes (line and headers) ...
MAX_REQUEST: Final = 16 * 1024
#: ... within this many seconds; otherwise it is closed.
HANDSHAKE_TIMEOUT: Final = 5.0
#: Connections whose request has not been checked yet, at most: beyond, the
#: oldest of them is closed.
MAX_HANDSHAKES: Final = 64
#: A message from a client (a filter) is at most this long; a longer one
#: closes the connection (1009).
MAX_CLIENT_MESSAGE: Final = 4096
#: Seconds the monitor may take to start listening (resolving its host's
#: name, binding); past them, or if the address cannot be had, entering the
#: runner fails with an :class:`OSError` naming the address and the reason.
LISTEN_TIMEOUT: Final = 10.0

_T = TypeVar("_T")

_json = msgspec.json.Encoder()


#: Where the monitor listens when only a port is given (or ``monitor=True``).
DEFAULT_HOST: Final = "127.0.0.1"


def parse_address(address: str | bool) -> tuple[str, int]:
    """Where to listen, as ``(host, port)``; ``ValueError`` for anything else.

    ``"HOST:PORT"`` (``"[::1]:0"`` for IPv6); a port alone (``"8765"`` or
    ``":8765"``) or ``True`` listens on loopback, port 0 meaning any free one.
    """
    if address is True:
        return DEFAULT_HOST, 0
    if not isinstance(address, str):
        raise TypeError(f"monitor must be 'HOST:PORT' or True, not {type(address).__name__}")
    host, colon, port = address.rpartition(":")
    if not colon:
        host, port = "", address
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"monitor={address!r}: expected 'HOST:PORT' (or a port alone, on loopback), "
            "e.g. '127.0.0.1:0'"
        )
    return host.strip("[]") or DEFAULT_HOST, int(port)


#: What the log service hands the monitor, kept as it came (no line is split
#: until a client is sent it): ``("lines", source, stream, level, created,
#: text)`` for a read of output, ``("wire", source, records)`` for records of
#: a log connection, ``("row", row)`` for one record built for handlers.
_Entry = tuple[Any, ...]
#: An entry as the monitor keeps it: with its count of rows and its size in bytes.
_Held = tuple[_Entry, int, int]


def _held(entry: _Entry) -> _Held:
    kind = entry[0]
    if kind == "lines":
        text = entry[5]
        return entry, text.count(b"\n") + 1, len(text) + 200
    if kind == "wire":
        records = entry[2]
        size = sum(map(_record_size, records))
        return entry, len(records), size + 300 * len(records) + 200
    return entry, 1, len(entry[1][5]) + 400


def _record_size(rec: Record) -> int:
    return len(rec.msg) + len(rec.exc_text or "") + len(rec.stack_info or "")


#: About what a row costs in JSON beyond its text.
_ROW_FRAMING: Final = 64


def _cut(text: str, keep: int = ROW_TEXT) -> str:
    """``text``, or its beginning and its end if it is longer than ``keep`` characters."""
    if len(text) <= keep:
        return text
    half = keep // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _encode_row(row: list[Any]) -> bytes:
    """A row in JSON, at most :data:`ROW_BYTES` long."""
    row[5] = _cut(row[5])
    if row[4] is not None:
        row[4] = _cut(row[4], ROW_NAME)
    data = _json.encode(row)
    if len(data) > ROW_BYTES:  # escaped control characters: keep fewer
        row[0] = _cut(row[0], ROW_NAME)
        row[5] = _cut(row[5], ROW_BYTES // 8)
        data = _json.encode(row)
    return data


class _Filter:
    """What some clients follow (a source glob and a level), and what of it went unread.

    ``evicted`` counts the rows it matches among the entries the monitor let
    go since the filter was made: a client that knows how many rows it
    matched before its place in the queue can tell, once it finds that place
    gone, how many it lost, without the monitor doing anything per client
    when it lets an entry go.
    """

    __slots__ = ("_matches", "evicted", "level", "pattern", "users")

    def __init__(self, pattern: str, level: int) -> None:
        self.pattern = pattern
        self.level = level
        self.users = 0
        self.evicted = 0
        self._matches: dict[str, bool] = {}

    def source_ok(self, source: str) -> bool:
        wanted = self._matches.get(source)
        if wanted is None:
            pattern = self.pattern
            wanted = pattern == "*" or fnmatch.fnmatchcase(source, pattern)
            if len(self._matches) < 4096:
                self._matches[source] = wanted
        return wanted

    def row_ok(self, row: list[Any]) -> bool:
        return bool(row[2] >= self.level and self.source_ok(row[0]))

    def count(self, entry: _Entry, rows: int, end: int | None = None) -> int:
        """How many of the rows of ``entry`` (of its first ``end`` rows) it matches."""
        kind = entry[0]
        if end is not None and end <= 0:
            return 0
        if kind == "lines":
            if entry[3] < self.level or not self.source_ok(entry[1]):
                return 0
            return rows if end is None else min(end, rows)
        if kind == "wire":
            if not self.source_ok(entry[1]):
                return 0
            records = entry[2] if end is None else entry[2][:end]
            level = self.level
            if level <= 0:
                return len(records)
            return sum(1 for rec in records if rec.level >= level)
        return 1 if self.row_ok(entry[1]) else 0

    def recent(self, entry: _Entry, rows: int, wanted: int, nbytes: int) -> tuple[int, int]:
        """The newest rows of ``entry`` it matches, at most ``wanted`` of them and about
        ``nbytes`` bytes: where they begin, and how many they are."""
        kind = entry[0]
        if kind == "lines":
            if entry[3] < self.level or not self.source_ok(entry[1]):
                return rows, 0
            sizes: list[int] = [len(line) + _ROW_FRAMING for line in entry[5].split(b"\n")]
        elif kind == "wire":
            if not self.source_ok(entry[1]):
                return rows, 0
            sizes = [
                _record_size(rec) + _ROW_FRAMING if rec.level >= self.level else -1
                for rec in entry[2]
            ]
        else:
            sizes = [len(entry[1][5]) + _ROW_FRAMING if self.row_ok(entry[1]) else -1]
        start, count = rows, 0
        for index in range(rows - 1, -1, -1):
            size = sizes[index]
            if size < 0:
                continue  # not wanted
            if count == wanted or size > nbytes:
                break
            start, count, nbytes = index, count + 1, nbytes - size
        return start, count


class _Client:
    """One connected client: what it follows and where it is in the monitor's queue.

    Every client reads the one queue of the :class:`MonitorSink`; a client
    costs it nothing per read of output, whether it reads or not.
    """

    def __init__(self, source: str, level: int) -> None:
        self.wanted = (source, level)
        self.filter = _Filter(source, level)
        self.entry = 0  # the number of the entry it reads next...
        self.offset = 0  # ... and how many of that entry's rows it has read
        self.base = 0  # rows its filter matched before that place (see _Filter)
        self.dropped = 0  # rows it lost, not told yet
        self.state = 0  # the number of the state message it gets next
        self.resync: list[bytes] = []  # the newest states, for one that fell far behind
        self.busy = threading.Lock()  # a take or a filter change at a time

    @property
    def source(self) -> str:
        """The glob of the sources this client wants."""
        return self.filter.pattern

    @property
    def level(self) -> int:
        """The lowest level this client wants."""
        return self.filter.level


def _logs_message(rows: list[bytes]) -> bytes:
    return b'{"type":"logs","records":[' + b",".join(rows) + b"]}"


class MonitorSink(_BlockSink):
    """A destination of the runner's log service that feeds the monitor's clients.

    It keeps one queue of entries (reads of output, batches of records) for
    every client: the newest :data:`QUEUE_RECORDS` records, at most
    :data:`QUEUE_BYTES` bytes (:data:`RECENT_RECORDS` and
    :data:`RECENT_BYTES` while no client is connected).  Each client has a
    place in it; one that falls behind the queue's start loses what went
    and is told how much.  Adding an entry costs the same however many
    clients there are, and however slow.
    """

    def __init__(self, monitor: Monitor) -> None:
        super().__init__(logging.NOTSET)
        self._monitor = monitor
        monitor.sink = self
        self._lock = threading.Lock()
        self._held: deque[_Held] = deque()
        self._first = 0  # the number of the oldest entry held
        self._rows = 0
        self._bytes = 0
        self._filters: dict[tuple[str, int], _Filter] = {}
        self._clients: list[_Client] = []
        self._states: deque[bytes] = deque()
        self._states_first = 0  # the number of the oldest state message held
        self._newest: dict[str, bytes] = {}  # each process's newest state message
        self._in_flight = 0  # bytes of the messages being sent
        self._loop: LoopHandle | None = None
        self._waiting = False  # a client waits for an entry
        self._data: anyio.Event | None = None
        self._ended = False

    @property
    def clients(self) -> list[_Client]:
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

    def _add(self, entry: _Entry) -> None:
        held = _held(entry)
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
        message = _format_message(record) if stream == "logging" else record.getMessage()
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

    def end(self) -> None:
        """The runner has ended (on the loop): every client is woken to say so."""
        self._ended = True
        self._fire()

    async def wait(self, client: _Client) -> None:
        """Wait until there is something for ``client``, or the runner has ended."""
        with self._lock:
            if self._ended or self._has_more(client):
                return
            self._waiting = True
            event = self._data
        assert event is not None
        await event.wait()

    def _has_more(self, client: _Client) -> bool:
        return (
            client.entry < self._first + len(self._held)
            or client.state < self._states_first + len(self._states)
            or bool(client.resync)
        )

    # -- a client's own (in a worker thread) -------------------------------------------------

    def _use_filter(self, client: _Client, source: str, level: int) -> None:
        wanted = self._filters.get((source, level))
        if wanted is None:
            wanted = self._filters[(source, level)] = _Filter(source, level)
        wanted.users += 1
        client.filter = wanted

    def _drop_filter(self, client: _Client) -> None:
        wanted = client.filter
        wanted.users -= 1
        if not wanted.users:
            self._filters.pop((wanted.pattern, wanted.level), None)

    def _matched_from(self, client: _Client, entry: int, offset: int) -> int:
        """Rows ``client``'s filter matches from the ``offset``-th row of entry ``entry`` on."""
        wanted = client.filter
        held = list(self._held)[entry - self._first :]
        total = sum(wanted.count(e, rows) for e, rows, _ in held)
        if held and offset:
            e, rows, _ = held[0]
            total -= wanted.count(e, rows, offset)
        return total

    def attach(self, client: _Client) -> None:
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
                if count <= missing and size + _ROW_FRAMING * rows <= nbytes:
                    entry, offset = self._first + index, 0
                    missing, taken = missing - count, taken + count
                    nbytes -= size + _ROW_FRAMING * rows
                    continue
                start, count = wanted.recent(e, rows, missing, nbytes)
                if count:
                    entry, offset, taken = self._first + index, start, taken + count
                break
            client.entry, client.offset = entry, offset
            client.base = wanted.evicted + sum(counts) - taken
            self._clients = [*self._clients, client]

    def join(self, client: _Client) -> tuple[list[bytes], int, bool]:
        """:meth:`attach` ``client``, and :meth:`take` its first messages (the recent
        records all in one, whatever the budget)."""
        self.attach(client)
        return self.take(client, RECENT_MESSAGE + ROW_BYTES)

    def state_position(self) -> int:
        """The number of the next state message (a client that joins gets it and those after)."""
        with self._lock:
            return self._states_first + len(self._states)

    def detach(self, client: _Client) -> None:
        with self._lock:
            if client not in self._clients:
                return
            self._clients = [c for c in self._clients if c is not client]
            self._drop_filter(client)
            if not self._clients:
                self._trim(RECENT_RECORDS, RECENT_BYTES)

    def set_filter(self, client: _Client, source: str, level: int) -> None:
        """``client`` now wants other rows: from where it is on."""
        with client.busy, self._lock:
            self._catch_up(client)
            self._drop_filter(client)
            self._use_filter(client, source, level)
            wanted = client.filter
            client.base = wanted.evicted
            client.base += sum(wanted.count(e, rows) for e, rows, _ in self._held)
            client.base -= self._matched_from(client, client.entry, client.offset)

    def _catch_up(self, client: _Client) -> None:
        """If ``client``'s place in the queue is gone, count what it lost: on from the start."""
        if client.entry < self._first:
            client.dropped += client.filter.evicted - client.base
            client.entry, client.offset = self._first, 0
            client.base = client.filter.evicted

    def sent(self, size: int) -> None:
        """Messages of ``size`` bytes that :meth:`take` made were sent (or given up)."""
        with self._lock:
            self._in_flight -= size

    def take(self, client: _Client, least: int = MIN_MESSAGE) -> tuple[list[bytes], int, bool]:
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
                entries: list[_Held] = []
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
            if dropped:
                messages.append(_json.encode({"type": "dropped", "count": dropped}))
            messages.extend(states)
            made, entry, offset = _make_rows(entries, entry, offset, wanted, limit - size)
            if made:
                messages.append(_logs_message(made))
            size = sum(map(len, messages))
            with self._lock:
                client.entry, client.offset = entry, offset
                client.base += len(made)
                self._in_flight += size
                return messages, size, self._has_more(client)


def _make_rows(
    entries: list[_Held], entry: int, offset: int, wanted: _Filter, limit: int
) -> tuple[list[bytes], int, int]:
    """Rows in JSON from ``entries`` (the first from its ``offset``-th row) that ``wanted``
    matches, up to :data:`MESSAGE_ROWS` of them and ``limit`` bytes (one at least).

    Returns them and the place after the last row looked at.
    """
    made: list[bytes] = []
    nbytes = 0

    def room(data: bytes) -> bool:
        return not made or (len(made) < MESSAGE_ROWS and nbytes + len(data) <= limit)

    for held, rows, _ in entries:
        kind = held[0]
        if kind == "lines":
            _, name, stream, level, created, text = held
            if level >= wanted.level and wanted.source_ok(name):
                lines = text.split(b"\n")
                for index in range(offset, rows):
                    data = _encode_row(
                        [
                            name,
                            stream,
                            level,
                            created,
                            None,
                            lines[index].decode("utf-8", "replace"),
                        ]
                    )
                    if not room(data):
                        return made, entry, index
                    made.append(data)
                    nbytes += len(data)
        elif kind == "wire":
            name, records = held[1], held[2]
            if wanted.source_ok(name):
                for index in range(offset, rows):
                    rec = records[index]
                    if rec.level < wanted.level:
                        continue
                    data = _encode_row(
                        [
                            name,
                            "logging",
                            rec.level,
                            rec.created,
                            rec.name or None,
                            _wire_message(rec),
                        ]
                    )
                    if not room(data):
                        return made, entry, index
                    made.append(data)
                    nbytes += len(data)
        elif offset == 0 and wanted.row_ok(held[1]):
            data = _encode_row(list(held[1]))
            if not room(data):
                return made, entry, 0
            made.append(data)
            nbytes += len(data)
        entry, offset = entry + 1, 0
    return made, entry, offset


def _process_info(proc: Process, state: str) -> dict[str, Any]:
    code = proc.returncode
    if state == "exited" and code not in (None, 0):
        state = "failed"
    started = time.time() - (time.monotonic() - proc.started_at)
    return {
        "name": proc.name,
        "source": proc.source,
        "pid": proc.pid,
        "state": state,
        "returncode": code,
        "started": round(started, 3),
        "restarts": proc.restarts,
    }


@dataclass
class _Joined:
    """A client that has joined, and the first messages for it (see :meth:`MonitorSink.take`)."""

    client: _Client
    messages: list[bytes]
    size: int
    more: bool


class Monitor:
    """The monitor of one runner (see the module's docs)."""

    def __init__(self, address: str | bool, runner_name: str) -> None:
        self.host, self.port = parse_address(address)
        self.token = secrets.token_urlsafe(18)
        self._runner_name = runner_name
        self._log_path: str | None = None
        self._processes: dict[str, dict[str, Any]] = {}
        self._loop: LoopHandle | None = None
        #: Set once the monitor listens, or once it could not (then :attr:`error`).
        self.ready = anyio.Event()
        self.error: OSError | None = None
        self._ended = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self.sink: MonitorSink
        self._page: bytes | None = None
        #: Connections whose request is not checked yet, oldest first: how to close each.
        self._handshakes: dict[object, Callable[[], None]] = {}
        self._joining = 0  # clients accepted, not attached yet
        self._limiter: anyio.CapacityLimiter | None = None

    # -- what the runner tells it ---------------------------------------------------------

    @property
    def url(self) -> str:
        host = self.host
        if host in _WILDCARDS:
            # Listening everywhere: name this machine, which others can reach.
            host = socket.gethostname()
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/?token={self.token}"

    def set_log_path(self, path: str | None) -> None:
        self._log_path = path

    def process_event(self, proc: Process, state: str) -> None:
        """A process changed state (on the loop)."""
        info = _process_info(proc, state)
        self._processes[proc.name] = info
        self.sink.push_state(proc.name, _json.encode({"type": "process", **info}))

    def clients(self) -> list[_Client]:
        return self.sink.clients

    def end(self) -> None:
        """The runner has ended: tell every client, then close."""
        self._ended.set()
        self.sink.end()

    # -- serving ----------------------------------------------------------------------------

    def _snapshot(self) -> bytes:
        return _json.encode(
            {
                "type": "hello",
                "v": PROTOCOL_VERSION,
                "runner": self._runner_name,
                "log_path": self._log_path,
                "processes": list(self._processes.values()),
            }
        )

    def page(self) -> bytes:
        if self._page is None:
            self._page = resources.files("corral").joinpath("_monitor_page.html").read_bytes()
        return self._page

    def check(self, target: str, origin: str | None) -> tuple[bool, str, int]:
        """Whether a request may proceed: (allowed, source filter, level filter).

        ``origin`` is the request's ``Origin`` header (a browser sends one).
        """
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        token = (query.get("token") or [""])[0]
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return False, "*", 0
        if origin is not None and not self._origin_allowed(origin):
            return False, "*", 0
        source = (query.get("source") or ["*"])[0] or "*"
        try:
            level = int((query.get("level") or ["0"])[0])
        except ValueError:
            level = _level_number((query.get("level") or ["0"])[0])
        return True, source, level

    def _origin_allowed(self, origin: str) -> bool:
        """A browser may connect only from the monitor's own page.

        That page's origin is ``http://NAME:PORT`` with the monitor's port,
        and NAME one that cannot be made to point elsewhere (DNS rebinding):
        the address the monitor listens on, loopback, ``localhost`` or this
        machine's own names; any IP address when it listens on all of them.
        """
        parts = urllib.parse.urlsplit(origin)
        try:
            port = parts.port
        except ValueError:
            return False
        if parts.scheme != "http" or port != self.port or parts.hostname is None:
            return False
        name = parts.hostname.lower()
        if name in {self.host.lower(), "localhost", "127.0.0.1", "::1", *_machine_names()}:
            return True
        if self.host not in _WILDCARDS:
            return False
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def _full(self) -> bool:
        """Whether :data:`MAX_CLIENTS` clients are connected (or joining)."""
        return len(self.sink.clients) + self._joining >= MAX_CLIENTS

    def _handshake_begins(self, key: object, close: Callable[[], None]) -> None:
        """A connection whose request is not checked yet; the oldest goes beyond the bound."""
        self._handshakes[key] = close
        while len(self._handshakes) > MAX_HANDSHAKES:
            oldest = next(iter(self._handshakes))
            self._handshakes.pop(oldest)()

    def _handshake_ends(self, key: object) -> None:
        self._handshakes.pop(key, None)

    async def serve(self, loop: LoopHandle) -> None:
        """Serve until the runner ends (a task of the runner)."""
        self._loop = loop
        self._limiter = anyio.CapacityLimiter(TAKE_THREADS)
        self.sink.start(loop)
        if loop.backend == "trio":
            await self._serve_trio()
        else:
            await self._serve_asyncio()

    async def _listen(self, opening: Awaitable[_T]) -> _T | None:
        """What ``opening`` (the server's bind) gives, within :data:`LISTEN_TIMEOUT`.

        ``None`` if the address cannot be had: :attr:`error` then says so, and
        :attr:`ready` is set, so that the runner's entry fails at once.
        """
        try:
            with anyio.fail_after(LISTEN_TIMEOUT):
                return await opening
        except (OSError, UnicodeError) as exc:  # TimeoutError included; a bad name
            host = f"[{self.host}]" if ":" in self.host else self.host
            where = f"monitor cannot listen on {host}:{self.port}"
            if isinstance(exc, TimeoutError):
                self.error = TimeoutError(f"{where}: not done within {LISTEN_TIMEOUT:g} s")
            else:
                number = getattr(exc, "errno", None)
                reason = os.strerror(number) if number and number > 0 else None
                reason = reason or getattr(exc, "strerror", None)
                reason = reason or str(exc) or type(exc).__name__
                message = f"{where}: {reason[:1].lower()}{reason[1:]}"
                self.error = OSError(number, message) if number else OSError(message)
            self.ready.set()
            return None

    async def _join(self, source: str, level: int) -> _Joined:
        """A new client, attached, and its first messages: the snapshot, the recent records.

        They are ready before the client is accepted, so that they are the
        first it gets, before even the answer to a ping.
        """
        sink = self.sink
        client = _Client(source, level)
        if self._idle.is_set():
            self._idle = anyio.Event()
        client.state = sink.state_position()
        snapshot = self._snapshot()
        self._joining += 1
        try:
            messages, size, more = await anyio.to_thread.run_sync(
                sink.join, client, limiter=self._limiter
            )
        except BaseException:
            self._leave(client)
            raise
        finally:
            self._joining -= 1
        return _Joined(client, [snapshot, *messages], size, more)

    def _leave(self, client: _Client) -> None:
        self.sink.detach(client)
        if not self.sink.clients:
            self._idle.set()

    async def _talk(
        self,
        joined: _Joined,
        send: Callable[[bytes], Awaitable[None]],
        receive: Callable[[], Any],
        closed: type[BaseException],
    ) -> None:
        """The life of one WebSocket client: snapshot, then events; filters from it.

        Returns when the runner has ended (after saying so) or the client is
        gone, having detached the client.
        """
        sink = self.sink
        client = joined.client

        async def listen() -> None:
            try:
                while True:
                    text = await receive()
                    try:
                        request = msgspec.json.decode(text)
                    except msgspec.DecodeError:
                        continue
                    if isinstance(request, dict) and request.get("type") == "filter":
                        level = request.get("level", 0)
                        await anyio.to_thread.run_sync(
                            sink.set_filter,
                            client,
                            str(request.get("source") or "*"),
                            level if isinstance(level, int) else _level_number(str(level)),
                            limiter=self._limiter,
                        )
            except closed:
                pass
            tg.cancel_scope.cancel()  # the client is gone

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(listen)
                messages, size, more = joined.messages, joined.size, joined.more
                del joined
                last = False
                try:
                    while True:
                        try:
                            for message in messages:
                                await send(message)
                        finally:
                            sink.sent(size)
                        messages = []
                        if not more:
                            if last:
                                await send(b'{"type":"end"}')
                                break
                            # At most SEND_RATE batches a second: during a flood,
                            # few large messages cost both sides far less than many.
                            with anyio.move_on_after(1 / SEND_RATE):
                                await self._ended.wait()
                            await sink.wait(client)
                            last = self._ended.is_set()
                        # Rows are made and encoded off the loop, one message's worth
                        # at a time: a client that reads nothing is made one message,
                        # not one for everything that follows.
                        messages, size, more = await anyio.to_thread.run_sync(
                            sink.take, client, limiter=self._limiter
                        )
                except closed:
                    pass
                tg.cancel_scope.cancel()
        finally:
            self._leave(client)

    # -- asyncio: the websockets package ---------------------------------------------------------

    async def _serve_asyncio(self) -> None:
        from websockets.asyncio.server import ServerConnection, serve
        from websockets.datastructures import Headers
        from websockets.exceptions import ConnectionClosed
        from websockets.http11 import Request, Response

        monitor = self

        class Connection(ServerConnection):
            """Bounds what a connection may send before its request is checked."""

            received = 0
            joined: _Joined | None = None  # accepted, not served yet

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                monitor._handshake_begins(self, transport.abort)  # type: ignore[attr-defined]

            def data_received(self, data: bytes) -> None:
                if self.request is None:
                    self.received += len(data)
                    if self.received > MAX_REQUEST:
                        monitor._handshake_ends(self)
                        self.transport.abort()
                        return
                super().data_received(data)

            def connection_lost(self, exc: Exception | None) -> None:
                monitor._handshake_ends(self)
                joined, self.joined = self.joined, None
                if joined is not None:  # gone before it was served
                    monitor._leave(joined.client)
                super().connection_lost(exc)

        async def process_request(
            connection: ServerConnection, request: Request
        ) -> Response | None:
            self._handshake_ends(connection)
            headers = request.headers
            allowed, source, level = self.check(request.path, headers.get("Origin"))
            if not allowed:
                return _response(403, b"forbidden\n", "text/plain")
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return _response(200, self.page(), "text/html; charset=utf-8")
            if self._full():
                return _response(503, b"too many clients\n", "text/plain")
            assert isinstance(connection, Connection)
            connection.joined = await self._join(source, level)
            return None

        def _response(status: int, body: bytes, kind: str) -> Response:
            reason = {200: "OK", 403: "Forbidden", 503: "Service Unavailable"}[status]
            headers = Headers(
                [
                    ("Content-Type", kind),
                    ("Content-Length", str(len(body))),
                    ("Cache-Control", "no-store"),
                    ("Connection", "close"),
                ]
            )
            return Response(status, reason, headers, body)

        async def handler(connection: ServerConnection) -> None:
            assert isinstance(connection, Connection)
            joined, connection.joined = connection.joined, None
            assert joined is not None
            _bound_send_buffer(connection.transport.get_extra_info("socket"))

            async def send(message: bytes) -> None:
                await connection.send(message, text=True)  # UTF-8 already

            await self._talk(joined, send, connection.recv, ConnectionClosed)

        server = await self._listen(
            serve(
                handler,
                self.host or None,
                self.port,
                create_connection=Connection,
                process_request=process_request,
                compression=None,
                server_header=None,
                close_timeout=1,
                open_timeout=HANDSHAKE_TIMEOUT,
                max_size=MAX_CLIENT_MESSAGE,
                max_queue=4,
                # Its own buffer, beyond the message being sent: the kernel's is the buffer.
                write_limit=WRITE_LIMIT,
            )
        )
        if server is None:
            return
        try:
            sockets = list(server.sockets)
            self.port = sockets[0].getsockname()[1]
            self.ready.set()
            await self._ended.wait()
            # The handlers send "end" and close; give them a moment.
            with anyio.move_on_after(2):
                await self._idle.wait()
        finally:
            server.close()
            # A connection that says nothing (a browser's speculative one, half
            # a request) or a client that reads nothing would hold the close
            # up for the library's timeouts: give them one second, then cut.
            with anyio.move_on_after(1):
                await server.wait_closed()
            for connection in list(server.all_connections):
                transport = connection.transport
                if transport is not None:
                    transport.abort()
            with anyio.move_on_after(1):
                await server.wait_closed()

    # -- Trio: trio-websocket, with h11 in front for the page --------------------------------

    async def _serve_trio(self) -> None:
        trio = sys.modules["trio"]
        import h11
        import trio_websocket

        async def connection(stream: Any) -> None:
            try:
                await talk(stream)
            except (
                h11.ProtocolError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio_websocket.HandshakeError,
                trio_websocket.ConnectionClosed,
                OSError,
            ):
                pass  # a client that broke the protocol or went away: its own loss
            finally:
                with trio.CancelScope(shield=True):
                    await stream.aclose()

        async def read_request(stream: Any, conn: Any, received: bytearray) -> Any:
            """The request, read within the bounds; ``None`` if it broke them."""
            key = object()
            with trio.move_on_after(HANDSHAKE_TIMEOUT) as scope:
                self._handshake_begins(key, scope.cancel)
                try:
                    while True:
                        event = conn.next_event()
                        if event is h11.NEED_DATA:
                            data = await stream.receive_some(4096)
                            received += data
                            if not data or len(received) > MAX_REQUEST:
                                return None
                            conn.receive_data(data)
                        elif isinstance(event, h11.Request):
                            return event
                        else:
                            return None
                finally:
                    self._handshake_ends(key)
            return None

        async def talk(stream: Any) -> None:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
            received = bytearray()
            request = await read_request(stream, conn, received)
            if request is None:
                return
            headers = {k.decode().lower(): v.decode() for k, v in request.headers}
            target = request.target.decode()
            allowed, source, level = self.check(target, headers.get("origin"))
            websocket = headers.get("upgrade", "").lower() == "websocket"
            if not allowed or not websocket or self._full():
                status, body, kind = (
                    (403, b"forbidden\n", "text/plain")
                    if not allowed
                    else (200, self.page(), "text/html; charset=utf-8")
                    if not websocket
                    else (503, b"too many clients\n", "text/plain")
                )
                response = h11.Response(
                    status_code=status,
                    headers=[
                        ("Content-Type", kind),
                        ("Content-Length", str(len(body))),
                        ("Cache-Control", "no-store"),
                        ("Connection", "close"),
                    ],
                )
                reply = conn.send(response) or b""
                reply += conn.send(h11.Data(data=body)) or b""
                reply += conn.send(h11.EndOfMessage()) or b""
                await stream.send_all(reply)
                await stream.aclose()
                return
            joined = await self._join(source, level)
            try:
                _bound_send_buffer(stream.socket)
                replay = _replay_stream(trio, stream, bytes(received))
                del received
                ws_request = await trio_websocket.wrap_server_stream(
                    nursery, replay, message_queue_size=1, max_message_size=MAX_CLIENT_MESSAGE
                )
                ws = await ws_request.accept()

                async def send(message: bytes) -> None:
                    await ws.send_message(message.decode())

                try:
                    await self._talk(joined, send, ws.get_message, trio_websocket.ConnectionClosed)
                finally:
                    with trio.move_on_after(2):
                        await ws.aclose()
            finally:
                self._leave(joined.client)

        listeners = await self._listen(trio.open_tcp_listeners(self.port, host=self.host or None))
        if listeners is None:
            return
        async with trio.open_nursery() as nursery:
            self.port = listeners[0].socket.getsockname()[1]
            self.ready.set()
            nursery.start_soon(trio.serve_listeners, connection, listeners)
            await self._ended.wait()
            with trio.move_on_after(2):
                await self._idle.wait()
            nursery.cancel_scope.cancel()


#: What websockets' asyncio server buffers for a connection beyond the message
#: being sent (its high-water mark): the kernel's buffer is the one that counts.
WRITE_LIMIT: Final = 4096

#: The kernel send buffer of a monitor connection.  Left to the kernel, it
#: grows to megabytes for a client that does not read, and the runner would
#: prepare all of that for it; this much is a few hundred records, and
#: still megabytes a second over a link of a few milliseconds.
SEND_BUFFER: Final = 64 * 1024


def _bound_send_buffer(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError:  # pragma: no cover - not a TCP socket
        pass


def _replay_stream(trio: Any, stream: Any, head: bytes) -> Any:
    """``stream``, giving back ``head`` (bytes already read) before the rest."""

    class Replay(trio.abc.Stream):  # type: ignore[misc]
        def __init__(self) -> None:
            self._head = head

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            if self._head:
                data, self._head = self._head, b""
                return data
            return await stream.receive_some(max_bytes)  # type: ignore[no-any-return]

        async def send_all(self, data: bytes) -> None:
            await stream.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await stream.wait_send_all_might_not_block()

        async def aclose(self) -> None:
            await stream.aclose()

    return Replay()


_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})


@functools.cache
def _machine_names() -> frozenset[str]:
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:  # pragma: no cover - getfqdn does not raise in practice
        pass
    return frozenset(names)


def _level_number(name: str) -> int:
    value = logging.getLevelName(name.upper())
    return value if isinstance(value, int) else 0
