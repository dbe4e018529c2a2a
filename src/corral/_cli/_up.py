"""``corral up``, ``corral check`` and ``corral exec``: honcho's start, check and run."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import click

from ._group import CONTEXT, Output, name_option, output_options
from ._io import exit_code, fail, say, shorten
from ._procfile import Plan, env_option, plan_options, read_env_files

if TYPE_CHECKING:
    from corral import Process, Runner

    from ._loop import Status

__all__ = ["SYSTEM", "check", "exec_command", "up"]

#: What the console of ``corral up`` shows for corral's own lines, as honcho does.
SYSTEM = "system"

_EXAMPLES_UP = """
\b
Examples:
  corral up                       (./Procfile, ./.env)
  corral up Procfile.dev web db   (only those two)
  corral up -c worker=3 -e .env.local -q worker
"""


@click.command(epilog=_EXAMPLES_UP, context_settings=CONTEXT)
@plan_options
@click.option(
    "-q",
    "--quiet",
    multiple=True,
    metavar="NAME[,NAME]",
    help="Keep these processes' lines off the console, as honcho does (the log files, the "
    "monitor and the lines of 'system' still have them).",
)
@name_option("up")
@output_options
@click.argument("args", nargs=-1)
def up(
    procfile_option: str | None,
    env_files: tuple[str, ...],
    concurrency: tuple[str, ...],
    port: int | None,
    quiet: tuple[str, ...],
    name: str,
    log_dir: str | None,
    allow_log_loss: bool,
    no_prefix: bool,
    no_color: bool,
    raw: bool,
    no_status: bool,
    grace: float,
    monitor: str | None,
    no_contain: bool,
    args: tuple[str, ...],
) -> None:
    """Run the processes of a Procfile; when any of them exits, stop the rest.

    ARGS is an optional Procfile path (one with a slash in it, or a name
    starting with "Procfile") followed by the names of the processes to run
    (all of them by default).  Each process runs through /bin/sh with
    the variables of the .env files, a PORT of its own (the base port,
    plus 100 per process type, plus 1 per copy), and its name (web.1) in
    PS, HONCHO_PROCESS_NAME and CORRAL_PROCESS_NAME.  As in honcho, corral's
    own lines are "system"'s (web.1 started (pid=...), stopped (rc=...))
    and the names are aligned.  A process whose name
    starts with "-" is named after "--": corral up -- -name.  The exit code is that of
    the first process to exit (128 + N for a signal N); 130 after Ctrl-C.
    """
    plan = _plan(procfile_option, env_files, concurrency, port, args)
    hidden = {item.strip() for value in quiet for item in value.split(",") if item.strip()}
    unknown = sorted(hidden - set(plan.processes) - set(plan.names))
    if unknown:
        raise click.BadParameter(
            f"no process named {', '.join(map(shorten, unknown))}", param_hint="--quiet"
        )
    output = Output.of(
        log_dir,
        no_prefix,
        no_color,
        no_status,
        monitor,
        raw=raw,
        allow_log_loss=allow_log_loss,
        no_contain=no_contain,
    )
    job = _UpJob(plan, grace)
    job.label = system_label(name, plan.names, hidden)
    from ._loop import main_loop  # the runner, the console: only once a command runs

    main_loop(name, output, job)


def _plan(
    procfile_option: str | None,
    env_files: Sequence[str],
    concurrency: Sequence[str],
    port: int | None,
    args: Sequence[str],
) -> Plan:
    """The plan of ``up`` and ``check``: ARGS is an optional Procfile path, then names."""
    names = list(args)
    path = procfile_option
    if path is None and names and _looks_like_a_path(names[0]):
        path = names.pop(0)
    return Plan.make(path, env_files, concurrency, port, names)


def _looks_like_a_path(arg: str) -> bool:
    """Whether ``corral up``'s first argument names a Procfile rather than a process.

    A process name cannot contain a slash, and Procfiles are called
    ``Procfile`` or ``Procfile.something``; a file in the current directory
    that happens to share a process's name does not count.
    """
    return "/" in arg or os.path.basename(arg).startswith("Procfile")


def system_label(run: str, names: Sequence[str], hidden: set[str]) -> Callable[[str], str | None]:
    """The console's label of each source, as honcho prints it: ``system`` for corral's own
    lines, every name padded to the longest, none for a process of ``hidden`` (a name, or
    its type)."""
    width = max(len(SYSTEM), *map(len, names))

    def label(source: str) -> str | None:
        if source == run:
            return SYSTEM.ljust(width)
        if source in hidden or source.rpartition(".")[0] in hidden:
            return None
        return source.ljust(width)

    return label


@dataclass
class _UpJob:
    plan: Plan
    grace: float
    #: The console's label of each source, set by the command.
    label: Callable[[str], str | None] | None = None

    #: The programs the job starts: each command runs through the shell.
    programs = ("/bin/sh",)

    @property
    def what(self) -> str:
        """What a stop stops."""
        count = sum(self.plan.counts.values())
        return f"{count} process{'es' if count != 1 else ''}"

    async def __call__(self, r: Runner, status: Status) -> int:
        import logging  # (loaded with the runner: not for --help)

        for notice in self.plan.notices:
            r.log(logging.WARNING, notice)

        def stopped(proc: Process, state: str) -> None:
            if state == "exited":
                r.log(logging.INFO, f"{proc.name} stopped (rc={proc.returncode})")

        r.add_observer(stopped)
        started = []
        for process, command, env in self.plan.copies():
            proc = await r.start(
                ["/bin/sh", "-c", command],
                name=process,
                extra_env=env,
                check=False,
                grace=self.grace,
            )
            r.log(logging.INFO, f"{process} started (pid={proc.pid})")
            started.append(proc)
        first = anyio.Event()
        ended: list[Process] = []

        async def watch(proc: Process) -> None:
            await proc.wait()
            if not ended:
                ended.append(proc)
                first.set()

        async with anyio.create_task_group() as tg:
            for proc in started:
                tg.start_soon(watch, proc)
            await first.wait()
            proc = ended[0]
            status.stopping()
            r.log(
                logging.INFO,
                f"{proc.name} exited with code {proc.returncode}: stopping the others",
            )
            tg.cancel_scope.cancel()
        code = ended[0].returncode
        assert code is not None  # it was waited for
        if code != 0 and r.received_signal is None:
            from ._status import describe_failure

            status.failure = describe_failure(ended[0].name, code, ended[0].stderr_tail)
        r.cancel()
        return exit_code(code)


# -- honcho's check and run -----------------------------------------------------------------


@click.command(context_settings=CONTEXT)
@plan_options
@click.argument("args", nargs=-1)
def check(
    procfile_option: str | None,
    env_files: tuple[str, ...],
    concurrency: tuple[str, ...],
    port: int | None,
    args: tuple[str, ...],
) -> None:
    """Check a Procfile and its .env files as corral up reads them; start nothing.

    Takes corral up's options and ARGS.  Prints what corral up would run and
    exits 0, or says what is wrong in one line and exits 2, as corral up
    would before starting anything.
    """
    plan = _plan(procfile_option, env_files, concurrency, port, args)
    for notice in plan.notices:
        say(f"corral: {notice}")
    names = plan.names
    files = plan.env_files
    where = f"; {len(plan.env)} variables from {', '.join(files)}" if files else ""
    click.echo(
        f"{plan.path} is valid: {', '.join(plan.processes)} ({len(names)} "
        f"process{'es' if len(names) != 1 else ''}: {', '.join(names)}){where}"
    )


@click.command("exec", context_settings={**CONTEXT, "allow_interspersed_args": False})
@env_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(env_files: tuple[str, ...], command: tuple[str, ...]) -> None:
    """Run COMMAND with the variables of the .env files, as honcho run does.

    The command replaces corral (it gets the signals, its exit code is
    corral's) with this shell's environment and the .env files' over it:
    no PORT, no process name, none of corral run's torchrun variables.
    127 if the command is not found, 126 if it cannot be executed, 2 for a
    bad .env file.  Put the command after "--" (or after the options).
    """
    notices: list[str] = []
    env, _ = read_env_files(env_files, notices)
    for notice in notices:
        say(f"corral: {notice}")
    try:
        sys.stdout.flush()
        os.execvpe(command[0], list(command), os.environ | env)
    except OSError as exc:
        code = 127 if exc.errno == errno.ENOENT else 126
        fail(f"cannot run {shorten(command[0])}: {exc.strerror or exc}", code)
