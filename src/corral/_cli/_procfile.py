"""Procfiles and ``.env`` files, read as honcho and foreman read them, within bounds."""

from __future__ import annotations

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
