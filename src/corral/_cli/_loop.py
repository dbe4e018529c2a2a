"""The loop ``corral run`` and ``corral up`` share: one runner, the console, the status table."""

from __future__ import annotations

import errno
import io
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn, Protocol, TextIO, TypeVar, cast

import anyio
import anyio.to_thread

from ._group import Output
from ._io import EXIT_PIPE, Stdout, fail, say

if TYPE_CHECKING:
    from corral import ConsoleHandler, Process, Runner

    from .._sys._backend import LoopHandle

__all__ = ["Job", "Status", "call_soon", "check_written", "main_loop"]

_E = TypeVar("_E", bound=BaseException)


class Job(Protocol):
    """What ``corral run`` and ``corral up`` do in their runner; its exit code."""

    @property
    def programs(self) -> Sequence[str]:
        """The programs it starts (an OS error about one of them is the shell's "cannot run")."""

    async def __call__(self, r: Runner, status: Status) -> int: ...


@dataclass
class Status:
    """The live status table: what the runner's processes are doing."""

    restarts: int = 0
    seen: dict[str, Process] = field(default_factory=dict)
    #: The last exit code of each name, whichever Process object it was (a
    #: group restart starts new ones), recorded as it happens.
    last: dict[str, int] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def observe(self, proc: Process, state: str) -> None:
        """A runner observer (on the loop): note exits, redraw soon."""
        if state == "exited" and proc.returncode is not None:
            self.last[proc.name] = proc.returncode
        self.changed.set()

    def rows(self, processes: Sequence[Process]) -> Iterator[tuple[str, ...]]:
        for proc in processes:
            self.seen[proc.name] = proc
        now = time.monotonic()
        for name, proc in self.seen.items():
            code = proc.returncode
            if code is None:
                state = "running"
                uptime = _duration(now - proc.started_at)
            else:
                state = "exited" if code == 0 else "failed"
                uptime = _duration(proc.duration or 0.0)
            last = code if code is not None else self.last.get(name, proc.previous_exit)
            yield (
                name,
                state,
                str(proc.pid),
                uptime,
                str(proc.restarts or self.restarts),
                "-" if last is None else str(last),
            )

    def render(self, processes: Sequence[Process], width: int, colour: bool) -> list[bytes]:
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for column in ("name", "state", "pid", "uptime", "restarts", "last exit"):
            table.add_column(column, no_wrap=True)
        for row in self.rows(processes):
            style = {"running": "green", "failed": "red"}.get(row[1], "")
            table.add_row(*row, style=style)
        buffer = io.StringIO()
        console = Console(
            file=buffer,
            width=width,
            force_terminal=colour,
            color_system="standard" if colour else None,
        )
        console.print(table)
        return [line.encode() for line in buffer.getvalue().rstrip("\n").split("\n")]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def check_written(stdout: Stdout) -> None:
    """Exit with 1 and say why if stdout failed otherwise than by its reader going."""
    if stdout.error is not None:
        fail(f"cannot write to stdout: {stdout.error.strerror or stdout.error}", 1)


def call_soon(loop: LoopHandle, fn: Callable[[], object]) -> None:
    """``fn()`` on ``loop`` soon, from any thread; nothing if the loop has finished."""
    try:
        loop.call_soon_threadsafe(fn)
    except anyio.RunFinishedError:
        pass


def main_loop(name: str, output: Output, job: Job) -> NoReturn:
    stdout = Stdout(sys.stdout)
    try:
        code = anyio.run(_serve, name, output, job, stdout)
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseExceptionGroup as group:
        sys.exit(_from_group(group, job.programs))
    except BaseException as exc:
        sys.exit(_from_group(BaseExceptionGroup("", [exc]), job.programs))
    check_written(stdout)
    sys.exit(code)


def _from_group(group: BaseExceptionGroup[BaseException], programs: Sequence[str]) -> int:
    """The exit code for what ended the run; a one-line message first for an error.

    ``programs`` are those the run starts: an error of the operating system
    about one of them is the shell's "cannot run" (127 if it does not exist,
    126 otherwise).
    """
    import corral

    if group.subgroup(KeyboardInterrupt) is not None:
        return 130
    signalled = group.subgroup(corral.Signalled)
    if signalled is not None:
        first = signalled.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        assert isinstance(first, corral.Signalled)
        return 128 + int(first.signal)
    limit = _first(group, corral.ResourceLimitError)
    if limit is not None:
        fail(str(limit), 1)
    for error in _all(group, OSError):
        if error.filename is not None and os.fspath(error.filename) in programs:
            code = 127 if error.errno == errno.ENOENT else 126
            reason = error.strerror or str(error)
            fail(f"cannot run {os.fspath(error.filename)!r}: {reason}", code)
    failed = _first(group, corral.LaunchError)
    if failed is not None:
        fail(" ".join(str(failed).split()), 1)  # ssh's message, on one line
    other = _first(group, OSError)
    if other is not None:  # a log folder or a monitor address that cannot be had, say
        if other.filename is not None:
            fail(f"{os.fspath(other.filename)}: {other.strerror or other}", 1)
        fail(str(other), 1)
    raise group


def _all(group: BaseExceptionGroup[BaseException], kind: type[_E]) -> list[_E]:
    """Every exception of type ``kind`` in ``group``, however deeply nested, in order."""
    found: list[_E] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        elif isinstance(exc, kind):
            found.append(exc)

    walk(group)
    return found


def _first(group: BaseExceptionGroup[BaseException], kind: type[_E]) -> _E | None:
    """The first exception of type ``kind`` in ``group``, however deeply nested."""
    found = group.subgroup(kind)
    if found is None:
        return None
    exc: BaseException = found
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, kind)
    return exc


async def _serve(name: str, output: Output, job: Job, stdout: Stdout) -> int:
    import corral

    console = corral.ConsoleHandler(
        cast(TextIO, stdout),
        colour=output.colour,
        prefix="relative" if output.prefix else "none",
    )
    console.setLevel(logging.INFO)
    status = Status()
    code: int | None = None
    async with corral.open_runner(
        name=name,
        console=False,
        handlers=[console],
        log_dir=output.log_dir,
        handle_signals=True,
        monitor=output.monitor,
    ) as r:
        loop = r.token.loop
        stdout.when_gone(lambda: call_soon(loop, r.cancel))
        r.add_observer(status.observe)
        if r.monitor_url is not None:
            say(f"corral: monitor at {r.monitor_url}")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stdout.watch)
                if output.status and console.terminal:
                    tg.start_soon(_show_status, r, console, status)
                code = await job(r, status)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(console.set_footer, [])
    console.close()
    if stdout.gone or code is None:
        return EXIT_PIPE  # the runner was cancelled for it
    return code


async def _show_status(r: Runner, console: ConsoleHandler, status: Status) -> None:
    """Redraw the status table on every start and exit, and twice a second.

    The drawing runs on the log handlers' thread, never at the same time as
    a batch of lines.
    """
    while True:
        status.changed = anyio.Event()
        width = console.width
        lines = status.render(r.processes, width, bool(console.colour))
        await r.to_log_thread(console.set_footer, lines)
        with anyio.move_on_after(0.5):
            await status.changed.wait()
        await anyio.sleep(0.05)  # a burst of exits is drawn once
