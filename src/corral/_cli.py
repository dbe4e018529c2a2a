"""The ``corral`` command: run N workers or a Procfile, with the library's guarantees.

``corral run`` is torchrun's job (N copies of a command per host, with
``RANK``, ``WORLD_SIZE``... and prefixed output, and torchrun's restart of
the whole group on a failure), ``corral up`` is honcho's and foreman's (the
processes of a Procfile, any exit stops all), and both show a live status
table on a terminal.  The lines go to stdout, as the processes' own output
would; corral's own errors go to stderr.  Underneath is
one runner with ``handle_signals=True``: Ctrl-C reaches every process group
at once, and nothing outlives the command.

Exit codes follow the shell's: 0 when everything succeeded, otherwise the
first failure's exit code (128 + N for a signal N), 130 after Ctrl-C, 143
after SIGTERM, 127 for a command that is not found and 126 for one that
cannot be executed, 2 for bad arguments.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.to_thread
import click

__all__ = ["cli", "main"]

_E = TypeVar("_E", bound=BaseException)

_EXAMPLES_RUN = """
\b
Examples:
  corral run -n 4 -- python train.py --epochs 3
  corral run -n 8 --hosts node1,node2 -- python train.py
  corral run --hosts slurm -- python train.py        (inside salloc/sbatch)
  corral run -n 2 --restart on-failure --max-restarts 3 -- ./worker.sh
"""

_EXAMPLES_UP = """
\b
Examples:
  corral up                       (./Procfile, ./.env)
  corral up Procfile.dev web db   (only those two)
  corral up -c worker=3 -e .env.local
"""

_EXAMPLES = """
\b
Examples:
  corral run -n 4 -- python train.py     (4 workers, torchrun's environment)
  corral up                              (the processes of ./Procfile)
  corral tail 'http://127.0.0.1:8765/?token=...'
"""

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _exit_code(returncode: int) -> int:
    """The shell's convention: a signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"corral: error: {message}", err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script: ``corral``.  Bad usage is one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="corral", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        sys.exit(2)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "corral"
        click.echo(f"{command}: error: {exc.format_message()} (see {command} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"corral: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    sys.exit(0)


@click.group(context_settings=_CONTEXT, epilog=_EXAMPLES)
@click.version_option(None, "-V", "--version", package_name="corral", message="corral %(version)s")
def cli() -> None:
    """Run processes the structured way: N workers of a command, or a Procfile.

    Every line the processes write is shown with its source (coloured on a
    terminal), optionally kept in a log folder, with a live status table
    under it.  Ctrl-C stops every process (and every process it started) at
    once; nothing outlives the command.
    """


# -- shared options ----------------------------------------------------------------------------


@dataclass
class _Output:
    log_dir: str | None
    prefix: bool
    colour: bool | None
    status: bool
    monitor: str | None = None

    @classmethod
    def of(
        cls,
        log_dir: str | None,
        no_prefix: bool,
        no_color: bool,
        no_status: bool,
        monitor: str | None,
    ) -> _Output:
        """From the shared options, as click gives them."""
        colour = False if no_color else None
        return cls(log_dir, not no_prefix, colour, not no_status, _monitor(monitor))


def _output_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--log-dir",
                type=click.Path(file_okay=False),
                help="Also write every line to files in a timestamped folder under this one.",
            ),
            click.option("--no-prefix", is_flag=True, help="Show the lines as they are."),
            click.option("--no-color", is_flag=True, help="No colours, even on a terminal."),
            click.option("--no-status", is_flag=True, help="No live status table under the lines."),
            click.option(
                "--grace",
                type=click.FloatRange(min=0),
                default=5.0,
                show_default=True,
                help="Seconds between the stop signal and SIGKILL.",
            ),
            click.option(
                "--monitor",
                metavar="HOST:PORT",
                help="Serve a live monitor (a page and a WebSocket) here, e.g. 127.0.0.1:0.",
            ),
        ]
    ):
        func = option(func)
    return func


# -- corral run ---------------------------------------------------------------------------------


@cli.command(
    context_settings={**_CONTEXT, "allow_interspersed_args": False},
    epilog=_EXAMPLES_RUN,
)
@click.option(
    "-n",
    "--nproc-per-node",
    "nproc",
    type=click.IntRange(min=1),
    default=None,
    help="Copies of the command on each host (default: 1, or the tasks per node of "
    "the Slurm allocation with --hosts slurm).",
)
@click.option(
    "--hosts",
    metavar="H1,H2|slurm",
    help="Run on these hosts over ssh, or on the Slurm allocation's nodes.",
)
@click.option("--name", default="run", show_default=True, help="The name of the run.")
@click.option(
    "--restart",
    type=click.Choice(["never", "on-failure"]),
    default="never",
    show_default=True,
    help="Restart the whole group of workers when one fails, as torchrun does.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Restarts allowed with --restart on-failure.",
)
@click.option("--ssh-user", help="The remote user for --hosts.")
@click.option("--ssh-identity", type=click.Path(dir_okay=False), help="An ssh private key.")
@click.option(
    "--ssh-option", multiple=True, metavar="OPTION", help="An extra ssh argument (repeatable)."
)
@_output_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    nproc: int | None,
    hosts: str | None,
    name: str,
    restart: str,
    max_restarts: int,
    ssh_user: str | None,
    ssh_identity: str | None,
    ssh_option: tuple[str, ...],
    log_dir: str | None,
    no_prefix: bool,
    no_color: bool,
    no_status: bool,
    grace: float,
    monitor: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND NPROC times per host, as torchrun would, and show every line.

    Each copy gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    MASTER_ADDR and MASTER_PORT.  The exit code is 0 when every copy
    succeeded, otherwise the first failure's (128 + N for a signal N); 130
    after Ctrl-C.  Put the command after "--" (or after the options).
    """
    host_list: list[str] | str | None = None
    if hosts is not None:
        host_list = "slurm" if hosts == "slurm" else [h for h in hosts.split(",") if h]
        if not host_list:
            raise click.BadParameter("give at least one host", param_hint="--hosts")
    from ._hosts import SSH, slurm_hosts

    ssh = SSH(user=ssh_user, identity_file=ssh_identity, options=tuple(ssh_option))
    if host_list is not None and host_list != "slurm":
        try:
            ssh.check()
        except (OSError, ValueError, TypeError) as exc:
            hint = "--ssh-identity" if ssh_identity and str(ssh_identity) in str(exc) else None
            raise click.BadParameter(str(exc), param_hint=hint) from None
    if host_list == "slurm":
        try:
            slurm_hosts()
        except (RuntimeError, OSError) as exc:
            raise click.BadParameter(str(exc), param_hint="--hosts") from None
    output = _Output.of(log_dir, no_prefix, no_color, no_status, monitor)
    job = _RunJob(list(command), nproc, host_list, ssh, restart, max_restarts, grace)
    _main_loop(name, output, job)


@dataclass
class _RunJob:
    argv: list[str]
    nproc: int | None
    hosts: list[str] | str | None
    ssh: Any
    restart: str
    max_restarts: int
    grace: float

    async def __call__(self, r: Any, status: _Status) -> int:
        import corral

        from ._process import RestartPolicy

        attempt = 0
        while True:
            try:
                await r.launch_command(
                    self.argv,
                    hosts=self.hosts,
                    workers_per_host=self.nproc,
                    ssh=self.ssh,
                    grace=self.grace,
                )
                return 0
            except corral.WorkerFailed as failure:
                if self.restart != "on-failure" or attempt >= self.max_restarts:
                    r._hub.log(logging.ERROR, str(failure).split("\n", 1)[0])
                    return _exit_code(failure.returncode if failure.returncode is not None else 1)
                attempt += 1
                status.restarts = attempt
                # The library's policy: 1 s doubled each time, with jitter, at most 30 s.
                delay = RestartPolicy("on-failure", self.max_restarts).delay(attempt)
                r._hub.log(
                    logging.WARNING,
                    f"restarting the worker group in {delay:.2f} s (restart {attempt} of "
                    f"{self.max_restarts}): {failure}",
                )
                await anyio.sleep(delay)


# -- corral up ------------------------------------------------------------------------------------


_PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)\s*:\s*(.*\S)\s*$")


class ProcfileError(click.ClickException):
    """A Procfile that cannot be read, with the line that is wrong."""

    exit_code = 2


def parse_procfile(text: str, path: str = "Procfile") -> dict[str, str]:
    """The processes of a Procfile (honcho's and foreman's format), in order.

    Each line is ``name: command``; blank lines and lines starting with ``#``
    are skipped.  Anything else is an error naming the line.
    """
    processes: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _PROCFILE_LINE.match(stripped)
        if match is None:
            raise ProcfileError(
                f"{path}, line {number}: expected 'name: command', got {stripped!r}"
            )
        name, command = match.groups()
        if name in processes:
            raise ProcfileError(f"{path}, line {number}: the process {name!r} is defined twice")
        processes[name] = command
    if not processes:
        raise ProcfileError(f"{path} defines no process")
    return processes


@cli.command(epilog=_EXAMPLES_UP, context_settings=_CONTEXT)
@click.option("-f", "--procfile", "procfile_option", help="The Procfile (default: ./Procfile).")
@click.option(
    "-e",
    "--env",
    "env_files",
    multiple=True,
    help="A .env file to load (repeatable; default: ./.env if there is one).",
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
    help="The base of the PORT each process gets (default: $PORT or 5000).",
)
@click.option("--name", default="up", show_default=True, help="The name of the run.")
@_output_options
@click.argument("args", nargs=-1)
def up(
    procfile_option: str | None,
    env_files: tuple[str, ...],
    concurrency: tuple[str, ...],
    port: int | None,
    name: str,
    log_dir: str | None,
    no_prefix: bool,
    no_color: bool,
    no_status: bool,
    grace: float,
    monitor: str | None,
    args: tuple[str, ...],
) -> None:
    """Run the processes of a Procfile; when any of them exits, stop the rest.

    ARGS is an optional Procfile path (one with a slash in it, or a name
    starting with "Procfile") followed by the names of the processes to run
    (all of them by default).  Each process runs through /bin/sh with
    the variables of the .env files and a PORT of its own (the base port,
    plus 100 per process type, plus 1 per copy).  The exit code is that of
    the first process to exit (128 + N for a signal N); 130 after Ctrl-C.
    """
    from dotenv import dotenv_values

    names = list(args)
    path = procfile_option
    if path is None and names and _looks_like_a_path(names[0]):
        path = names.pop(0)
    path = path or "Procfile"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ProcfileError(f"cannot read {path}: {exc.strerror}") from None
    processes = parse_procfile(text, path)
    unknown = [n for n in names if n not in processes]
    if unknown:
        raise ProcfileError(f"{path} has no process named {', '.join(map(repr, unknown))}")
    selected = {n: c for n, c in processes.items() if not names or n in names}
    counts = _concurrency(concurrency, selected)
    if not any(counts.values()):
        raise click.UsageError("nothing to run: every selected process has 0 copies (-c)")
    env: dict[str, str] = {}
    files = list(env_files) or ([".env"] if os.path.isfile(".env") else [])
    for env_file in files:
        if not os.path.isfile(env_file):
            raise ProcfileError(f"the env file {env_file} does not exist")
        env.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
    base = port or int(env.get("PORT") or os.environ.get("PORT") or 5000)
    output = _Output.of(log_dir, no_prefix, no_color, no_status, monitor)
    _main_loop(name, output, _UpJob(selected, counts, env, base, grace))


def _looks_like_a_path(arg: str) -> bool:
    """Whether ``corral up``'s first argument names a Procfile rather than a process.

    A process name cannot contain a slash, and Procfiles are called
    ``Procfile`` or ``Procfile.something``; a file in the current directory
    that happens to share a process's name does not count.
    """
    return "/" in arg or os.path.basename(arg).startswith("Procfile")


def _monitor(address: str | None) -> str | None:
    if address is None:
        return None
    from ._monitor import parse_address

    try:
        parse_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--monitor") from None
    return address


def _concurrency(values: Sequence[str], processes: dict[str, str]) -> dict[str, int]:
    counts = dict.fromkeys(processes, 1)
    for value in values:
        for item in value.split(","):
            name, equals, number = item.partition("=")
            if not equals or not number.strip().isdigit():
                raise click.BadParameter(f"{item!r} is not NAME=N", param_hint="--concurrency")
            if name.strip() not in processes:
                raise click.BadParameter(f"no process named {name!r}", param_hint="--concurrency")
            counts[name.strip()] = int(number)
    return counts


@dataclass
class _UpJob:
    processes: dict[str, str]
    counts: dict[str, int]
    env: dict[str, str]
    base_port: int
    grace: float

    async def __call__(self, r: Any, status: _Status) -> int:
        started = []
        for index, (name, command) in enumerate(self.processes.items()):
            for copy in range(self.counts[name]):
                env = dict(self.env)
                env["PORT"] = str(self.base_port + 100 * index + copy)
                started.append(
                    await r.start(
                        ["/bin/sh", "-c", command],
                        name=f"{name}.{copy + 1}",
                        extra_env=env,
                        check=False,
                        grace=self.grace,
                    )
                )
        first = anyio.Event()
        ended: list[Any] = []

        async def watch(proc: Any) -> None:
            await proc.wait()
            if not ended:
                ended.append(proc)
                first.set()

        async with anyio.create_task_group() as tg:
            for proc in started:
                tg.start_soon(watch, proc)
            await first.wait()
            proc = ended[0]
            r._hub.log(
                logging.INFO,
                f"{proc.name} exited with code {proc.returncode}: stopping the others",
            )
            tg.cancel_scope.cancel()
        code = ended[0].returncode
        r.cancel()
        return _exit_code(code)


# -- corral tail -------------------------------------------------------------------------------

_EXAMPLES_TAIL = """
\b
Examples:
  corral tail 'http://127.0.0.1:8765/?token=...'
  corral tail 'http://127.0.0.1:8765/?token=...' --source 'run.agent-0.*' --level WARNING
"""


@cli.command(epilog=_EXAMPLES_TAIL, context_settings=_CONTEXT)
@click.argument("url")
@click.option("--source", default="*", show_default=True, help="Only sources matching this glob.")
@click.option(
    "--level",
    default="INFO",
    show_default=True,
    help="Only records at this level or above (a name or a number).",
)
@click.option("--no-prefix", is_flag=True, help="Show the lines as they are.")
@click.option("--no-color", is_flag=True, help="No colours, even on a terminal.")
def tail(url: str, source: str, level: str, no_prefix: bool, no_color: bool) -> None:
    """Follow the log of a running corral through its monitor URL.

    Prints every line with the same prefixes and colours as corral run,
    reconnects if the connection drops while the runner lives, and exits 0
    when the runner ends.
    """
    from ._monitor import _level_number

    number = int(level) if level.lstrip("-").isdigit() else _level_number(level)
    if number == 0 and level.upper() not in ("NOTSET", "0"):
        raise click.BadParameter(f"{level!r} is not a level", param_hint="--level")
    split = _urlsplit(url, source, number)
    sys.exit(
        anyio.run(
            _tail,
            split,
            number,
            not no_prefix,
            False if no_color else None,
            backend="asyncio",
        )
    )


def _urlsplit(url: str, source: str, level: int) -> str:
    """The WebSocket URL for ``url``, asking the server for this filter from the start."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "ws", "https", "wss") or not parts.netloc:
        raise click.BadParameter(f"{url!r} is not a monitor URL", param_hint="URL")
    query = [
        (k, v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if k not in ("source", "level")
    ]
    if not any(k == "token" for k, _ in query):
        raise click.BadParameter("the URL has no token (?token=...)", param_hint="URL")
    query += [("source", source), ("level", str(level))]
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    encoded = urllib.parse.urlencode(query)
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path or "/", encoded, ""))


async def _tail(url: str, level: int, prefix: bool, colour: bool | None) -> int:
    import msgspec
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    import corral

    from ._records import make_record

    console = corral.ConsoleHandler(
        sys.stdout, colour=colour, prefix="relative" if prefix else "none"
    )
    give_up_after = 30.0
    failing_since: float | None = None
    delay = 0.2
    # The last row printed: after a reconnection the server sends its recent
    # rows again, and those up to this one were printed already.
    last: list[Any] | None = None
    try:
        while True:
            try:
                async with connect(url, open_timeout=10, max_size=None) as ws:
                    failing_since = None
                    delay = 0.2
                    backlog = True
                    async for text in ws:
                        message = msgspec.json.decode(text)
                        kind = message.get("type")
                        if kind == "logs":
                            rows = message["records"]
                            if backlog and last is not None:
                                for index in range(len(rows) - 1, -1, -1):
                                    if rows[index] == last:
                                        rows = rows[index + 1 :]
                                        break
                            backlog = False
                            if not rows:
                                continue
                            last = rows[-1]
                            records = [
                                make_record(src, lvl, line, created=created)
                                for src, _stream, lvl, created, _name, line in rows
                                if lvl >= level
                            ]
                            await anyio.to_thread.run_sync(_print_all, console, records)
                        elif kind == "dropped":
                            click.echo(
                                f"corral tail: {message['count']} records dropped "
                                "(this terminal fell behind)",
                                err=True,
                            )
                        elif kind == "end":
                            return 0
            except InvalidStatus as exc:
                code = exc.response.status_code
                click.echo(
                    f"corral tail: the monitor refused the connection ({code}): wrong token?",
                    err=True,
                )
                return 1
            except (OSError, ConnectionClosed, TimeoutError) as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > give_up_after:
                    click.echo(f"corral tail: lost the runner: {exc}", err=True)
                    return 1
                await anyio.sleep(delay)  # reconnecting: back off between attempts
                delay = min(delay * 2, 2.0)
    finally:
        console.close()


def _print_all(console: Any, records: list[logging.LogRecord]) -> None:
    for record in records:
        console.handle(record)


# -- the loop both commands share -------------------------------------------------------------


@dataclass
class _Status:
    """The live status table: what the runner's processes are doing."""

    restarts: int = 0
    seen: dict[str, Any] = field(default_factory=dict)
    #: The last exit code of each name, whichever Process object it was (a
    #: group restart starts new ones), recorded as it happens.
    last: dict[str, int] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def observe(self, proc: Any, state: str) -> None:
        """A runner observer (on the loop): note exits, redraw soon."""
        if state == "exited" and proc.returncode is not None:
            self.last[proc.name] = proc.returncode
        self.changed.set()

    def rows(self, processes: Sequence[Any]) -> Iterator[tuple[str, ...]]:
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

    def render(self, processes: Sequence[Any], width: int, colour: bool) -> list[bytes]:
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


def _main_loop(name: str, output: _Output, job: Any) -> NoReturn:
    try:
        code = anyio.run(_serve, name, output, job)
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseExceptionGroup as group:
        sys.exit(_from_group(group))
    except BaseException as exc:
        sys.exit(_from_group(BaseExceptionGroup("", [exc])))
    sys.exit(code)


def _from_group(group: BaseExceptionGroup[BaseException]) -> int:
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
    for kind, code in ((FileNotFoundError, 127), (PermissionError, 126)):
        found = _first(group, kind)
        if found is not None:
            if found.filename is None:
                _fail(str(found), code)
            _fail(f"cannot run {found.filename!r}: {found.strerror}", code)
    failed = _first(group, corral.LaunchError)
    if failed is not None:
        _fail(" ".join(str(failed).split()), 1)  # ssh's message, on one line
    raise group


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


async def _serve(name: str, output: _Output, job: Any) -> int:
    import corral

    console = corral.ConsoleHandler(
        sys.stdout, colour=output.colour, prefix="relative" if output.prefix else "none"
    )
    console.setLevel(logging.INFO)
    status = _Status()
    async with corral.open_runner(
        name=name,
        console=False,
        handlers=[console],
        log_dir=output.log_dir,
        handle_signals=True,
        monitor=output.monitor,
    ) as r:
        r._observers.append(status.observe)
        if r.monitor_url is not None:
            click.echo(f"corral: monitor at {r.monitor_url}", err=True)
        try:
            async with anyio.create_task_group() as tg:
                if output.status and console.terminal:
                    tg.start_soon(_show_status, r, console, status)
                code: int = await job(r, status)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(console.set_footer, [])
    console.close()
    return code


async def _show_status(r: Any, console: Any, status: _Status) -> None:
    """Redraw the status table on every start and exit, and twice a second.

    The drawing runs on the log handlers' thread, never at the same time as
    a batch of lines.
    """
    limiter = r._hub.collector._limiter
    while True:
        status.changed = anyio.Event()
        width = console._width()
        lines = status.render(r.processes, width, bool(console.colour))
        await anyio.to_thread.run_sync(console.set_footer, lines, limiter=limiter)
        with anyio.move_on_after(0.5):
            await status.changed.wait()
        await anyio.sleep(0.05)  # a burst of exits is drawn once


if __name__ == "__main__":  # pragma: no cover
    main()
