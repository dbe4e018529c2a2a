"""A runner's children: how one is started, named, watched and let go.

:class:`Children` is the registry behind :class:`~corral._runner._runner.Runner`:
the children that run now under their unique names, the observers told of
each change of state, and the one path by which a child comes into being —
options checked, the child spawned, its :class:`Supervisor` started in the
runner's task group, the :class:`Process` handed back.  The runner's public
methods are thin: :meth:`Runner.start` and :meth:`Runner.run` both come here.

Names follow one rule (:func:`corral._checks.check_name`, applied when the
start is checked): 1 to :data:`~corral._checks.MAX_NAME` characters, no
spaces or slashes, since a name is part of a log source and of a log file's
name.  A child without a name gets its program's base name, with a numbered
suffix while that one is taken.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import anyio
import anyio.lowlevel

from .._checks import MAX_NAME
from .._core._options import StartSpec
from .._core._process import Process
from .._core._spawn import describe_argv
from .._core._supervisor import Supervisor
from .._logs._hub import LogHub
from .._sys import _backend
from ._scope import Scope

__all__ = ["Children"]

#: What a program's name may not keep in a child's name.
_NAME_BAD_CHARS = re.compile(r"[\s/\\\0]+")

Observer = Callable[[Process, str], None]


class Children:
    """The children of one runner (see the module's docs).

    ``grace`` and ``stop_signal`` are the runner's defaults, checked.
    """

    def __init__(
        self, runner: str, *, hub: LogHub, scope: Scope, grace: float, stop_signal: int
    ) -> None:
        self._runner = runner
        self._hub = hub
        self._scope = scope
        self._grace = grace
        self._stop_signal = stop_signal
        self._live: dict[str, Process] = {}
        #: The live children started with ``service=True``.
        self._services: set[Process] = set()
        self._name_counters: dict[str, int] = {}
        self._observers: list[Observer] = []
        if scope.usage is not None:  # a child that starts wakes the sampler
            self._observers.append(scope.usage.observe)
        #: Spawns one at a time, with a loop turn after each (see :meth:`start`).
        self._spawn_lock = anyio.Lock()

    @property
    def live(self) -> tuple[Process, ...]:
        """The children that run now, in the order they were started."""
        return tuple(self._live.values())

    def __len__(self) -> int:
        return len(self._live)

    # -- observers --------------------------------------------------------------------

    def add_observer(self, callback: Observer) -> Callable[[], None]:
        """Call ``callback(process, state)`` at each change of state; returns its remover."""
        self._observers.append(callback)

        def remove() -> None:
            if callback in self._observers:
                self._observers.remove(callback)

        return remove

    def _event(self, proc: Process, state: str) -> None:
        for observer in self._observers:
            observer(proc, state)

    def _exited(self, proc: Process) -> None:
        if self._live.get(proc.name) is proc:
            del self._live[proc.name]
        self._services.discard(proc)
        if self._scope.closing and not self._live:
            self._scope.children_done.set()

    # -- starting ---------------------------------------------------------------------

    def check_open(self) -> None:
        """``RuntimeError`` unless the runner is entered and not closing: it may start children."""
        if self._scope.tg is None:
            raise RuntimeError("the runner has not been entered yet (use 'async with')")
        if self._scope.closing:
            raise RuntimeError(f"runner {self._runner!r} is closing; it starts no new processes")

    async def start(self, spec: StartSpec) -> Process:
        """Spawn the checked start ``spec`` and supervise it; its handle, once it runs.

        With ``wait_started``, once it reported that it started.  Nothing is
        spawned when the calling scope is cancelled already; a cancellation
        that arrives once the child runs stops and reaps it before it goes on.
        """
        self.check_open()
        grace = self._grace if spec.grace is None else spec.grace
        stop_signal = self._stop_signal if spec.stop_signal is None else spec.stop_signal
        services = self._scope.services
        tg = self._scope.tg
        assert services is not None and tg is not None
        # Spawning holds the loop (and the GIL) for a few hundred
        # microseconds, so a worker thread would not help.  The lock puts
        # concurrent starts in a queue, and the turn each one gives the loop
        # before letting the next go keeps a burst of starts from running
        # as one long batch: timers and I/O run between any two spawns.
        token = self._scope.token
        trio_loop = token is not None and token.backend == "trio"
        async with self._spawn_lock:
            # A start in a cancelled scope (or one whose deadline has passed)
            # spawns nothing.
            await checkpoint_if_cancelled()
            # No await from here until the supervisor runs: the name stays ours.
            name = self._unique_name(spec.name, spec.program)
            source = self._hub.source(name)
            spawned = services.spawner.spawn(spec, self._hub.child_env(source), name)

            def exited() -> None:
                self._exited(proc)

            def event(state: str) -> None:
                self._event(proc, state)

            sup = Supervisor(
                services,
                spec,
                spawned,
                name=name,
                source=source,
                grace=grace,
                stop_signal=stop_signal,
                on_exit=exited,
                on_event=event,
            )
            proc = Process(sup)
            self._live[name] = proc
            if spec.service:
                self._services.add(proc)
            signals = self._scope.signals
            if signals is not None:
                signals.add(sup)
            self._hub.log(
                logging.DEBUG, f"started {name} (pid {proc.pid}): {describe_argv(spec.argv)}"
            )
            self._event(proc, "running")
            try:
                # Its supervisor must run, or nobody ever reaps the child.
                await _backend.start_surely(
                    tg, (sup.supervise, (), f"corral supervisor {self._runner}.{name}")
                )
                # The loop's turn before the next spawn (start_surely's on asyncio).
                if trio_loop:
                    await anyio.lowlevel.cancel_shielded_checkpoint()
            except BaseException:
                await sup.abandon()
                raise
        try:
            # A cancellation that arrives now (a deadline that passed during
            # the spawn included) cancels the start: the child is stopped and
            # reaped first: a start returns only a child its caller is still
            # there to hold.
            await checkpoint_if_cancelled()
        except BaseException:
            await sup.abandon()
            raise
        if spec.wait_started:
            await sup.wait_started()
        return proc

    # -- the end of the block -----------------------------------------------------------

    def end_services(self) -> None:
        """At the normal end of the block: stop the services once the other children exited.

        Each service (``service=True``) then gets what a stop gives (its stop
        signal, its grace, SIGKILL) instead of being waited for; a failure or
        a cancellation meanwhile stops every child anyway.
        """
        tg = self._scope.tg
        if tg is not None and self._services:
            tg.start_soon(self._end_services, name=f"corral services of {self._runner}")

    async def _end_services(self) -> None:
        waited: set[Process] = set()
        while others := [p for p in self.live if p not in self._services and p not in waited]:
            for proc in others:
                await proc.wait()
                waited.add(proc)
        tg = self._scope.tg
        assert tg is not None
        for proc in self.live:
            if proc in self._services:
                tg.start_soon(proc.stop, name=f"corral stop {self._runner}.{proc.name}")

    def _unique_name(self, name: str | None, program: str) -> str:
        taken = self._live
        if name is not None:
            if name in taken:
                raise ValueError(f"a process named {name!r} is already running in this runner")
        else:
            base = (_NAME_BAD_CHARS.sub("-", program) or "process")[: MAX_NAME - 8]
            name = base
            if name in taken:
                # Suffixes count up per base name, so naming stays linear even
                # with a thousand children of one program.
                n = self._name_counters.get(base, 1)
                while name in taken:
                    n += 1
                    name = f"{base}-{n}"
                self._name_counters[base] = n
        return name


async def checkpoint_if_cancelled() -> None:
    """Raise the cancellation if the calling task is cancelled, or its deadline has passed.

    :func:`anyio.lowlevel.checkpoint_if_cancelled` sees a cancelled scope, but
    not a deadline that has passed while the loop has not yet noticed it.
    """
    await anyio.lowlevel.checkpoint_if_cancelled()
    while anyio.current_effective_deadline() <= anyio.current_time():
        await anyio.lowlevel.checkpoint()  # the deadline's cancellation is on its way
