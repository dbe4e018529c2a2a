"""A runner's scope: its task group, and the services that live exactly as long as it.

Entering a runner opens, in this order, its log service (the log folder, the
socket), its lifeline, its signal subscription and its task group, then
starts the services that run in that group: the collector, the log server,
the lifeline's watch, the monitor and the sampler of what each child costs.
Leaving it waits for the children (or stops them, on error or cancellation),
then closes everything in reverse; a failure half-way in undoes what was
opened.  See :mod:`corral._runner._runner` for the rules.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from .._core import _signals
from .._core._spawn import Spawner
from .._core._stop import Census, Grace, stop_strays
from .._core._supervisor import ProcessServices
from .._core._token import LoopToken
from .._core._usage import Sampled, UsageSampler
from .._logs._hub import LogHub
from .._sys import _backend, _contain, _platform
from .._sys._lifeline import Lifeline

if TYPE_CHECKING:
    from .._launch._context import LaunchContext, LogForwarder, StartFn
    from .._monitor._server import Monitor

__all__ = ["Scope"]


class Scope:
    """The task group of one runner and the services around it (see the module's docs).

    ``live`` gives the children that run now; ``usage`` asks for their
    figures to be sampled (:attr:`usage`, ``None`` without).  :attr:`tg`,
    :attr:`services` and :attr:`signals` are there once entered;
    :attr:`closing` once the exit began, and :attr:`children_done` is set
    once the exit began and every child is gone; :attr:`done` once what they
    left behind is gone too, which ends the services.
    """

    def __init__(
        self,
        name: str,
        *,
        hub: LogHub,
        lifeline: Lifeline,
        monitor: Monitor | None,
        handle_signals: bool | None,
        live: Callable[[], Sequence[Sampled]],
        usage: bool = True,
        contain: tuple[bool, bool] = (True, False),
        stop: tuple[int, float],
    ) -> None:
        self._name = name
        self._live = live
        self.usage = UsageSampler.make(usage, live)
        if self.usage is not None and monitor is not None:
            self.usage.add_listener(monitor.usage_event)
        self._hub = hub
        self._lifeline = lifeline
        self._monitor = monitor
        self._handle_signals = handle_signals
        self.token: LoopToken | None = None
        self.tg: TaskGroup | None = None
        self.closing = False
        self._aborted = False
        #: Set by a second signal: stop waiting for anything but the reaping.
        self.aborted = anyio.Event()
        self.children_done = anyio.Event()
        self.done = anyio.Event()
        self.signals: _signals.Subscription | None = None
        self._signal_pending = False
        self.services: ProcessServices | None = None
        self._host_hold: _backend.HostHold | None = None
        #: ``(contain, subreaper)`` and ``(stop_signal, grace)``: what is left
        #: of the children is found so, and stopped so.
        self._stop_signal, self._grace = stop
        self._contain = _contain.Containment(
            name, cgroup=contain[0], subreaper=contain[1], marker=lifeline.marker
        )
        #: The grace of the strays' stop, once it began (a second signal ends it).
        self._strays_grace: Grace | None = None

    def _live_count(self) -> int:
        return len(self._live())

    async def enter(self) -> None:
        """Open the log service, the lifeline, the signals, the task group and its services."""
        _platform.require_pidfd()
        token = LoopToken.current()
        if token.backend == "trio":
            protect_loop_side()
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
            cgroup = self._open_containment()
            entered.append("contain")
            self.signals = _signals.subscribe(
                self._name, self._handle_signals, token.loop, self._on_signal, self._abort
            )
            entered.append("signals")
            spawner = Spawner(self._name, self._lifeline, hub.log, self._live_count, cgroup=cgroup)
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
            census=Census(),
            usage=self.usage,
        )
        # Each service must run, or the exit waits for it forever (the
        # collector's hand-over, the log server's end, the monitor's): they
        # are started surely, all of them even if a native cancellation
        # (Ctrl-C under asyncio.run, its end) comes meanwhile.  Then the
        # runner leaves as a block cancelled at once would, and the
        # cancellation goes on.
        services: list[_backend.SureTask] = [
            (hub.collector.run, (), f"corral log collector {self._name}"),
            (self._contain_strays, (), f"corral strays {self._name}"),
            (hub.serve, (self.done,), f"corral log server {self._name}"),
            (self._lifeline.watch, (self.done,), f"corral lifeline {self._name}"),
        ]
        if self._monitor is not None:
            self._monitor.set_log_path(hub.log_path)
            services.append((self._serve_monitor, (self._monitor,), f"corral monitor {self._name}"))
        try:
            await _backend.start_surely(tg, *services)
        except BaseException as exc:
            await self._leave_entry(exc)
            raise
        if self.usage is not None:
            # Nothing waits for it: a cancellation may end it.
            tg.start_soon(self.usage.run, self.children_done, name=f"corral usage {self._name}")
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
                    await self.done.wait()
                    # Their last lines may still be on their way to the sinks,
                    # the monitor's among them: let them arrive first (bounded,
                    # like the log service's own wait for a stuck handler).
                    with anyio.move_on_after(10):
                        await self._hub.delivered(self._hub.collector.mark())
                        await self._hub.report_losses()  # what the log files missed
                    signals = self.signals
                    monitor.end(None if signals is None else signals.received)

                await _backend.start_surely(
                    tg, (end_with_the_children, (), f"corral monitor end {self._name}")
                )
                from .._monitor._serve import server_for

                serve = server_for(monitor, self.token.loop)
                self.protect()  # the server's code, just loaded
                await serve(monitor)

    async def _undo_entry(self, entered: list[str]) -> None:
        if "signals" in entered and self.signals is not None:
            try:
                self.signals.close(None)
            except BaseException:
                pass  # we are failing anyway; the signal's meaning is lost only if it came now
            self.signals = None
        if "contain" in entered:
            self._close_containment()
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

    # -- containment (see corral._sys._contain) ----------------------------------------

    def _open_containment(self) -> str | None:
        """Make the runner's cgroup and take the subreaper role; the ``cgroup.procs`` or None."""
        contain = self._contain
        contain.open()
        if contain.cgroup is None:
            if contain.unavailable is not None:
                self._hub.log(
                    logging.DEBUG,
                    f"no cgroup for the children ({contain.unavailable}): a descendant that "
                    "leaves its process group is not stopped with them",
                )
            return None
        self._lifeline.add_cgroup(contain.cgroup.path)
        return contain.cgroup.procs

    async def _contain_strays(self) -> None:
        """A service: once every child is gone, stop what they left, then end the services.

        What is left outside their process groups gets the stop signal, the
        runner's grace (cut short by a second signal), SIGKILL (``cgroup.kill``),
        and the orphans among them are reaped: in a thread of its own, since
        the kill waits for the kernel.  Then the cgroup is removed.
        """
        try:
            with anyio.CancelScope(shield=True):
                # (asyncio.run's final cancel-all kills the children: wait on.)
                await _backend.outlast_native_cancel(self.children_done.wait)
                await self._stop_strays()
        finally:
            self.done.set()

    async def _stop_strays(self) -> None:
        contain = self._contain
        strays = contain.strays()
        if strays:
            self._hub.log(
                logging.INFO,
                f"stopping {len(strays)} process(es) that the children left outside their "
                f"process groups: {_contain.describe(strays)}",
            )
            grace = self._strays_grace = Grace(0.0 if self._aborted else self._grace)
            if not await stop_strays(contain, self._stop_signal, grace):
                self._hub.log(
                    logging.WARNING,
                    f"cannot stop them all: some did not die within {_contain.KILL_WAIT:g} s "
                    "of SIGKILL",
                )
        self._close_containment()

    def _close_containment(self) -> None:
        contain = self._contain
        cgroup = contain.cgroup
        if contain.close():
            if cgroup is not None:
                self._lifeline.remove_cgroup(cgroup.path)
        elif cgroup is not None:
            self._hub.log(
                logging.WARNING,
                f"cannot remove the cgroup {cgroup.path}: a process in it did not die within "
                f"{_contain.KILL_WAIT:g} s of SIGKILL; the lifeline tries again",
            )

    def protect(self) -> None:
        """On Trio, protect more of corral's code (loaded on first use) as the runner's own."""
        if self.token is not None and self.token.backend == "trio":
            protect_loop_side()

    def launch_context(self, start: StartFn, logs: LogForwarder, grace: float) -> LaunchContext:
        """What a launch in this runner needs of it, the signals that stop it included."""
        from .._launch._context import LaunchContext

        return LaunchContext(
            start=start,
            logs=logs,
            grace=grace,
            stop_signal=lambda: None if self.signals is None else self.signals.received,
            aborted=self.aborted.wait,
            scratch=self._hub.server.folder,
            usage=self.usage,
        )

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
        if self._strays_grace is not None:
            self._strays_grace.shorten(0)
        self.aborted.set()
        if self.tg is not None:
            self.tg.cancel_scope.cancel()
        self._hub.abort()

    def _on_host_ending(self) -> None:
        """On the loop, when the asyncio host of this Trio guest run is ending."""
        if self.tg is not None and not self.tg.cancel_scope.cancel_called:
            self._hub.log(logging.INFO, "the host event loop is ending: stopping every child")
            self.tg.cancel_scope.cancel()


#: The units of the package whose code runs on a runner's loop: the floors below the blocking
#: runner and the facade (see tests/project/test_layering.py).  What they define is protected
#: from KeyboardInterrupt on Trio as the runner's own code; the facade, the blocking runner,
#: the command, the pytest plugin and the child's side are the application's.
LOOP_SIDE: Final = (
    "_errors",
    "_checks",
    "_results",
    "_scaleout",
    "_sys",
    "_logs",
    "_core",
    "_launch",
    "_monitor",
    "_runner",
)


@functools.cache
def loop_side_names() -> tuple[str, ...]:
    """The names of every module of :data:`LOOP_SIDE`: one walk of those folders' files."""
    root = Path(__file__).resolve().parents[1]
    package = root.name
    names: list[str] = []
    for unit in LOOP_SIDE:
        folder = root / unit
        if folder.is_dir():
            names += [f"{package}.{unit}.{p.stem}" for p in sorted(folder.glob("_*.py"))]
            names.append(f"{package}.{unit}")
        else:
            names.append(f"{package}.{unit}")
    return tuple(n for n in names if not n.endswith(".__init__"))


def protect_loop_side() -> None:
    """On Trio, protect the loop-side code loaded so far (idempotent; cheap once done).

    Called when a runner is entered and when it loads more of its code (a
    launch, the monitor's server): whatever of :data:`LOOP_SIDE` is loaded by
    then is covered, so a new module of those folders cannot be forgotten.
    """
    _backend.protect_on_trio(
        [module for name in loop_side_names() if (module := sys.modules.get(name)) is not None]
    )
