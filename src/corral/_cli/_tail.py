"""``corral tail``: follow a running corral's log through its monitor."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING, Any, TextIO, cast

import anyio
import click

from .._logs._terminal import write_out
from ._group import CONTEXT, RAW_OPTION, text_option
from ._io import (
    EXIT_PIPE,
    Stdout,
    call_soon,
    check_written,
    python_handles_ctrl_c,
    say,
    shorten,
)

if TYPE_CHECKING:
    import logging

    from corral import ConsoleHandler

__all__ = ["MAX_TAIL_MESSAGE", "tail", "websocket_url"]

_EXAMPLES_TAIL = """
\b
Examples:
  corral tail 'http://127.0.0.1:8765/?token=...'
  corral tail 'http://127.0.0.1:8765/?token=...' --source 'run.agent-0.*' --level WARNING
"""


@click.command(epilog=_EXAMPLES_TAIL, context_settings=CONTEXT)
@click.argument("url", callback=text_option)
@click.option(
    "--source",
    default="*",
    show_default=True,
    callback=text_option,
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
@RAW_OPTION
def tail(url: str, source: str, level: str, no_prefix: bool, no_color: bool, raw: bool) -> None:
    """Follow the log of a running corral through its monitor URL.

    Prints every line with the same prefixes and colours as corral run,
    reconnects if the connection drops while the runner lives, and exits
    when the runner ends, with the runner's status (what corral run or
    corral up exits with), having said on stderr the failure that ended it,
    as they say it; 1 if the monitor refuses it, cannot be reached at the
    first attempt (nothing listens: at once), stays unreachable for 30 s
    after that, or sends a message larger than 4 MiB.
    """
    from .._logs._records import level_number

    if re.fullmatch(r"-?[0-9]{1,9}", level):
        number = int(level)
    else:
        number = level_number(level)
        if number == 0 and level.upper() != "NOTSET":
            raise click.BadParameter(f"{shorten(level)} is not a level", param_hint="--level")
    split = _urlsplit(url, source, number)
    python_handles_ctrl_c()  # its loop handles Ctrl-C
    stdout = Stdout(sys.stdout)
    try:
        code = anyio.run(
            _tail,
            split,
            number,
            stdout,
            not no_prefix,
            False if no_color else None,
            raw,
            backend="asyncio",
        )
    except KeyboardInterrupt:
        code = 130
    check_written(stdout)
    sys.exit(code)


def _urlsplit(url: str, source: str, level: int) -> str:
    """The WebSocket URL for ``url``, asking the server for this filter from the start."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a bad IPv6 address, a port out of range...
        raise click.BadParameter(
            f"{shorten(url, 80)} is not a URL: {exc}", param_hint="URL"
        ) from None
    if parts.scheme not in ("http", "ws", "https", "wss") or not parts.hostname or port == 0:
        raise click.BadParameter(f"{shorten(url, 80)} is not a monitor URL", param_hint="URL")
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


def websocket_url(url: str, source: str, level: int) -> str:
    """The WebSocket URL of the monitor at ``url`` (as ``corral tail`` checks it), with a filter."""
    return _urlsplit(url, source, level)


async def _tail(
    url: str, level: int, stdout: Stdout, prefix: bool, colour: bool | None, raw: bool
) -> int:
    """Follow the log until the runner ends; :data:`EXIT_PIPE` as soon as stdout's reader goes."""
    import corral

    loop = corral.LoopToken.current().loop
    code = EXIT_PIPE
    async with anyio.create_task_group() as tg:
        stdout.when_gone(lambda: call_soon(loop, tg.cancel_scope.cancel))
        tg.start_soon(stdout.watch)
        code = await _follow(url, level, stdout, prefix, colour, raw)
        tg.cancel_scope.cancel()
    return EXIT_PIPE if stdout.gone else code


#: The longest message ``corral tail`` takes from a monitor: its own are at most
#: 256 KiB, and its first (every process) grows with the processes; a longer
#: one ends the command with one line and exit code 1.
MAX_TAIL_MESSAGE = 4 * 1024 * 1024


async def _follow(
    url: str, level: int, stdout: Stdout, prefix: bool, colour: bool | None, raw: bool
) -> int:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    import corral

    console = corral.ConsoleHandler(
        cast(TextIO, stdout),
        colour=colour,
        prefix="relative" if prefix else "none",
        raw=raw,
    )
    follower = _Follower(console, level)
    give_up_after = 30.0
    failing_since: float | None = None
    connected = False  # once: from then on, a refusal is a runner restarting its monitor
    delay = 0.2
    try:
        while True:
            try:
                async with connect(url, open_timeout=10, max_size=MAX_TAIL_MESSAGE) as ws:
                    failing_since = None
                    connected = True
                    delay = 0.2
                    code = await follower.follow(ws)
                    if code is not None:
                        return code
            except InvalidStatus as exc:
                code = exc.response.status_code
                say(f"corral tail: the monitor refused the connection ({code}): wrong token?")
                return 1
            except (OSError, ConnectionClosed, TimeoutError) as exc:
                if _hopeless(exc, connected, url):
                    return 1
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > give_up_after:
                    say(f"corral tail: lost the runner: {exc}")
                    return 1
                await anyio.sleep(delay)  # reconnecting: back off between attempts
                delay = min(delay * 2, 2.0)
    finally:
        console.close()


class _Follower:
    """What ``corral tail`` prints of a monitor's messages, over one connection and the next."""

    def __init__(self, console: ConsoleHandler, level: int) -> None:
        self.console = console
        self.level = level
        # The last row printed: after a reconnection the server sends its recent
        # rows again, and those up to this one were printed already.
        self.last: list[Any] | None = None

    async def follow(self, ws: AsyncIterable[str | bytes]) -> int | None:
        """Print what ``ws`` sends until it closes; the run's exit code if its end came."""
        import msgspec

        backlog = True
        async for text in ws:
            message = msgspec.json.decode(text)
            kind = message.get("type")
            if kind == "logs":
                await self._print(message["records"], backlog)
                backlog = False
            elif kind == "dropped":
                say(f"corral tail: {message['count']} records dropped (this terminal fell behind)")
            elif kind == "end":
                return _ended(message)
        return None

    async def _print(self, rows: list[list[Any]], backlog: bool) -> None:
        from .._logs._records import make_record

        if backlog and self.last is not None:
            for index in range(len(rows) - 1, -1, -1):
                if rows[index] == self.last:
                    rows = rows[index + 1 :]
                    break
        if not rows:
            return
        self.last = rows[-1]
        records = [
            make_record(src, lvl, line, created=created)
            for src, _stream, lvl, created, _name, line in rows
            if lvl >= self.level
        ]
        await anyio.to_thread.run_sync(_print_all, self.console, records)


def _hopeless(exc: Exception, connected: bool, url: str) -> bool:
    """Whether a connection's error ends ``corral tail`` (it says why) rather than a retry."""
    from websockets.exceptions import ConnectionClosed

    if isinstance(exc, ConnectionClosed) and exc.sent and exc.sent.code == 1009:
        say(
            "corral tail: the monitor sent a message larger than "
            f"{MAX_TAIL_MESSAGE // 2**20} MiB: not a corral monitor?"
        )
        return True
    if not connected and isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
        # Refused (a run that is over), a name that does not resolve: never
        # reached, which waiting will not change.
        say(f"corral tail: cannot reach the monitor at {_where(url)}: {_reason(exc)}")
        return True
    return False


def _where(url: str) -> str:
    """``HOST:PORT`` of ``url`` (never its token)."""
    import urllib.parse

    return urllib.parse.urlsplit(url).netloc


def _reason(exc: OSError) -> str:
    number = exc.errno
    reason = os.strerror(number) if number and number > 0 else exc.strerror or str(exc)
    return reason[:1].lower() + reason[1:]


def _ended(message: dict[str, Any]) -> int:
    """The run's status, from its monitor's ``end``; its failure said first, on stderr."""
    from ._status import describe_failure

    status = message.get("status", 0)
    failure = message.get("failure")
    if isinstance(failure, dict):
        try:
            stderr = "\n".join(map(str, failure["stderr"])).encode("utf-8", "replace")
            text = describe_failure(str(failure["name"]), int(failure["returncode"]), stderr)
        except (KeyError, TypeError, ValueError):
            pass  # not a failure this corral describes
        else:
            try:  # on stderr, as the command that ran the processes says it
                write_out(sys.stderr, (text + "\n").encode("utf-8", "replace"))
            except (OSError, ValueError):
                pass  # nobody reads it any more
    return status if isinstance(status, int) and 0 <= status <= 255 else 1


def _print_all(console: ConsoleHandler, records: list[logging.LogRecord]) -> None:
    for record in records:
        console.handle(record)
