"""The monitor of one runner: its state, who may connect, and the life of each client.

The server stacks that carry it (:mod:`corral._monitor._asyncio`,
:mod:`corral._monitor._trio`) are chosen by :func:`corral._monitor._serve.serve`.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import secrets
import signal
import socket
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.to_thread
import msgspec

from .._logs._records import level_number
from .._results import end_state
from ._clients import Client, MonitorSink
from ._rows import JSON

if TYPE_CHECKING:
    from .._core._process import Process
    from .._sys._backend import LoopHandle
    from .._sys._proc import ResourceUsage

__all__ = [
    "DEFAULT_HOST",
    "FAILURE_LINES",
    "PROTOCOL_VERSION",
    "Joined",
    "Monitor",
    "bound_send_buffer",
    "check_origins",
    "parse_address",
    "parse_origin",
    "process_info",
    "run_status",
]

PROTOCOL_VERSION: Final = 1

# Every bound below is in docs/howto/limits.rst, each with its test.

#: Clients at once; the next is refused (``503``) until one leaves.
MAX_CLIENTS: Final = 256
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
#: Every this many seconds a client is pinged; one that has not answered
#: (its pong) within :data:`PING_TIMEOUT` is closed.  So a client gone
#: without a word (a host that went down, a cut cable, a process stopped)
#: gives its place back within ``PING_INTERVAL + PING_TIMEOUT`` seconds; one
#: that closed its socket (killed, even during the handshake), at once.  A
#: client that reads nothing for that long answers no ping either.
PING_INTERVAL: Final = 20.0
PING_TIMEOUT: Final = 20.0
#: Samples of what each process costs that the monitor keeps for a client that
#: comes (its first message has them, for the page's sparklines): the last
#: few minutes at one a second ...
USAGE_HISTORY: Final = 180
#: ... and at most this many bytes of them (the newest sample at least).
USAGE_HISTORY_BYTES: Final = 512 * 1024
#: Seconds the monitor may take to start listening (resolving its host's
#: name, binding); past them, or if the address cannot be had, entering the
#: runner fails with an :class:`OSError` naming the address and the reason.
LISTEN_TIMEOUT: Final = 10.0

_T = TypeVar("_T")


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


def parse_origin(origin: str) -> str:
    """``origin`` as a browser sends it in its ``Origin`` header: ``scheme://host[:port]``.

    Lower-cased, without the scheme's default port (``https://Example.com:443``
    is ``https://example.com``); ``ValueError`` for anything else (a path, a
    query, a user, another scheme than http and https, ``null``).
    """
    if not isinstance(origin, str):
        raise TypeError(f"an origin is a str ('https://host[:port]'), not {type(origin).__name__}")
    parts = urllib.parse.urlsplit(origin.strip())
    try:
        port = parts.port
    except ValueError:
        port = -1
    scheme = parts.scheme.lower()
    if (
        scheme not in ("http", "https")
        or not parts.hostname
        or port == -1
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"not an origin: {origin!r} (expected 'https://HOST' or 'http://HOST:PORT', the "
            "scheme, name and port of the pages' address, without a path)"
        )
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def check_origins(origins: Iterable[str]) -> frozenset[str]:
    """``monitor_origins=``: the origins of pages (a reverse proxy's) let in, normalised."""
    if isinstance(origins, str):
        raise TypeError(
            f"monitor_origins is a list of origins, not a str: [{origins!r}], not {origins!r}"
        )
    return frozenset(parse_origin(origin) for origin in origins)


#: What a request that does not become a WebSocket is answered: (status, body, content type).
Reply = tuple[int, bytes, str]

_TEXT: Final = "text/plain; charset=utf-8"
#: The query parameter by which the page asks whether its origin would be let in (the
#: browser sends no ``Origin`` header with a plain ``GET`` of its own site).
_PROBE: Final = "check_origin"


def run_status(returncode: int) -> int:
    """A process's ``returncode`` as a shell's exit status: 128 + N for a signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(returncode: int | None) -> str | None:
    """The name of the signal that ended a process, from its ``returncode`` (``-15``)."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


#: The last lines of its stderr that the end of a run carries about the process whose
#: failure ended it (at most the 4 KiB of stderr every process keeps for its failure).
FAILURE_LINES: Final = 10


def process_info(proc: Process, state: str) -> dict[str, Any]:
    # A process that exits at once may have exited before its "running" is
    # told: that message is of its start, and its exit follows.
    code = None if state == "running" else proc.returncode
    if state == "exited" and code is not None:
        state = end_state(code, proc.stop_requested)
    started = time.time() - (time.monotonic() - proc.started_at)
    return {
        "name": proc.name,
        "source": proc.source,
        "pid": proc.pid,
        "state": state,
        "returncode": code,
        "signal": _signal_name(code),
        "started": round(started, 3),
        "restarts": proc.restarts,
    }


@dataclass
class Joined:
    """A client that has joined, and the first messages for it (see :meth:`MonitorSink.take`)."""

    client: Client
    messages: list[bytes]
    size: int
    more: bool


class Monitor:
    """The monitor of one runner (see the module's docs)."""

    def __init__(self, address: str | bool, runner_name: str, origins: Iterable[str] = ()) -> None:
        self.host, self.port = parse_address(address)
        #: Origins let in besides the monitor's own (a reverse proxy's pages).
        self.origins = check_origins(origins)
        self.token = secrets.token_urlsafe(18)
        self._runner_name = runner_name
        self._log_path: str | None = None
        self._processes: dict[str, dict[str, Any]] = {}
        #: The last samples of what each process costs, in JSON, oldest first.
        self._usage: deque[bytes] = deque()
        self._usage_bytes = 0
        #: The processes whose own failure is their last word, in the order they failed.
        self._failures: dict[str, dict[str, Any]] = {}
        self._end_message = b'{"type":"end","status":0,"failure":null}'
        self._loop: LoopHandle | None = None
        #: Set once the monitor listens, or once it could not (then :attr:`error`).
        self.ready = anyio.Event()
        self.error: OSError | None = None
        self.ended = anyio.Event()
        self.idle = anyio.Event()
        self.idle.set()
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
        info = process_info(proc, state)
        self._processes[proc.name] = info
        if state == "running":
            self._failures.pop(proc.name, None)  # run again: that failure is over
        elif info["state"] == "failed" and proc.name not in self._failures:
            stderr = proc.stderr_tail.decode("utf-8", "replace").rstrip()
            self._failures[proc.name] = {
                "name": proc.name,
                "source": proc.source,
                "returncode": info["returncode"],
                "stderr": stderr.splitlines()[-FAILURE_LINES:],
            }
        self.sink.push_state(proc.name, JSON.encode({"type": "process", **info}))

    def usage_event(self, now: float, figures: Mapping[str, ResourceUsage]) -> None:
        """What each process costs now (on the loop, about once a second)."""
        sample = JSON.encode(
            {
                "time": round(now, 3),
                "processes": {
                    name: {
                        "pid": usage.pid,
                        "cpu": usage.cpu_percent,
                        "rss": usage.rss,
                        "gpu": usage.gpu_memory,
                        "processes": usage.processes,
                        "host": usage.host,
                    }
                    for name, usage in figures.items()
                },
            }
        )
        history = self._usage
        history.append(sample)
        self._usage_bytes += len(sample)
        while len(history) > 1 and (
            len(history) > USAGE_HISTORY or self._usage_bytes > USAGE_HISTORY_BYTES
        ):
            self._usage_bytes -= len(history.popleft())
        self.sink.push_usage(b'{"type":"usage",' + sample[1:])

    @property
    def usage_history(self) -> tuple[int, int]:
        """The samples kept for clients that come, and their bytes."""
        return len(self._usage), self._usage_bytes

    def clients(self) -> list[Client]:
        return self.sink.clients

    def end(self, received: int | None = None) -> None:
        """The runner has ended: tell every client how, then close.

        Its status is what the ``corral`` command exits with: 128 + N after
        the signal N reached it (``received``), else the first failure's code
        among its processes' last runs (see :func:`run_status`), else 0.
        """
        failure = next(iter(self._failures.values()), None)
        if received is not None:
            status = 128 + received
        elif failure is not None:
            status = run_status(failure["returncode"])
        else:
            status = 0
        self._end_message = JSON.encode({"type": "end", "status": status, "failure": failure})
        self.ended.set()
        self.sink.end()

    # -- serving ----------------------------------------------------------------------------

    def _snapshot(self) -> bytes:
        hello = JSON.encode(
            {
                "type": "hello",
                "v": PROTOCOL_VERSION,
                "runner": self._runner_name,
                "log_path": self._log_path,
                "processes": list(self._processes.values()),
            }
        )
        return hello[:-1] + b',"usage":[' + b",".join(self._usage) + b"]}"

    def page(self) -> bytes:
        if self._page is None:
            self._page = resources.files("corral._monitor").joinpath("page.html").read_bytes()
        return self._page

    def answer(
        self, target: str, origin: str | None, websocket: bool
    ) -> tuple[Reply | None, str, int]:
        """What to answer a request: ``(reply, source filter, level filter)``.

        ``reply`` is ``None`` when the WebSocket is to be taken.  ``origin`` is
        the request's ``Origin`` header (a browser sends one with a WebSocket).
        A refusal says which check refused (the token or the origin), nothing
        about the runner.  A page whose WebSocket failed asks why with
        ``check_origin=`` its own origin: ``200`` if the token and that origin
        would be let in (and there is room), else the refusal.
        """
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        token = (query.get("token") or [""])[0]
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return (403, b"forbidden: wrong or missing token\n", _TEXT), "*", 0
        probe = None if websocket else next(iter(query.get(_PROBE, ())), None)
        if origin is None:
            origin = probe
        if origin is not None and not self._origin_allowed(origin):
            refused = b"forbidden: this origin is not allowed (see monitor_origins)\n"
            return (403, refused, _TEXT), "*", 0
        if websocket or probe is not None:
            if self.full():
                return (503, b"too many clients\n", _TEXT), "*", 0
            if probe is not None:
                return (200, b"ok\n", _TEXT), "*", 0
        else:
            return (200, self.page(), "text/html; charset=utf-8"), "*", 0
        source = (query.get("source") or ["*"])[0] or "*"
        try:
            level = int((query.get("level") or ["0"])[0])
        except ValueError:
            level = level_number((query.get("level") or ["0"])[0])
        return None, source, level

    def _origin_allowed(self, origin: str) -> bool:
        """A browser may connect only from the monitor's own page, or one of :attr:`origins`.

        The own page's origin is ``http://NAME:PORT`` with the monitor's port,
        and NAME one that cannot be made to point elsewhere (DNS rebinding):
        the address the monitor listens on, loopback, ``localhost`` or this
        machine's own names; any IP address when it listens on all of them.
        A page served through a reverse proxy has the proxy's origin, which
        only :attr:`origins` (``monitor_origins=``) names.
        """
        if self.origins:
            try:
                if parse_origin(origin) in self.origins:
                    return True
            except ValueError:
                return False
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

    def full(self) -> bool:
        """Whether :data:`MAX_CLIENTS` clients are connected (or joining)."""
        return len(self.sink.clients) + self._joining >= MAX_CLIENTS

    def handshake_begins(self, key: object, close: Callable[[], None]) -> None:
        """A connection whose request is not checked yet; the oldest goes beyond the bound."""
        self._handshakes[key] = close
        while len(self._handshakes) > MAX_HANDSHAKES:
            oldest = next(iter(self._handshakes))
            self._handshakes.pop(oldest)()

    def handshake_ends(self, key: object) -> None:
        self._handshakes.pop(key, None)

    def bind_loop(self, loop: LoopHandle) -> None:
        """The monitor is about to serve on ``loop`` (see :func:`~corral._monitor._serve.serve`)."""
        self._loop = loop
        self._limiter = anyio.CapacityLimiter(TAKE_THREADS)
        self.sink.start(loop)

    async def listen(self, opening: Awaitable[_T]) -> _T | None:
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

    async def join(self, source: str, level: int) -> Joined:
        """A new client, attached, and its first messages: the snapshot, the recent records.

        They are ready before the client is accepted, so that they are the
        first it gets, before even the answer to a ping.
        """
        sink = self.sink
        client = Client(source, level)
        if self.idle.is_set():
            self.idle = anyio.Event()
        client.state = sink.state_position()
        client.usage = sink.usage_position()
        snapshot = self._snapshot()
        self._joining += 1
        try:
            messages, size, more = await anyio.to_thread.run_sync(
                sink.join, client, limiter=self._limiter
            )
        except BaseException:
            self.leave(client)
            raise
        finally:
            self._joining -= 1
        return Joined(client, [snapshot, *messages], size, more)

    def leave(self, client: Client) -> None:
        self.sink.detach(client)
        if not self.sink.clients:
            self.idle.set()

    async def talk(
        self,
        joined: Joined,
        send: Callable[[bytes], Awaitable[None]],
        receive: Callable[[], Any],
        ping: Callable[[], Awaitable[None]],
        closed: type[BaseException],
    ) -> None:
        """The life of one WebSocket client: snapshot, then events; filters from it.

        Returns when the runner has ended (after saying so) or the client is
        gone (closed, or silent: see :data:`PING_INTERVAL`), having detached
        the client.  ``ping`` sends a ping and returns once its pong came.
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
                            level if isinstance(level, int) else level_number(str(level)),
                            limiter=self._limiter,
                        )
            except closed:
                pass
            tg.cancel_scope.cancel()  # the client is gone

        async def heartbeat() -> None:
            try:
                while True:
                    await anyio.sleep(PING_INTERVAL)
                    with anyio.move_on_after(PING_TIMEOUT) as waited:
                        await ping()
                    if waited.cancelled_caught:
                        break  # no answer: gone
            except closed:
                pass
            tg.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(listen)
                tg.start_soon(heartbeat)
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
                                await send(self._end_message)
                                break
                            # At most SEND_RATE batches a second: during a flood,
                            # few large messages cost both sides far less than many.
                            with anyio.move_on_after(1 / SEND_RATE):
                                await self.ended.wait()
                            await sink.wait(client)
                            last = self.ended.is_set()
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
            self.leave(client)


#: The kernel send buffer of a monitor connection.  Left to the kernel, it
#: grows to megabytes for a client that does not read, and the runner would
#: prepare all of that for it; this much is a few hundred records, and
#: still megabytes a second over a link of a few milliseconds.
SEND_BUFFER: Final = 64 * 1024


def bound_send_buffer(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError:  # pragma: no cover - not a TCP socket
        pass


_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})


@functools.cache
def _machine_names() -> frozenset[str]:
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:  # pragma: no cover - getfqdn does not raise in practice
        pass
    return frozenset(names)
