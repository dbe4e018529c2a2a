"""A runner's scope: its task group, and the services that live exactly as long as it.

Entering a runner opens, in this order, its log service (the log folder, the
socket), its lifeline, its signal subscription and its task group, then
starts the services that run in that group: the collector, the log server,
the lifeline's watch and the monitor.  Leaving it waits for the children (or
stops them, on error or cancellation), then closes everything in reverse; a
failure half-way in undoes what was opened.  See :mod:`corral._core._runner`
for the rules.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import ModuleType, TracebackType

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from .._logs._hub import LogHub, protected_modules
from .._monitor._serve import serve as serve_monitor
from .._monitor._server import Monitor
from .._sys import _backend, _platform
from . import _signals
from ._lifeline import Lifeline
from ._spawn import Spawner
from ._supervisor import ProcessServices
from ._token import LoopToken

__all__ = ["Scope"]


class Scope:
    """The task group of one runner and the services around it (see the module's docs).

    ``live_count`` tells how many children run.  :attr:`tg`,
    :attr:`services` and :attr:`signals` are there once entered;
    :attr:`closing` once the exit began, and :attr:`children_done` is set
    once the exit began and every child is gone.
    """

    def __init__(
        self,
        name: str,
        *,
        hub: LogHub,
        lifeline: Lifeline,
        monitor: Monitor | None,
        handle_signals: bool | None,
        live_count: Callable[[], int],
    ) -> None:
        self._name = name
        self._hub = hub
        self._lifeline = lifeline
        self._monitor = monitor
        self._handle_signals = handle_signals
        self._live_count = live_count
        self.token: LoopToken | None = None
        self.tg: TaskGroup | None = None
        self.closing = False
        self._aborted = False
        self.children_done = anyio.Event()
        self.signals: _signals.Subscription | None = None
        self._signal_pending = False
        self.services: ProcessServices | None = None
        self._host_hold: _backend.HostHold | None = None

    async def enter(self) -> None:
        """Open the log service, the lifeline, the signals, the task group and its services."""
        _platform.require_pidfd()
        token = LoopToken.current()
        if token.backend == "trio":
            _backend.protect_on_trio(_protected_modules())
        self.token = token
        hub = self._hub
        entered: list[str] = []
        try:
            entered.append("hub")
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(hub.prepare)
            self._lifeline.start()
            entered.append("lifeline")
            self._lifeline.add_folder(hub.server.folder)
            self.signals = _signals.subscribe(
                self._name, self._handle_signals, token.loop, self._on_signal, self._abort
            )
            entered.append("signals")
            spawner = Spawner(self._name, self._lifeline, hub.log, self._live_count)
            tg = anyio.create_task_group()
            await tg.__aenter__()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._undo_entry(entered)
            raise
        self.tg = tg
        self.services = ProcessServices(
            token=token,
            runner_name=self._name,
            hub=hub,
            spawner=spawner,
            lifeline_remove=self._lifeline.remove,
            signals=self.signals,
            open_streams=set(),
        )
        # Each service must run, or the exit waits for it forever (the
        # collector's hand-over, the log server's end, the monitor's): they
        # are started surely, all of them even if a native cancellation
        # (Ctrl-C under asyncio.run, its end) comes meanwhile.  Then the
        # runner leaves as a block cancelled at once would, and the
        # cancellation goes on.
        services: list[_backend.SureTask] = [
            (hub.collector.run, (), f"corral log collector {self._name}"),
            (hub.serve, (self.children_done,), f"corral log server {self._name}"),
            (self._lifeline.watch, (self.children_done,), f"corral lifeline {self._name}"),
        ]
        if self._monitor is not None:
            self._monitor.set_log_path(hub.log_path)
            services.append((self._serve_monitor, (self._monitor,), f"corral monitor {self._name}"))
        try:
            await _backend.start_surely(tg, *services)
        except BaseException as exc:
            await self._leave_entry(exc)
            raise
        if self._monitor is not None:
            await self._monitor_listens(self._monitor)
            hub.log(logging.INFO, f"monitor at {self._monitor.url}")
        # In Trio's guest mode on asyncio: stop in order when the host ends.
        self._host_hold = _backend.hold_asyncio_host(token.loop, self._on_host_ending)
        if self._signal_pending:
            tg.cancel_scope.cancel()  # a signal arrived while we were entering

    async def _leave_entry(self, exc: BaseException) -> None:
        """Exit the runner as a block that started nothing would, on the way out with ``exc``."""
        try:
            await self.exit(type(exc), exc, exc.__traceback__)
        except BaseException as teardown:
            if teardown is not exc:
                raise

    async def _monitor_listens(self, monitor: Monitor) -> None:
        """Wait (within the monitor's ``LISTEN_TIMEOUT``) until the monitor listens.

        If it cannot, or the wait is cancelled (Ctrl-C), the runner is exited
        as a block that started nothing would be, and the monitor's error (or
        the cancellation) raised.
        """
        try:
            await monitor.ready.wait()
        except BaseException as exc:
            await self._leave_entry(exc)
            raise
        if monitor.error is not None:
            await self.exit(None, None, None)
            raise monitor.error

    async def _serve_monitor(self, monitor: Monitor) -> None:
        """The monitor's life: from entry until every child is gone (then "end")."""
        assert self.token is not None
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:

                async def end_with_the_children() -> None:
                    await self.children_done.wait()
                    # Their last lines may still be on their way to the sinks,
                    # the monitor's among them: let them arrive first (bounded,
                    # like the log service's own wait for a stuck handler).
                    with anyio.move_on_after(10):
                        await self._hub.delivered(self._hub.collector.mark())
                    signals = self.signals
                    monitor.end(None if signals is None else signals.received)

                await _backend.start_surely(
                    tg, (end_with_the_children, (), f"corral monitor end {self._name}")
                )
                await serve_monitor(monitor, self.token.loop)

    async def _undo_entry(self, entered: list[str]) -> None:
        if "signals" in entered and self.signals is not None:
            try:
                self.signals.close(None)
            except BaseException:
                pass  # we are failing anyway; the signal's meaning is lost only if it came now
            self.signals = None
        if "lifeline" in entered:
            await self._lifeline.aclose()
        if "hub" in entered:
            await self._hub.abandon()

    async def exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Wait for the children (or stop them), then close everything :meth:`enter` opened."""
        assert self.tg is not None
        self.closing = True
        if not self._live_count():
            self.children_done.set()
        error: BaseException | None = None
        try:
            return await self.tg.__aexit__(exc_type, exc, tb)
        except BaseException as caught:
            error = caught
            raise
        finally:
            try:
                if self.signals is not None:
                    # Raises KeyboardInterrupt or Signalled if a signal stopped us.
                    self.signals.close(error)
            finally:
                del error
                with anyio.CancelScope(shield=True):
                    # Every child is reaped: an idle lifeline is let go at
                    # once, and reaped after the log service's close, which
                    # gives it the time to die (no wait on a failure's way out).
                    released = self._lifeline.release()
                    if not released:
                        await self._lifeline.aclose()
                    if self._hub.has_handlers():  # (no thread to start for nothing)
                        with anyio.move_on_after(10):
                            await anyio.to_thread.run_sync(
                                self._hub.close_blocking, abandon_on_cancel=True
                            )
                    if released:
                        await self._lifeline.aclose()
                for source in self._hub.sources():
                    source.end()
                if self.services is not None:
                    # Pipes handed out as streams and not closed by their users:
                    # every child has exited, nobody can wait on them any more.
                    for stream in list(self.services.open_streams):
                        stream.close()
                if self._host_hold is not None:
                    self._host_hold.release()
                if self.signals is not None:
                    # A signal nobody held before ends the process now, as it
                    # would have without corral (see corral._core._signals).
                    self.signals.finish()

    def cancel(self) -> None:
        """Cancel the task group: every child is stopped, the ``async with`` ends."""
        assert self.tg is not None
        self.tg.cancel_scope.cancel()

    def _on_signal(self) -> None:
        """On the loop, soon after a signal the runner holds: cancel its scope."""
        self._signal_pending = True
        if self.tg is not None:
            self.tg.cancel_scope.cancel()

    def _abort(self) -> None:
        """On the loop, after a second signal: stop waiting for anything but the reaping."""
        self._aborted = True
        if self.tg is not None:
            self.tg.cancel_scope.cancel()
        self._hub.abort()

    def _on_host_ending(self) -> None:
        """On the loop, when the asyncio host of this Trio guest run is ending."""
        if self.tg is not None and not self.tg.cancel_scope.cancel_called:
            self._hub.log(logging.INFO, "the host event loop is ending: stopping every child")
            self.tg.cancel_scope.cancel()


#: The modules of the core whose code runs on the loop.
_CORE_MODULES = (
    "_children",
    "_handshake",
    "_lifeline",
    "_options",
    "_process",
    "_run",
    "_runner",
    "_scope",
    "_signals",
    "_spawn",
    "_supervisor",
    "_token",
)


def _protected_modules() -> list[ModuleType]:
    """The modules whose code is KeyboardInterrupt-protected on Trio (see ``protect_on_trio``).

    Looked up by name: each is imported by the time a runner is entered.
    """
    names = [f"{__package__}.{m}" for m in _CORE_MODULES] + ["corral._checks", "corral._results"]
    return [sys.modules[n] for n in names if n in sys.modules] + protected_modules()
