"""``corral export``: a Procfile's processes as systemd units or a supervisord program group.

What honcho's ``export`` writes for the same two formats, with corral up's
reading of the Procfile and the ``.env`` files, the same copies, PORTs and
process names.  Each value is escaped for the format that reads it; a value
the format cannot carry is an error naming it, and nothing is written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import click

from .._checks import is_text
from ._group import CONTEXT, text_option
from ._io import shorten
from ._procfile import Plan, plan_options

__all__ = ["FORMATS", "export"]

_EXAMPLES_EXPORT = """
\b
Examples:
  corral export systemd ./units -a shop -u www-data
  corral export supervisord /etc/supervisor/conf.d -a shop -l /var/log/shop
"""

#: A name for the app's units and programs: a unit name's characters, no spaces.
_APP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class ExportError(click.ClickException):
    """A value the format cannot carry, or a folder that cannot be written."""

    exit_code = 2


def _check_app(value: str) -> str:
    if not _APP_NAME.fullmatch(value):
        raise click.BadParameter(
            f"{shorten(value)} is not an app name: 1-64 letters, digits, '_', '.' or '-'",
            param_hint="--app",
        )
    return value


def _check_shell(value: str) -> str:
    if not os.path.isabs(value) or not is_text(value):
        raise click.BadParameter(f"{shorten(value)} is not an absolute path", param_hint="--shell")
    return value


@dataclass
class _Export:
    """What a format is given: the plan, and where and how its processes run."""

    plan: Plan
    app: str
    #: The folder they run in.
    root: str
    #: Whom they run as (``None``: the service manager's user).
    user: str | None
    shell: str
    #: The folder of their log files (where the format has files).
    log: str


# -- systemd ---------------------------------------------------------------------------------

#: What a double-quoted word of a unit file writes as an escape (C's), and ``%``, which
#: starts a specifier anywhere.
_SYSTEMD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "%": "%%"}


def _systemd_quoted(value: str, *, command: bool = False) -> str:
    """``value`` as one double-quoted word of a unit file (``$`` doubled in a command line,
    where it would expand a variable)."""
    out = []
    for char in value:
        if char in _SYSTEMD_ESCAPES:
            out.append(_SYSTEMD_ESCAPES[char])
        elif command and char == "$":
            out.append("$$")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _systemd_path(value: str) -> str:
    if "\n" in value or value != value.strip():
        raise ExportError(f"systemd cannot take the path {shorten(value)}")
    return value.replace("%", "%%")


def _systemd(export: _Export) -> dict[str, str]:
    """``APP.target`` wants one target per process type, each of which wants its copies'
    services, ``APP-TYPE-N.service``; every one is part of the one above it."""
    plan, app, user = export.plan, export.app, export.user
    files: dict[str, str] = {}
    types = list(plan.processes)
    header = f"# Made by corral export from {plan.path}: the processes of corral up.\n"
    files[f"{app}.target"] = (
        f"{header}[Unit]\nDescription={app}\n"
        f"Wants={' '.join(f'{app}-{kind}.target' for kind in types)}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    wants: dict[str, list[str]] = {kind: [] for kind in types}
    for name, command, env in plan.copies():
        kind, _, copy = name.rpartition(".")
        unit = f"{app}-{kind}-{copy}"
        wants[kind].append(f"{unit}.service")
        lines = [
            header.rstrip("\n"),
            "[Unit]",
            f"Description={app} {name}",
            f"PartOf={app}-{kind}.target",
            "",
            "[Service]",
        ]
        if user is not None:
            lines.append(f"User={user}")
        lines.append(f"WorkingDirectory={_systemd_path(export.root)}")
        lines += [f"Environment={_systemd_quoted(f'{k}={v}')}" for k, v in env.items()]
        lines += [
            f"ExecStart={_systemd_path(export.shell)} -c " + _systemd_quoted(command, command=True),
            "Restart=always",
            "StandardInput=null",
            "StandardOutput=journal",
            "StandardError=journal",
            f"SyslogIdentifier={unit}",
            # The whole control group is stopped, as corral up stops a process's group.
            "KillMode=control-group",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
        files[f"{unit}.service"] = "\n".join(lines) + "\n"
    for kind in types:
        files[f"{app}-{kind}.target"] = (
            f"{header}[Unit]\nDescription={app} {kind}\nPartOf={app}.target\n"
            f"Wants={' '.join(wants[kind])}\n"
        )
    return files


# -- supervisord -----------------------------------------------------------------------------


def _supervisord_value(value: str, what: str) -> str:
    """``value`` for supervisord's configuration file (``%`` starts its expansions)."""
    if "\n" in value or "\r" in value:
        raise ExportError(f"supervisord cannot take a line break in {what}")
    return value.replace("%", "%%")


def _supervisord_env(key: str, value: str) -> str:
    """``KEY="value"`` as supervisord's ``environment=`` reads it.

    It splits the list with :mod:`shlex` in its non-POSIX mode: a value is
    quoted whole, has no escapes, and loses any quote it begins or ends with.
    """
    what = f"the value of {key}"
    value = _supervisord_value(value, what)
    quote = '"' if '"' not in value else "'"
    if quote in value or value[:1] in ("'", '"') or value[-1:] in ("'", '"'):
        raise ExportError(
            f"supervisord cannot take {what}, {shorten(value)}: it has both kinds of quote, "
            "or begins or ends with one"
        )
    return f"{key}={quote}{value}{quote}"


def _supervisord_word(value: str) -> str:
    """``value`` as one word of a ``command=`` line, which supervisord splits with shlex."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _supervisord(export: _Export) -> dict[str, str]:
    """``APP.conf``: a program per copy, ``APP-TYPE-N``, in the group ``APP``."""
    plan, app = export.plan, export.app
    sections = [f"; Made by corral export from {plan.path}: the processes of corral up.\n"]
    programs = []
    for name, command, env in plan.copies():
        kind, _, copy = name.rpartition(".")
        program = f"{app}-{kind}-{copy}"
        programs.append(program)
        word = _supervisord_word(command)
        lines = [
            f"[program:{program}]",
            f"command={_supervisord_value(export.shell, 'the shell')} -c "
            f"{_supervisord_value(word, 'the command of ' + name)}",
            f"directory={_supervisord_value(export.root, 'the folder')}",
        ]
        if export.user is not None:
            lines.append(f"user={_supervisord_value(export.user, 'the user')}")
        lines += [
            "environment=" + ",".join(_supervisord_env(k, v) for k, v in env.items()),
            "autostart=true",
            "autorestart=true",
            # The whole process group is stopped, as corral up stops it.
            "stopasgroup=true",
            "killasgroup=true",
            "stdout_logfile="
            + _supervisord_value(os.path.join(export.log, f"{name}.log"), "the log folder"),
            "stderr_logfile="
            + _supervisord_value(os.path.join(export.log, f"{name}.error.log"), "the log folder"),
        ]
        sections.append("\n".join(lines) + "\n")
    sections.append(f"[group:{app}]\nprograms={','.join(programs)}\n")
    return {f"{app}.conf": "\n".join(sections)}


#: Each format and what it writes: file name -> text.
FORMATS: dict[str, Callable[[_Export], dict[str, str]]] = {
    "systemd": _systemd,
    "supervisord": _supervisord,
}


@click.command(epilog=_EXAMPLES_EXPORT, context_settings=CONTEXT)
@plan_options
@click.option(
    "-a",
    "--app",
    callback=lambda _ctx, _param, value: None if value is None else _check_app(value),
    help="The app's name, which starts every unit's or program's (default: this folder's).",
)
@click.option(
    "-l",
    "--log",
    "log",
    metavar="DIR",
    callback=text_option,
    help="supervisord: the folder of the log files (default: /var/log/APP); systemd's go to "
    "the journal.",
)
@click.option(
    "-u",
    "--user",
    callback=text_option,
    help="The user the processes run as (default: the service manager's).",
)
@click.option(
    "-s",
    "--shell",
    default="/bin/sh",
    show_default=True,
    callback=lambda _ctx, _param, value: _check_shell(value),
    help="The shell that runs each command, as corral up's /bin/sh does.",
)
@click.argument("format", type=click.Choice(sorted(FORMATS)))
@click.argument("location", type=click.Path(file_okay=False), callback=text_option)
def export(
    procfile_option: str | None,
    env_files: tuple[str, ...],
    concurrency: tuple[str, ...],
    port: int | None,
    app: str | None,
    log: str | None,
    user: str | None,
    shell: str,
    format: str,
    location: str,
) -> None:
    """Write the processes of the Procfile as FORMAT (systemd, supervisord) into LOCATION.

    Each copy corral up would start (-c, -p, -e and -f as there) becomes a
    systemd service, or a supervisord program, with the same command, run by
    the shell in this folder, and the same variables: those of the .env
    files, its PORT and its name (web.1) in PS, HONCHO_PROCESS_NAME and
    CORRAL_PROCESS_NAME.  The service manager restarts each one that exits
    and stops its whole process group.  Prints each file it writes.
    """
    root = os.getcwd()
    app = app or _check_app(re.sub(r"[^A-Za-z0-9_.-]", "-", os.path.basename(root)) or "app")
    plan = Plan.make(procfile_option, env_files, concurrency, port)
    log = os.path.abspath(log) if log else f"/var/log/{app}"
    files = FORMATS[format](_Export(plan, app, root, user, shell, log))
    try:
        os.makedirs(location, exist_ok=True)
        for name, text in files.items():
            path = os.path.join(location, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            click.echo(path)
    except OSError as exc:
        raise ExportError(f"cannot write to {shorten(location)}: {exc.strerror or exc}") from None
