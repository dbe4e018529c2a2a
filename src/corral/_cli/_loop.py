"""The loop ``corral run`` and ``corral up`` share: one runner, the console, the status table."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn, Protocol, TextIO, TypeVar, cast

import anyio
import anyio.to_thread

from .._core._stop import Grace, stop_strays
from .._logs._terminal import terminal_text, write_out
from .._sys import _contain
from ._console import CommandConsole
from ._group import Output
from ._io import (
    EXIT_PIPE,
    STOPPED_EARLY,
    Stdout,
    call_soon,
    check_written,
    ctrl_c_pending,
    ctrl_c_stage,
    fail,
    python_handles_ctrl_c,
    say,
)
from ._status import Status

if TYPE_CHECKING:
    from corral import Runner

__all__ = ["Job", "Status", "main_loop"]

_E = TypeVar("_E", bound=BaseException)


class Job(Protocol):
    """What ``corral run`` and ``corral up`` do in their runner; its exit code."""

    @property
    def programs(self) -> Sequence[str]:
        """The programs it starts (an OS error about one of them is the shell's "cannot run")."""

    @property
    def label(self) -> Callable[[str], str | None] | None:
        """What the console shows of each source (``None``: not shown); see ConsoleHandler."""

    @property
    def grace(self) -> float:
        """The grace period of its processes' stop."""

    @property
    def what(self) -> str:
        """What a stop stops: ``"4 workers"``, ``"3 processes"``."""

    async def __call__(self, r: Runner, status: Status) -> int: ...


def main_loop(name: str, output: Output, job: Job) -> NoReturn:
    stdout = Stdout(sys.stdout)
    if output.contain:
        # The command owns its process: what its processes orphan is handed
        # to it (not to init), to stop and reap, up to its very end.
        _contain.set_subreaper(True)
    ctrl_c_stage("pending")  # a Ctrl-C is noted until the runner holds the signal
    try:
        try:
            code = anyio.run(_serve, name, output, job, stdout)
        finally:
            python_handles_ctrl_c()
            if output.contain:
                _last_sweep(job.grace)
    except KeyboardInterrupt:
        _interrupted()
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            _interrupted()
        sys.exit(_from_group(group, job.programs))
    except BaseException as exc:
        sys.exit(_from_group(BaseExceptionGroup("", [exc]), job.programs))
    check_written(stdout)
    if ctrl_c_pending():  # a Ctrl-C once the run had ended (the runner had given it back)
        say("corral: Ctrl-C as the run ended")
        sys.exit(130)
    sys.exit(code)


def _interrupted() -> NoReturn:
    """Exit after a Ctrl-C: 130, and the one line, if the runner did not say it already."""
    if ctrl_c_pending():
        say(STOPPED_EARLY)
    sys.exit(130)


def _last_sweep(grace: float) -> None:
    """Once the runner is gone, stop every child the command still has, and reap it.

    The runner stopped what it could tell was its children's (in its cgroup,
    or marked in the environment); an orphan that cleared its environment,
    without a cgroup, is still the command's child (it is a subreaper).  Nothing
    else can be running now, so every child is a stray.  A Ctrl-C meanwhile
    kills them at once.
    """
    strays = _contain.Containment("corral", cgroup=False, subreaper=False, adopt_all=True)
    found = strays.strays()
    if not found:
        return
    say(f"corral: stopping {len(found)} process(es) left behind: {_contain.describe(found)}")

    async def sweep(signum: int, seconds: float) -> None:
        await stop_strays(strays, signum, Grace(seconds))

    try:
        anyio.run(sweep, signal.SIGTERM, grace)
    except KeyboardInterrupt:
        anyio.run(sweep, signal.SIGKILL, 0.0)


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

    console = CommandConsole(
        cast(TextIO, stdout),
        colour=output.colour,
        prefix="relative" if output.prefix else "none",
        label=job.label,
        raw=output.raw,
        errors=sys.stderr if output.split_stderr else None,
        quiet=output.quiet,
    )
    console.setLevel(logging.INFO)
    status = Status(grace=job.grace)
    code: int | None = None
    runner: list[Runner] = []
    try:
        async with anyio.create_task_group() as shows:
            try:
                async with corral.open_runner(
                    name=name,
                    grace=job.grace,
                    console=False,
                    handlers=[console],
                    log_dir=output.log_dir,
                    handle_signals=True,
                    monitor=output.monitor,
                    monitor_origins=output.monitor_origins,
                    contain=output.contain,
                    subreaper=output.contain,
                    usage=output.usage,
                ) as r:
                    runner.append(r)
                    if ctrl_c_pending():
                        # A Ctrl-C while the runner started: it holds the signal now,
                        # and has started nothing.
                        raise KeyboardInterrupt
                    console.interrupted = lambda: r.received_signal == signal.SIGINT
                    loop = r.token.loop
                    stdout.when_gone(lambda: call_soon(loop, r.cancel))
                    r.add_observer(status.observe)
                    if r.monitor_url is not None:
                        say(f"corral: monitor at {r.monitor_url}")
                    if output.status and console.terminal:
                        # Outside the runner's scope: the table goes on during the stop.
                        shows.start_soon(_show_status, r, console, status)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(stdout.watch)
                        tg.start_soon(_notice_stop, r, console, status, job)
                        code = await job(r, status)
                        tg.cancel_scope.cancel()
            finally:
                ctrl_c_stage("ended")  # the runner has given the signal back
                shows.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_end, console, output, status, runner)
    if stdout.gone or code is None:
        return EXIT_PIPE  # the runner was cancelled for it
    if code == 0 and runner and runner[0].log_lines_lost and not output.allow_log_loss:
        return 1  # _end said why
    return code


async def _notice_stop(r: Runner, console: CommandConsole, status: Status, job: Job) -> None:
    """Wait for the runner's scope to be cancelled; after a signal, say what it stops.

    The job itself notices only once its processes are stopped (a launch
    stops its workers shielded), this at once.
    """
    try:
        await anyio.sleep_forever()
    finally:
        received = r.received_signal
        if received is not None:
            status.stopping()
            why = "Ctrl-C" if received == signal.SIGINT else received.name
            text = (
                f"corral: {why}: stopping {job.what} (SIGKILL in {status.grace:g} s); "
                "Ctrl-C again kills them now"
            )
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(console.say, text)


def _end(console: CommandConsole, output: Output, status: Status, runner: list[Runner]) -> None:
    """At the end: the live table gives way to the summary, then the failure, on stderr."""
    console.set_footer([])
    console.close()
    stream: TextIO | None = None
    if output.status and console.terminal:
        stream = console.stream
    elif output.status and sys.stderr.isatty():
        stream = sys.stderr
    if stream is not None:
        lines = status.summary(console.width - 1, bool(console.colour), console.height // 2)
        if lines:
            _write(stream, "\n".join(lines) + "\n")
    said = []
    if status.failure is not None:
        # It quotes the process's stderr: the console's policy applies.
        said.append(status.failure if output.raw else terminal_text(status.failure))
    if console.hidden:
        where = f"in {runner[0].log_path}" if runner and runner[0].log_path else "not kept"
        tracebacks = "traceback" if console.hidden == 1 else "tracebacks"
        said.append(
            f"corral: {console.hidden} KeyboardInterrupt {tracebacks} of the stop not shown "
            f"({where}{'' if where != 'not kept' else '; --log-dir keeps them'})"
        )
    lost = runner[0].log_lines_lost if runner else 0
    if lost:
        said.append(
            f"corral: the log files missed {lost} lines (see the warnings above)"
            + ("" if output.allow_log_loss else "; exit code 1 (--allow-log-loss: 0)")
        )
    if said:
        _write(sys.stderr, "\n".join(said) + "\n")


def _write(stream: TextIO, text: str) -> None:
    try:
        write_out(stream, text.encode("utf-8", "replace"))
    except (OSError, ValueError):
        pass  # nobody reads it any more


async def _show_status(r: Runner, console: CommandConsole, status: Status) -> None:
    """Redraw the status table on every start and exit, and twice a second.

    It goes on while the runner stops its processes (it runs outside the
    runner's scope), so that the table shows each one stopping.
    """
    while True:
        status.changed = anyio.Event()
        # The table leaves the bars half the room, if they need it.
        room = console.room
        height = max(room - min(console.bars, room // 2), 2)
        lines = status.render(r.processes, console.width - 1, bool(console.colour), height, r.usage)
        await anyio.to_thread.run_sync(console.set_footer, lines)
        with anyio.move_on_after(0.5):
            await status.changed.wait()
        await anyio.sleep(0.05)  # a burst of exits is drawn once
