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
after SIGTERM, 141 when stdout is closed under it (``| head``: what SIGPIPE
would give, once the processes are stopped), 127 for a command that is not
found and 126 for one that cannot be executed, 2 for bad arguments and bad
input files, 1 when corral itself fails (a host that cannot be reached).
Each error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import os
import re
import select
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO, TypeVar, cast

import anyio
import anyio.to_thread
import click

from ._hosts import MAX_WORKERS, MAX_WORKERS_PER_HOST
from ._link import DEFAULT_LINK_TIMEOUT

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


#: The exit code after stdout was closed under the command: 128 + SIGPIPE, the
#: code a program killed by SIGPIPE at its next write has.
EXIT_PIPE = 141

#: What a write raises once the reader of a pipe or socket has gone.
_READER_GONE = (BrokenPipeError, ConnectionResetError)
#: What a pipe or socket reports once its reader has gone.
_HANG_UP = select.POLLERR | select.POLLHUP


def _say(message: str) -> None:
    """One line of corral's own on stderr (nothing if nobody reads stderr any more)."""
    try:
        sys.stderr.write(message.replace("\n", " ") + "\n")
        sys.stderr.flush()
    except _READER_GONE:
        _silence(sys.stderr)


def _fail(message: str, code: int) -> NoReturn:
    _say(f"corral: error: {message}")
    sys.exit(code)


def _silence(stream: Any) -> None:
    """Point the descriptor under ``stream`` at /dev/null, its reader being gone.

    What is left in the stream's buffer then goes nowhere instead of failing
    again when the interpreter flushes it at exit (which would print an
    "Exception ignored" message and turn the exit code into 120).
    """
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


def _shorten(value: str, limit: int = 40) -> str:
    """``repr(value)``, cut to about ``limit`` characters: user input quoted on one line."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class _Stdout:
    """``sys.stdout`` as the console writes to it: a reader that went away is a stop.

    A program whose stdout is a pipe (``corral run ... | head -1``) gets
    SIGPIPE at its first write after the reader has gone, and dies of it.
    Python ignores SIGPIPE and raises :class:`BrokenPipeError` instead, here
    on the log router's thread, where it would stop nothing.  This wrapper
    does what SIGPIPE would, in order: once the reader is gone (a write
    failed, or :meth:`watch` saw it go) it drops every later write (no
    error, no work), points the descriptor at /dev/null, and calls the
    :meth:`when_gone` callback once, which stops the run; the command then
    exits with :data:`EXIT_PIPE`.  Any other error writing to stdout (a full
    disk) stops the run the same way, and the command exits with 1 and says
    why (:attr:`error`), as ``echo hi > /dev/full`` does.
    """

    name = "<stdout>"

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        raw = getattr(stream, "buffer", None)
        self.buffer = None if raw is None else _StdoutBytes(self, raw)
        self._lock = threading.Lock()
        self._gone = False
        self._on_closed: Callable[[], None] | None = None
        #: What a write raised that was not the reader going, if one did.
        self.error: OSError | None = None

    @property
    def gone(self) -> bool:
        """Whether the reader has gone (every write since was dropped)."""
        return self._gone

    def when_gone(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the reader goes (now, if it has gone already).

        It is called from the thread that found out: a log handler's, or the watch's.
        """
        with self._lock:
            self._on_closed = callback
            gone = self._gone
        if gone:
            callback()

    def guard(self, call: Callable[..., object], *args: Any) -> None:
        """``call(*args)``, unless the reader has gone; a write that finds it gone stops."""
        if self._gone:
            return
        try:
            call(*args)
        except _READER_GONE:
            self._went()
        except OSError as exc:
            self._went(exc)

    def _went(self, error: OSError | None = None) -> None:
        with self._lock:
            if self._gone:
                return
            self._gone = True
            self.error = error
            callback = self._on_closed
        _silence(self._stream)
        if callback is not None:
            callback()

    async def watch(self) -> None:
        """Notice the reader going even while nothing is written; run it in a task group.

        Only a pipe or a socket is watched: when its reader goes, the kernel
        reports an error or a hang-up on it, whatever events were asked for,
        and the loop wakes whoever waits for it to be readable.  A file never
        closes under the command, and a terminal that goes away sends SIGHUP.
        """
        try:
            fd = self._stream.fileno()
            mode = os.fstat(fd).st_mode
        except (OSError, ValueError, AttributeError):
            return
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return
        poller = select.poll()
        poller.register(fd, 0)  # only what is always reported: POLLERR, POLLHUP, POLLNVAL
        while not self._gone:
            await anyio.wait_readable(fd)
            if any(events & _HANG_UP for _, events in poller.poll(0)):
                self._went()
                return
            if stat.S_ISSOCK(mode):
                return  # a peer that writes back: its data is not ours to read

    def write(self, text: str) -> int:
        self.guard(self._stream.write, text)
        return len(text)

    def flush(self) -> None:
        self.guard(self._stream.flush)

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def fileno(self) -> int:
        return int(self._stream.fileno())


class _StdoutBytes:
    """The binary side of :class:`_Stdout` (``sys.stdout.buffer``), guarded the same way."""

    def __init__(self, owner: _Stdout, raw: Any) -> None:
        self._owner = owner
        self._raw = raw

    def write(self, data: bytes) -> int:
        self._owner.guard(self._raw.write, data)
        return len(data)

    def flush(self) -> None:
        self._owner.guard(self._raw.flush)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script: ``corral``.  Bad usage is one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="corral", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        sys.exit(2)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "corral"
        _say(f"{command}: error: {exc.format_message()} (see {command} --help)")
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _say(f"corral: error: {exc.format_message()}")
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

#: What a run's name may not contain: it begins every source's name, where a
#: dot separates the parts, and names a folder under ``--log-dir``.
_BAD_NAME = re.compile(r"[\s/\\.\0]")


#: The most copies of a command on one host (``-n``) or of a Procfile's process
#: (``-c``): the library's maximum of workers on a host.
MAX_COPIES = MAX_WORKERS_PER_HOST


def _grace(value: float) -> float:
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", param_hint="--grace")
    return value


def _link_timeout(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise click.BadParameter(
            f"{value} is not a positive number of seconds", param_hint="--link-timeout"
        )
    return value


def _is_text(value: str) -> bool:
    """Whether ``value`` is printable UTF-8 text (an argument of bytes that are not is not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return value.isprintable()


def _text_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A click callback: the value (or each value) must be printable UTF-8 text.

    Host names, ssh options and URLs end up in programs that print them
    back, and in messages; bytes that are not text have no business there.
    """
    for item in value if isinstance(value, tuple) else [value]:
        if item is not None and not _is_text(item):
            raise click.BadParameter(f"{_shorten(item)} is not printable UTF-8 text")
    return value


def _run_name(value: str) -> str:
    from ._runner import MAX_NAME

    if not value or len(value) > MAX_NAME or _BAD_NAME.search(value) or not _is_text(value):
        raise click.BadParameter(
            f"{_shorten(value)} is not a run name: 1-{MAX_NAME} printable characters, "
            "without spaces, dots or slashes",
            param_hint="--name",
        )
    return value


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
        if log_dir is not None:
            try:
                os.makedirs(log_dir, exist_ok=True)
            except OSError as exc:
                raise click.BadParameter(
                    f"cannot make the folder {_shorten(log_dir)}: {exc.strerror or exc}",
                    param_hint="--log-dir",
                ) from None
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
                callback=lambda _ctx, _param, value: _grace(value),
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
    type=click.IntRange(min=1, max=MAX_COPIES),
    default=None,
    help="Copies of the command on each host (default: 1, or the tasks per node of "
    f"the Slurm allocation with --hosts slurm; at most {MAX_COPIES}).",
)
@click.option(
    "--hosts",
    metavar="H1,H2|slurm",
    callback=_text_option,
    help="Run on these hosts over ssh, or on the Slurm allocation's nodes.",
)
@click.option(
    "--name",
    default="run",
    show_default=True,
    callback=lambda _ctx, _param, value: _run_name(value),
    help="The name of the run (it starts every source's name; no dots, spaces or slashes).",
)
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
@click.option(
    "--link-timeout",
    metavar="SECONDS",
    type=float,
    default=DEFAULT_LINK_TIMEOUT,
    callback=lambda _ctx, _param, value: _link_timeout(value),
    show_default=True,
    help="With --hosts: a host whose link stays silent this long counts as lost "
    "(its workers are stopped, the run fails).",
)
@click.option("--ssh-user", callback=_text_option, help="The remote user for --hosts.")
@click.option(
    "--ssh-identity",
    type=click.Path(dir_okay=False),
    callback=_text_option,
    help="An ssh private key.",
)
@click.option(
    "--ssh-option",
    multiple=True,
    metavar="OPTION",
    callback=_text_option,
    help="An extra ssh argument (repeatable).",
)
@_output_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    nproc: int | None,
    hosts: str | None,
    name: str,
    restart: str,
    max_restarts: int,
    link_timeout: float,
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
        if host_list != "slurm" and (nproc or 1) * len(host_list) > MAX_WORKERS:
            raise click.BadParameter(
                f"at most {MAX_WORKERS} copies in all, not {(nproc or 1) * len(host_list)}",
                param_hint="--hosts",
            )
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
    job = _RunJob(list(command), nproc, host_list, ssh, restart, max_restarts, grace, link_timeout)
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
    link_timeout: float

    @property
    def programs(self) -> list[str]:
        """The programs the job starts."""
        return self.argv[:1]

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
                    link_timeout=self.link_timeout,
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

#: The longest process name a Procfile may give: its copies are named
#: ``NAME.N``, and a process's name has at most 100 characters.
MAX_PROCFILE_NAME = 90

#: The most a Procfile or a ``.env`` file may hold: corral reads no more.
MAX_INPUT_FILE = 1024 * 1024

#: The longest ``NAME=value`` one variable may be, its final NUL included:
#: Linux's limit on one string handed to exec (``MAX_ARG_STRLEN``, 32 pages).
MAX_VARIABLE = 128 * 1024


class ProcfileError(click.ClickException):
    """A Procfile that cannot be read, with the line that is wrong."""

    exit_code = 2


class EnvFileError(click.ClickException):
    """A ``.env`` file that cannot be read, with what is wrong."""

    exit_code = 2


def read_input_file(path: str, error: type[click.ClickException]) -> bytes:
    """The bytes of a Procfile or ``.env`` file, at most :data:`MAX_INPUT_FILE`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUT_FILE + 1)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_INPUT_FILE:
        raise error(f"{path} is larger than {MAX_INPUT_FILE // 1024} KiB")
    return data


def _text(data: bytes, path: str, error: type[click.ClickException]) -> str:
    """``data`` as UTF-8 text (a byte-order mark skipped), or ``error`` naming the line."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}, line {line}: not UTF-8 text (byte {data[exc.start]:#04x})") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise error(f"{path}, line {line}: a NUL character")
    return text


def parse_procfile(text: str | bytes, path: str = "Procfile") -> dict[str, str]:
    """The processes of a Procfile (honcho's and foreman's format), in order.

    Each line is ``name: command``; blank lines and lines starting with ``#``
    are skipped.  Anything else is an error naming the line, as is a file
    that is not UTF-8 text or has a NUL character, and a name longer than
    :data:`MAX_PROCFILE_NAME`.
    """
    if isinstance(text, bytes):
        text = _text(text, path, ProcfileError)
    processes: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if "\0" in line:
            raise ProcfileError(f"{path}, line {number}: a NUL character")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _PROCFILE_LINE.match(stripped)
        if match is None:
            raise ProcfileError(
                f"{path}, line {number}: expected 'name: command', got {_shorten(stripped, 60)}"
            )
        name, command = match.groups()
        if len(name) > MAX_PROCFILE_NAME:
            raise ProcfileError(
                f"{path}, line {number}: the name {_shorten(name)} is longer than "
                f"{MAX_PROCFILE_NAME} characters"
            )
        if name in processes:
            raise ProcfileError(
                f"{path}, line {number}: the process {_shorten(name)} is defined twice"
            )
        processes[name] = command
    if not processes:
        raise ProcfileError(f"{path} defines no process")
    return processes


def parse_env_file(data: bytes, path: str = ".env") -> dict[str, str]:
    """The variables of a ``.env`` file, as python-dotenv reads it (honcho's format).

    A line python-dotenv cannot parse is an error naming the line (it would
    only warn), as is a file that is not UTF-8 text or has a NUL character,
    and a variable longer than :data:`MAX_VARIABLE` (no program can be
    started with it).  A name without ``=`` sets nothing.
    """
    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    text = _text(data, path, EnvFileError)
    lines: dict[str, int] = {}
    for binding in parse_stream(io.StringIO(text)):
        line = binding.original.line
        if binding.error:
            statement = binding.original.string.strip()
            raise EnvFileError(f"{path}, line {line}: cannot parse {_shorten(statement, 60)}")
        if binding.key is not None:
            if not binding.key or "=" in binding.key:
                raise EnvFileError(f"{path}, line {line}: {_shorten(binding.key)} is not a name")
            lines.setdefault(binding.key, line)
    env: dict[str, str] = {}
    for key, value in dotenv_values(stream=io.StringIO(text)).items():
        if value is None:
            continue
        size = len(key.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_VARIABLE:
            raise EnvFileError(
                f"{path}, line {lines.get(key, '?')}: {_shorten(key)} is {size // 1024} KiB "
                f"long; a variable may have at most {MAX_VARIABLE // 1024} KiB (the limit of "
                "exec)"
            )
        env[key] = value
    return env


def _port_base(port: int | None, env: dict[str, str]) -> int:
    """``--port``, or PORT from the .env files, from the environment, or 5000."""
    if port is not None:
        return port
    for where, value in (("the .env files", env.get("PORT")), ("$PORT", os.environ.get("PORT"))):
        if value:
            number = value.strip()
            if not re.fullmatch(r"[0-9]{1,5}", number) or not 1 <= int(number) <= 65535:
                raise click.BadParameter(
                    f"PORT={_shorten(value)} from {where} is not a port number",
                    param_hint="--port",
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
@click.option(
    "--name",
    default="up",
    show_default=True,
    callback=lambda _ctx, _param, value: _run_name(value),
    help="The name of the run (it starts every source's name; no dots, spaces or slashes).",
)
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
    names = list(args)
    path = procfile_option
    if path is None and names and _looks_like_a_path(names[0]):
        path = names.pop(0)
    path = path or "Procfile"
    processes = parse_procfile(read_input_file(path, ProcfileError), path)
    unknown = [n for n in names if n not in processes]
    if unknown:
        raise ProcfileError(f"{path} has no process named {', '.join(map(_shorten, unknown))}")
    selected = {n: c for n, c in processes.items() if not names or n in names}
    counts = _concurrency(concurrency, selected)
    if not any(counts.values()):
        raise click.UsageError("nothing to run: every selected process has 0 copies (-c)")
    env: dict[str, str] = {}
    files = list(env_files) or ([".env"] if os.path.isfile(".env") else [])
    for env_file in files:
        if not os.path.exists(env_file):
            raise EnvFileError(f"the env file {env_file} does not exist")
        env.update(parse_env_file(read_input_file(env_file, EnvFileError), env_file))
    _check_env_size(env, files)
    base = _port_base(port, env)
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
        host, port = parse_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--monitor") from None
    # An address this machine does not have, or a port in use, is a bad
    # argument: say so now rather than once the processes run.
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise click.BadParameter(
            f"cannot listen on {_shorten(address)}: {reason}", param_hint="--monitor"
        ) from None
    return address


_CONCURRENCY_ITEM = re.compile(r"\s*([^=]*?)\s*=\s*([0-9]{1,12})\s*")


def _concurrency(values: Sequence[str], processes: dict[str, str]) -> dict[str, int]:
    counts = dict.fromkeys(processes, 1)
    for value in values:
        for item in value.split(","):
            match = _CONCURRENCY_ITEM.fullmatch(item)
            if match is None:
                raise click.BadParameter(
                    f"{_shorten(item)} is not NAME=N", param_hint="--concurrency"
                )
            name, number = match.groups()
            if name not in processes:
                raise click.BadParameter(
                    f"no process named {_shorten(name)}", param_hint="--concurrency"
                )
            if int(number) > MAX_COPIES:
                raise click.BadParameter(
                    f"{_shorten(item)}: at most {MAX_COPIES} copies", param_hint="--concurrency"
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

    #: The programs the job starts: each command runs through the shell.
    programs = ("/bin/sh",)

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
@click.argument("url", callback=_text_option)
@click.option(
    "--source",
    default="*",
    show_default=True,
    callback=_text_option,
    help="Only sources matching this glob.",
)
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
    when the runner ends; 1 if the monitor refuses it, stays unreachable
    for 30 s, or sends a message larger than 4 MiB.
    """
    from ._monitor import _level_number

    if re.fullmatch(r"-?[0-9]{1,9}", level):
        number = int(level)
    else:
        number = _level_number(level)
        if number == 0 and level.upper() != "NOTSET":
            raise click.BadParameter(f"{_shorten(level)} is not a level", param_hint="--level")
    split = _urlsplit(url, source, number)
    stdout = _Stdout(sys.stdout)
    try:
        code = anyio.run(
            _tail,
            split,
            number,
            stdout,
            not no_prefix,
            False if no_color else None,
            backend="asyncio",
        )
    except KeyboardInterrupt:
        code = 130
    _check_written(stdout)
    sys.exit(code)


def _urlsplit(url: str, source: str, level: int) -> str:
    """The WebSocket URL for ``url``, asking the server for this filter from the start."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a bad IPv6 address, a port out of range...
        raise click.BadParameter(
            f"{_shorten(url, 80)} is not a URL: {exc}", param_hint="URL"
        ) from None
    if parts.scheme not in ("http", "ws", "https", "wss") or not parts.hostname or port == 0:
        raise click.BadParameter(f"{_shorten(url, 80)} is not a monitor URL", param_hint="URL")
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


async def _tail(url: str, level: int, stdout: _Stdout, prefix: bool, colour: bool | None) -> int:
    """Follow the log until the runner ends; :data:`EXIT_PIPE` as soon as stdout's reader goes."""
    import corral

    loop = corral.LoopToken.current().loop
    code = EXIT_PIPE
    async with anyio.create_task_group() as tg:
        stdout.when_gone(lambda: _call_soon(loop, tg.cancel_scope.cancel))
        tg.start_soon(stdout.watch)
        code = await _follow(url, level, stdout, prefix, colour)
        tg.cancel_scope.cancel()
    return EXIT_PIPE if stdout.gone else code


#: The longest message ``corral tail`` takes from a monitor: its own are at most
#: 256 KiB, and its first (every process) grows with the processes; a longer
#: one ends the command with one line and exit code 1.
MAX_TAIL_MESSAGE = 4 * 1024 * 1024


async def _follow(url: str, level: int, stdout: _Stdout, prefix: bool, colour: bool | None) -> int:
    import msgspec
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    import corral

    from ._records import make_record

    console = corral.ConsoleHandler(
        cast(TextIO, stdout),
        colour=colour,
        prefix="relative" if prefix else "none",
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
                async with connect(url, open_timeout=10, max_size=MAX_TAIL_MESSAGE) as ws:
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
                            _say(
                                f"corral tail: {message['count']} records dropped "
                                "(this terminal fell behind)"
                            )
                        elif kind == "end":
                            return 0
            except InvalidStatus as exc:
                code = exc.response.status_code
                _say(f"corral tail: the monitor refused the connection ({code}): wrong token?")
                return 1
            except (OSError, ConnectionClosed, TimeoutError) as exc:
                if isinstance(exc, ConnectionClosed) and exc.sent and exc.sent.code == 1009:
                    _say(
                        "corral tail: the monitor sent a message larger than "
                        f"{MAX_TAIL_MESSAGE // 2**20} MiB: not a corral monitor?"
                    )
                    return 1
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > give_up_after:
                    _say(f"corral tail: lost the runner: {exc}")
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


def _check_written(stdout: _Stdout) -> None:
    """Exit with 1 and say why if stdout failed otherwise than by its reader going."""
    if stdout.error is not None:
        _fail(f"cannot write to stdout: {stdout.error.strerror or stdout.error}", 1)


def _call_soon(loop: Any, fn: Callable[[], object]) -> None:
    """``fn()`` on ``loop`` soon, from any thread; nothing if the loop has finished."""
    try:
        loop.call_soon_threadsafe(fn)
    except anyio.RunFinishedError:
        pass


def _main_loop(name: str, output: _Output, job: Any) -> NoReturn:
    stdout = _Stdout(sys.stdout)
    try:
        code = anyio.run(_serve, name, output, job, stdout)
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseExceptionGroup as group:
        sys.exit(_from_group(group, job.programs))
    except BaseException as exc:
        sys.exit(_from_group(BaseExceptionGroup("", [exc]), job.programs))
    _check_written(stdout)
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
        _fail(str(limit), 1)
    for error in _all(group, OSError):
        if error.filename is not None and os.fspath(error.filename) in programs:
            code = 127 if error.errno == errno.ENOENT else 126
            reason = error.strerror or str(error)
            _fail(f"cannot run {os.fspath(error.filename)!r}: {reason}", code)
    failed = _first(group, corral.LaunchError)
    if failed is not None:
        _fail(" ".join(str(failed).split()), 1)  # ssh's message, on one line
    other = _first(group, OSError)
    if other is not None:  # a log folder or a monitor address that cannot be had, say
        if other.filename is not None:
            _fail(f"{os.fspath(other.filename)}: {other.strerror or other}", 1)
        _fail(str(other), 1)
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


async def _serve(name: str, output: _Output, job: Any, stdout: _Stdout) -> int:
    import corral

    console = corral.ConsoleHandler(
        cast(TextIO, stdout),
        colour=output.colour,
        prefix="relative" if output.prefix else "none",
    )
    console.setLevel(logging.INFO)
    status = _Status()
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
        stdout.when_gone(lambda: _call_soon(loop, r.cancel))
        r._observers.append(status.observe)
        if r.monitor_url is not None:
            _say(f"corral: monitor at {r.monitor_url}")
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
