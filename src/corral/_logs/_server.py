"""Receive log records from child processes over a private Unix socket.

Children send their :mod:`logging` records as frames (described in
:mod:`corral._logs._wire`; the sending half is :mod:`corral._logs._child_logging`).  The
:class:`LogServer` listens on a Unix socket in a fresh private directory (mode
0700, removed at exit, and by the lifeline if the launcher dies) and, for each
connection:

1. waits (at most ``hello_timeout`` seconds) for a hello carrying the runner's
   secret and a protocol version it speaks, compared in constant time;
   otherwise it closes the connection with a warning naming the peer process
   (its pid, as the kernel reports it) and the reason;
2. hands every later read of the socket, as raw bytes, to the collector: the
   frames are decoded into records on the collector's worker thread, not on
   the loop.  At the first malformed frame the worker delivers every good
   record before it and marks the connection, which is then closed with a
   warning naming the peer and its source.

Every connection is served by its own task, so one slow, broken or hostile
peer holds up no other, and a connection is read only as fast as the
collector takes its reads (backpressure: the child's logging calls block in
their send).

**Bounded waits.**  When a child exits, :meth:`LogServer.drain` reads its
connections to the end: a dead process's socket always reads as end-of-file
after everything it wrote, so nothing it logged is lost, not even just
before ``os._exit``.  But a connection can outlive its process — inherited by
a descendant that left the process group (a ``setsid`` daemon), or by a
program that does not mark it close-on-exec.  So once the child has exited,
a connection that stays silent for ``idle`` seconds, or is still open
``linger`` seconds later, is closed with a warning saying so.  The same rules
bound the server's own exit.  When the process runs out of descriptors, new
connections wait in the listener's backlog and accepting is retried every
0.1 s (with one warning), rather than failing the server.
"""

from __future__ import annotations

import errno
import hmac
import os
import secrets
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.lowlevel

from .._sys import _childenv, _platform
from .._sys._backend import start_surely
from ._chunks import FRAMES, Chunk, StreamState
from ._collector import Collector
from ._sources import Source
from ._wire import MAX_FRAME, MAX_HELLO, FrameDecoder, WireError, decode_hello

__all__ = ["LogServer"]

_PEERCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid
_PREFIX: Final = struct.Struct(">I")
_RECEIVE_SIZE: Final = 64 * 1024
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_RETRY_DELAY: Final = 0.1
#: A read shorter than this means the connection trickles: coalesce.
_TRICKLE: Final = 16 * 1024
#: While a connection trickles, read it at most this often (seconds).
_COALESCE: Final = 0.005
#: Source names on the wire may not be longer than this.
MAX_SOURCE: Final = 1024
#: Connections accepted whose hello is not checked yet, at most.  To accept
#: another, the one of them that has waited longest for the rest of its hello
#: is closed (a child sends its hello whole as it connects: only a peer that
#: trickles waits); if none waits, the next waits in the listener's backlog.
MAX_PENDING_HELLOS: Final = 64
#: Connections refused before their hello was checked that are reported, at most.
MAX_REFUSALS_REPORTED: Final = 20


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer_pid: int | None
    source: Source | None = None
    state: StreamState | None = None
    draining_since: float | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    wait_scope: anyio.CancelScope | None = None
    closed: anyio.Event = field(default_factory=anyio.Event)
    evicted: bool = False  # closed to make room for other hellos
    hello: bytearray = field(default_factory=bytearray)  # what came of it so far

    def describe(self) -> str:
        who = f"pid {'?' if self.peer_pid is None else self.peer_pid}"
        if self.source is not None:
            who += f", source {self.source.name!r}"
        return who

    def start_draining(self) -> None:
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            if self.wait_scope is not None:
                self.wait_scope.cancel()


class LogServer:
    """The runner's log socket and its connections (see the module's docs)."""

    def __init__(
        self,
        collector: Collector,
        source_for: Callable[[str], Source | None],
        *,
        warn: Callable[[str], None],
        hello_timeout: float = 5.0,
        idle: float = 0.5,
        linger: float = 5.0,
        max_frame: int = MAX_FRAME,
        dir: str | None = None,
    ) -> None:
        self._collector = collector
        self._source_for = source_for
        self._warn = warn
        self.hello_timeout = hello_timeout
        self.idle = idle
        self.linger = linger
        self.max_frame = max_frame
        self.folder = tempfile.mkdtemp(prefix="corral-log-", dir=dir)
        self.path = os.path.join(self.folder, "log.sock")
        self.secret = secrets.token_hex(16)
        self._listener: socket.socket | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._pending: set[_Connection] = set()
        self._waiting: dict[_Connection, None] = {}  # for the rest of their hello, oldest first
        self._evicted = 0
        self._refusals = 0
        self._room = anyio.Event()  # set when a pending connection is done or waits
        self._by_source: dict[Source, set[_Connection]] = {}
        self._aborted = False

    def env(self) -> dict[bytes, bytes]:
        """The variables a child needs to reach this server (its source is added per child)."""
        return {
            _childenv.LOG_SOCKET.encode(): os.fsencode(self.path),
            _childenv.LOG_SECRET.encode(): self.secret.encode(),
        }

    # -- lifetime ----------------------------------------------------------------------

    def listen(self) -> None:
        """Bind the socket (on entry, before any child can be started)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)
            listener.listen(socket.SOMAXCONN)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self._listener = listener

    async def serve(self, until: anyio.Event) -> None:
        """Accept and serve connections until ``until`` is set, then close (bounded)."""
        assert self._listener is not None
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                accept_scope = anyio.CancelScope()
                await start_surely(tg, (self._accept_loop, (accept_scope,), "corral log accept"))
                await until.wait()
                accept_scope.cancel()
                self._stop_listening()
                # Everything still open belongs to a process that outlived
                # its runner's children: give it the same bounded drain.
                for conn in self._open():
                    conn.start_draining()
        finally:
            self._tg = None
            self._stop_listening()
            # Every connection's task has ended with the group.  One still
            # open had its task cancelled before it ever ran (natively, at the
            # end of asyncio.run): close it here, so that no drain waits for it.
            for conn in self._open():
                self._pending.discard(conn)
                conn.sock.close()
                conn.closed.set()
            self._by_source.clear()
            try:
                os.rmdir(self.folder)  # empty by now, as a rule: cheaper than rmtree's walk
            except OSError:
                shutil.rmtree(self.folder, ignore_errors=True)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._accept_backlog(force=True)
            if self._tg is not None:
                anyio.notify_closing(self._listener)  # the accept loop may wait on it
            self._listener.close()
            self._listener = None

    def close(self) -> None:
        """Give up the socket and its folder without serving (an entry that failed)."""
        self._stop_listening()
        shutil.rmtree(self.folder, ignore_errors=True)

    def abort(self) -> None:
        """Close every connection now (a second Ctrl-C)."""
        self._aborted = True
        for conn in self._open():
            conn.scope.cancel()

    def _open(self) -> list[_Connection]:
        return [*self._pending, *(c for conns in self._by_source.values() for c in conns)]

    # -- accepting -----------------------------------------------------------------------

    async def _accept_loop(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self._accept_until_closed()

    async def _accept_until_closed(self) -> None:
        warned = False
        while True:
            listener = self._listener
            if listener is None:
                return  # closed (the rest of the backlog was accepted then)
            try:
                await anyio.wait_readable(listener)
            except anyio.ClosedResourceError:
                return  # closing: _stop_listening accepts what is left
            try:
                self._accept_backlog(raise_errors=True)
                while self._listener is not None and self._pending_full():
                    # Every pending connection is being read: accept once one is done.
                    self._room = anyio.Event()
                    await self._room.wait()
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                # Out of descriptors (or memory): the connection waits in the
                # backlog.  Try again shortly; retrying at once would spin.
                if not warned:
                    self._warn(
                        f"cannot accept log connections: {exc.strerror}; "
                        f"retrying every {_ACCEPT_RETRY_DELAY:g} s"
                    )
                    warned = True
                await anyio.sleep(_ACCEPT_RETRY_DELAY)

    def _pending_full(self) -> bool:
        return len(self._pending) >= MAX_PENDING_HELLOS and not self._waiting

    def _accept_backlog(self, *, raise_errors: bool = False, force: bool = False) -> None:
        """Accept what waits in the listener's backlog: everything if ``force`` (at
        the end, or a drain), else as long as there is room for hellos."""
        listener = self._listener
        if listener is None or self._tg is None:
            return
        while True:
            if not force and len(self._pending) >= MAX_PENDING_HELLOS:
                if not self._waiting:
                    return
                self._evict(next(iter(self._waiting)))
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError:
                if raise_errors:
                    raise
                return
            sock.setblocking(False)
            conn = _Connection(sock, _peer_pid(sock))
            # Registered here, not when its task starts, so that a drain never
            # overlooks a connection whose task has not run yet.
            self._pending.add(conn)
            self._tg.start_soon(self._serve, conn)

    # -- draining -------------------------------------------------------------------------

    async def drain(self, source: Source, pgid: int) -> None:
        """Read an exited child's connections to the end (bounded; see the module's docs).

        Every connection of ``source`` (or that has not said yet whose it is)
        from a process that is gone or still in group ``pgid`` is read until
        end-of-file, and closed if it stays silent for ``idle`` seconds or open
        for ``linger``.  A connection from a live process that left the group is
        left alone: it may go on logging under this source.
        """
        self._accept_backlog(force=True)
        conns = [
            conn
            for conn in (*self._pending, *self._by_source.get(source, ()))
            if conn.source in (source, None)
            and (conn.peer_pid is None or _platform.gone_or_in_group(conn.peer_pid, pgid))
        ]
        for conn in conns:
            conn.start_draining()
        for conn in conns:
            await conn.closed.wait()

    # -- one connection --------------------------------------------------------------------

    async def _serve(self, conn: _Connection) -> None:
        try:
            with conn.scope:
                if await self._hello(conn):
                    await self._read(conn)
                else:
                    _discard(conn.sock)
        finally:
            self._pending.discard(conn)
            self._waiting.pop(conn, None)
            self._room.set()
            if conn.source is not None:
                conns = self._by_source.get(conn.source)
                if conns is not None:
                    conns.discard(conn)
                    if not conns:
                        del self._by_source[conn.source]
            if conn.state is not None:
                with anyio.CancelScope(shield=True):
                    await self._collector.put(Chunk(conn.state, final=True))
            anyio.notify_closing(conn.sock)
            conn.sock.close()
            conn.closed.set()
            if conn.scope.cancelled_caught and self._aborted:
                self._warn(f"closed the log connection from {conn.describe()}: exit aborted")
            elif conn.evicted:
                self._evicted += 1
                if self._evicted == 1:  # once: a flood of them would say it a thousand times
                    self._warn(
                        f"closed the log connection from {conn.describe()}: it waited for "
                        f"the rest of its hello while {MAX_PENDING_HELLOS} connections did "
                        "and others came (more such are closed without a word)"
                    )

    async def _wait_readable(self, conn: _Connection) -> bool:
        """Wait for data; ``False`` if the drain rules say to give up on the connection."""
        while True:
            timeout = float("inf")
            if conn.draining_since is not None:
                left = conn.draining_since + self.linger - time.monotonic()
                if left <= 0:
                    self._warn(
                        f"closed the log connection from {conn.describe()}: still open "
                        f"{self.linger:g} s after its process exited"
                    )
                    return False
                timeout = min(self.idle, left)
            if conn.state is not None and conn.state.error is not None:
                return False  # the worker found garbage: hang up
            with anyio.CancelScope() as conn.wait_scope, anyio.move_on_after(timeout) as timer:
                await anyio.wait_readable(conn.sock)
            cancelled = conn.wait_scope.cancelled_caught
            conn.wait_scope = None
            if timer.cancelled_caught and conn.draining_since is not None:
                if time.monotonic() >= conn.draining_since + self.linger:
                    continue  # reported as "still open" at the top
                self._warn(
                    f"closed the log connection from {conn.describe()}: silent for "
                    f"{timeout:g} s after its process exited (is it held open by a "
                    "descendant that left the process group?)"
                )
                return False
            if cancelled:
                continue  # draining began: wait again, with the drain's deadlines
            return True

    async def _hello(self, conn: _Connection) -> bool:
        """Read and check the hello; ``False`` (with a warning) if it is none.

        Nothing is read beyond the hello, which may be at most
        :data:`~corral._logs._wire.MAX_HELLO` bytes and must come within
        ``hello_timeout``: before its secret is checked, a connection costs
        at most that.
        """
        buffered = conn.hello
        length = 0
        with anyio.move_on_after(self.hello_timeout) as timer:
            while True:
                if len(buffered) >= _PREFIX.size:
                    (length,) = _PREFIX.unpack_from(buffered)
                    if not 0 < length <= MAX_HELLO:
                        self._refuse(
                            f"log connection from {conn.describe()}: a first frame of "
                            f"{length} bytes is no hello"
                        )
                        return False
                    missing = _PREFIX.size + length - len(buffered)
                    if not missing:
                        break
                else:
                    missing = _PREFIX.size - len(buffered)
                try:
                    data = conn.sock.recv(missing)
                except BlockingIOError:
                    self._wait_for_hello(conn)
                    if not await self._wait_readable(conn):
                        return False
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._refuse(f"log connection from {conn.describe()}: closed before the hello")
                    return False
                buffered += data
        self._waiting.pop(conn, None)
        conn.hello = bytearray()  # the hello is in ``buffered``, for this call only
        if timer.cancelled_caught:
            self._refuse(
                f"log connection from {conn.describe()}: no hello within {self.hello_timeout:g} s"
            )
            return False
        end = _PREFIX.size + length
        try:
            hello = decode_hello(memoryview(buffered)[_PREFIX.size : end])
        except WireError as exc:
            self._refuse(f"log connection from {conn.describe()}: {exc.reason}")
            return False
        # compare_digest takes str only if it is ASCII: compare the UTF-8 bytes.
        if not hmac.compare_digest(hello.secret.encode(), self.secret.encode()):
            self._refuse(f"log connection from {conn.describe()}: wrong secret")
            return False
        if not hello.source or len(hello.source) > MAX_SOURCE:
            self._refuse(
                f"log connection from {conn.describe()}: a source name of "
                f"{len(hello.source)} characters is not acceptable"
            )
            return False
        source = self._source_for(hello.source)
        if source is None:
            self._refuse(f"log connection from {conn.describe()}: unknown source {hello.source!r}")
            return False
        conn.source = source
        conn.state = StreamState(
            source,
            FRAMES,
            "logging",
            0,
            hello.pid or conn.peer_pid or 0,
            peer=conn.describe(),
            decoder=FrameDecoder(self.max_frame),
            on_error=lambda: _wake(conn),
        )
        self._pending.discard(conn)
        self._room.set()
        self._by_source.setdefault(source, set()).add(conn)
        return True

    def _refuse(self, message: str) -> None:
        """Warn of a connection refused before its hello was checked: the first
        :data:`MAX_REFUSALS_REPORTED` of them (what a peer that is no child of ours
        makes us say must cost little too)."""
        self._refusals += 1
        if self._refusals <= MAX_REFUSALS_REPORTED:
            if self._refusals == MAX_REFUSALS_REPORTED:
                message += " (further connections refused before their hello go unreported)"
            self._warn(message)

    def _wait_for_hello(self, conn: _Connection) -> None:
        """``conn`` waits for the rest of its hello: it may be closed to make room."""
        if conn not in self._waiting:
            self._waiting[conn] = None
            self._room.set()

    def _evict(self, conn: _Connection) -> None:
        """Close ``conn``, which waits for the rest of its hello, to accept another."""
        del self._waiting[conn]
        self._pending.discard(conn)
        conn.evicted = True
        conn.hello.clear()  # now: its task runs later
        conn.scope.cancel()

    async def _read(self, conn: _Connection) -> None:
        state = conn.state
        assert state is not None
        while state.error is None:
            if conn.draining_since is None:
                # A live tail of this source is full: read on once it has room
                # (backpressure, as for pipes), or once the process has exited.
                room = state.source.room_event()
                if not room.is_set():
                    with anyio.CancelScope() as conn.wait_scope:
                        await room.wait()
                    conn.wait_scope = None
                    continue
            # Read first, wait only when the socket is empty: during a burst the
            # data is there already, and a readiness wait costs more than a read.
            try:
                data = conn.sock.recv(_RECEIVE_SIZE)
            except BlockingIOError:
                if not await self._wait_readable(conn):
                    return
                continue
            except OSError:
                data = b""
            if not data:
                return
            await self._collector.put(Chunk(state, data, time.time()))
            if len(data) < _TRICKLE and conn.draining_since is None:
                # The child sends no faster than we read: take its records in
                # batches, at most one read per _COALESCE, rather than wake up for
                # each one (which costs both sides far more than the read).
                await anyio.sleep(_COALESCE)
            else:
                await anyio.lowlevel.checkpoint()


def _wake(conn: _Connection) -> None:
    """The worker found garbage on ``conn`` (called on the loop): stop waiting on it."""
    if conn.wait_scope is not None:
        conn.wait_scope.cancel()


_SCRATCH: Final = bytearray(16 * 1024)


def _discard(sock: socket.socket) -> None:
    """Read and forget what a refused peer sent already (up to 64 KiB), so that it
    sees the connection end rather than reset."""
    for _ in range(4):
        try:
            if not sock.recv_into(_SCRATCH):
                return
        except OSError:
            return


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end, as the kernel saw it at connect time."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid: int = _PEERCRED.unpack(creds)[0]
    except (OSError, struct.error):
        return None
    return pid or None
