"""What ``corral run`` and ``corral up`` show of their processes: the live table, the summary.

The live table sits under the scrolling lines while the processes run, and
says ``stopping`` with the grace left once a stop is under way.  At the end a
summary takes its place and stays: each process, how it ended, how long it
ran.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from .._results import end_state

if TYPE_CHECKING:
    from corral import Process, ResourceUsage

__all__ = ["Status", "describe_failure", "size", "usage_cells"]

#: Trailing blanks before the end of a rendered line (and its closing colour codes).
_TRAILING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$")


@dataclass
class Status:
    """The processes of the run as the command shows them, and how the run is ending."""

    restarts: int = 0
    seen: dict[str, Process] = field(default_factory=dict)
    #: The last exit code of each name, whichever Process object it was (a
    #: group restart starts new ones), recorded as it happens.
    last: dict[str, int] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)
    #: The grace period of a stop: stop signal, then SIGKILL this long after.
    grace: float = 5.0
    #: When the stop of every process began (a signal, a failure, the first
    #: exit of ``corral up``), if it has.
    stop_began: float | None = None
    #: What is said on stderr at the end about the failure that ended the run.
    failure: str | None = None

    def observe(self, proc: Process, state: str) -> None:
        """A runner observer (on the loop): note exits, redraw soon."""
        if state == "exited" and proc.returncode is not None:
            self.last[proc.name] = proc.returncode
            if end_state(proc.returncode, proc.stop_requested) == "failed":
                # A failure: the others are stopped because of it (a group
                # restart starts them again: see :meth:`restarted`).
                self.stopping()
        self.changed.set()

    def restarted(self, attempt: int) -> None:
        """The group was started again: what stopped it is over."""
        self.restarts = attempt
        self.stop_began = None
        self.changed.set()

    def stopping(self) -> None:
        """The stop of every process begins now (the first call counts)."""
        if self.stop_began is None:
            self.stop_began = time.monotonic()
            self.changed.set()

    def _state(self, proc: Process, now: float) -> str:
        code = proc.returncode
        if code is None:
            if self.stop_began is None:
                return "running"
            left = self.grace - (now - self.stop_began)
            return f"stopping, {left:.0f} s left" if left > 0 else "killing"
        return end_state(code, proc.stop_requested)

    def rows(
        self, processes: Sequence[Process], usage: Mapping[str, ResourceUsage] | None = None
    ) -> Iterator[tuple[str, ...]]:
        for proc in processes:
            self.seen[proc.name] = proc
        now = time.monotonic()
        usage = usage or {}
        for name, proc in self.seen.items():
            code = proc.returncode
            if code is None:
                uptime = _duration(now - proc.started_at)
            else:
                uptime = _duration(proc.duration or 0.0)
            last = code if code is not None else self.last.get(name, proc.previous_exit)
            yield (
                name,
                self._state(proc, now),
                str(proc.pid),
                *usage_cells(usage.get(name) if code is None else None),
                uptime,
                str(proc.restarts or self.restarts),
                "-" if last is None else str(last),
            )
        yield from _remote_rows(usage, self.seen)

    def render(
        self,
        processes: Sequence[Process],
        width: int,
        colour: bool,
        height: int = 1000,
        usage: Mapping[str, ResourceUsage] | None = None,
    ) -> list[bytes]:
        """The live table, at most ``width`` columns wide and ``height`` rows tall, with what
        each process costs (``usage``, by name: :attr:`Runner.usage <corral.Runner.usage>`)."""
        from rich.table import Table

        rows = list(self.rows(processes, usage))
        shown = rows
        if len(rows) + 1 > height:
            # Too many to show: the ones that are not simply running first.
            shown = sorted(rows, key=lambda row: row[1] == "running")[: max(height - 2, 0)]
        gpu = _COLUMNS.index("gpu")
        wanted = [c for c in _COLUMNS if c != "gpu" or any(row[gpu] != "-" for row in shown)]
        columns = _fitting(wanted, shown, width)
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for column in columns:
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        for row in shown:
            style = {"running": "green", "failed": "red"}.get(row[1], "")
            if row[1].startswith(("stopping", "killing")):
                style = "yellow"
            table.add_row(*(row[_COLUMNS.index(c)] for c in columns), style=style)
        lines = _lines(table, width, colour)
        if len(shown) < len(rows):
            counts: dict[str, int] = {}
            for row in rows:
                kind = row[1].split(",")[0]
                counts[kind] = counts.get(kind, 0) + 1
            said = ", ".join(f"{n} {kind}" for kind, n in counts.items())
            lines.append(f"... {len(rows) - len(shown)} more not shown; in all {said}"[:width])
        return [line.encode() for line in lines]

    def summary(self, width: int, colour: bool, height: int) -> list[str]:
        """What stays on screen at the end: each process, how it ended, how long it ran.

        When there are more processes than ``height`` rows can show, those that
        exited with 0 are counted instead of listed.
        """
        from rich.table import Table

        now = time.monotonic()
        rows: list[tuple[str, str, str, str]] = []
        for name, proc in self.seen.items():
            code = proc.returncode
            state = self._state(proc, now) if code is not None else "running"
            if code is None:
                how = "-"
            elif code < 0:
                how = _signal_name(-code)
            else:
                how = f"code {code}"
            rows.append((name, state, how, _duration(proc.duration or 0.0)))
        if not rows:
            return []
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for column in ("name", "ended", "how", "ran for"):
            table.add_column(column, no_wrap=True, overflow="ellipsis")
        shown = rows
        if len(rows) + 1 > height:
            shown = [row for row in rows if row[1] != "exited"][: max(height - 2, 0)]
        for row in shown:
            style = {"exited": "green", "failed": "red"}.get(row[1], "yellow")
            table.add_row(*row, style=style)
        lines = _lines(table, width, colour) if shown else []
        if len(shown) < len(rows):
            counts: dict[str, int] = {}
            for row in rows:
                counts[row[1]] = counts.get(row[1], 0) + 1
            said = ", ".join(f"{n} {kind}" for kind, n in counts.items())
            more = f"... and {len(rows) - len(shown)} more; " if shown else ""
            lines.append(f"{more}{len(rows)} processes in all: {said}"[:width])
        return lines


#: The columns of the live table, and those it goes without on a narrow terminal, in order.
#: ``gpu`` is shown only when a process holds GPU memory.
_COLUMNS = ("name", "state", "pid", "cpu", "mem", "gpu", "uptime", "restarts", "last exit")
_DROPPED = ("pid", "restarts", "uptime", "gpu", "mem", "cpu")


def usage_cells(usage: ResourceUsage | None) -> tuple[str, str, str]:
    """The ``cpu``, ``mem`` and ``gpu`` cells of a process: ``99.5%``, ``1.2G``, ``3.0G``
    (``-`` for what is not known)."""
    if usage is None:
        return "-", "-", "-"
    gpu = "-" if usage.gpu_memory is None else size(usage.gpu_memory)
    return f"{usage.cpu_percent:.1f}%", size(usage.rss), gpu


def size(nbytes: int) -> str:
    """A size in bytes as ``top`` shows one: ``512K``, ``97M``, ``1.2G``."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{nbytes >> 10}K"


def _remote_rows(
    usage: Mapping[str, ResourceUsage], seen: Mapping[str, Process]
) -> Iterator[tuple[str, ...]]:
    """The rows of a launch's workers on other hosts: known by their figures alone."""
    for name, figures in usage.items():
        if figures.host is not None and name not in seen:
            yield (name, "running", str(figures.pid), *usage_cells(figures), "-", "-", "-")


def _fitting(columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """``columns``, less those of :data:`_DROPPED` that ``width`` has no room for."""
    widths = {
        name: max([len(name), *(len(row[_COLUMNS.index(name)]) for row in rows)])
        for name in columns
    }
    kept = list(columns)
    for dropped in _DROPPED:
        if sum(widths[c] for c in kept) + 2 * (len(kept) - 1) <= width:
            break
        if dropped in kept:
            kept.remove(dropped)
    return kept


def _lines(table: object, width: int, colour: bool) -> list[str]:
    """``table`` rendered by rich at ``width`` columns, its lines without trailing blanks."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=max(width, 20),
        force_terminal=colour,
        color_system="standard" if colour else None,
    )
    console.print(table)
    return [_TRAILING.sub(r"\1", line) for line in buffer.getvalue().rstrip("\n").split("\n")]


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def describe_failure(
    who: str, returncode: int | None, stderr: bytes, traceback: str = "", lines: int = 10
) -> str:
    """What the command says on stderr about the failure that ended the run.

    ``who`` names the process (``rank 1 (local rank 1 on host node2)``); then
    how it ended, and its last ``lines`` stderr lines (or that it wrote
    none), or the traceback of the exception it raised.
    """
    if returncode is None:
        how = "raised an exception"
    elif returncode < 0:
        how = f"was killed by {_signal_name(-returncode)}"
    else:
        how = f"exited with code {returncode}"
    text = f"corral: {who} {how}"
    tail = stderr.decode("utf-8", "replace").rstrip().splitlines()[-lines:]
    said = [line for line in traceback.splitlines() if line.strip()]
    if said and returncode is not None:
        text += f": {said[-1].strip()}"  # the exception torch's @record wrote down
    if traceback.strip():
        text += ":\n" + "\n".join("  " + line for line in traceback.rstrip().splitlines())
    elif tail:
        text += "; its last stderr lines:\n" + "\n".join("  " + line for line in tail)
    else:
        text += " (it wrote nothing to stderr)"
    return text
