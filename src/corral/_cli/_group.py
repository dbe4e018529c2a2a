"""What the commands of ``corral`` share: options, names, output."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from .._checks import MAX_NAME, MAX_WORKERS_PER_HOST, check_seconds, is_text
from ._io import shorten

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = [
    "CONTEXT",
    "MAX_COPIES",
    "Output",
    "RAW_OPTION",
    "name_option",
    "output_options",
    "seconds",
    "text_option",
]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


# -- shared options ----------------------------------------------------------------------------

#: What a run's name may not contain: it begins every source's name, where a
#: dot separates the parts, and names a folder under ``--log-dir``.
_BAD_NAME = re.compile(r"[\s/\\.\0]")


#: The most copies of a command on one host (``-n``) or of a Procfile's process
#: (``-c``): the library's maximum of workers on a host.
MAX_COPIES = MAX_WORKERS_PER_HOST


def seconds(option: str, *, positive: bool = False) -> Callable[..., float]:
    """A click callback: ``option``'s value must be a number of seconds (``check_seconds``),
    finite, and positive (a deadline) or not negative."""

    def callback(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
        try:
            return check_seconds(value, option.lstrip("-"), positive=positive)
        except (TypeError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint=option) from None

    return callback


def text_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A click callback: the value (or each value) must be printable UTF-8 text.

    Host names, ssh options and URLs end up in programs that print them
    back, and in messages; bytes that are not text have no business there.
    """
    for item in value if isinstance(value, tuple) else [value]:
        if item is not None and not is_text(item):
            raise click.BadParameter(f"{shorten(item)} is not printable UTF-8 text")
    return value


def run_name(value: str) -> str:

    if not value or len(value) > MAX_NAME or _BAD_NAME.search(value) or not is_text(value):
        raise click.BadParameter(
            f"{shorten(value)} is not a run name: 1-{MAX_NAME} printable characters, "
            "without spaces, dots or slashes",
            param_hint="--name",
        )
    return value


def name_option(default: str) -> Callable[[_F], _F]:
    """``--name``, the run's name (checked by :func:`run_name`), for ``run`` and ``up``."""
    return click.option(
        "--name",
        default=default,
        show_default=True,
        callback=lambda _ctx, _param, value: run_name(value),
        help="The name of the run (it starts every source's name; no dots, spaces or slashes).",
    )


@dataclass
class Output:
    log_dir: str | None
    prefix: bool
    colour: bool | None
    status: bool
    monitor: str | None = None
    #: Origins of pages besides the monitor's own that may connect (``--monitor-origin``).
    monitor_origins: tuple[str, ...] = ()
    #: The children's text reaches the terminal as it is (``--raw``).
    raw: bool = False
    #: Lines the log files missed do not make the exit code 1 (``--allow-log-loss``).
    allow_log_loss: bool = False
    #: Containment: the runner's cgroup, and the command as a child subreaper.
    contain: bool = True
    #: Whether the processes' stderr lines go to the command's stderr (else to its stdout).
    split_stderr: bool = False
    #: Which lines (source, stream) stay off the console: torchrun's ``--redirects``.
    quiet: Callable[[str, str], bool] | None = None
    #: Whether each process's CPU and memory is sampled (``--no-usage`` turns it off).
    usage: bool = True

    @classmethod
    def of(
        cls,
        log_dir: str | None,
        no_prefix: bool,
        no_color: bool,
        no_status: bool,
        monitor: str | None,
        *,
        raw: bool = False,
        allow_log_loss: bool = False,
        no_contain: bool = False,
        split_stderr: bool = False,
    ) -> Output:
        """From the shared options, as click gives them; ``split_stderr``: the command's default.

        ``--split-stderr``/``--merge-stderr`` chooses otherwise.
        """
        meta = click.get_current_context().meta
        chosen = meta.get(_SPLIT_STDERR)
        split = split_stderr if chosen is None else bool(chosen)
        colour = False if no_color else None
        if log_dir is not None:
            try:
                os.makedirs(log_dir, exist_ok=True)
            except OSError as exc:
                raise click.BadParameter(
                    f"cannot make the folder {shorten(log_dir)}: {exc.strerror or exc}",
                    param_hint="--log-dir",
                ) from None
        usage = not meta.get(_NO_USAGE, False)
        origins = tuple(meta.get(_MONITOR_ORIGINS, ()))
        if origins and monitor is None:
            raise click.BadParameter(
                "names pages that may reach a monitor: give --monitor too",
                param_hint="--monitor-origin",
            )
        return cls(
            log_dir,
            not no_prefix,
            colour,
            not no_status,
            _monitor(monitor),
            monitor_origins=origins,
            raw=raw,
            allow_log_loss=allow_log_loss,
            contain=not no_contain,
            split_stderr=split,
            usage=usage,
        )


#: ``--raw``, for ``run``, ``up`` and ``tail``.
RAW_OPTION = click.option(
    "--raw",
    is_flag=True,
    help="Write the processes' text as it is, escape sequences and all (by default only "
    "colours and progress bars reach the terminal; see docs/howto/logging).",
)


#: Where ``--split-stderr``/``--merge-stderr`` leaves its choice (in the click context's meta).
_SPLIT_STDERR = "corral.split_stderr"


def _remember_split(ctx: click.Context, _param: click.Parameter, value: bool | None) -> None:
    ctx.meta[_SPLIT_STDERR] = value


def output_options(func: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--log-dir",
                "--log_dir",
                "log_dir",
                type=click.Path(file_okay=False),
                help="Also write every line to files in a timestamped folder under this one.",
            ),
            click.option(
                "--allow-log-loss",
                is_flag=True,
                help="Exit as if nothing was lost when the --log-dir files missed lines (a "
                "full disk); by default such a run that succeeded exits 1.",
            ),
            click.option("--no-prefix", is_flag=True, help="Show the lines as they are."),
            click.option(
                "--split-stderr/--merge-stderr",
                default=None,
                expose_value=False,
                callback=_remember_split,
                help="The processes' stderr lines on stderr and their stdout lines on stdout "
                "(corral run's default, as torchrun), or both on stdout (corral up's, as honcho).",
            ),
            click.option(
                "--no-color",
                "--no-colour",
                "no_color",
                is_flag=True,
                help="No colours, even on a terminal.",
            ),
            RAW_OPTION,
            click.option("--no-status", is_flag=True, help="No live status table under the lines."),
            click.option(
                "--grace",
                type=click.FloatRange(min=0),
                default=5.0,
                callback=seconds("--grace"),
                show_default=True,
                help="Seconds between the stop signal and SIGKILL.",
            ),
            click.option(
                "--monitor",
                metavar="HOST:PORT",
                help="Serve a live monitor (a page and a WebSocket) here, e.g. 127.0.0.1:0.",
            ),
            click.option(
                "--monitor-origin",
                metavar="ORIGIN",
                multiple=True,
                expose_value=False,
                callback=_monitor_origins,
                help="Let the monitor's page connect from this origin too: a reverse proxy's "
                "address, https://HOST[:PORT] (repeatable; see docs/howto/monitor).",
            ),
            click.option(
                "--no-contain",
                is_flag=True,
                help="Stop process groups only: leave what left its group (a daemon) running.",
            ),
            click.option(
                "--no-usage",
                is_flag=True,
                expose_value=False,
                callback=_no_usage,
                help="Do not sample what each process costs (the table's cpu and mem columns, "
                "the monitor's figures).",
            ),
        ]
    ):
        func = option(func)
    return func


#: Where ``--no-usage`` is kept, in the command's context (read by :meth:`Output.of`).
_NO_USAGE = "corral.no_usage"


def _no_usage(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[_NO_USAGE] = value
    return value


#: Where ``--monitor-origin`` is kept, in the command's context (read by :meth:`Output.of`).
_MONITOR_ORIGINS = "corral.monitor_origins"


def _monitor_origins(ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> None:
    from .._monitor._server import parse_origin

    try:
        ctx.meta[_MONITOR_ORIGINS] = tuple(parse_origin(value) for value in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--monitor-origin") from None


def _monitor(address: str | None) -> str | None:
    if address is None:
        return None
    from .._monitor._server import parse_address

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
            f"cannot listen on {shorten(address)}: {reason}", param_hint="--monitor"
        ) from None
    return address
