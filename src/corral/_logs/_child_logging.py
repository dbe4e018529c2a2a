"""The child side of corral's log stream: send this process's :mod:`logging` records home.

A process started by corral finds three variables in its environment:

- ``CORRAL_LOG_SOCKET``: the path of the launcher's Unix socket,
- ``CORRAL_LOG_SECRET``: the secret that proves this process was started by it,
- ``CORRAL_SOURCE``: the name the launcher knows this process by.

:func:`connect` reads them and puts a :class:`CorralLogHandler` on the root logger (or another
logger); from then on every record that reaches that logger is also sent to the
launcher, with its level, logger name, timestamp, message, traceback, pid and thread,
in the format described in ``corral._logs._wire``.  Without those variables :func:`connect` does
nothing, so a script can call it unconditionally and still run on its own.

The handler writes each record to the socket *before the logging call returns*, with
one blocking send from the thread that logged.  There is no queue and no sender thread,
on purpose:

- nothing is lost when the process dies right after logging -- ``os._exit``,
  ``SIGKILL``, a segfault: what the logging call wrote is already in the kernel, and
  the launcher reads it all before it closes the connection;
- nothing piles up: if the launcher falls behind, the socket fills and the logging
  call waits, so the process is slowed down instead of either side's memory growing
  (backpressure, not loss).

The price is a system call per record, a few microseconds.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import warnings
import weakref
from typing import Final

import msgspec

from ._wire import (
    ENCODER,
    ENV_SECRET,
    ENV_SOCKET,
    ENV_SOURCE,
    MAX_FRAME,
    PREFIX,
    PREFIX_SIZE,
    PROTOCOL_VERSION,
    Hello,
    Record,
    encode,
)

__all__ = [
    "ENV_SECRET",
    "ENV_SOCKET",
    "ENV_SOURCE",
    "CorralLogHandler",
    "connect",
]

# Without MSG_NOSIGNAL, writing to a socket whose reader has gone raises SIGPIPE, which
# kills any process that has not set it to "ignore" (Python does, at start-up, but an
# embedding application may not have).  With it the write just fails with EPIPE.
_SEND_FLAGS: Final = getattr(socket, "MSG_NOSIGNAL", 0)

_default_formatter: Final = logging.Formatter()
# A record is encoded as the array a `Record` encodes to, tag first, without
# building one, into a reused buffer after room for the length prefix, which is
# then written in place: the frame of corral._logs._wire, with no allocation.
_encode_into: Final = ENCODER.encode_into
_pack_prefix: Final = PREFIX.pack_into


class CorralLogHandler(logging.Handler):
    """A :class:`logging.Handler` that sends every record to a corral launcher.

    Constructing it connects to the Unix socket at *path* and sends the hello; an
    :exc:`OSError` from that propagates.  Usually you do not construct it yourself: call
    :func:`connect`.

    `emit` formats the record -- ``record.getMessage()``, and the traceback with this
    handler's formatter (:class:`logging.Formatter` if none was set) when the record carries
    exception information -- and writes it as one frame with a blocking send, from the
    calling thread, under the handler's lock.  A message too big for one frame is cut in
    the middle, with a note saying how much was left out.

    If the launcher has gone away (the send fails with, say, ``EPIPE``), the handler
    reports that once through :meth:`logging.Handler.handleError` and then drops every later
    record silently; the process carries on.  In a process created by ``os.fork``, the
    handler leaves its parent's connection alone and opens its own, with the new pid,
    the first time it is used.  If an exception (``KeyboardInterrupt``, say) interrupts
    a send, that record is dropped along with the connection, whose stream may now end
    in half a frame; the next record goes over a new connection.  The launcher keeps
    the order of records within a connection, not across two.
    """

    def __init__(self, path: str, secret: str, source: str, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.path: Final = path
        self.secret: Final = secret
        self.source: Final = source
        self._sock: socket.socket | None = None
        self._broken = False  # set when the launcher is gone: drop records from then on
        self._closed = False
        self._buffer = bytearray()  # reused for every frame, under _send_lock
        self._send_lock = threading.Lock()
        self._pid = os.getpid()
        self._sock = self._open()
        _live_handlers.add(self)

    def _open(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            hello = Hello(
                v=PROTOCOL_VERSION, secret=self.secret, source=self.source, pid=os.getpid()
            )
            sock.sendall(encode(hello), _SEND_FLAGS)
        except BaseException:
            sock.close()
            raise
        return sock

    def handle(self, record: logging.LogRecord) -> bool:
        # This runs once per logging call, so it is one flat function: the filter
        # machinery only when there are filters, the record's fields straight into
        # a reused buffer, one send, under a plain lock of our own.
        if self.filters and not self.filter(record):
            return False
        if self._broken:
            return True
        try:
            msg = record.getMessage() if record.args else record.msg
            if type(msg) is not str:
                msg = str(msg)
            if record.exc_info and not record.exc_text:
                # Formatter.format caches the traceback the same way.
                formatter = self.formatter or _default_formatter
                record.exc_text = formatter.formatException(record.exc_info)
            fields = (
                "record",
                record.created,
                record.levelno,
                record.levelname,
                record.name,
                msg,
                record.exc_text or None,
                record.stack_info or None,
                record.process or self._pid,
                record.threadName or "",
                record.processName or "",
                record.pathname or "",
                record.lineno or 0,
                record.funcName or "",
            )
        except RecursionError:
            raise
        except Exception:
            # A bad format string, a __str__ that raises: the usual logging mishaps.
            self.handleError(record)
            return True
        with self._send_lock:
            buffer = self._buffer
            try:
                _encode_into(fields, buffer, PREFIX_SIZE)
                size = len(buffer) - PREFIX_SIZE
                _pack_prefix(buffer, 0, size)
                frame: bytes | bytearray = buffer
                if size > MAX_FRAME:
                    frame = self._slow_frame(record, msg)
            except (UnicodeEncodeError, TypeError, OverflowError):
                try:
                    frame = self._slow_frame(record, msg)
                except Exception:
                    self.handleError(record)
                    return True
            sock = self._sock
            if sock is not None and frame is buffer:
                # The usual case, inline: one send takes the whole frame.
                try:
                    sent = sock.send(buffer, _SEND_FLAGS)
                except OSError:
                    sent = 0  # _send below meets the error again, and reports it
                except BaseException:
                    self._drop_socket()
                    raise
                if sent == size + PREFIX_SIZE:
                    return True
                frame = bytes(buffer[sent:])  # rare: no view may pin the reused buffer
            self._send(frame, record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record (``handle`` does it all; this is for direct callers)."""
        self.handle(record)

    def _send(self, frame: bytes | bytearray, record: logging.LogRecord) -> None:
        # Called with self._send_lock held.
        try:
            sock = self._sock
            if sock is None:
                # First record since a fork, or since a send was interrupted.
                sock = self._sock = self._open()
            sent = sock.send(frame, _SEND_FLAGS)
            if sent != len(frame):
                # Rare: a large frame and a full socket.  Finish the job.
                sock.sendall(memoryview(frame)[sent:], _SEND_FLAGS)
        except OSError:
            # The launcher is gone (EPIPE, ECONNRESET), or never was (after a fork).
            self._broken = True
            self._drop_socket()
            self.handleError(record)
        except BaseException:
            # Interrupted (KeyboardInterrupt, SystemExit from a signal handler...)
            # while blocked in a send: part of the frame may be on the wire, and the
            # stream is out of step.  Abandon this connection (the launcher delivers
            # what came before and notes the cut-off frame); the next record opens a
            # fresh one.
            self._drop_socket()
            raise

    def _slow_frame(self, record: logging.LogRecord, msg: str) -> bytes:
        """The frame of a record that needs care: odd types, lone surrogates, too big."""
        rec = Record(
            created=float(record.created),
            level=int(record.levelno),
            levelname=str(record.levelname),
            name=str(record.name),
            msg=msg,
            exc_text=str(record.exc_text) if record.exc_text else None,
            stack_info=str(record.stack_info) if record.stack_info else None,
            pid=int(record.process or self._pid),
            thread_name=str(record.threadName or ""),
            process_name=str(record.processName or ""),
            pathname=str(record.pathname or ""),
            lineno=int(record.lineno or 0),
            func_name=str(record.funcName or ""),
        )
        try:
            frame = encode(rec)
        except UnicodeEncodeError:
            # Lone surrogates (say, from a file name decoded with surrogateescape)
            # cannot be UTF-8; show them as \udcxx escapes rather than lose the record.
            rec = _clean_strings(rec)
            frame = encode(rec)
        if len(frame) - 4 > MAX_FRAME:
            frame = encode(_shrink(rec, MAX_FRAME))
        return frame

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _after_fork_in_child(self) -> None:
        # The socket is shared with the parent: close our copy of the descriptor (the
        # parent's connection is unaffected) and connect afresh when next needed.
        # logging re-creates the handler's lock in the child before this runs.
        self._send_lock = threading.Lock()
        self._pid = os.getpid()
        self._drop_socket()
        self._broken = self._closed

    def close(self) -> None:
        with self._send_lock:
            self._drop_socket()
            self._broken = self._closed = True
        _live_handlers.discard(self)
        super().close()

    def __repr__(self) -> str:
        level = logging.getLevelName(self.level)
        return f"<{type(self).__name__} {self.source!r} -> {self.path} ({level})>"


def connect(
    level: int = logging.NOTSET, *, logger: logging.Logger | None = None, stacklevel: int = 2
) -> CorralLogHandler | None:
    """Send this process's log records to the corral launcher that started it.

    If the environment names a launcher's log socket (``CORRAL_LOG_SOCKET`` and
    ``CORRAL_LOG_SECRET``), connect to it, add a :class:`CorralLogHandler` at *level* to
    *logger* (the root logger by default) and return the handler.  Otherwise do nothing
    and return ``None``.

    Calling it again does not add a second handler: it returns the one already on that
    logger, with its level set to *level*.

    The logger's own level still filters records before any handler sees them; the root
    logger's default is ``WARNING``.  So if *level* is given and is below the logger's
    effective level, the logger's level is lowered to *level*: ``connect(logging.INFO)``
    makes ``logging.info(...)`` reach the launcher.  With the default ``NOTSET`` the
    logger's level is left alone.

    If the socket cannot be reached, a :exc:`RuntimeWarning` says so and ``None`` is
    returned: losing the logs is no reason to stop the program.
    """
    path = os.environ.get(ENV_SOCKET)
    secret = os.environ.get(ENV_SECRET)
    if not path or secret is None:
        return None
    source = os.environ.get(ENV_SOURCE, "")
    target = logger if logger is not None else logging.getLogger()
    with _connect_lock:
        handler = next((h for h in target.handlers if isinstance(h, CorralLogHandler)), None)
        if handler is None:
            try:
                handler = CorralLogHandler(path, secret, source, level)
            except OSError as exc:
                warnings.warn(
                    f"corral: cannot send log records to the launcher at {path!r}: {exc}",
                    RuntimeWarning,
                    stacklevel=stacklevel,
                )
                return None
            target.addHandler(handler)
        else:
            handler.setLevel(level)
        if level != logging.NOTSET and target.getEffectiveLevel() > level:
            target.setLevel(level)
    return handler


def _clean_strings(rec: Record) -> Record:
    changes: dict[str, str] = {}
    for field in rec.__struct_fields__:
        value = getattr(rec, field)
        if isinstance(value, str):
            changes[field] = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return msgspec.structs.replace(rec, **changes)


_TEXT_FIELDS: Final = ("msg", "exc_text", "stack_info")


def _shrink(rec: Record, limit: int) -> Record:
    """Cut the longest text fields of *rec* until its payload fits in *limit* bytes."""
    while (excess := len(encode(rec)) - 4 - limit) > 0:
        sizes = {f: len((getattr(rec, f) or "").encode("utf-8")) for f in _TEXT_FIELDS}
        field = max(sizes, key=sizes.__getitem__)
        if sizes[field] == 0:
            # Only the small fields are left; they cannot be this big with a sane
            # limit.  Give up on the details rather than loop.
            return Record(
                created=rec.created,
                level=rec.level,
                levelname=rec.levelname[:100],
                name=rec.name[:1000],
                msg="[corral: record too large to send]",
                pid=rec.pid,
            )
        text = getattr(rec, field)
        rec = msgspec.structs.replace(rec, **{field: _cut(text, excess + 100)})
    return rec


def _cut(text: str, drop: int) -> str:
    """Remove at least *drop* UTF-8 bytes from the middle of *text*, noting it."""
    data = text.encode("utf-8")
    keep = max(len(data) - drop, 0)
    head = data[: keep // 2].decode("utf-8", "ignore")
    tail = data[len(data) - (keep - keep // 2) :].decode("utf-8", "ignore")
    removed = len(data) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    return f"{head}\n[corral: {removed} bytes cut]\n{tail}"


_connect_lock: Final = threading.Lock()
_live_handlers: Final[weakref.WeakSet[CorralLogHandler]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handler in list(_live_handlers):
        handler._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # pragma: no branch - always there on Unix
    os.register_at_fork(after_in_child=_after_fork_in_child)
