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
import sys
import traceback
from collections import deque
from collections.abc import Callable, Sequence

import anyio
import anyio.to_thread

__all__ = ["Collector"]

#: Records waiting for the handlers may add up to this many (estimated)
#: bytes before producers are made to wait.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

#: What a queued record costs beyond its text: the LogRecord object and its
#: attribute dictionary.
RECORD_OVERHEAD = 600


class Collector:
    """Bounded queue of log records drained by a worker thread."""

    def __init__(
        self,
        dispatch: Callable[[list[logging.LogRecord]], None],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_level: float = 0,
    ) -> None:
        #: Records below this level would reach no handler: producers skip
        #: building them at all.
        self.min_level = min_level
        self._dispatch = dispatch
        self._max_bytes = max_bytes
        self._chunks: deque[tuple[Sequence[logging.LogRecord], int]] = deque()
        self._queued_bytes = 0
        self._queued_chunks = 0  # chunks ever queued
        self._handled_chunks = 0  # chunks ever handled
        self._data = anyio.Event()
        self._space = anyio.Event()
        self._progress = anyio.Event()
        self._closed = False

    @property
    def queued_bytes(self) -> int:
        """Estimated bytes of the records waiting for the handlers."""
        return self._queued_bytes

    async def put(self, records: Sequence[logging.LogRecord], size: int) -> None:
        """Queue ``records`` (``size`` bytes of text), waiting while the queue is full."""
        while self._queued_bytes >= self._max_bytes and not self._closed:
            if self._space.is_set():
                self._space = anyio.Event()
            await self._space.wait()
        self.put_nowait(records, size)

    def put_nowait(self, records: Sequence[logging.LogRecord], size: int = 0) -> None:
        """Queue ``records`` without waiting (for the runner's own, rare records)."""
        if not records:
            return
        cost = size + RECORD_OVERHEAD * len(records)
        self._chunks.append((records, cost))
        self._queued_bytes += cost
        self._queued_chunks += 1
        self._data.set()

    def mark(self) -> int:
        """A position in the queue: everything queued so far."""
        return self._queued_chunks

    async def wait_handled(self, mark: int) -> None:
        """Wait until everything queued before ``mark`` was taken was handled."""
        while self._handled_chunks < mark:
            if self._progress.is_set():
                self._progress = anyio.Event()
            await self._progress.wait()

    def close(self) -> None:
        """No more records will come; the consumer ends once the queue is empty."""
        self._closed = True
        self._data.set()
        self._space.set()

    async def run(self) -> None:
        """The consumer: hand batches to a worker thread until closed and drained.

        Runs shielded from cancellation: records already queued are always
        delivered.  It returns once :meth:`close` was called and the queue is
        empty.  A handler that raises is reported on stderr (as
        :meth:`logging.Handler.handleError` does) and does not stop delivery.
        """
        with anyio.CancelScope(shield=True):
            while True:
                if not self._chunks:
                    if self._closed:
                        return
                    self._data = anyio.Event()
                    await self._data.wait()
                    continue
                chunks = self._chunks
                self._chunks = deque()
                batch = [record for records, _ in chunks for record in records]
                try:
                    await anyio.to_thread.run_sync(self._dispatch, batch)
                except Exception:
                    traceback.print_exc(file=sys.stderr)
                self._queued_bytes -= sum(cost for _, cost in chunks)
                self._handled_chunks += len(chunks)
                self._space.set()
                self._progress.set()
