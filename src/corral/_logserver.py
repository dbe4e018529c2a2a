# The launcher's end of the log stream.
#
# Children send their `logging` records over a private Unix socket (the frames are
# described in _wire.py; the sending half is _child_logging.py).  This module accepts
# those connections, checks that each one opens with the runner's secret, turns every
# frame into a real logging.LogRecord and hands it, one at a time, to the runner.

"""Receive log records from child processes and hand them to the launcher.

`LogServer` listens on a Unix socket in a fresh private directory.  Each child that is
to send its logs gets the socket's path, a secret and its source name through its
environment (`LogServer.env`).  For every connection the server:

1. waits (at most `hello_timeout` seconds) for a hello carrying the right secret and a
   protocol version it speaks, and otherwise closes the connection and logs a warning
   naming the peer process (its pid, as the kernel reports it) and the reason;
2. turns each following record frame into a `logging.LogRecord` -- level, logger name,
   message, the child's own timestamp, traceback text, pid, thread and process names --
   marked with ``corral_source`` (the source named in the hello) and
   ``corral_stream = "logging"``, and awaits the ``deliver`` callback with it;
3. at the first malformed frame -- garbage, a length over the limit, a frame cut off
   by the end of the stream, a message of the wrong kind -- delivers every good record
   that came before it, then closes that connection with a warning naming the peer and
   its source.

Every connection is served by its own task, so one slow, broken or hostile peer holds
up no other.  When the process runs out of descriptors, new connections wait in the
listener's backlog and accepting is retried every 0.1 s (with one warning), rather than
failing the server.  Warnings go to the ``corral.logserver`` logger, with the attributes
``corral_peer_pid``, ``corral_peer_source`` and ``corral_reason`` on the record.


Backpressure
------------

A connection's task reads at most `receive_size` bytes, delivers the records in them,
and only then reads again.  While ``deliver`` is waiting -- because a console is slow,
say, or a live tail is not keeping up -- nothing more is read from that socket; the
kernel's buffers fill, and then the child's logging calls block in their send.  So the
server holds at most one read's worth of records per connection that it has not yet
delivered (`records_received` minus `records_delivered` shows it), however fast a child
logs.  Between reads, and every few dozen records, the task passes through a
checkpoint, so a flood of records does not keep the rest of the event loop from running.


Closing
-------

Leaving the ``async with`` block stops accepting connections at once (the socket's
path is removed; connections the kernel had already queued are still served).  Then:

- on a normal exit, it waits for every open connection to reach end-of-file, which a
  child's connection does when the child exits (or is killed: a dead process's socket
  always reads as end-of-file, after everything it wrote).  This is what makes a record
  logged just before ``os._exit`` arrive: the server does not hang up while unread
  records may still be in the socket.  It waits as long as it takes, as a task group
  waits for its tasks, so leave the block after the processes it serves have ended;
  connections whose process is gone never hold it up.  (The child's socket is
  close-on-exec, and `corral._child_logging` closes its copy in a forked child, so no
  descendant keeps a dead child's connection open -- unless it was forked by C code
  that bypasses Python's fork hooks; then the wait lasts as long as that process.)
- on an exit by an exception or a cancellation (or a cancellation that arrives during
  that wait), it goes on reading -- shielded from the cancellation -- for at most
  `linger` seconds, then closes whatever is still open with a warning.

Finally the socket and its directory are removed.
"""

from __future__ import annotations

import errno
import hmac
import logging
import math
import os
import secrets
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.abc import SocketAttribute

from . import _platform
from ._wire import (
    ENV_SECRET,
    ENV_SOCKET,
    ENV_SOURCE,
    MAX_FRAME,
    FrameDecoder,
    Hello,
    Message,
    Record,
    WireError,
)

__all__ = ["Deliver", "LogServer"]

Deliver = Callable[[logging.LogRecord], Awaitable[None]]
"""The callback that receives each record; awaiting it is what applies backpressure."""

_log: Final = logging.getLogger("corral.logserver")

_PEERCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid

# How many records a connection delivers between checkpoints when `deliver` itself
# never yields.
_RECORDS_PER_CHECKPOINT: Final = 256

# accept() errors that mean "not now" rather than "never": retry after a pause.
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_RETRY_DELAY: Final = 0.1

# Timestamps further than this from the epoch (about the year 5138) are not believed.
_MAX_ABS_CREATED: Final = 1e11


@dataclass(eq=False)
class _Connection:
    stream: anyio.abc.SocketStream
    peer_pid: int | None
    # Shielded, so that a cancellation of the surrounding code does not cut a connection
    # off in the middle; closing decides when to stop, by cancelling this scope.
    scope: anyio.CancelScope = field(default_factory=lambda: anyio.CancelScope(shield=True))
    source: str | None = None
    hello_pid: int = 0
    delivered: int = 0
    closed: anyio.Event = field(default_factory=anyio.Event)

    def describe(self) -> str:
        pid = "?" if self.peer_pid is None else str(self.peer_pid)
        who = f"pid {pid}"
        if self.source is not None:
            who += f", source {self.source!r}"
        return who


class LogServer:
    """Receive `logging` records from child processes over a private Unix socket.

    Use it as an async context manager, inside a running AnyIO event loop (Trio or
    asyncio); it runs its own task group for the connections.  *deliver* is awaited with
    each record, one at a time per connection, in the order the child sent them; it is
    called from the server's tasks and must not raise (an exception from it stops the
    whole server and comes out of the ``async with``).

    ``deliver`` runs shielded from cancellation of the code around the server, so that
    records keep flowing while that code cleans up after an error; the server cancels
    it itself when it gives up on a connection (see Closing, in the module's docs).

    *hello_timeout* bounds the wait for a connection's first frame; *linger* bounds how
    long closing keeps reading after an error or a cancellation; *max_frame* is the
    largest frame payload accepted; *receive_size* is how many bytes are read from a
    socket at a time; *dir* is where the private directory is made (the system's
    temporary directory by default -- mind that a Unix socket path may not be longer
    than about 100 bytes).
    """

    def __init__(
        self,
        deliver: Deliver,
        *,
        hello_timeout: float = 5.0,
        linger: float = 5.0,
        max_frame: int = MAX_FRAME,
        receive_size: int = 65536,
        dir: str | None = None,
        deliver_many: Callable[[list[logging.LogRecord]], Awaitable[None]] | None = None,
    ) -> None:
        if receive_size < 1:
            raise ValueError("receive_size must be positive")
        self._deliver: Final = deliver
        self._deliver_many: Final = deliver_many
        self.hello_timeout: Final = hello_timeout
        self.linger: Final = linger
        self.max_frame: Final = max_frame
        self.receive_size: Final = receive_size
        self._parent_dir: Final = dir
        self._dir: str | None = None
        self._path: str | None = None
        self._secret: str | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lifetime: AbstractAsyncContextManager[None] | None = None
        self._open: set[_Connection] = set()
        self._listener: anyio.abc.SocketListener | None = None
        self._idle: anyio.Event | None = None
        self.records_received = 0
        """Records decoded so far, over all connections."""
        self.records_delivered = 0
        """Records for which ``deliver`` has returned, over all connections."""

    # -- what a launcher needs to start a child ---------------------------------------

    @property
    def path(self) -> str:
        """The path of the listening socket."""
        if self._path is None:
            raise RuntimeError("the LogServer has not been entered")
        return self._path

    @property
    def secret(self) -> str:
        """The secret every connection must present in its hello."""
        if self._secret is None:
            raise RuntimeError("the LogServer has not been entered")
        return self._secret

    def env(self, source: str) -> dict[str, str]:
        """The environment variables a child needs to send its records as *source*."""
        return {ENV_SOCKET: self.path, ENV_SECRET: self.secret, ENV_SOURCE: source}

    # -- lifetime ----------------------------------------------------------------------

    async def __aenter__(self) -> LogServer:
        if self._lifetime is not None:
            raise RuntimeError("a LogServer can be entered only once")
        self._lifetime = self._run()
        await self._lifetime.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._lifetime is not None
        return await self._lifetime.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[None]:
        self._dir = tempfile.mkdtemp(prefix="corral-log-", dir=self._parent_dir)
        try:
            self._path = os.path.join(self._dir, "log.sock")
            self._secret = secrets.token_hex(16)
            listener = await anyio.create_unix_listener(self._path, mode=0o600)
            self._listener = listener
            body_error: BaseException | None = None
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    accept_scope = anyio.CancelScope()
                    accept_done = anyio.Event()
                    tg.start_soon(self._accept_loop, listener, accept_scope, accept_done)
                    try:
                        yield
                    except BaseException as exc:
                        # Kept out of the task group, so that it comes out of the
                        # `async with LogServer` as it went in, not wrapped in a group.
                        body_error = exc
                        await self._close(listener, accept_scope, accept_done, wait=False)
                    else:
                        await self._close(listener, accept_scope, accept_done, wait=True)
                if body_error is not None:
                    raise body_error
            finally:
                # Closed only now that no task can be waiting on it any more.
                with anyio.CancelScope(shield=True):
                    await listener.aclose()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _accept_loop(
        self,
        listener: anyio.abc.SocketListener,
        scope: anyio.CancelScope,
        done: anyio.Event,
    ) -> None:
        warned = False
        try:
            with scope:
                while True:
                    try:
                        stream = await listener.accept()
                    except anyio.BrokenResourceError as exc:
                        cause = exc.__cause__
                        if not (isinstance(cause, OSError) and cause.errno in _OUT_OF_RESOURCES):
                            raise
                        # Out of descriptors (or memory): the connection waits in the
                        # backlog.  Try again shortly, as trio.serve_listeners does;
                        # retrying at once would spin.
                        if not warned:
                            _log.warning(
                                "cannot accept log connections: %s; retrying every %g s",
                                cause,
                                _ACCEPT_RETRY_DELAY,
                            )
                            warned = True
                        await anyio.sleep(_ACCEPT_RETRY_DELAY)
                    else:
                        self._serve_soon(stream)
        finally:
            done.set()

    def _serve_soon(self, stream: anyio.abc.SocketStream) -> None:
        # Registered here, not when the task starts, so that closing never overlooks a
        # connection whose task has not run yet.
        assert self._tg is not None
        conn = _Connection(stream, _peer_pid(stream))
        self._open.add(conn)
        self._tg.start_soon(self._serve, conn)

    async def _close(
        self,
        listener: anyio.abc.SocketListener,
        accept_scope: anyio.CancelScope,
        accept_done: anyio.Event,
        *,
        wait: bool,
    ) -> None:
        with anyio.CancelScope(shield=True):
            # No new connections: without the path nobody can connect any more.
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            accept_scope.cancel()
            await accept_done.wait()
            # Connections that completed before the unlink but were not yet accepted
            # sit in the listener's backlog; serve those too.
            await self._accept_backlog(listener)
        try:
            if wait:
                await self._wait_idle()
        finally:
            # After an error, or a cancellation (possibly during the wait above), keep
            # reading for a bounded time so records already written are not lost.
            with anyio.move_on_after(self.linger, shield=True):
                await self._wait_idle()
            for conn in list(self._open):
                self._warn(
                    conn,
                    f"connection still open {self.linger:g} s after the log server "
                    f"began to close; closing it",
                )
                conn.scope.cancel()

    async def _accept_backlog(self, listener: anyio.abc.SocketListener) -> None:
        raw = listener.extra(SocketAttribute.raw_socket)
        while True:
            try:
                sock, _ = raw.accept()
            except BlockingIOError:  # The backlog is empty.
                return
            except OSError as exc:
                _log.warning("log connections still queued at exit are lost: %s", exc)
                return
            sock.setblocking(False)
            self._serve_soon(await anyio.abc.UNIXSocketStream.from_socket(sock))

    async def drain(self, source: str, pgid: int) -> None:
        """Wait until the connections of a child that has exited have been read to the end.

        Called once the child's process-group leader has exited and the rest of
        its group was killed: every connection that claims *source* (or has not
        said yet) and comes from a process that is gone or still in group *pgid*
        is about to reach end-of-file, after its last record.  Connections the
        kernel has queued but the server has not accepted yet are accepted first.
        A connection from a process that left the group (``setsid``) is not
        waited for: it may stay open for as long as that process lives.
        """
        if self._listener is not None:
            await self._accept_backlog(self._listener)
        while True:
            pending = [
                conn
                for conn in self._open
                if conn.source in (source, None) and _belongs(conn.peer_pid, pgid)
            ]
            if not pending:
                return
            await pending[0].closed.wait()

    async def _wait_idle(self) -> None:
        while self._open:
            self._idle = anyio.Event()
            await self._idle.wait()

    # -- one connection ----------------------------------------------------------------

    async def _serve(self, conn: _Connection) -> None:
        try:
            with conn.scope:
                async with conn.stream:
                    await self._converse(conn)
        except Exception:
            # `deliver` failed: that is a bug in the launcher.  Stop everything and let
            # the task group report it.
            for other in self._open:
                other.scope.cancel()
            raise
        finally:
            self._open.discard(conn)
            conn.closed.set()
            if not self._open and self._idle is not None:
                self._idle.set()

    async def _read(
        self, conn: _Connection, decoder: FrameDecoder
    ) -> tuple[list[Message], str | None, bool]:
        """Read once: the messages completed, a reason to hang up (or None), and EOF."""
        try:
            chunk = await conn.stream.receive(self.receive_size)
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            try:
                decoder.eof()
            except WireError as exc:
                return [], str(exc), True
            return [], None, True
        try:
            return decoder.feed(chunk), None, False
        except WireError as exc:
            return exc.messages, str(exc), False

    async def _converse(self, conn: _Connection) -> None:
        decoder = FrameDecoder(self.max_frame)
        messages: list[Message] = []
        error: str | None = None
        eof = False
        with anyio.move_on_after(self.hello_timeout) as hello_wait:
            while not (messages or error or eof):
                messages, error, eof = await self._read(conn, decoder)
        if hello_wait.cancelled_caught:
            self._warn(conn, f"no hello within {self.hello_timeout:g} s")
            return
        if not messages:
            self._warn(conn, error or "connection closed before the hello")
            return
        hello = messages[0]
        if not isinstance(hello, Hello):
            self._warn(conn, "the first message is not a hello")
            return
        # compare_digest takes str only if it is ASCII: compare the UTF-8 bytes.
        if not hmac.compare_digest(hello.secret.encode(), self.secret.encode()):
            self._warn(conn, "wrong secret")
            return
        conn.source = hello.source
        conn.hello_pid = hello.pid
        del messages[0]

        while True:
            self.records_received += len(messages)
            batch: list[logging.LogRecord] = []
            bad = False
            for msg in messages:
                if not isinstance(msg, Record):
                    bad = True
                    break
                batch.append(self._to_log_record(msg, conn))
            # Deliver in slices, with a checkpoint between them, so that one big
            # read never holds the loop for long.
            for i in range(0, len(batch), _RECORDS_PER_CHECKPOINT):
                part = batch[i : i + _RECORDS_PER_CHECKPOINT]
                if self._deliver_many is not None:
                    await self._deliver_many(part)
                else:
                    for record in part:
                        await self._deliver(record)
                conn.delivered += len(part)
                self.records_delivered += len(part)
                await anyio.lowlevel.checkpoint()
            if bad:
                self._warn(conn, "a second hello on the same connection")
                return
            if error is not None:
                self._warn(conn, f"{error}; closing after {conn.delivered} records")
                return
            if eof:
                return
            if not batch:
                await anyio.lowlevel.checkpoint()
            messages, error, eof = await self._read(conn, decoder)

    @staticmethod
    def _to_log_record(rec: Record, conn: _Connection) -> logging.LogRecord:
        # A dictionary copy of a template instead of LogRecord.__init__ (which looks
        # up the current thread and process, and splits the path, on every call).
        record = logging.LogRecord.__new__(logging.LogRecord)
        fields = record.__dict__
        fields.update(_RECORD_TEMPLATE)
        pathname = rec.pathname
        names = _PATH_NAMES.get(pathname)
        if names is None:
            names = _path_names(pathname)
        created = rec.created
        if not (math.isfinite(created) and abs(created) < _MAX_ABS_CREATED):
            created = time.time()  # Nonsense from the sender: use the arrival time.
        fields["name"] = rec.name
        fields["msg"] = rec.msg
        fields["levelname"] = rec.levelname
        fields["levelno"] = rec.level
        fields["pathname"] = pathname
        fields["filename"], fields["module"] = names
        fields["exc_text"] = rec.exc_text
        fields["stack_info"] = rec.stack_info
        fields["lineno"] = rec.lineno
        fields["funcName"] = rec.func_name or None
        fields["created"] = created
        fields["msecs"] = math.floor((created - math.floor(created)) * 1000)
        fields["relativeCreated"] = (created - _START_TIME) * 1000
        fields["threadName"] = rec.thread_name
        fields["processName"] = rec.process_name
        fields["process"] = rec.pid or conn.hello_pid
        fields["corral_source"] = conn.source
        fields["corral_stream"] = "logging"
        return record

    def _warn(self, conn: _Connection, reason: str) -> None:
        _log.warning(
            "log connection from %s: %s",
            conn.describe(),
            reason,
            extra={
                "corral_peer_pid": conn.peer_pid,
                "corral_peer_source": conn.source,
                "corral_reason": reason,
            },
        )


_RECORD_TEMPLATE: Final = logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__.copy()
_RECORD_TEMPLATE.update(thread=None)
_START_TIME: Final[float] = getattr(logging, "_startTime", 0.0)
_PATH_NAMES: dict[str, tuple[str, str]] = {}


def _path_names(pathname: str) -> tuple[str, str]:
    try:
        filename = os.path.basename(pathname)
        module = os.path.splitext(filename)[0]
    except (TypeError, ValueError, AttributeError):
        filename, module = pathname, "Unknown module"
    if len(_PATH_NAMES) < 1024:
        _PATH_NAMES[pathname] = (filename, module)
    return filename, module


def _belongs(pid: int | None, pgid: int) -> bool:
    """Whether process *pid* is gone (its socket is closing) or still in group *pgid*."""
    return pid is not None and _platform.gone_or_in_group(pid, pgid)


def _peer_pid(stream: anyio.abc.SocketStream) -> int | None:
    """The pid of the process at the other end, as the kernel saw it at connect time."""
    try:
        raw = stream.extra(SocketAttribute.raw_socket)
        creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid: int = _PEERCRED.unpack(creds)[0]
    except (OSError, AttributeError, struct.error, anyio.TypedAttributeLookupError):
        return None
    return pid or None
