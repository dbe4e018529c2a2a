"""What each process costs: CPU and resident memory of its whole tree, from ``/proc``.

:class:`TreeSampler` is called about once a second (by the runner's sampler,
in a worker thread, and by each agent for its workers) with the pids of the
processes to watch, the *roots*.  For each it sums the figures of the root and
of its descendants: the processes whose parent chain leads to it, and the
members of the process group it leads (a descendant whose parent died stays
in its group).

* **CPU** is in percent of one core, as ``top`` and ``ps`` count it (a
  process with two busy threads shows 200 %): the growth of the tree's CPU
  time (user and system, of the live members and of the children they have
  reaped) over the wall time since the last sample.  The first sample of a
  root is its average since it started.
* **Memory** is the sum of the members' resident set sizes (pages shared by
  several members, after a ``fork``, count once for each of them).
* **GPU memory**, where NVML is there (the ``pynvml`` module, from the
  ``nvidia-ml-py`` package, and NVIDIA's driver): what the members hold on
  every GPU.  Without it the figure is ``None``, never an error.

The cost is one read of ``/proc/<pid>/stat`` per known member per sample;
the descendants are looked for, in a scan of every process's ``stat``, at a
root's first sample and then every :data:`DISCOVER_EVERY` samples.  A
descendant found late counts from then on at its average rate so far.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["DISCOVER_EVERY", "INTERVAL", "ResourceUsage", "TreeSampler", "clock", "group_members"]

#: Seconds between two samples (of a runner's children, of an agent's workers).
INTERVAL: Final = 1.0
#: Samples between two scans for new descendants of the roots.
DISCOVER_EVERY: Final = 5

_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """What a process and its descendants cost at the last sample (see :attr:`Process.usage
    <corral.Process.usage>` and :attr:`Runner.usage <corral.Runner.usage>`)."""

    #: The process's pid (on its host).
    pid: int
    #: CPU in percent of one core (two busy threads: 200), over the last second or so.
    cpu_percent: float
    #: Resident memory in bytes, the sum of the tree's members.
    rss: int
    #: GPU memory in bytes on every GPU, where NVML tells it (``pynvml``); else ``None``.
    gpu_memory: int | None = None
    #: The processes counted: the process itself and its descendants.
    processes: int = 1
    #: The host a remote worker runs on (a name of ``hosts=``); ``None`` for this machine.
    host: str | None = None


def clock() -> float:
    """Seconds since boot, in the clock of ``/proc/<pid>/stat``'s start times."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(slots=True)
class _Stat:
    ppid: int
    pgrp: int
    ticks: int  # user + system of the process, and of the children it reaped
    rss: int  # pages
    start: int  # clock ticks after boot


def _read_stat(pid: int) -> _Stat | None:
    """``/proc/<pid>/stat``, the fields that count; ``None`` if the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 2048)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return _Stat(
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            ticks=int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14]),
            rss=int(fields[21]),
            start=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def _all_pids() -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def group_members(pgids: Collection[int]) -> dict[int, list[int]]:
    """The processes of each group of ``pgids`` (zombies included): one walk of ``/proc``.

    One ``getpgid`` per process of the machine, no file read: a few
    milliseconds for a few thousand processes (call it from a worker thread).
    """
    found: dict[int, list[int]] = {}
    for pid in _all_pids():
        try:
            pgid = os.getpgid(pid)
        except OSError:
            continue  # gone meanwhile
        if pgid in pgids:
            found.setdefault(pgid, []).append(pid)
    return found


@dataclass(slots=True)
class _Tree:
    """One root's members as last read: pid -> (start, ticks)."""

    start: int
    members: dict[int, tuple[int, int]] = field(default_factory=dict)
    total: int = 0  # the members' ticks at the last sample
    at: float = 0.0  # when (clock())
    samples: int = 0


class TreeSampler:
    """Figures for process trees, one call a sample (see the module's docs).

    Not thread-safe: one caller at a time (the runner's sampler calls it from
    one worker thread at a time).  ``gpu=False`` never asks NVML.
    """

    def __init__(self, *, gpu: bool = True) -> None:
        self._trees: dict[int, _Tree] = {}
        self._count = 0
        self._gpu = _Nvml() if gpu else None

    def sample(self, roots: Collection[int]) -> dict[int, ResourceUsage]:
        """The figures of each root still alive (a root that is gone is left out)."""
        stats: dict[int, _Stat] = {}
        for pid in roots:
            stat = _read_stat(pid)
            if stat is not None:
                stats[pid] = stat
        trees = self._trees
        for gone in set(trees) - set(stats):
            del trees[gone]
        new = False
        for pid, stat in stats.items():
            tree = trees.get(pid)
            if tree is None or tree.start != stat.start:  # new, or a pid used again
                trees[pid] = _Tree(stat.start)
                new = True
        now = clock()
        if new or self._count % DISCOVER_EVERY == 0:
            members = self._discover(stats)
        else:
            members = {pid: self._known(pid, stats[pid]) for pid in trees}
        self._count += 1
        gpu = self._gpu.memory() if self._gpu is not None and trees else None
        return {
            pid: self._figures(pid, tree, members[pid], now, gpu) for pid, tree in trees.items()
        }

    def _known(self, root: int, stat: _Stat) -> dict[int, _Stat]:
        """The root and the members it had, as they are now (those still there)."""
        found = {root: stat}
        for pid, (start, _) in self._trees[root].members.items():
            if pid != root:
                member = _read_stat(pid)
                if member is not None and member.start == start:
                    found[pid] = member
        return found

    def _discover(self, roots: dict[int, _Stat]) -> dict[int, dict[int, _Stat]]:
        """Every root's tree, from a scan of every process."""
        children: dict[int, list[int]] = {}
        groups: dict[int, list[int]] = {}
        every: dict[int, _Stat] = dict(roots)
        for pid in _all_pids():
            stat = every.get(pid) or _read_stat(pid)
            if stat is None:
                continue
            every[pid] = stat
            children.setdefault(stat.ppid, []).append(pid)
            groups.setdefault(stat.pgrp, []).append(pid)
        trees: dict[int, dict[int, _Stat]] = {}
        for root in roots:
            found: dict[int, _Stat] = {}
            todo = [root]
            if roots[root].pgrp == root:  # it leads its group: the group is its own
                todo += groups.get(root, [])
            while todo:
                pid = todo.pop()
                if pid in found or pid not in every or (pid in roots and pid != root):
                    continue
                found[pid] = every[pid]
                todo += children.get(pid, [])
            trees[root] = found
        return trees

    def _figures(
        self,
        root: int,
        tree: _Tree,
        members: dict[int, _Stat],
        now: float,
        gpu: dict[int, int] | None,
    ) -> ResourceUsage:
        total = sum(stat.ticks for stat in members.values())
        if tree.samples == 0:
            # The first sample: the average since the root started (a quarter of a
            # second at least, or a tick of a process just born would be 400 %).
            ticks = members[root].ticks
            elapsed = max(now - tree.start / _TICKS, 0.25)
        else:
            ticks = total - tree.total
            elapsed = now - tree.at
            for pid, stat in members.items():
                if pid not in tree.members:
                    # Found since the last sample: what it used before does not
                    # count; what it used since, at its average rate if it is
                    # older than that sample.
                    ticks -= stat.ticks
                    age = now - stat.start / _TICKS
                    share = 1.0 if age <= elapsed else elapsed / max(age, 1e-9)
                    ticks += round(stat.ticks * share)
        cpu = max(ticks, 0) / _TICKS / elapsed * 100 if elapsed > 0 else 0.0
        tree.members = {pid: (stat.start, stat.ticks) for pid, stat in members.items()}
        tree.total, tree.at = total, now
        tree.samples += 1
        held = None
        if gpu is not None:
            held = sum(gpu.get(pid, 0) for pid in members)
        return ResourceUsage(
            pid=root,
            cpu_percent=round(cpu, 1),
            rss=sum(stat.rss for stat in members.values()) * _PAGE,
            gpu_memory=held,
            processes=len(members),
        )


#: Where a loaded NVIDIA driver shows itself (in a container too): without it,
#: NVML is not even imported.
NVIDIA_DRIVER: Final = "/proc/driver/nvidia"


class _Nvml:
    """GPU memory by pid through NVML, if ``pynvml`` and a driver are there; else nothing.

    Without NVIDIA's driver, ``pynvml`` is not imported at all.  Whatever goes
    wrong (no module, no library, no GPU, a call that fails) turns the figure
    off for good, silently: it is an extra, never an error.
    """

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] | None = None  # None: not tried yet; []: off

    def _start(self) -> list[Any]:
        if not os.path.exists(NVIDIA_DRIVER):
            return []
        return self.start_nvml()

    def start_nvml(self) -> list[Any]:
        """NVML's devices (``[]`` if it cannot be had), whether a driver shows or not."""
        try:
            import pynvml  # nvidia-ml-py: optional

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:  # no module, no library, no driver, no device...
            return []
        self._nvml = pynvml
        return handles

    @property
    def available(self) -> bool:
        """Whether GPU figures can be had (tried on first use)."""
        if self._handles is None:
            self._handles = self._start()
        return bool(self._handles)

    def memory(self) -> dict[int, int] | None:
        """The GPU memory each pid holds, all GPUs together; ``None`` without NVML."""
        if not self.available:
            return None
        held: dict[int, int] = {}
        try:
            for handle in self._handles or ():
                for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(proc, "usedGpuMemory", None) or 0
                    held[proc.pid] = held.get(proc.pid, 0) + int(used)
        except Exception:
            self._handles = []
            return None
        return held
