"""A runner's log service: where every line and record of its children goes.

The path a line takes reads top-down through the modules:

1. a child writes to its stdout or stderr pipe, or sends a record over the
   runner's log socket (:mod:`corral._core._pipes`, :mod:`corral._logs._server`);
2. the loop reads whole blocks and queues them, bounded, in the collector
   (:mod:`corral._logs._collector`), which hands them to one worker thread in
   batches;
3. the router (:mod:`corral._logs._router`) turns blocks into lines and records and
   writes them to the run's files, the console and your handlers; live tails
   (:mod:`corral._logs._sources`) get their records back on the loop.

:class:`LogHub` owns those parts for one runner: it makes the run's log folder,
builds the router from the runner's options, runs the collector and the log
server in the runner's task group, and gives each child its source, its
stream states and the environment that lets it reach the socket.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

import anyio
import anyio.to_thread

from .._sys import _childenv
from .._sys._backend import outlast_native_cancel
from ._chunks import FRAMES, LINES, RECORDS, Chunk, StreamState
from ._collector import Collector
from ._console import ConsoleHandler
from ._records import make_record
from ._route import Route
from ._router import Router
from ._server import LogServer
from ._sinks import LogFiles
from ._sources import Backlogs, Source

if TYPE_CHECKING:
    from ._wire import Record

__all__ = ["Forwarder", "LogHub", "routes_of"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class LogHub:
    """The log service of one runner (see the module's docs)."""

    def __init__(
        self,
        runner_name: str,
        *,
        routes: Sequence[Route],
        console: bool,
        log_dir: str | None,
        propagate: bool,
    ) -> None:
        self._runner_name = runner_name
        self._routes = list(routes)
        self._owned: list[logging.Handler] = []
        if console:
            handler = ConsoleHandler()
            handler.setLevel(logging.INFO)
            self._routes.append(Route(handler))
            self._owned.append(handler)
        self._log_dir = log_dir
        self._propagate = propagate
        self._sources: dict[str, Source] = {}
        #: The backlogs of every source, bounded together.
        self._backlogs = Backlogs()
        self.log_path: str | None = None
        self._files: LogFiles | None = None
        self._said_losses: str | None = None
        self.router: Router
        self.collector: Collector
        self.server: LogServer
        self._runner_state: StreamState
        self._server_done = anyio.Event()
        self._state_lock = threading.Lock()
        self._started = False
        self._prepared = False
        self._abandoned = False
        self._undone = False
        self._finished = threading.Event()

    # -- entry and exit -------------------------------------------------------------------

    def prepare(self) -> None:
        """Make the log folder and files, bind the socket (blocking: run it in a thread).

        If the runner's entry was abandoned meanwhile (a native asyncio
        cancellation can cut the wait for this thread short), this call
        undoes its own work at the end instead, and :meth:`abandon` waits for
        that.
        """
        with self._state_lock:
            if self._abandoned:
                return
            self._started = True
        try:
            if self._log_dir is not None:
                self.log_path = _make_run_folder(self._log_dir, self._runner_name)
                self._files = LogFiles(self.log_path)
                self._routes.append(Route(self._files))
                self._owned.append(self._files)
            self.router = Router(
                self._runner_name, self._routes, propagate=self._propagate, backlogs=self._backlogs
            )
            if self._files is not None:
                self._files.warn = self.router.warn
            self.collector = Collector(self.router, name=self._runner_name)
            self._runner_state = StreamState(
                self.router.runner_source, RECORDS, None, 0, os.getpid()
            )
            self.server = LogServer(self.collector, self.source_for_wire, warn=self.warn)
            self.server.listen()
            with self._state_lock:
                self._prepared = True
                abandoned = self._abandoned
            if abandoned:
                self._undo_blocking()
        except BaseException:
            self.close_blocking()
            raise
        finally:
            self._finished.set()

    async def abandon(self) -> None:
        """The runner's entry failed: undo :meth:`prepare`, or wait until it undid itself."""
        with self._state_lock:
            self._abandoned = True
            started, prepared = self._started, self._prepared
        if prepared:
            await outlast_native_cancel(lambda: anyio.to_thread.run_sync(self._undo_blocking))
        elif started:
            await outlast_native_cancel(lambda: anyio.to_thread.run_sync(self._finished.wait))

    def _undo_blocking(self) -> None:
        with self._state_lock:
            if self._undone:
                return
            self._undone = True
        self.server.close()
        self.close_blocking()

    async def serve(self, until: anyio.Event) -> None:
        """Run the log server until ``until`` (every child gone), then close the collector."""
        try:
            with anyio.CancelScope(shield=True):
                await self.server.serve(until)
        finally:
            self.collector.close()
            self._server_done.set()

    def abort(self) -> None:
        """Drop what the exit still waits for (a second Ctrl-C)."""
        self.server.abort()
        self.collector.abort()

    def has_handlers(self) -> bool:
        """Whether :meth:`close_blocking` has any handler to flush or close."""
        router = getattr(self, "router", None)
        return bool(self._owned) or router is None or bool(router.handlers)

    def close_blocking(self) -> None:
        """Flush every handler and close the runner's own (blocking: run it in a thread)."""
        router = getattr(self, "router", None)
        if router is not None:
            if self._files is not None:
                self._files.flush()  # what the files still hold: written, or counted
            self._say_losses()  # the runner's own last word, while every handler is open
            router.close(self._owned)
        else:
            for handler in self._owned:
                handler.close()

    async def report_losses(self) -> None:
        """Say now (a WARNING of the runner's) what the log files missed, if anything.

        For the monitor, whose clients are told before it ends; said again at
        the close only if more was lost since.  In the thread of the handlers,
        between two batches; given up on with the caller's cancellation.
        """
        if self._files is not None:
            await anyio.to_thread.run_sync(
                self._say_losses, limiter=self.collector.limiter, abandon_on_cancel=True
            )

    def _say_losses(self) -> None:
        losses = self._files.losses() if self._files is not None else None
        if losses is not None and losses != self._said_losses:
            self._said_losses = losses
            self.router.warn(losses)

    @property
    def lines_lost(self) -> int:
        """The lines and records the run's log files could not write (a full disk)."""
        return self._files.missed if self._files is not None else 0

    # -- sources --------------------------------------------------------------------------

    def source(self, relative: str) -> Source:
        """The source of a child named ``relative`` (the same object across restarts)."""
        name = f"{self._runner_name}.{relative}"
        source = self._sources.get(name)
        if source is None:
            source = self._sources[name] = Source(name, relative, self._backlogs)
        else:
            source.restart()
        return source

    def source_for_wire(self, name: str) -> Source | None:
        """The source a log connection names in its hello (made if it is new)."""
        source = self._sources.get(name)
        if source is None:
            prefix = self._runner_name + "."
            relative = name[len(prefix) :] if name.startswith(prefix) else name
            if len(self._sources) >= 100_000:
                return None
            source = self._sources[name] = Source(name, relative, self._backlogs)
        return source

    def sources(self) -> list[Source]:
        return list(self._sources.values())

    def lines(self, source: Source, stream: str, pid: int) -> StreamState:
        """The worker-side state of one captured pipe of a child."""
        level = logging.INFO if stream == "stdout" else logging.WARNING
        return StreamState(source, LINES, stream, level, pid)

    def child_env(self, source: Source) -> dict[bytes, bytes]:
        """The variables a child needs to send its records under ``source``."""
        env = self.server.env()
        env[_childenv.SOURCE.encode()] = source.name.encode()
        return env

    # -- the runner's own records -----------------------------------------------------------

    def log(self, level: int, message: str) -> None:
        """A lifecycle record of the runner (from the loop; never waits)."""
        if not self.router.wants(level):
            return
        record = make_record(self._runner_name, level, message)
        self.collector.put_nowait(Chunk(self._runner_state, records=[record]))

    def warn(self, message: str) -> None:
        self.log(logging.WARNING, message)

    # -- waiting ----------------------------------------------------------------------------

    async def drain(self, source: Source, pgid: int) -> None:
        await self.server.drain(source, pgid)

    async def delivered(self, mark: int) -> None:
        """Wait until everything queued before ``mark`` reached the handlers (bounded)."""
        await self.collector.wait_handled(mark)

    async def to_worker_thread(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` in the thread that calls the handlers, between two batches."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.collector.limiter)

    # -- what other hosts send ------------------------------------------------------------

    def forwarder(self) -> Forwarder:
        """Where a launch hands what its agents on other hosts forward (one per launch)."""
        return Forwarder(self)


class Forwarder:
    """Lines and records that agents on other hosts forward, into this runner's log path.

    Each source within the runner (``agent-0.worker-3``) and stream gets one
    stream state, made at its first message (whose level it keeps) and kept
    for the launch.
    """

    def __init__(self, hub: LogHub) -> None:
        self._hub = hub
        self._states: dict[tuple[str, str], StreamState] = {}

    async def lines(
        self, relative: str, stream: str, level: int, created: float, text: bytes, *, peer: str
    ) -> None:
        state = self._state(relative, stream, LINES, level, peer)
        await self._hub.collector.put(Chunk(state, text, created))

    async def records(self, relative: str, records: list[Record], *, peer: str) -> None:
        state = self._state(relative, "logging", FRAMES, 0, peer)
        await self._hub.collector.put(Chunk(state, wire=records))

    def warn(self, message: str) -> None:
        self._hub.warn(message)

    def _state(self, relative: str, stream: str, kind: str, level: int, peer: str) -> StreamState:
        key = (relative, stream)
        state = self._states.get(key)
        if state is None:
            src = self._hub.source(relative)
            state = StreamState(src, kind, stream, level, 0, peer=peer)
            self._states[key] = state
        return state


def _make_run_folder(log_dir: str, runner_name: str) -> str:
    """Create ``<log_dir>/<YYYYmmdd-HHMMSS>-<runner>`` (with a suffix if taken)."""
    os.makedirs(log_dir, exist_ok=True)
    base = os.path.join(log_dir, time.strftime("%Y%m%d-%H%M%S") + f"-{runner_name}")
    path, n = base, 1
    while True:
        try:
            os.mkdir(path)
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"
            continue
        return path


def routes_of(handlers: object) -> list[Route]:
    """A runner's ``handlers=`` (a handler, a :class:`Route` or a sequence of them) as routes."""
    if isinstance(handlers, (logging.Handler, Route)):
        handlers = [handlers]
    routes = []
    for handler in handlers:  # type: ignore[attr-defined]
        if isinstance(handler, Route):
            routes.append(handler)
        elif isinstance(handler, logging.Handler):
            routes.append(Route(handler))
        else:
            raise TypeError(f"handlers: {handler!r} is neither a logging.Handler nor a Route")
    return routes
