"""Signal fan-out: Ctrl-C stops every child at once, then the runner.

A launcher that is told to stop — Ctrl-C in its terminal (SIGINT), a
``kill`` or a service manager (SIGTERM), a closed terminal (SIGHUP) — must
pass the news on to its children *at once*, all of them, and then get out
of the way.  The runners we learned from get this wrong in instructive
ways: one signals only its direct children, so their own children are
orphaned; one installs its handler per runner, so a second runner silently
takes the signal away from the first; one sleeps for two seconds, blocking,
inside async code; several never give the application its handler back.

While at least one runner with signal handling is open, corral owns
SIGINT, SIGTERM and SIGHUP in this process.  There is exactly one handler,
installed by the first such runner to be entered and removed — with
whatever ``signal.getsignal`` returned before, be it Python's
``default_int_handler``, asyncio's or Trio's own, or the application's —
when the last one leaves.  Every open runner *subscribes* to it, whether
the runners are siblings or nested; nothing a runner does can take the
signal away from another.

Python runs signal handlers in the main thread, between two bytecodes of
whatever that thread was doing: here, the event loop of every subscribed
runner (a runner subscribes only when entered on the main thread).  So the
handler does only what is safe at any point of that loop's work, and
nothing that waits:

1. The **sweep**: for every running child of every subscribed runner, mark
   it as stop-requested (its exit is then not a failure) and send the same
   signal to its whole process group with one ``killpg`` each.  A child
   whose leader has already exited is skipped: after its leader is reaped,
   a group id may belong to a stranger.
2. For every subscribed runner, schedule a callback onto the runner's own
   loop (``call_soon_threadsafe`` on asyncio, ``TrioToken.run_sync_soon`` on
   Trio; both are safe in a signal handler) and return.

The callback, now an ordinary step of the loop, cancels the runner's
scope.  Each child's supervisor then runs its usual stop, minus its stop
signal — the child already has the forwarded one, and a second, different
signal would cut short the clean-up the first one started: it waits up to
the child's ``grace`` seconds for the exit and sends SIGKILL to whatever is
left of the group at that deadline.  When every child is reaped, the
runner's ``async with`` raises :class:`KeyboardInterrupt` for SIGINT and
:class:`~corral.Signalled` for SIGTERM and SIGHUP.

A second signal while a runner is still stopping means "now": the handler
sends SIGKILL to every group that is left, at once.

The interrupt leaves the runner bare when nothing else went wrong (nested
runners raise it once, not as a group of copies), and inside a
:class:`BaseExceptionGroup` together with any other error; so
``except* KeyboardInterrupt`` is the way to catch it.  One more case wraps
it: on asyncio, a :class:`KeyboardInterrupt` escaping any task but the one
``asyncio.run`` is running makes asyncio abandon the loop on the spot, so
there the runner raises it inside a group, which task groups carry up like
any other error.

What is deliberately *not* done here: the handler never raises (an
exception in a signal handler surfaces inside whatever the loop was doing
and can wreck it), never logs (logging takes locks), and never chains to
the previous handler (Python's, asyncio's and Trio's SIGINT handlers all
interrupt or cancel the main task, which is exactly what an orderly stop
must avoid).  Signals the process ignores (``SIG_IGN``, as SIGHUP is under
``nohup``) stay ignored, and a signal whose handler was installed outside
Python (``getsignal`` returns ``None``) is left alone, since it could not
be put back.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio

from ._errors import Signalled
from ._process import Process

if TYPE_CHECKING:
    from ._runner import Runner

__all__ = ["HANDLED_SIGNALS", "Subscription", "subscribe", "wanted"]

#: The signals a runner handles while it is open.
HANDLED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None


class Subscription:
    """One runner's place in the dispatcher, from ``__aenter__`` to ``__aexit__``."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._signal: int | None = None
        self._closed = False

    @property
    def received(self) -> int | None:
        """The first signal that reached this runner, or ``None``."""
        return self._signal

    def _targets(self) -> list[Process]:
        # Skip whatever is not (yet) a supervised Process — a child spawned
        # this very moment gets the ordinary stop once the scope is
        # cancelled — and every child whose leader has exited: its
        # supervisor has killed what was left of its group already, and once
        # the leader is reaped the group id is not ours to signal.
        return [
            proc
            for proc in list(self._runner._live.values())
            if isinstance(proc, Process) and not proc._reaped and not proc._leader_exited.is_set()
        ]

    def _sweep(self, signum: int) -> None:
        """Signal every child's group (called in the signal handler)."""
        if self._closed:
            return
        if self._signal is None:
            self._signal = signum
            forward = signum
        else:
            forward = signal.SIGKILL  # asked twice: stop everything now
        for proc in self._targets():
            proc._forward_stop(forward)

    def _schedule(self) -> None:
        """Ask the runner's loop to cancel the scope (called in the signal handler)."""
        if self._closed:
            return
        native = self._runner.token.native.native_token
        try:
            if self._runner.token.backend == "asyncio":
                native.call_soon_threadsafe(self._on_loop)  # type: ignore[attr-defined]
            else:
                native.run_sync_soon(self._on_loop)  # type: ignore[attr-defined]
        except Exception:
            # The loop has finished or closed: its runner has left already.
            pass

    def _on_loop(self) -> None:
        """Runs on the runner's loop soon after the signal: cancel the runner's scope."""
        tg = self._runner._tg
        if not self._closed and tg is not None:
            tg.cancel_scope.cancel()

    def close(self, error: BaseException | None) -> None:
        """Unsubscribe; then, if a signal stopped the runner, raise what it means.

        ``error`` is what the runner's task group raised (``None`` if it
        exited quietly, which is what a scope cancelled by the signal does).
        Raises :class:`KeyboardInterrupt` or :class:`Signalled` bare when
        nothing else went wrong — including when the only other errors are
        the same interrupt coming out of a nested runner — and a
        :class:`BaseExceptionGroup` holding it and ``error`` otherwise.
        """
        if self._closed:
            return
        # Unsubscribe first: until our handler is gone, a signal still lands
        # here, and is raised below rather than lost.
        _dispatcher.unsubscribe(self)
        self._closed = True
        if self._signal is None:
            return
        outcome = _outcome(self._signal)
        message = f"runner {self._runner.name!r} was stopped by {signal.Signals(self._signal).name}"
        if (
            error is None
            or _only(type(outcome), error)
            # An enclosing scope was cancelled as well: the interrupt is the
            # stronger news, and a cancellation must not travel in a group.
            or isinstance(error, anyio.get_cancelled_exc_class())
        ):
            if isinstance(outcome, KeyboardInterrupt) and not _may_raise_bare_interrupt(
                self._runner.token.backend
            ):
                raise BaseExceptionGroup(message, [outcome]) from None
            raise outcome from None
        raise BaseExceptionGroup(message, [outcome, error]) from None


def _outcome(signum: int) -> BaseException:
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Signalled(signum)


def _may_raise_bare_interrupt(backend: str) -> bool:
    """Whether a bare :class:`KeyboardInterrupt` may leave the current task.

    On Trio it always may: it travels up through nurseries like any error.
    asyncio, though, treats a :class:`KeyboardInterrupt` escaping a task
    specially: it re-raises it straight out of the event loop, abandoning
    every other task mid-step, and ``asyncio.run`` then cancels those
    natively, which no cancel scope's shield withstands (with two sibling
    runners, our experiment ended with the process hanging at exit, waiting
    for AnyIO's worker threads that were never told to stop).  That is
    harmless only in the task that ``asyncio.run`` (or
    ``run_until_complete``) is running, which is over anyway.  Anywhere
    else the interrupt is raised inside a :class:`BaseExceptionGroup`, which
    task groups carry up like any error; that is what Trio's task groups
    make of it a level higher anyway.
    """
    if backend != "asyncio":
        return True
    task = asyncio.current_task()
    if task is None:
        return False
    done_callback = getattr(asyncio.base_events, "_run_until_complete_cb", None)
    # A task's done callbacks are not public; this is how AnyIO finds the
    # root task too.  If it ever stops working we wrap, which is safe.
    callbacks = getattr(task, "_callbacks", None) or ()
    return any(
        callback is done_callback or getattr(callback, "__module__", None) == "uvloop.loop"
        for callback, _context in callbacks
    )


def _only(kind: type[BaseException], error: BaseException) -> bool:
    """Whether ``error`` is ``kind``, or a group of nothing else (a nested runner's outcome)."""
    if isinstance(error, BaseExceptionGroup):
        _, rest = error.split(kind)
        return rest is None
    return isinstance(error, kind)


class _Dispatcher:
    """The process-wide handler and the runners subscribed to it.

    Only ever touched from the main thread (subscribing happens in a
    runner's ``__aenter__`` there, and Python runs signal handlers there),
    so it needs no lock.
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscription] = []
        self._previous: dict[int, _Handler] = {}

    @property
    def installed(self) -> bool:
        return bool(self._subscribers)

    # The order of the steps below keeps one invariant: whenever our handler
    # is installed, somebody is subscribed to it, so no signal is ever
    # swallowed by a handler with nobody to tell.

    def subscribe(self, subscription: Subscription) -> None:
        self._subscribers.append(subscription)
        if len(self._subscribers) == 1:
            self._install()

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription not in self._subscribers:
            return
        if len(self._subscribers) == 1:
            self._uninstall()
        self._subscribers.remove(subscription)

    def _install(self) -> None:
        self._previous.clear()
        for signum in HANDLED_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is None or previous == signal.SIG_IGN:
                continue
            try:
                signal.signal(signum, _handle)
            except (ValueError, OSError):  # pragma: no cover - e.g. a subinterpreter
                continue
            self._previous[signum] = previous

    def _uninstall(self) -> None:
        for signum, previous in self._previous.items():
            # If someone replaced our handler meanwhile, theirs is newer
            # than what we would put back: leave it.
            if signal.getsignal(signum) is _handle:
                assert previous is not None
                signal.signal(signum, previous)
        self._previous.clear()

    def dispatch(self, signum: int) -> None:
        subscribers = list(self._subscribers)
        # First the sweep over every runner, so that all children get the
        # signal within microseconds of each other; then the loops.
        for subscription in subscribers:
            subscription._sweep(signum)
        for subscription in subscribers:
            subscription._schedule()


_dispatcher = _Dispatcher()


def _handle(signum: int, frame: FrameType | None) -> None:
    _dispatcher.dispatch(signum)


def wanted(handle_signals: bool | None) -> bool:
    """Whether a runner being entered now should subscribe to the signal handler.

    ``None`` means "if entered on the main thread"; ``False`` never;
    ``True`` always, and raises :class:`RuntimeError` off the main thread,
    where Python cannot install signal handlers.
    """
    if handle_signals is False:
        return False
    if threading.current_thread() is not threading.main_thread():
        if handle_signals:
            raise RuntimeError(
                "handle_signals=True needs the runner to be entered on the main thread, "
                "the only one where Python runs signal handlers; pass handle_signals=False "
                "and cancel the runner (r.cancel()) from the application's own handler instead"
            )
        return False
    return True


def subscribe(runner: Runner) -> Subscription:
    """Subscribe ``runner`` to the signal handler, installing it if it is the first."""
    subscription = Subscription(runner)
    _dispatcher.subscribe(subscription)
    return subscription
