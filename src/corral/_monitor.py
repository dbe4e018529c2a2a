"""Watch a runner live: a WebSocket monitor, a page for a browser, ``corral tail``.

``open_runner(monitor="127.0.0.1:0")`` starts a :class:`Monitor` in the
runner's task group, stopped with it.  :attr:`Runner.monitor_url` is
``http://HOST:PORT/?token=...``: opened in a browser it is a live page (the
process table and a filterable log tail); the same address with ``ws://`` is
the WebSocket endpoint, which speaks the JSON protocol below.  The server is
the WebSocket library of the running loop: trio-websocket on Trio, the
``websockets`` package's asyncio server on asyncio.

**Security.**  The monitor binds to loopback unless told otherwise.  Every
connection — the page, the WebSocket — must carry the access token
(``?token=``, compared in constant time); a missing or wrong one is refused
with ``403`` and no data.  A browser's ``Origin`` must be the monitor's own.

**Never in the way.**  Each client has a bounded queue of log events; a
client that reads slowly (or not at all) loses its *oldest* log events, and
the next message it gets says how many (``{"type": "dropped"}``).  The
runner, the other clients, the log files and handlers lose nothing and wait
for nobody.

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
import hmac
import logging
import secrets
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
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


def parse_address(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:0"`` for IPv6) as a pair; ``ValueError`` if it is not one."""
    if not isinstance(address, str):
        raise TypeError(f"monitor must be 'HOST:PORT', not {type(address).__name__}")
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise ValueError(f"monitor={address!r}: expected 'HOST:PORT', e.g. '127.0.0.1:0'")
    return host.strip("[]"), int(port)


class _Client:
    """One connected client: its filter and its bounded queue."""

    def __init__(self, loop: LoopHandle, source: str, level: int) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._states: list[bytes] = []  # state messages are never dropped
        self._logs: deque[list[Any]] = deque()
        self.dropped = 0
        self.source = source
        self.level = level
        self.wake = anyio.Event()
        self.ended = False

    def wants(self, source: str, level: int) -> bool:
        if level < self.level:
            return False
        return self.source == "*" or fnmatch.fnmatchcase(source, self.source)

    def push_logs(self, rows: list[list[Any]]) -> None:
        """From any thread: queue log rows, dropping the oldest beyond the bound."""
        rows = [row for row in rows if self.wants(row[0], row[2])]
        if not rows:
            return
        with self._lock:
            self._logs.extend(rows)
            excess = len(self._logs) - CLIENT_QUEUE
            if excess > 0:
                for _ in range(excess):
                    self._logs.popleft()
                self.dropped += excess
        self._poke()

    def push_state(self, message: bytes) -> None:
        with self._lock:
            self._states.append(message)
        self._poke()

    def _poke(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self.wake.set)
        except anyio.RunFinishedError:
            pass

    def take(self) -> list[bytes]:
        """Everything waiting, as messages to send (on the loop)."""
        self.wake = anyio.Event()
        with self._lock:
            states, self._states = self._states, []
            logs = list(self._logs)
            self._logs.clear()
            dropped, self.dropped = self.dropped, 0
        messages = []
        if dropped:
            messages.append(_json.encode({"type": "dropped", "count": dropped}))
        messages.extend(states)
        if logs:
            messages.append(_json.encode({"type": "logs", "records": logs}))
        return messages


class MonitorSink(_BlockSink):
    """A destination of the runner's log service that feeds the monitor's clients."""

    def __init__(self, monitor: Monitor) -> None:
        super().__init__(logging.NOTSET)
        self._monitor = monitor
        monitor.sink = self
        # The last reads, as they came (cheap: no line is split until a client
        # connects and asks for them).
        self._recent: deque[tuple[str, str, int, float, bytes] | list[list[Any]]] = deque(
            maxlen=RECENT_READS
        )
        self._recent_lock = threading.Lock()

    def recent_rows(self) -> list[list[Any]]:
        """The last :data:`RECENT_RECORDS` log rows (for a client that just connected)."""
        with self._recent_lock:
            entries = list(self._recent)
        rows: list[list[Any]] = []
        for entry in reversed(entries):
            if isinstance(entry, tuple):
                name, stream, level, created, text = entry
                lines = text.decode("utf-8", "replace").split("\n")
                rows[:0] = [[name, stream, level, created, None, line] for line in lines]
            else:
                rows[:0] = entry
            if len(rows) >= RECENT_RECORDS:
                break
        return rows[-RECENT_RECORDS:]

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        name = source.name
        with self._recent_lock:
            self._recent.append((name, stream, level, created, text))
        clients = self._monitor.clients()
        if not clients:
            return
        rows = [
            [name, stream, level, created, None, line]
            for line in text.decode("utf-8", "replace").split("\n")
        ]
        for client in clients:
            client.push_logs(rows)

    def write_wire(self, source: Source, records: list[Record]) -> None:
        name = source.name
        rows = [
            [name, "logging", rec.level, rec.created, rec.name, _wire_message(rec)]
            for rec in records
        ]
        with self._recent_lock:
            self._recent.append(rows)
        for client in self._monitor.clients():
            client.push_logs(rows)

    def emit(self, record: logging.LogRecord) -> None:
        stream = getattr(record, "corral_stream", None)
        message = _format_message(record) if stream == "logging" else record.getMessage()
        row = [source_of(record), stream, record.levelno, record.created, record.name, message]
        with self._recent_lock:
            self._recent.append([row])
        for client in self._monitor.clients():
            client.push_logs([row])


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

    def __init__(self, address: str, runner_name: str) -> None:
        self.host, self.port = parse_address(address)
        self.token = secrets.token_urlsafe(18)
        self._runner_name = runner_name
        self._log_path: str | None = None
        self._processes: dict[str, dict[str, Any]] = {}
        self._clients: set[_Client] = set()
        self._lock = threading.Lock()
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
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    def set_log_path(self, path: str | None) -> None:
        self._log_path = path

    def process_event(self, proc: Process, state: str) -> None:
        """A process changed state (on the loop)."""
        info = _process_info(proc, state)
        self._processes[proc.name] = info
        message = _json.encode({"type": "process", **info})
        for client in self.clients():
            client.push_state(message)

    def clients(self) -> list[_Client]:
        with self._lock:
            return list(self._clients)

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
        """Whether a request may proceed: (allowed, source filter, level filter)."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        token = (query.get("token") or [""])[0]
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return False, "*", 0
        if origin is not None and origin not in self._origins():
            return False, "*", 0
        source = (query.get("source") or ["*"])[0] or "*"
        try:
            level = int((query.get("level") or ["0"])[0])
        except ValueError:
            level = _level_number((query.get("level") or ["0"])[0])
        return True, source, level

    def _origins(self) -> set[str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        names = {host, "localhost"} if host in ("127.0.0.1", "[::1]") else {host}
        return {f"http://{name}:{self.port}" for name in names}

    async def serve(self, loop: LoopHandle) -> None:
        """Serve until the runner ends (a task of the runner)."""
        self._loop = loop
        if loop.backend == "trio":
            await self._serve_trio()
        else:
            await self._serve_asyncio()

    def _attach(self, source: str, level: int) -> _Client:
        assert self._loop is not None
        client = _Client(self._loop, source, level)
        with self._lock:
            self._clients.add(client)
            if self._idle.is_set():
                self._idle = anyio.Event()
        return client

    def _detach(self, client: _Client) -> None:
        with self._lock:
            self._clients.discard(client)
            if not self._clients:
                self._idle.set()

    async def _talk(
        self,
        client: _Client,
        send: Callable[[str], Any],
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
                        client.source = str(request.get("source") or "*")
                        level = request.get("level", 0)
                        client.level = (
                            level if isinstance(level, int) else _level_number(str(level))
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
                await send(self._snapshot().decode())
                recent = self._recent(client)
                if recent is not None:
                    await send(recent.decode())
                while True:
                    await client.wake.wait()
                    for message in client.take():
                        await send(message.decode())
                    if client.ended:
                        for message in client.take():
                            await send(message.decode())
                        await send('{"type":"end"}')
                        break
            except closed:
                pass
            tg.cancel_scope.cancel()

    def _recent(self, client: _Client) -> bytes | None:
        """The last log records before the client came, as one message (or ``None``)."""
        rows = [row for row in self.sink.recent_rows() if client.wants(row[0], row[2])]
        if not rows:
            return None
        return _json.encode({"type": "logs", "records": rows})

    # -- asyncio: the websockets package ---------------------------------------------------------

    async def _serve_asyncio(self) -> None:
        from websockets.asyncio.server import ServerConnection, serve
        from websockets.datastructures import Headers
        from websockets.exceptions import ConnectionClosed
        from websockets.http11 import Request, Response

        def process_request(connection: ServerConnection, request: Request) -> Response | None:
            allowed, _, _ = self.check(request.path, request.headers.get("Origin"))
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
            _, source, level = self.check(request.path, None)
            client = self._attach(source, level)
            try:
                await self._talk(client, connection.send, connection.recv, ConnectionClosed)
            finally:
                self._detach(client)

        async with serve(
            handler,
            self.host,
            self.port,
            process_request=process_request,
            compression=None,
            server_header=None,
            close_timeout=2,
        ) as server:
            sockets = list(server.sockets)
            self.port = sockets[0].getsockname()[1]
            self.bound.set()
            await self._ended.wait()
            # The handlers send "end" and close; give them a moment, then close.
            with anyio.move_on_after(2):
                await self._idle.wait()
            server.close()

    # -- Trio: trio-websocket, with h11 in front for the page --------------------------------

    async def _serve_trio(self) -> None:
        trio = sys.modules["trio"]
        import h11
        import trio_websocket

        async def connection(stream: Any) -> None:
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
            replay = _replay_stream(trio, stream, bytes(received))
            ws_request = await trio_websocket.wrap_server_stream(nursery, replay)
            ws = await ws_request.accept()
            client = self._attach(source, level)
            try:
                await self._talk(
                    client, ws.send_message, ws.get_message, trio_websocket.ConnectionClosed
                )
            finally:
                self._detach(client)
                with trio.move_on_after(2):
                    await ws.aclose()

        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            self.port = listeners[0].socket.getsockname()[1]
            self.bound.set()
            nursery.start_soon(trio.serve_listeners, connection, listeners)
            await self._ended.wait()
            with trio.move_on_after(2):
                await self._idle.wait()
            nursery.cancel_scope.cancel()


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


def _level_number(name: str) -> int:
    value = logging.getLevelName(name.upper())
    return value if isinstance(value, int) else 0
