"""Procfiles and ``.env`` files, read as honcho and foreman read them, within bounds."""

from __future__ import annotations

import io
import re

import click

from ._io import shorten

__all__ = [
    "MAX_INPUT_FILE",
    "MAX_PROCFILE_NAME",
    "MAX_VARIABLE",
    "EnvFileError",
    "ProcfileError",
    "parse_env_file",
    "parse_procfile",
    "read_input_file",
]

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
            raise EnvFileError(f"{path}, line {line}: cannot parse {shorten(statement, 60)}")
        if binding.key is not None:
            if not binding.key or "=" in binding.key:
                raise EnvFileError(f"{path}, line {line}: {shorten(binding.key)} is not a name")
            lines.setdefault(binding.key, line)
    env: dict[str, str] = {}
    for key, value in dotenv_values(stream=io.StringIO(text)).items():
        if value is None:
            continue
        size = len(key.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_VARIABLE:
            raise EnvFileError(
                f"{path}, line {lines.get(key, '?')}: {shorten(key)} is {size // 1024} KiB "
                f"long; a variable may have at most {MAX_VARIABLE // 1024} KiB (the limit of "
                "exec)"
            )
        env[key] = value
    return env
