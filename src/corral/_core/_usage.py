"""The runner's sampler: what each child costs, about once a second (``usage=`` of the runner).

A task of the runner's group reads the CPU and memory of every running
child's tree from ``/proc`` (:class:`corral._sys._proc.TreeSampler`) in a
worker thread, so the loop only hands the pids over and takes the figures
back.  It sleeps while no child runs (its first sample comes a second after
a child started), and ends with the children.  Remote workers' figures come
from their agents (:meth:`UsageSampler.remote`) and are published with the
next sample.  Those who want the figures (the monitor, :attr:`Runner.usage
<corral.Runner.usage>`, :attr:`Process.usage <corral.Process.usage>`) read
them here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import anyio
import anyio.to_thread

from .._sys._proc import INTERVAL, ResourceUsage, TreeSampler

__all__ = ["UsageSampler"]

Listener = Callable[[float, Mapping[str, ResourceUsage]], None]


class Sampled(Protocol):
    """What the sampler reads of a child (a :class:`~corral.Process` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...


class UsageSampler:
    """The figures of a runner's children, sampled while any runs (see the module's docs).

    ``live`` gives the children that run now.
    """

    def __init__(self, live: Callable[[], Iterable[Sampled]]) -> None:
        self._live = live
        self._sampler = TreeSampler()
        #: The last figures of each child sampled, by pid.
        self.by_pid: dict[int, ResourceUsage] = {}
        #: The last figures published: every child's and remote worker's, by name.
        self.latest: dict[str, ResourceUsage] = {}
        self._remote: dict[str, dict[str, ResourceUsage]] = {}
        self._listeners: list[Listener] = []
        self._wake = anyio.Event()

    @classmethod
    def make(cls, usage: object, live: Callable[[], Iterable[Sampled]]) -> UsageSampler | None:
        """The sampler ``usage=`` (``True`` or ``False``) asks for, if any."""
        if not isinstance(usage, bool):
            raise TypeError(f"usage must be True or False, not {usage!r}")
        return cls(live) if usage else None

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(time, figures by name)`` on the loop after each sample."""
        self._listeners.append(listener)

    def observe(self, proc: Sampled, state: str) -> None:
        """A runner observer: a child that starts ends the sampler's sleep; one that ends
        leaves the figures."""
        if state == "running":
            self._wake.set()
        else:
            self.latest.pop(proc.name, None)

    def remote(self, agent: str, figures: Mapping[str, ResourceUsage]) -> None:
        """The figures of ``agent``'s workers, by name within the runner; none: it is done."""
        if figures:
            self._remote[agent] = dict(figures)
        else:
            self._remote.pop(agent, None)
        self._wake.set()

    async def run(self, done: anyio.Event) -> None:
        """Sample every :data:`INTERVAL` seconds while children run, until ``done`` is set."""
        limiter = anyio.CapacityLimiter(1)
        fresh = True
        while not done.is_set():
            self._wake = anyio.Event()
            children = {proc.pid: proc.name for proc in self._live() if proc.returncode is None}
            if not children and not self._remote:
                self.by_pid, self.latest = {}, {}
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_set_when, done, tg.cancel_scope)
                    await self._wake.wait()
                    tg.cancel_scope.cancel()
                fresh = True
                continue
            if fresh:
                # The first sample a second after children came: a runner whose
                # children live shorter costs nothing (a sample scans every process).
                fresh = False
                with anyio.move_on_after(INTERVAL):
                    await done.wait()
                continue
            began = anyio.current_time()
            figures = await anyio.to_thread.run_sync(
                self._sampler.sample, list(children), limiter=limiter
            )
            self.by_pid = figures
            named = {children[pid]: usage for pid, usage in figures.items()}
            for workers in self._remote.values():
                named.update(workers)
            self.latest = named
            now = time.time()
            for listener in self._listeners:
                listener(now, named)
            with anyio.move_on_after(INTERVAL - (anyio.current_time() - began)):
                await done.wait()


async def _set_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
