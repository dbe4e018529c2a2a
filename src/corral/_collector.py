"""The log collector: a bounded hand-off from the event loop to handler threads.

Everything a child says ends up as a :class:`logging.LogRecord`: lines it
writes to stdout and stderr, records its Python ``logging`` sends over the
wire, and the runner's own lifecycle records.  Producers run on the event
loop; handlers (files, the console) do blocking I/O and must not.  The
collector sits between them:

* producers ``await put(records, size)``; when the records waiting for the
  handlers add up to more than ``max_bytes``, ``put`` waits.  A producer that
  waits stops reading its pipe or socket, so the child blocks in its own
  ``write``: that is backpressure, and memory stays bounded without dropping
  a single record;
* one consumer task takes everything that is waiting in one batch and hands
  the batch to a worker thread (:func:`anyio.to_thread.run_sync`), which
  calls the handlers; the loop thread never touches a file;
* :meth:`close` ends the consumer once everything put before it has been
  handled, which is how the runner guarantees that no record is lost at exit.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

import anyio
import anyio.to_thread

__all__ = ["Collector"]

#: Records waiting for the handlers may add up to this many bytes of text
#: before producers are made to wait.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class Collector:
    """Bounded queue of log records drained by a worker thread."""

    def __init__(
        self,
        dispatch: Callable[[list[logging.LogRecord]], None],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._dispatch = dispatch
        self._max_bytes = max_bytes
        self._queue: deque[logging.LogRecord] = deque()
        self._queued_bytes = 0
        self._sizes: deque[int] = deque()
        self._data = anyio.Event()
        self._space = anyio.Event()
        self._closed = False
        self._idle = anyio.Event()
        self._idle.set()

    @property
    def queued_bytes(self) -> int:
        """Bytes of records waiting for the handlers (for tests and monitoring)."""
        return self._queued_bytes

    async def put(self, records: Iterable[logging.LogRecord], size: int) -> None:
        """Queue ``records`` (about ``size`` bytes in all), waiting while the queue is full."""
        while self._queued_bytes >= self._max_bytes and not self._closed:
            if self._space.is_set():
                self._space = anyio.Event()
            await self._space.wait()
        self.put_nowait(records, size)

    def put_nowait(self, records: Iterable[logging.LogRecord], size: int = 0) -> None:
        """Queue ``records`` without waiting (for the runner's own, rare records)."""
        before = len(self._queue)
        self._queue.extend(records)
        added = len(self._queue) - before
        if not added:
            return
        self._sizes.append(size)
        self._queue.append(_BATCH_END)  # marks where this put's size is accounted
        self._queued_bytes += size
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._data.set()

    async def flushed(self) -> None:
        """Wait until every record queued so far has been handled."""
        while self._queue or not self._idle.is_set():
            await self._idle.wait()

    def close(self) -> None:
        """No more records will come; the consumer ends once the queue is empty."""
        self._closed = True
        self._data.set()
        self._space.set()

    async def run(self) -> None:
        """The consumer: hand batches to a worker thread until closed and drained.

        Runs shielded from cancellation: records already queued are always
        delivered.  It returns once :meth:`close` was called and the queue is
        empty.
        """
        with anyio.CancelScope(shield=True):
            while True:
                if not self._queue:
                    self._idle.set()
                    if self._closed:
                        return
                    self._data = anyio.Event()
                    await self._data.wait()
                    continue
                batch: list[logging.LogRecord] = []
                freed = 0
                queue = self._queue
                while queue:
                    record = queue.popleft()
                    if record is _BATCH_END:
                        freed += self._sizes.popleft()
                    else:
                        batch.append(record)
                if batch:
                    await anyio.to_thread.run_sync(self._dispatch, batch)
                self._queued_bytes -= freed
                self._space.set()


# A sentinel record separating puts inside the queue, so that the bytes of a
# put are released only once all of its records have been handled.
_BATCH_END = logging.LogRecord("corral.batch", 0, "", 0, "", None, None)
