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
page: its port, and a name that cannot be made to point elsewhere.

**Never in the way.**  Each client has a bounded queue of log events; a
client that reads slowly (or not at all) loses its *oldest* log events, and
the next message it gets says how many (``{"type": "dropped"}``).  The
runner, the other clients, the log files and handlers lose nothing and wait
for nobody.  The queue holds output as it was read; it is split into
records only to be sent, in a worker thread, a message of at most
:data:`MESSAGE_ROWS` records at a time, and the kernel holds at most
:data:`SEND_BUFFER` bytes for a connection: a client that stops reading is
prepared one message for, not everything that follows.

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
import secrets
import socket
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec

from ._routing import _BlockSink, _format_message, _wire_message, source_of
from ._sources import Source
from ._wire import Record

if TYPE_CHECKING:
    from ._backend import LoopHandle
    from ._process import Process

__all__ = ["PROTOCOL_VERSION", "Monitor", "MonitorSink", "parse_address"]

PROTOCOL_VERSION: Final = 1

#: Log events a client may fall behind by before its oldest are dropped.
CLIENT_QUEUE: Final = 10_000
#: Log records a client gets on connecting, from before it came.
RECENT_RECORDS: Final = 500
#: Reads of output kept for that (each holds one or more records).
RECENT_READS: Final = 500

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

#: State messages a client may fall behind by before only the newest state
#: of each process is kept for it.
STATE_QUEUE: Final = 1000
#: Batches of events sent to a client per second, at most.
SEND_RATE: Final = 20
#: Rows per ``logs`` message at most (a long backlog goes out in several).
MESSAGE_ROWS: Final = 2000


def _count(entry: _Entry) -> int:
    """How many rows ``entry`` holds."""
    kind = entry[0]
    if kind == "lines":
        return int(entry[5].count(b"\n")) + 1
    if kind == "wire":
        return len(entry[2])
    return 1


def _rows(entry: _Entry) -> list[list[Any]]:
    """The rows of ``entry``: ``[source, stream, level, time, logger, message]``."""
    kind = entry[0]
    if kind == "lines":
        _, name, stream, level, created, text = entry
        return [
            [name, stream, level, created, None, line]
            for line in text.decode("utf-8", "replace").split("\n")
        ]
    if kind == "wire":
        name, records = entry[1], entry[2]
        return [
            [name, "logging", rec.level, rec.created, rec.name or None, _wire_message(rec)]
            for rec in records
        ]
    return [entry[1]]


class _Client:
    """One connected client: its filter and its bounded queue.

    The log service pushes whole reads and batches of records (one cheap
    check and an append each, on its worker thread); they are split into
    rows only when the client is sent them, so a client that does not read
    costs the runner next to nothing.  The queue holds at least
    :data:`CLIENT_QUEUE` rows and at most that plus one read; beyond it, the
    oldest go, and the count of what went is sent next.
    """

    def __init__(self, loop: LoopHandle, source: str, level: int) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._states: list[tuple[str, bytes]] = []
        self._entries: deque[tuple[_Entry, int, int]] = deque()
        self._generation = 0  # of the filter: entries pushed under it are filtered
        self._queued = 0
        self._poked = False
        self.dropped = 0
        self._source = source
        self._level = level
        self._matches: dict[str, bool] = {}
        self.wake = anyio.Event()
        self.ended = False

    @property
    def source(self) -> str:
        """The glob of the sources this client wants."""
        return self._source

    @property
    def level(self) -> int:
        """The lowest level this client wants."""
        return self._level

    def set_filter(self, source: str, level: int) -> None:
        with self._lock:
            self._source, self._level = source, level
            self._matches = {}
            self._generation += 1

    def _wants_source(self, source: str) -> bool:
        wanted = self._matches.get(source)
        if wanted is None:
            pattern = self._source
            wanted = pattern == "*" or fnmatch.fnmatchcase(source, pattern)
            if len(self._matches) < 4096:
                self._matches[source] = wanted
        return wanted

    def wants(self, row: list[Any]) -> bool:
        return bool(row[2] >= self._level and self._wants_source(row[0]))

    def push(self, entry: _Entry) -> None:
        """From any thread: queue an entry, dropping the oldest beyond the bound."""
        kind = entry[0]
        with self._lock:
            if kind == "row":
                if not self.wants(entry[1]):
                    return
                count = 1
            else:
                if not self._wants_source(entry[1]):
                    return
                if kind == "lines":
                    if entry[3] < self._level:
                        return
                    count = _count(entry)
                elif self._level > 0:
                    count = sum(1 for rec in entry[2] if rec.level >= self._level)
                    if not count:
                        return
                else:
                    count = len(entry[2])
            self._entries.append((entry, count, self._generation))
            self._queued += count
            while len(self._entries) > 1 and self._queued - self._entries[0][1] >= CLIENT_QUEUE:
                _, gone, _ = self._entries.popleft()
                self._queued -= gone
                self.dropped += gone
            poke, self._poked = not self._poked, True
        if poke:
            self._poke()

    def push_state(self, name: str, message: bytes) -> None:
        with self._lock:
            self._states.append((name, message))
            if len(self._states) > STATE_QUEUE:
                # A client this far behind gets the newest state of each process.
                newest = dict(self._states)
                self._states = list(newest.items())
            poke, self._poked = not self._poked, True
        if poke:
            self._poke()

    def _poke(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except anyio.RunFinishedError:
            pass

    def _wake(self) -> None:
        self.wake.set()

    def take(self, limit: int = 0) -> tuple[list[bytes], bool]:
        """What is waiting, as messages to send, and whether more is left.

        Takes whole entries until they hold ``limit`` rows (all of them if
        ``limit`` is 0).  Runs in a worker thread: it splits lines.  A client
        that reads nothing is thus never made more than one batch for.
        """
        with self._lock:
            states = [message for _, message in self._states]
            self._states = []
            entries: list[tuple[_Entry, int, int]] = []
            taken = 0
            while self._entries and (not limit or taken < limit):
                queued = self._entries.popleft()
                entries.append(queued)
                taken += queued[1]
            self._queued -= taken
            more = bool(self._entries)
            if not more:
                self._poked = False
            dropped, self.dropped = self.dropped, 0
            generation, level = self._generation, self._level
        rows: list[list[Any]] = []
        for entry, _, pushed_under in entries:
            if pushed_under != generation:  # the filter changed since: apply the new one
                rows.extend(row for row in _rows(entry) if self.wants(row))
            elif entry[0] == "wire" and level > 0:  # one level per record
                rows.extend(row for row in _rows(entry) if row[2] >= level)
            else:  # filtered whole when pushed
                rows.extend(_rows(entry))
        if len(rows) > CLIENT_QUEUE:  # one read of more lines than the queue holds
            dropped += len(rows) - CLIENT_QUEUE
            del rows[: len(rows) - CLIENT_QUEUE]
        messages = []
        if dropped:
            messages.append(_json.encode({"type": "dropped", "count": dropped}))
        messages.extend(states)
        messages.extend(_logs_messages(rows))
        return messages, more


def _logs_messages(rows: list[list[Any]]) -> list[bytes]:
    return [
        _json.encode({"type": "logs", "records": rows[i : i + MESSAGE_ROWS]})
        for i in range(0, len(rows), MESSAGE_ROWS)
    ]


class MonitorSink(_BlockSink):
    """A destination of the runner's log service that feeds the monitor's clients.

    Each entry is kept among the recent ones (for clients yet to come) and
    pushed to the clients there are, under one lock: a client that attaches
    gets the recent entries from before it came and every entry after, with
    neither a gap nor a repeat at the join.
    """

    def __init__(self, monitor: Monitor) -> None:
        super().__init__(logging.NOTSET)
        self._monitor = monitor
        monitor.sink = self
        self._recent: deque[_Entry] = deque(maxlen=RECENT_READS)
        self._lock = threading.Lock()
        self._clients: list[_Client] = []

    @property
    def clients(self) -> list[_Client]:
        """The connected clients (a list that is replaced, never changed: safe to iterate)."""
        return self._clients

    def attach(self, client: _Client) -> list[_Entry]:
        """Add ``client``; return the recent entries, which it is not pushed."""
        with self._lock:
            self._clients = [*self._clients, client]
            return list(self._recent)

    def detach(self, client: _Client) -> None:
        with self._lock:
            self._clients = [c for c in self._clients if c is not client]

    def _add(self, entry: _Entry) -> None:
        with self._lock:
            self._recent.append(entry)
            for client in self._clients:
                client.push(entry)

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


def _recent_rows(entries: list[_Entry], client: _Client) -> list[list[Any]]:
    """The last :data:`RECENT_RECORDS` rows of ``entries`` that ``client`` wants."""
    rows: list[list[Any]] = []
    for entry in reversed(entries):
        rows[:0] = [row for row in _rows(entry) if client.wants(row)]
        if len(rows) >= RECENT_RECORDS:
            break
    return rows[-RECENT_RECORDS:]


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


class Monitor:
    """The monitor of one runner (see the module's docs)."""

    def __init__(self, address: str | bool, runner_name: str) -> None:
        self.host, self.port = parse_address(address)
        self.token = secrets.token_urlsafe(18)
        self._runner_name = runner_name
        self._log_path: str | None = None
        self._processes: dict[str, dict[str, Any]] = {}
        self._loop: LoopHandle | None = None
        self.bound = anyio.Event()
        self._ended = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self.sink: MonitorSink
        self._page: bytes | None = None

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
        message = _json.encode({"type": "process", **info})
        for client in self.clients():
            client.push_state(proc.name, message)

    def clients(self) -> list[_Client]:
        return self.sink.clients

    def end(self) -> None:
        """The runner has ended: tell every client, then close."""
        self._ended.set()

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

    async def serve(self, loop: LoopHandle) -> None:
        """Serve until the runner ends (a task of the runner)."""
        self._loop = loop
        if loop.backend == "trio":
            await self._serve_trio()
        else:
            await self._serve_asyncio()

    def _attach(self, source: str, level: int) -> tuple[_Client, list[_Entry]]:
        """A new client, and the recent entries from before it came (on the loop)."""
        assert self._loop is not None
        client = _Client(self._loop, source, level)
        if self._idle.is_set():
            self._idle = anyio.Event()
        return client, self.sink.attach(client)

    def _detach(self, client: _Client) -> None:
        self.sink.detach(client)
        if not self.sink.clients:
            self._idle.set()

    async def _talk(
        self,
        client: _Client,
        recent: list[_Entry],
        send: Callable[[bytes], Awaitable[None]],
        receive: Callable[[], Any],
        closed: type[BaseException],
    ) -> None:
        """The life of one WebSocket client: snapshot, then events; filters from it.

        Returns when the runner has ended (after saying so) or the client is gone.
        """

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
                        client.set_filter(
                            str(request.get("source") or "*"),
                            level if isinstance(level, int) else _level_number(str(level)),
                        )
            except closed:
                pass
            tg.cancel_scope.cancel()  # the client is gone

        async def ended() -> None:
            await self._ended.wait()
            client.ended = True
            client.wake.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            tg.start_soon(ended)
            try:
                await send(self._snapshot())
                backlog = await anyio.to_thread.run_sync(_recent_rows, recent, client)
                del recent
                for message in _logs_messages(backlog):
                    await send(message)
                while True:
                    await client.wake.wait()
                    client.wake = anyio.Event()
                    more = True
                    while more:
                        last = client.ended
                        # Lines are split and encoded off the loop, one message's
                        # worth at a time.
                        messages, more = await anyio.to_thread.run_sync(client.take, MESSAGE_ROWS)
                        for message in messages:
                            await send(message)
                    if last:
                        await send(b'{"type":"end"}')
                        break
                    # At most SEND_RATE batches a second: during a flood, few
                    # large messages cost both sides far less than many small.
                    with anyio.move_on_after(1 / SEND_RATE):
                        await self._ended.wait()
            except closed:
                pass
            tg.cancel_scope.cancel()

    # -- asyncio: the websockets package ---------------------------------------------------------

    async def _serve_asyncio(self) -> None:
        from websockets.asyncio.server import ServerConnection, serve
        from websockets.datastructures import Headers
        from websockets.exceptions import ConnectionClosed
        from websockets.http11 import Request, Response

        def process_request(connection: ServerConnection, request: Request) -> Response | None:
            headers = request.headers
            allowed, _, _ = self.check(request.path, headers.get("Origin"))
            if not allowed:
                return _response(403, b"forbidden\n", "text/plain")
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return _response(200, self.page(), "text/html; charset=utf-8")
            return None

        def _response(status: int, body: bytes, kind: str) -> Response:
            reason = {200: "OK", 403: "Forbidden"}[status]
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
            request = connection.request
            assert request is not None
            _bound_send_buffer(connection.transport.get_extra_info("socket"))
            _, source, level = self.check(request.path, None)
            client, recent = self._attach(source, level)

            async def send(message: bytes) -> None:
                await connection.send(message, text=True)  # UTF-8 already

            try:
                await self._talk(client, recent, send, connection.recv, ConnectionClosed)
            finally:
                self._detach(client)

        server = await serve(
            handler,
            self.host or None,
            self.port,
            process_request=process_request,
            compression=None,
            server_header=None,
            close_timeout=1,
            open_timeout=5,
        )
        try:
            sockets = list(server.sockets)
            self.port = sockets[0].getsockname()[1]
            self.bound.set()
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

        async def talk(stream: Any) -> None:
            conn = h11.Connection(h11.SERVER)
            received = bytearray()
            request = None
            with trio.move_on_after(10):
                while request is None:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        received += data
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        request = event
                    else:
                        return
            if request is None:
                return
            headers = {k.decode().lower(): v.decode() for k, v in request.headers}
            target = request.target.decode()
            allowed, source, level = self.check(target, headers.get("origin"))
            websocket = headers.get("upgrade", "").lower() == "websocket"
            if not allowed or not websocket:
                status, body, kind = (
                    (200, self.page(), "text/html; charset=utf-8")
                    if allowed
                    else (403, b"forbidden\n", "text/plain")
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
            _bound_send_buffer(stream.socket)
            replay = _replay_stream(trio, stream, bytes(received))
            ws_request = await trio_websocket.wrap_server_stream(nursery, replay)
            ws = await ws_request.accept()
            client, recent = self._attach(source, level)

            async def send(message: bytes) -> None:
                await ws.send_message(message.decode())

            try:
                await self._talk(
                    client, recent, send, ws.get_message, trio_websocket.ConnectionClosed
                )
            finally:
                self._detach(client)
                with trio.move_on_after(2):
                    await ws.aclose()

        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host or None)
            self.port = listeners[0].socket.getsockname()[1]
            self.bound.set()
            nursery.start_soon(trio.serve_listeners, connection, listeners)
            await self._ended.wait()
            with trio.move_on_after(2):
                await self._idle.wait()
            nursery.cancel_scope.cancel()


#: The kernel send buffer of a monitor connection.  Left to the kernel, it
#: grows to megabytes for a client that does not read, and the runner would
#: prepare all of that for it; this much is a few thousand records.
SEND_BUFFER: Final = 256 * 1024


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
