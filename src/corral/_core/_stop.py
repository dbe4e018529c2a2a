"""The one stop: the stop signal, a grace period, SIGKILL, and the wait for the end.

Whatever corral stops — a child's process group (:meth:`Process.stop`, a
failure elsewhere, the end of a runner's scope, a Ctrl-C passed on), what the
children left outside their groups (see :mod:`corral._sys._contain`), the
workers of a launch — it stops the same way, here:

1. the stop signal goes to all of the target at once (SIGTERM unless told
   otherwise; a signal the launcher passed on already is not sent twice);
2. the target gets a **grace period** to end on its own.  The grace belongs
   to the whole target, not to its first process: a shell that runs its
   program without ``exec`` (``web: gunicorn app`` in a Procfile) dies at
   once on SIGTERM while the program it started goes on cleaning up in the
   same process group, and that program keeps the rest of the grace;
3. whatever is left when the grace ends gets SIGKILL;
4. the stop returns once the target is gone (the caller reaps).

Only these steps run shielded from cancellation, and each is bounded: the
grace by its deadline, the end after SIGKILL by the kernel.

A stop under way can be **hastened**: another stop of the same target with a
shorter grace (a second ``stop()``, ``kill()``, a second Ctrl-C) moves the
deadline forward — every wait on it wakes at the new deadline — and sends no
second signal, which would cut short the clean-up the first one started.
That deadline is a :class:`Grace`; one exists per stop under way, shared by
whoever waits on it.

A process group's members are found with a :class:`Census`: the kernel has
no call that lists them, so one walk of ``/proc`` (in a worker thread)
answers every group that asks at about the same time — a runner that stops a
thousand children walks ``/proc`` a few times, not a thousand.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import anyio.to_thread

from .._sys import _platform, _proc
from .._sys._backend import outlast_native_cancel
from .._sys._contain import KILL_WAIT, Containment

__all__ = ["Census", "Grace", "Strays", "Target", "group_gone", "stop", "stop_strays"]


class Grace:
    """The grace period of one stop under way: when it ends (see the module's docs).

    Created by the first stop of a target; a later stop with a shorter grace
    :meth:`shorten`\\ s it, and every :meth:`within` under way then ends at the
    new deadline.  Make it on the loop that waits on it.
    """

    def __init__(self, seconds: float) -> None:
        self.ends = anyio.current_time() + seconds
        self._scopes: set[anyio.CancelScope] = set()

    @property
    def over(self) -> bool:
        return anyio.current_time() >= self.ends

    def shorten(self, seconds: float) -> None:
        """End the grace ``seconds`` from now, if that is sooner than it would."""
        ends = anyio.current_time() + seconds
        if ends < self.ends:
            self.ends = ends
            for scope in self._scopes:
                scope.deadline = ends

    async def within(self, wait: Callable[[], Awaitable[object]]) -> bool:
        """Await ``wait()`` until the grace ends; whether it returned in time.

        For the shielded part of a stop: a native asyncio cancellation
        (``asyncio.run``'s at its end) does not cut it short.
        """
        with anyio.CancelScope(deadline=self.ends) as scope:
            self._scopes.add(scope)
            try:
                await outlast_native_cancel(wait, scope)
            finally:
                self._scopes.discard(scope)
        return not scope.cancelled_caught


class Target(Protocol):
    """What a stop stops: a process group, the strays of a runner."""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to all of it (an ``OSError`` if it cannot)."""

    async def gone(self) -> None:
        """Return once all of it has ended (safe to start again)."""

    async def kill(self) -> None:
        """SIGKILL to whatever of it is left."""


async def stop(
    target: Target,
    grace: Grace,
    signum: int | None,
    *,
    after_kill: float | None = None,
    on_kill: Callable[[], None] | None = None,
    on_signal_error: Callable[[OSError | ValueError], None] | None = None,
) -> bool:
    """Stop ``target``: ``signum`` (``None``: sent already), ``grace``, SIGKILL; until it is gone.

    Call it inside a shielded scope: it is bounded (the grace, then the
    kernel's SIGKILL, or ``after_kill`` seconds of it for what may not die of
    it at once: a process in uninterruptible sleep).  ``on_kill`` is called
    before the SIGKILL a grace that ran out brings, ``on_signal_error`` when
    the stop signal cannot be sent (the grace then ends at once).  Whether
    the target is gone.
    """
    if signum is not None:
        try:
            target.signal(signum)
        except (OSError, ValueError) as exc:
            if on_signal_error is not None:
                on_signal_error(exc)
            grace.shorten(0)
    if await grace.within(target.gone):
        return True
    if on_kill is not None:
        on_kill()
    await target.kill()
    if after_kill is None:
        await outlast_native_cancel(target.gone)
        return True
    return await Grace(after_kill).within(target.gone)


class Strays:
    """What a runner's children left outside their process groups, as a stop sees it.

    Held through pidfds (:class:`~corral._sys._contain.Containment` finds
    them, in the runner's cgroup or among the orphans it adopted); those that
    appear while the stop goes on (orphans handed over as their parents die)
    are held too, and the orphans are reaped as they end.
    """

    def __init__(self, contain: Containment) -> None:
        self._contain = contain
        self._held: dict[int, int] = {}

    def signal(self, signum: int) -> None:
        self._contain.hold(self._held)
        self._contain.send(self._held, signum)

    async def gone(self) -> None:
        while True:
            self._contain.hold(self._held)
            self._contain.reap(self._held)
            if not self._held:
                return
            await anyio.wait_readable(next(iter(self._held.values())))

    async def kill(self) -> None:
        # The cgroup's kill waits for the kernel (an RCU grace period): not on the loop.
        await anyio.to_thread.run_sync(self._contain.kill, self._held)

    def close(self) -> None:
        """Let go of every process still held."""
        for pidfd in self._held.values():
            os.close(pidfd)
        self._held.clear()


async def stop_strays(contain: Containment, signum: int, grace: Grace) -> bool:
    """Stop what a runner's children left (see :class:`Strays`); whether all of it is gone.

    After SIGKILL each gets up to :data:`~corral._sys._contain.KILL_WAIT`
    seconds to be gone.
    """
    strays = Strays(contain)
    try:
        return await stop(strays, grace, signum, after_kill=KILL_WAIT)
    finally:
        strays.close()


class Census:
    """Finds the members of process groups, one walk of ``/proc`` for every group that asks.

    A group's leader that has exited but is not reaped keeps the group's id
    from being reused, so the group can be signalled safely; but the kernel
    says nothing of who else is in it.  A walk of ``/proc`` does, at a cost
    that grows with the machine's processes: so the walks are shared, one at
    a time, by every group that asks meanwhile, in a worker thread.
    """

    def __init__(self) -> None:
        self._asked: dict[int, anyio.Event] = {}
        self._found: dict[int, list[int]] = {}
        self._walking = False

    async def members(self, pgid: int) -> list[int]:
        """The processes in group ``pgid`` now (its leader included while it is there)."""
        event = self._asked.get(pgid)
        if event is None:
            event = self._asked[pgid] = anyio.Event()
        if not self._walking:
            self._walking = True
            try:
                while self._asked:
                    asked, self._asked = self._asked, {}
                    found = await anyio.to_thread.run_sync(_proc.group_members, set(asked))
                    for group, done in asked.items():
                        self._found[group] = found.get(group, [])
                        done.set()
            finally:
                self._walking = False
        await event.wait()
        return self._found.pop(pgid, [])


async def group_gone(census: Census, pgid: int, leader: int) -> None:
    """Return once no process of group ``pgid`` runs but ``leader`` (which has exited).

    Each member found is waited for on a pidfd (a process that is not a child
    of ours can be waited for that way too); the group is looked at again
    once they have ended, since they may have started others meanwhile.
    """
    while True:
        running = []
        for pid in await census.members(pgid):
            if pid == leader:
                continue
            try:
                pidfd = _platform.pidfd_open(pid)
            except OSError:
                continue  # gone already
            if _platform.ended(pidfd) or not _platform.gone_or_in_group(pid, pgid):
                os.close(pidfd)  # ended (a zombie), or the number is someone else's now
                continue
            running.append(pidfd)
        if not running:
            return
        try:
            for pidfd in running:
                await anyio.wait_readable(pidfd)
        finally:
            for pidfd in running:
                os.close(pidfd)
