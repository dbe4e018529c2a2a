"""The log collector: a bounded hand-off from the event loop to one worker thread.

Producers run on the event loop: pipe readers queue whole reads of a
child's stdout and stderr, log connections queue whole reads of their
socket, the runner queues its own lifecycle records.  The router (see
:mod:`corral._logs._router`) turns those into lines, files and records, which
takes time proportional to the number of lines and may block on disk or a
terminal, so it runs on a worker thread.  The collector sits between them:

* producers ``await put(chunk)``; when the chunks waiting for the worker add
  up to more than ``max_bytes``, ``put`` waits.  A producer that waits stops
  reading its pipe or socket, so the child blocks in its own ``write``: that
  is backpressure, and memory stays bounded without dropping a single line;
* one consumer task takes *everything* that is waiting as one batch and hands
  it to the worker thread (:func:`anyio.to_thread.run_sync`, with a capacity
  limiter of its own so the application's thread pool cannot starve it).
  While the worker handles one batch, the next one gathers: the hand-offs
  per second stay few however many lines arrive.  A batch that reaches no
  destination (only the ends of pipes whose last line was complete, which
  is what stopping children produces) is handled on the loop instead: it
  calls no handler, and a thread's round trip would be most of a stop's cost;
* what the worker returns for live tails is published on the loop;
* :meth:`close` ends the consumer once everything queued before it was
  handled — but never waits forever: if the worker makes no progress for
  ``stall_timeout`` seconds (a handler blocked on a full disk or a stuck
  pipe), or the runner aborts its exit (a second Ctrl-C), what is left is
  dropped with a warning saying how much.
"""

from __future__ import annotations

import logging
from collections import deque

import anyio
import anyio.to_thread

from .._sys._backend import start_surely
from ._chunks import Chunk, Outcome
from ._router import Router

__all__ = ["Collector"]

#: Chunks waiting for the worker may add up to this many bytes before
#: producers are made to wait.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

#: At exit, give up on the worker after it made no progress for this long.
DEFAULT_STALL_TIMEOUT = 10.0

_log = logging.getLogger("corral")


class Collector:
    """Bounded queue of chunks drained by a worker thread."""

    def __init__(
        self,
        router: Router,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT,
        name: str = "corral",
    ) -> None:
        self._router = router
        self._name = name
        self._max_bytes = max_bytes
        self._stall_timeout = stall_timeout
        self._chunks: deque[Chunk] = deque()
        self._queued_bytes = 0
        self._queued = 0  # chunks ever queued
        self._handled = 0  # chunks ever handled
        self._data = anyio.Event()
        self._space = anyio.Event()
        self._progress = anyio.Event()
        self._closing = anyio.Event()
        self._closed = False
        self._abandoned = False
        self._abort_scope: anyio.CancelScope | None = None
        self._limiter = anyio.CapacityLimiter(1)

    @property
    def router(self) -> Router:
        return self._router

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """The limiter of the one thread that calls the handlers (``LogHub.to_worker_thread``)."""
        return self._limiter

    async def put(self, chunk: Chunk) -> None:
        """Queue ``chunk``, waiting while the queue is full."""
        while self._queued_bytes >= self._max_bytes and not self._closed:
            if self._space.is_set():
                self._space = anyio.Event()
            await self._space.wait()
        self.put_nowait(chunk)

    def put_nowait(self, chunk: Chunk) -> None:
        """Queue ``chunk`` without waiting (for the runner's own, rare records)."""
        if self._abandoned:
            return
        self._chunks.append(chunk)
        self._queued_bytes += chunk.size
        self._queued += 1
        self._data.set()

    def mark(self) -> int:
        """A position in the queue: everything queued so far."""
        return self._queued

    def handled(self, mark: int) -> bool:
        return self._handled >= mark or self._abandoned

    async def wait_handled(self, mark: int) -> None:
        """Wait until everything queued before ``mark`` was taken was handled.

        Returns early, without an error, if the collector gave up on its
        worker (the drop was reported then).
        """
        while not self.handled(mark):
            if self._progress.is_set():
                self._progress = anyio.Event()
            await self._progress.wait()

    def close(self) -> None:
        """No more chunks will come; the consumer ends once the queue is empty."""
        self._closed = True
        self._closing.set()
        self._data.set()
        self._space.set()

    def abort(self) -> None:
        """Stop waiting for the worker now (a second Ctrl-C); drop what is queued."""
        self._closed = True
        if self._abort_scope is not None:
            self._abort_scope.cancel()
        self._data.set()
        self._space.set()

    async def run(self) -> None:
        """The consumer: hand batches to the worker thread until closed and drained.

        Runs shielded from cancellation, so records already queued are
        delivered even when the runner is cancelled; bounded as described in
        the module's docs.
        """
        finished = False
        try:
            with anyio.CancelScope(shield=True) as self._abort_scope:
                while True:
                    if not self._chunks:
                        if self._closed:
                            break
                        self._data = anyio.Event()
                        await self._data.wait()
                        continue
                    batch = list(self._chunks)
                    self._chunks.clear()
                    size = sum(chunk.size for chunk in batch)
                    outcome: Outcome | None
                    if self._router.is_silent(batch):
                        # Nothing to write (the ends of pipes, at a stop): no
                        # hand-over, which would cost a thread's round trip.
                        self._router.process_silent(batch)
                        outcome = Outcome([], [])
                    else:
                        outcome = await self._hand_over(batch)
                    if outcome is None:
                        return
                    for source, first, records in outcome.deliveries:
                        source.publish(first, records)
                    for state in outcome.failed:
                        if state.on_error is not None:
                            state.on_error()
                    self._queued_bytes -= size
                    self._handled += len(batch)
                    self._space.set()
                    self._progress.set()
            finished = not self._chunks and not self._abort_scope.cancelled_caught
        finally:
            if not finished and not self._abandoned:
                # Aborted, or cancelled natively (asyncio.run's final cancel-all):
                # never leave a producer or a waiter hanging.
                self._give_up([], "were stopped before the end")

    async def _hand_over(self, batch: list[Chunk]) -> Outcome | None:
        """Run one batch on the worker thread; ``None`` if it was given up on."""
        result: Outcome | None = None
        stalled = False

        async def work() -> None:
            nonlocal result
            result = await anyio.to_thread.run_sync(
                self._router.process, batch, limiter=self._limiter, abandon_on_cancel=True
            )
            tg.cancel_scope.cancel()

        async def watchdog() -> None:
            # Only once the runner is closing: before that, a slow handler is
            # backpressure, not a reason to drop anything.
            nonlocal stalled
            await self._closing.wait()
            seen = -1
            while seen != self._router.chunks_done:
                seen = self._router.chunks_done
                await anyio.sleep(self._stall_timeout)
            stalled = True
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            await start_surely(
                tg,
                (work, (), f"corral log hand-over {self._name}"),
                (watchdog, (), f"corral log watchdog {self._name}"),
            )
        if stalled:
            self._give_up(batch, f"made no progress for {self._stall_timeout:g} s")
            return None
        return result

    def _give_up(self, batch: list[Chunk], why: str) -> None:
        lost = batch + list(self._chunks)
        self._chunks.clear()
        self._abandoned = True
        self._space.set()
        self._progress.set()
        nbytes = sum(len(chunk.data) for chunk in lost)
        nrecords = sum(len(chunk.records or ()) for chunk in lost)
        if not nbytes and not nrecords:
            return  # nothing was lost: nothing to say
        _log.warning(
            "runner %r: the log handlers %s; dropped %d unhandled reads (%d bytes of output, "
            "%d records) of its children",
            self._name,
            why,
            len(lost),
            nbytes,
            nrecords,
        )
