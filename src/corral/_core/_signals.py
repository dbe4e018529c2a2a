"""Signal fan-out: Ctrl-C stops every child at once, then the runner.

A launcher that is told to stop — Ctrl-C in its terminal (SIGINT), a
``kill`` or a service manager (SIGTERM), a closed terminal (SIGHUP) — must
pass the news on to its children *at once*, all of them, and then get out
of the way.  The runners we learned from get this wrong in instructive
ways: one signals only its direct children, so their own children are
orphaned; one installs its handler per runner, so a second runner silently
takes the signal away from the first; one sleeps for two seconds, blocking,
inside async code; several never give the application its handler back, or
take it from an application (a web server, say) that needed it.

**Whose signal is it?**  A signal belongs to whoever installed its handler.
By default (``handle_signals=None``) a runner takes SIGINT and SIGTERM only
when nobody holds them: when their handler is still the default
(``SIG_DFL``, or Python's ``default_int_handler`` for SIGINT).  SIGHUP it
leaves alone by default.  If the application, its framework
(uvicorn, hypercorn), ``asyncio.run`` or ``trio.run`` installed one, corral
leaves it alone and relies on what that handler does — cancel the main task,
raise :class:`KeyboardInterrupt` — since the cancellation that follows stops
every child's group with its grace period anyway.  ``handle_signals=True``
takes SIGINT, SIGTERM and SIGHUP whoever holds them (the ``corral`` command
does), ``False`` never touches a handler.  Ignored signals (``SIG_IGN``, as
SIGHUP is under ``nohup``) and handlers installed outside Python (which
could not be put back) are always left alone.

While at least one runner holds a signal, there is exactly one handler for
it, installed by the first such runner and removed — with whatever was there
before put back — when the last one leaves.  Each runner *subscribes* with
the set of process groups it runs; nothing a runner does can take the signal
away from another.

Python runs signal handlers in the main thread, between two bytecodes of
whatever that thread was doing: here, the event loop of every subscribed
runner.  So the handler does only what is safe at any point of that loop's
work, and nothing that waits:

1. The **sweep**: every registered process group of every subscriber gets
   the same signal with one ``killpg`` each, and is marked as stopped on
   purpose (its exit is then not a failure).  A group leaves the registry
   before its leader is reaped, so the sweep never signals a group id that
   may belong to a stranger.
2. For every subscriber, a callback is scheduled onto the runner's own loop
   (``call_soon_threadsafe`` on asyncio, ``TrioToken.run_sync_soon`` on
   Trio; both are safe in a signal handler), and the handler returns.

The callback, now an ordinary step of the loop, cancels the runner's
scope.  Each child's supervisor then runs its usual stop, minus its stop
signal — the child already has the forwarded one, and a second, different
signal would cut short the clean-up the first one started: it waits up to
the child's ``grace`` seconds for the exit and sends SIGKILL to whatever is
left of the group at that deadline.  When every child is reaped, the
runner's ``async with`` raises :class:`KeyboardInterrupt` for SIGINT and
:class:`~corral.Signalled` for SIGTERM and SIGHUP.

**A signal nobody held keeps its meaning.**  A runner that took a signal
only because nobody held it (``handle_signals=None`` and a handler still at
``SIG_DFL``, as SIGTERM is in most programs) borrowed it to stop the
children first; the signal still means what it meant before — end the
process.  So once the last runner holding it has stopped its children and
drained their logs, the default handler is put back and the signal is sent
again to the launcher itself, which then ends exactly as it would have
without corral (exit status 128 + the signal number).  Raising
:class:`~corral.Signalled` instead could not be trusted to end anything: a
server that runs the runner in its lifespan catches the error and goes on
serving, without the children.  With ``handle_signals=True`` the runner
raises instead, for the program to clean up; SIGINT under Python's
``default_int_handler`` raises :class:`KeyboardInterrupt`, which is what
that handler does.

A second signal while a runner is still stopping means "now": the handler
sends SIGKILL to every group that is left, at once, and the runner drops
whatever else its exit was still waiting for (log connections, a slow
handler), with a warning saying what was dropped.

The interrupt leaves the runner bare when nothing else went wrong (nested
runners raise it once, not as a group of copies), and inside a
:class:`BaseExceptionGroup` together with any other error; so
``except* KeyboardInterrupt`` is the way to catch it.  On asyncio, a
:class:`KeyboardInterrupt` escaping any task but the one ``asyncio.run`` is
running makes asyncio abandon the loop on the spot, so there the runner
raises it inside a group, which task groups carry up like any other error.

What is deliberately *not* done here: the handler never raises (an
exception in a signal handler surfaces inside whatever the loop was doing
and can wreck it), never logs (logging takes locks), and never chains to
the previous handler.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol, TypeAlias

import anyio

from .._errors import Signalled
from .._sys._backend import LoopHandle, is_asyncio_main_task

__all__ = ["HANDLED_SIGNALS", "Subscription", "Target", "subscribe"]

#: The signals a runner can handle while it is open.
HANDLED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Those it takes by default, when nobody holds them.  Not SIGHUP: a closed
#: terminal (or a host's reload request) is not the runner's to interpret,
#: and left alone it ends the process as before, the lifeline then stopping
#: the children.
DEFAULT_SIGNALS: frozenset[int] = frozenset({signal.SIGINT, signal.SIGTERM})

_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None


class Target(Protocol):
    """A process group the sweep reaches (a running child)."""

    def forward_signal(self, signum: int) -> None:
        """Pass ``signum`` on to the group, as a stop requested on purpose."""


class Subscription:
    """One runner's place in the dispatcher, from ``__aenter__`` to ``__aexit__``."""

    def __init__(
        self,
        name: str,
        signals: frozenset[int],
        loop: LoopHandle,
        on_signal: Callable[[], None],
        on_abort: Callable[[], None],
        *,
        raises: bool = False,
    ) -> None:
        self.name = name
        self.signals = signals
        #: ``handle_signals=True``: the signal is the runner's to raise, even
        #: one whose default action would end the process.
        self.raises = raises
        self._default_due: int | None = None
        self._loop = loop
        self._on_signal = on_signal
        self._on_abort = on_abort
        self._targets: set[Target] = set()
        self._signal: int | None = None
        self._closed = False

    @property
    def received(self) -> int | None:
        """The first signal that reached this runner, or ``None``."""
        return self._signal

    def add(self, target: Target) -> None:
        self._targets.add(target)

    def discard(self, target: Target) -> None:
        self._targets.discard(target)

    def _sweep(self, signum: int) -> bool:
        """Signal every group (in the signal handler); ``True`` on a repeated signal."""
        if self._closed or signum not in self.signals:
            return False
        again = self._signal is not None
        if not again:
            self._signal = signum
        forward = signal.SIGKILL if again else signum
        for target in list(self._targets):
            target.forward_signal(forward)
        return again

    def _schedule(self, again: bool) -> None:
        """Ask the runner's loop to act (in the signal handler)."""
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(self._on_abort if again else self._on_signal)
        except anyio.RunFinishedError:
            pass  # the loop has finished: its runner has left already

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
        self._default_due = _dispatcher.unsubscribe(self)
        self._closed = True
        self._targets.clear()
        if self._signal is None:
            return
        outcome = _outcome(self._signal)
        message = f"runner {self.name!r} was stopped by {signal.Signals(self._signal).name}"
        if (
            error is None
            or _only(type(outcome), error)
            # An enclosing scope was cancelled as well: the interrupt is the
            # stronger news, and a cancellation must not travel in a group.
            or isinstance(error, anyio.get_cancelled_exc_class())
        ):
            if (
                isinstance(outcome, KeyboardInterrupt)
                and self._loop.backend == "asyncio"
                and not is_asyncio_main_task()
            ):
                raise BaseExceptionGroup(message, [outcome]) from None
            raise outcome from None
        raise BaseExceptionGroup(message, [outcome, error]) from None

    def finish(self) -> None:
        """At the very end of the runner's exit: carry out a borrowed signal's default.

        If this runner was the last to hold a signal that nobody held before
        (its handler was ``SIG_DFL``) and that signal arrived, the default is
        back in place now; sending the signal again ends the process as it
        would have ended without corral, after the children were stopped and
        their logs written.
        """
        signum, self._default_due = self._default_due, None
        if signum is None or signal.getsignal(signum) != signal.SIG_DFL:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to keep
                pass
        os.kill(os.getpid(), signum)


def _outcome(signum: int) -> BaseException:
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Signalled(signum)


def _only(kind: type[BaseException], error: BaseException) -> bool:
    """Whether ``error`` is ``kind``, or a group of nothing else (a nested runner's outcome)."""
    if isinstance(error, BaseExceptionGroup):
        _, rest = error.split(kind)
        return rest is None
    return isinstance(error, kind)


def _is_free(handler: _Handler, signum: int) -> bool:
    """Whether nobody holds ``signum``: its handler is still Python's default."""
    return handler == signal.SIG_DFL or (
        signum == signal.SIGINT and handler is signal.default_int_handler
    )


class _Dispatcher:
    """The process-wide handler and the runners subscribed to it.

    Only ever touched from the main thread (subscribing happens in a
    runner's ``__aenter__`` there, and Python runs signal handlers there),
    so it needs no lock.
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscription] = []
        self._previous: dict[int, _Handler] = {}
        # Signals that arrived while only borrowed (SIG_DFL before, and no
        # runner with handle_signals=True holding them): their default action
        # is still due once the last holder has left.
        self._due: set[int] = set()

    def signals_for(self, mode: bool | None) -> frozenset[int]:
        """The signals a runner entered now with ``handle_signals=mode`` takes."""
        taken = set()
        for signum in HANDLED_SIGNALS:
            if signum in self._previous:
                taken.add(int(signum))  # held by corral already: share it
                continue
            current = signal.getsignal(signum)
            if current is None or current == signal.SIG_IGN:
                continue
            if mode or (signum in DEFAULT_SIGNALS and _is_free(current, signum)):
                taken.add(int(signum))
        return frozenset(taken)

    # The order of the steps below keeps one invariant: whenever our handler
    # is installed, somebody is subscribed to it, so no signal is ever
    # swallowed by a handler with nobody to tell.

    def subscribe(self, subscription: Subscription) -> None:
        self._subscribers.append(subscription)
        for signum in subscription.signals:
            if signum in self._previous:
                continue
            previous = signal.getsignal(signum)
            try:
                signal.signal(signum, _handle)
            except (ValueError, OSError):  # pragma: no cover - e.g. a subinterpreter
                continue
            self._previous[signum] = previous

    def unsubscribe(self, subscription: Subscription) -> int | None:
        """Remove a runner; return a borrowed signal whose default action is now due."""
        if subscription not in self._subscribers:
            return None
        self._subscribers.remove(subscription)
        still_wanted = {s for sub in self._subscribers for s in sub.signals}
        due = None
        for signum in list(self._previous):
            if signum in still_wanted:
                continue
            previous = self._previous.pop(signum)
            # If someone replaced our handler meanwhile, theirs is newer
            # than what we would put back: leave it.
            if signal.getsignal(signum) is _handle and previous is not None:
                signal.signal(signum, previous)
                if signum in self._due and previous == signal.SIG_DFL and due is None:
                    due = signum
            self._due.discard(signum)
        return due

    def dispatch(self, signum: int) -> None:
        subscribers = list(self._subscribers)
        holders = [sub for sub in subscribers if signum in sub.signals]
        if self._previous.get(signum) == signal.SIG_DFL and not any(sub.raises for sub in holders):
            self._due.add(signum)
        # First the sweep over every runner, so that all children get the
        # signal within microseconds of each other; then the loops.
        again = [subscription._sweep(signum) for subscription in subscribers]
        for subscription, repeated in zip(subscribers, again, strict=True):
            if signum in subscription.signals:
                subscription._schedule(repeated)


_dispatcher = _Dispatcher()


def _handle(signum: int, frame: FrameType | None) -> None:
    _dispatcher.dispatch(signum)


def subscribe(
    name: str,
    mode: bool | None,
    loop: LoopHandle,
    on_signal: Callable[[], None],
    on_abort: Callable[[], None],
) -> Subscription | None:
    """Subscribe a runner being entered now; ``None`` if it takes no signal.

    ``mode`` is the runner's ``handle_signals``: ``None`` takes the signals
    nobody holds, ``True`` takes them all (and raises :class:`RuntimeError`
    off the main thread, where Python cannot install signal handlers),
    ``False`` none.  ``on_signal`` runs on the runner's loop after the first
    signal, ``on_abort`` after each further one.
    """
    if mode is False:
        return None
    if threading.current_thread() is not threading.main_thread():
        if mode:
            raise RuntimeError(
                "handle_signals=True needs the runner to be entered on the main thread, "
                "the only one where Python runs signal handlers; pass handle_signals=False "
                "and cancel the runner (r.cancel()) from the application's own handler instead"
            )
        return None
    signals = _dispatcher.signals_for(mode)
    if not signals:
        return None
    subscription = Subscription(name, signals, loop, on_signal, on_abort, raises=bool(mode))
    _dispatcher.subscribe(subscription)
    return subscription
