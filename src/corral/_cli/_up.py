"""``corral up``: the processes of a Procfile, as honcho and foreman run them."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import click

from ._group import CONTEXT, MAX_COPIES, Output, name_option, output_options
from ._io import exit_code, shorten
from ._loop import Status, main_loop
from ._procfile import EnvFileError, ProcfileError, parse_env_file, parse_procfile, read_input_file
from ._status import describe_failure

if TYPE_CHECKING:
    from corral import Process, Runner

__all__ = ["PROCESS_NAME_VARIABLES", "up"]

#: The variables naming each process of ``corral up`` (``web.1``, ``web.2``,
#: ``worker.1``...): foreman's ``PS``, honcho's ``HONCHO_PROCESS_NAME`` and
#: corral's own.
PROCESS_NAME_VARIABLES = ("PS", "HONCHO_PROCESS_NAME", "CORRAL_PROCESS_NAME")

_EXAMPLES_UP = """
\b
Examples:
  corral up                       (./Procfile, ./.env)
  corral up Procfile.dev web db   (only those two)
  corral up -c worker=3 -e .env.local
"""


def _port_base(port: int | None, env: dict[str, str], notices: list[str]) -> int:
    """The base port, as honcho picks it: PORT from the .env files, ``-p``, $PORT or 5000."""
    candidates = [("the .env files", env.get("PORT"))]
    if port is not None:
        candidates.append(("-p", str(port)))
    candidates.append(("$PORT", os.environ.get("PORT")))
    for where, value in candidates:
        if value:
            number = value.strip()
            if not re.fullmatch(r"[0-9]{1,5}", number) or not 1 <= int(number) <= 65535:
                raise click.BadParameter(
                    f"PORT={shorten(value)} from {where} is not a port number",
                    param_hint="--port",
                )
            if where != "-p" and port is not None:
                notices.append(
                    f"PORT={number} from {where} is the base port, not -p {port} (as in honcho)"
                )
            return int(number)
    return 5000


def _check_env_size(env: dict[str, str], paths: Sequence[str]) -> None:
    """Fail if the environment with ``env`` could not be handed to exec at all."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (OSError, ValueError):
        return
    merged = os.environ | env
    # Each string and its pointer; and room for the command and corral's own variables.
    size = sum(len(k.encode()) + len(v.encode()) + 2 + 8 for k, v in merged.items())
    if size > limit - 64 * 1024:
        raise EnvFileError(
            f"{', '.join(paths)}: the environment would take {size // 1024} KiB, and the "
            f"kernel starts a program with at most {limit // 1024} KiB of arguments and "
            "environment"
        )


@click.command(epilog=_EXAMPLES_UP, context_settings=CONTEXT)
@click.option(
    "-f",
    "--procfile",
    "procfile_option",
    help="The Procfile (default: $PROCFILE from the .env files or the environment, or ./Procfile).",
)
@click.option(
    "-e",
    "--env",
    "env_files",
    multiple=True,
    help=(
        "The .env files to load, comma-separated or repeated; a later one wins "
        "(default: ./.env if there is one)."
    ),
)
@click.option(
    "-c",
    "--concurrency",
    multiple=True,
    metavar="NAME=N[,NAME=N]",
    help="Run N copies of a process (repeatable).",
)
@click.option(
    "-p",
    "--port",
    type=click.IntRange(min=1, max=65535),
    help=(
        "The base of the PORT each process gets, unless the .env files set PORT "
        "(as in honcho; default: $PORT or 5000)."
    ),
)
@name_option("up")
@output_options
@click.argument("args", nargs=-1)
def up(
    procfile_option: str | None,
    env_files: tuple[str, ...],
    concurrency: tuple[str, ...],
    port: int | None,
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
    PS, HONCHO_PROCESS_NAME and CORRAL_PROCESS_NAME.  A process whose name
    starts with "-" is named after "--": corral up -- -name.  The exit code is that of
    the first process to exit (128 + N for a signal N); 130 after Ctrl-C.
    """
    notices: list[str] = []
    env: dict[str, str] = {}
    files = [f.strip() for value in env_files for f in value.split(",") if f.strip()]
    if not env_files and os.path.isfile(".env"):
        files = [".env"]
    for env_file in files:
        if not os.path.exists(env_file):
            raise EnvFileError(f"the env file {env_file} does not exist")
        data = read_input_file(env_file, EnvFileError)
        env.update(parse_env_file(data, env_file, notices))
    _check_env_size(env, files)
    names = list(args)
    path = procfile_option
    if path is None and names and _looks_like_a_path(names[0]):
        path = names.pop(0)
    path = path or env.get("PROCFILE") or os.environ.get("PROCFILE") or "Procfile"
    processes = parse_procfile(read_input_file(path, ProcfileError), path)
    unknown = [n for n in names if n not in processes]
    if unknown:
        raise ProcfileError(f"{path} has no process named {', '.join(map(shorten, unknown))}")
    selected = {n: c for n, c in processes.items() if not names or n in names}
    counts = _concurrency(concurrency, selected)
    if not any(counts.values()):
        raise click.UsageError("nothing to run: every selected process has 0 copies (-c)")
    base = _port_base(port, env, notices)
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
    main_loop(name, output, _UpJob(selected, counts, env, base, grace, notices))


def _looks_like_a_path(arg: str) -> bool:
    """Whether ``corral up``'s first argument names a Procfile rather than a process.

    A process name cannot contain a slash, and Procfiles are called
    ``Procfile`` or ``Procfile.something``; a file in the current directory
    that happens to share a process's name does not count.
    """
    return "/" in arg or os.path.basename(arg).startswith("Procfile")


_CONCURRENCY_ITEM = re.compile(r"\s*([^=]*?)\s*=\s*([0-9]{1,12})\s*")


def _concurrency(values: Sequence[str], processes: dict[str, str]) -> dict[str, int]:
    counts = dict.fromkeys(processes, 1)
    for value in values:
        for item in value.split(","):
            match = _CONCURRENCY_ITEM.fullmatch(item)
            if match is None:
                raise click.BadParameter(
                    f"{shorten(item)} is not NAME=N", param_hint="--concurrency"
                )
            name, number = match.groups()
            if name not in processes:
                raise click.BadParameter(
                    f"no process named {shorten(name)}", param_hint="--concurrency"
                )
            if int(number) > MAX_COPIES:
                raise click.BadParameter(
                    f"{shorten(item)}: at most {MAX_COPIES} copies", param_hint="--concurrency"
                )
            counts[name] = int(number)
    return counts


@dataclass
class _UpJob:
    processes: dict[str, str]
    counts: dict[str, int]
    env: dict[str, str]
    base_port: int
    grace: float
    notices: list[str]

    #: The programs the job starts: each command runs through the shell.
    programs = ("/bin/sh",)
    #: Every source is shown as it is.
    label = None

    @property
    def what(self) -> str:
        """What a stop stops."""
        count = sum(self.counts.values())
        return f"{count} process{'es' if count != 1 else ''}"

    async def __call__(self, r: Runner, status: Status) -> int:
        for notice in self.notices:
            r.log(logging.WARNING, notice)
        started = []
        for index, (name, command) in enumerate(self.processes.items()):
            for copy in range(self.counts[name]):
                process = f"{name}.{copy + 1}"
                env = dict(self.env)
                env["PORT"] = str(self.base_port + 100 * index + copy)
                # foreman's name, honcho's, corral's: one value, set over the .env files'.
                env.update(dict.fromkeys(PROCESS_NAME_VARIABLES, process))
                started.append(
                    await r.start(
                        ["/bin/sh", "-c", command],
                        name=process,
                        extra_env=env,
                        check=False,
                        grace=self.grace,
                    )
                )
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
            status.failure = describe_failure(ended[0].name, code, ended[0].stderr_tail)
        r.cancel()
        return exit_code(code)
