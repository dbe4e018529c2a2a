"""Procfiles and ``.env`` files, read as honcho and foreman read them, within bounds.

And what ``corral up``, ``check`` and ``export`` make of them (:class:`Plan`):
the processes chosen, their copies, each copy's name and variables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from ._group import MAX_COPIES
from ._io import shorten

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = [
    "MAX_INPUT_FILE",
    "MAX_PROCFILE_NAME",
    "MAX_VARIABLE",
    "PROCESS_NAME_VARIABLES",
    "EnvFileError",
    "Plan",
    "ProcfileError",
    "env_option",
    "parse_env_file",
    "parse_procfile",
    "plan_options",
    "read_env_files",
    "read_input_file",
]

#: The variables naming each process of ``corral up`` (``web.1``, ``web.2``,
#: ``worker.1``...): foreman's ``PS``, honcho's ``HONCHO_PROCESS_NAME`` and
#: corral's own.
PROCESS_NAME_VARIABLES = ("PS", "HONCHO_PROCESS_NAME", "CORRAL_PROCESS_NAME")

_PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-][A-Za-z0-9_.-]*)\s*:\s*(.*\S)\s*$")

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
                f"{path}, line {number}: expected 'name: command', got {shorten(stripped, 60)}"
            )
        name, command = match.groups()
        if len(name) > MAX_PROCFILE_NAME:
            raise ProcfileError(
                f"{path}, line {number}: the name {shorten(name)} is longer than "
                f"{MAX_PROCFILE_NAME} characters"
            )
        if name in processes:
            raise ProcfileError(
                f"{path}, line {number}: the process {shorten(name)} is defined twice"
            )
        processes[name] = command
    if not processes:
        raise ProcfileError(f"{path} defines no process")
    return processes


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_ASSIGNMENT = re.compile(r"([^=\s]+)\s*=[ \t]*")
_EXPORT = re.compile(r"export[ \t]+\S")
#: The escapes of a double-quoted value; any other backslash stays as it is.
_DOUBLE_QUOTED_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}


class _EnvLineError(Exception):
    """What is wrong with one line of a ``.env`` file."""


def _env_value(text: str) -> str:
    """The value after ``NAME=``: quotes and escapes as honcho reads them, see the module doc."""
    value: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _EnvLineError("a ' quote is not closed on its line")
            value.append(text[i + 1 : end].replace("\\n", "\n").replace("\\t", "\t"))
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= len(text):
                    raise _EnvLineError('a " quote is not closed on its line')
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < len(text):
                    escaped = text[i + 1]
                    value.append(_DOUBLE_QUOTED_ESCAPES.get(escaped, c + escaped))
                    i += 2
                else:
                    value.append(c)
                    i += 1
        elif c == "\\":
            if i + 1 >= len(text):
                raise _EnvLineError("a backslash ends the line (a value spans one line)")
            value.append(text[i + 1])
            i += 2
        elif c in " \t":
            rest = text[i:].lstrip(" \t")
            if not rest or rest.startswith("#"):
                break  # trailing blanks, or a comment after them
            value.append(text[i : len(text) - len(rest)])
            i = len(text) - len(rest)
        else:
            value.append(c)
            i += 1
    return "".join(value)


def parse_env_file(
    data: bytes, path: str = ".env", notices: list[str] | None = None
) -> dict[str, str]:
    """The variables of a ``.env`` file, read as honcho reads it (see docs/cli.rst).

    One ``NAME=value`` a line; blank lines and ``#`` comments are skipped, as
    is a name alone.  The value runs to the end of the line or to a ``#``
    after a blank; ``'...'`` and ``"..."`` quote (``\\n`` and ``\\t`` are a
    newline and a tab in both, ``\\\\`` and ``\\"`` are escapes in double
    quotes), a backslash outside quotes takes the next character as it is,
    and nothing is interpolated (``$HOME`` stays ``$HOME``).  ``NAME=`` sets
    an empty value.  An ``export NAME=value`` line is skipped, as honcho and
    foreman skip it, with a line in ``notices`` saying so.

    Any other line is an error naming it (honcho would skip it), as is a
    quote left open, a name that is not a variable name, a file that is not
    UTF-8 text or has a NUL character, and a variable longer than
    :data:`MAX_VARIABLE` (no program can be started with it).
    """
    text = _text(data, path, EnvFileError)
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _ENV_NAME.fullmatch(stripped):
            continue
        if _EXPORT.match(stripped):
            if notices is not None:
                notices.append(
                    f"{path}, line {number}: an 'export' line is skipped, as honcho and "
                    "foreman skip it (write NAME=value to set it)"
                )
            continue
        match = _ENV_ASSIGNMENT.match(stripped)
        if match is None:
            raise EnvFileError(f"{path}, line {number}: cannot parse {shorten(stripped, 60)}")
        key = match[1]
        if not _ENV_NAME.fullmatch(key):
            raise EnvFileError(f"{path}, line {number}: {shorten(key)} is not a variable name")
        try:
            value = _env_value(stripped[match.end() :])
        except _EnvLineError as exc:
            raise EnvFileError(f"{path}, line {number}: {exc}") from None
        size = len(key.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_VARIABLE:
            raise EnvFileError(
                f"{path}, line {number}: {shorten(key)} is {size // 1024} KiB "
                f"long; a variable may have at most {MAX_VARIABLE // 1024} KiB (the limit of "
                "exec)"
            )
        env[key] = value
    return env


# -- what up, check and export make of them --------------------------------------------------


#: ``-e``: the .env files (see :func:`read_env_files`).
env_option = click.option(
    "-e",
    "--env",
    "env_files",
    multiple=True,
    help=(
        "The .env files to load, comma-separated or repeated; a later one wins "
        "(default: ./.env if there is one)."
    ),
)


def plan_options(func: _F) -> _F:
    """``-f``, ``-e``, ``-c`` and ``-p``: which Procfile, which .env files, copies, ports."""
    for option in reversed(
        [
            click.option(
                "-f",
                "--procfile",
                "procfile_option",
                help="The Procfile (default: $PROCFILE from the .env files or the "
                "environment, or ./Procfile).",
            ),
            env_option,
            click.option(
                "-c",
                "--concurrency",
                multiple=True,
                metavar="NAME=N[,NAME=N]",
                help="Run N copies of a process (repeatable).",
            ),
            click.option(
                "-p",
                "--port",
                type=click.IntRange(min=1, max=65535),
                help=(
                    "The base of the PORT each process gets, unless the .env files set PORT "
                    "(as in honcho; default: $PORT or 5000)."
                ),
            ),
        ]
    ):
        func = option(func)
    return func


@dataclass
class Plan:
    """The processes of a Procfile to run, as ``corral up`` runs them."""

    #: The Procfile read.
    path: str
    #: The processes chosen (all by default), in the Procfile's order: name -> command.
    processes: dict[str, str]
    #: Copies of each.
    counts: dict[str, int]
    #: The variables of the .env files.
    env: dict[str, str]
    #: The .env files read.
    env_files: list[str]
    base_port: int
    #: What is worth a line (a skipped ``export``, the PORT that wins).
    notices: list[str]

    @classmethod
    def make(
        cls,
        procfile_option: str | None,
        env_files: Sequence[str],
        concurrency: Sequence[str],
        port: int | None,
        names: Sequence[str] = (),
    ) -> Plan:
        """From the options of :func:`plan_options` and the names of the processes to run.

        Every error is a :class:`click.ClickException` naming what is wrong:
        nothing is started after one.
        """
        notices: list[str] = []
        env, files = read_env_files(env_files, notices)
        path = procfile_option or env.get("PROCFILE") or os.environ.get("PROCFILE") or "Procfile"
        processes = parse_procfile(read_input_file(path, ProcfileError), path)
        unknown = [n for n in names if n not in processes]
        if unknown:
            raise ProcfileError(f"{path} has no process named {', '.join(map(shorten, unknown))}")
        selected = {n: c for n, c in processes.items() if not names or n in names}
        counts = _concurrency(concurrency, selected)
        if not any(counts.values()):
            raise click.UsageError("nothing to run: every selected process has 0 copies (-c)")
        base = _port_base(port, env, notices)
        return cls(path, selected, counts, env, files, base, notices)

    @property
    def names(self) -> list[str]:
        """The name of each copy: ``web.1``, ``web.2``, ``worker.1``..."""
        return [name for name, _, _ in self.copies()]

    def copies(self) -> Iterator[tuple[str, str, dict[str, str]]]:
        """Each copy: its name, its command and its variables (over the environment's).

        The variables are those of the .env files, a PORT of its own (the
        base port, plus 100 per process type, plus 1 per copy) and its name
        in :data:`PROCESS_NAME_VARIABLES`.
        """
        for index, (name, command) in enumerate(self.processes.items()):
            for copy in range(self.counts[name]):
                process = f"{name}.{copy + 1}"
                env = dict(self.env)
                env["PORT"] = str(self.base_port + 100 * index + copy)
                # foreman's name, honcho's, corral's: one value, set over the .env files'.
                env.update(dict.fromkeys(PROCESS_NAME_VARIABLES, process))
                yield process, command, env


def read_env_files(
    env_files: Sequence[str], notices: list[str]
) -> tuple[dict[str, str], list[str]]:
    """The variables of ``-e``'s files (comma-separated or repeated; ./.env by default).

    A later file wins; a file that does not exist is an error, as is an
    environment too large for exec.  Returns them and the files read.
    """
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
    return env, files


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
