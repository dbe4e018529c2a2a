"""The loop side of a child's pipes: reading stdout and stderr, writing stdin.

Each pipe's read end is non-blocking, and the loop only ever waits until it
is readable (an ordinary readiness wait: no thread, no polling) and then
takes one read of up to :data:`CHUNK` bytes.  What happens to those bytes
depends on the option the stream was started with:

* ``LOG``: the whole read goes to the collector as one chunk; lines and
  records are made from it on the collector's worker thread, never here.
* ``PIPE``: the :class:`Process` offers the pipe itself as an AnyIO byte
  stream (:class:`PipeReceiveStream`); no reader task is involved.
  (:meth:`Runner.run` reads it to the end, as :func:`anyio.run_process` does.)
* ``LOG | PIPE``: both — logged, and offered as a stream
  (:class:`BufferedReceiveStream`).

Three details matter:

* **No starvation.** A pipe that always has data would never let the loop
  run anything else, so the reader yields to the loop after every read.
* **No deadlock, no unbounded memory.** The reader keeps reading while the
  child writes, so the child never blocks on a full pipe — unless the
  collector, a live tail or an unread ``LOG | PIPE`` stream is full, in which
  case the reader waits and the child blocks: backpressure, not loss.  Only
  while the child runs: a child that is stopping is read to the end.
* **Nothing lost at exit.** Once the child's process has exited the runner
  calls :meth:`PipeReader.finish`: the reader stops waiting and reads
  everything still in the pipe, including a last line without a newline.  It
  does not wait for end-of-file then, because a process that escaped the
  child's process group may hold the pipe open forever.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream, ByteSendStream

from .._logs._chunks import Chunk, StreamState
from .._logs._collector import Collector

__all__ = [
    "CHUNK",
    "BufferedReceiveStream",
    "PipeReader",
    "PipeReceiveStream",
    "PipeSendStream",
]

#: Bytes read from a pipe at a time (a pipe holds 64 KiB).
CHUNK = 64 * 1024

_EMPTY = object()
_EOF = object()

#: An unread ``LOG | PIPE`` stream of :meth:`Runner.start` holds this much
#: before the child is slowed down.
STREAM_BUFFER = 256 * 1024


class PipeReader:
    """Reads one pipe of a child: to the log and/or to a stream."""

    def __init__(
        self,
        fd: int,
        *,
        collector: Collector,
        state: StreamState | None = None,
        stream: BufferedReceiveStream | None = None,
        tail_bytes: int = 0,
    ) -> None:
        self.fd = fd
        self._collector = collector
        self._state = state
        self._stream = stream
        self._tail_bytes = tail_bytes
        #: The last ``tail_bytes`` bytes read (for a failure's stderr tail).
        self.tail = bytearray()
        self._finishing = False
        self._stopping = False
        self._wait_scope: anyio.CancelScope | None = None
        self._room_scope: anyio.CancelScope | None = None
        os.set_blocking(fd, False)

    def finish(self) -> None:
        """The child has exited: read what is left in the pipe, then stop."""
        self._finishing = True
        self.stopping()
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def stopping(self) -> None:
        """The child is being stopped: no more backpressure, keep reading what it writes."""
        self._stopping = True
        if self._room_scope is not None:
            self._room_scope.cancel()

    async def run(self) -> None:
        """Read until end-of-file, or until :meth:`finish` and the pipe is empty."""
        try:
            while True:
                if not self._stopping:
                    await self._wait_for_room()
                # Read first, wait only when the pipe is empty: during a burst the
                # data is there already, and a readiness wait costs more than a read.
                outcome = await self._read_once()
                if outcome is _EOF:
                    return
                if outcome is _EMPTY:
                    if self._finishing:
                        return  # read dry after the exit: done
                    with anyio.CancelScope() as self._wait_scope:
                        await anyio.wait_readable(self.fd)
                    self._wait_scope = None
                else:
                    await anyio.lowlevel.checkpoint()
        finally:
            await self._end()

    async def _wait_for_room(self) -> None:
        """Wait while a live tail or an unread stream of this child is full."""
        while not self._stopping:
            room: anyio.Event | None = None
            if self._state is not None:
                event = self._state.source.room_event()
                if not event.is_set():
                    room = event
            if room is None and self._stream is not None and not self._stream.has_room():
                room = self._stream.room
            if room is None:
                return
            with anyio.CancelScope() as self._room_scope:
                await room.wait()
            self._room_scope = None

    async def _read_once(self) -> object:
        """One read: the data, or ``_EMPTY``, or ``_EOF``."""
        try:
            data = os.read(self.fd, CHUNK)
        except BlockingIOError:
            return _EMPTY
        if not data:
            return _EOF
        if self._tail_bytes:
            tail = self.tail
            tail += data
            if len(tail) > self._tail_bytes:
                del tail[: len(tail) - self._tail_bytes]
        if self._stream is not None:
            self._stream.feed(data)
        if self._state is not None:
            await self._collector.put(Chunk(self._state, data, time.time()))
        return data

    async def _end(self) -> None:
        if self._state is not None:
            with anyio.CancelScope(shield=True):
                await self._collector.put(Chunk(self._state, b"", time.time(), final=True))
        if self._stream is not None:
            self._stream.end()


class BufferedReceiveStream(ByteReceiveStream):
    """The bytes of a ``LOG | PIPE`` stream of a started child, as the reader saw them."""

    def __init__(self, registry: set[Any], limit: int = STREAM_BUFFER) -> None:
        self._registry = registry
        registry.add(self)
        self._buffer: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        self._data = anyio.Event()
        self._room = anyio.Event()
        self._room.set()
        self._ended = False
        self._closed = False

    def feed(self, data: bytes) -> None:
        if self._closed:
            return
        self._buffer.append(data)
        self._size += len(data)
        self._data.set()
        if self._size >= self._limit and self._room.is_set():
            self._room = anyio.Event()

    def has_room(self) -> bool:
        return self._room.is_set()

    @property
    def room(self) -> anyio.Event:
        """Set while the buffer has room."""
        return self._room

    def end(self) -> None:
        self._ended = True
        self._data.set()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        while not self._buffer:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._ended:
                raise anyio.EndOfStream
            self._data = anyio.Event()
            await self._data.wait()
        if self._closed:
            raise anyio.ClosedResourceError
        data = self._buffer.popleft()
        if len(data) > max_bytes:
            self._buffer.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        self._size -= len(data)
        if self._size < self._limit:
            self._room.set()
        await anyio.lowlevel.checkpoint()
        return data

    async def aclose(self) -> None:
        self.close()
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        self._closed = True
        self._registry.discard(self)
        self._buffer.clear()
        self._size = 0
        self._data.set()
        self._room.set()


class _PipeEnd:
    """A pipe descriptor of ours, non-blocking, listed in the runner's registry until closed.

    The registry holds what is still open, so that the runner can close
    what its user left open once every child has exited.
    """

    def __init__(self, fd: int, registry: set[Any]) -> None:
        self._fd = fd
        self._registry = registry
        registry.add(self)
        self._closed = False
        os.set_blocking(fd, False)

    async def aclose(self) -> None:
        self.close()
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._registry.discard(self)
            anyio.notify_closing(self._fd)
            os.close(self._fd)


class PipeReceiveStream(_PipeEnd, ByteReceiveStream):
    """The read end of a child's stdout or stderr pipe (``PIPE`` with :meth:`Runner.start`).

    Ends (:class:`anyio.EndOfStream`) at end-of-file, or once the child has
    exited and the pipe is empty, so that a descendant holding the pipe
    open cannot make a reader wait forever.
    """

    def __init__(self, fd: int, registry: set[Any]) -> None:
        super().__init__(fd, registry)
        self._exited = False
        self._scope: anyio.CancelScope | None = None

    def child_exited(self) -> None:
        self._exited = True
        if self._scope is not None:
            self._scope.cancel()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                if self._exited:
                    raise anyio.EndOfStream from None
                with anyio.CancelScope() as self._scope:
                    await anyio.wait_readable(self._fd)
                self._scope = None
                continue
            if not data:
                raise anyio.EndOfStream
            await anyio.lowlevel.checkpoint()
            return data


class PipeSendStream(_PipeEnd, ByteSendStream):
    """The write end of a child's stdin pipe (``stdin=PIPE``)."""

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            except BrokenPipeError:
                raise anyio.BrokenResourceError from None
            view = view[written:]
            if not view:
                break
        await anyio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await self.aclose()
