"""``corral status``: one look at a running corral's processes and what each costs."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
import click

from ._group import CONTEXT, text_option
from ._io import python_handles_ctrl_c, say
from ._tail import MAX_TAIL_MESSAGE, websocket_url

__all__ = ["sparkline", "status"]

_EXAMPLES_STATUS = """
\b
Examples:
  corral status 'http://127.0.0.1:8765/?token=...'
"""

#: How long ``corral status`` waits for a first sample when the monitor has none yet.
FIRST_SAMPLE_WAIT = 2.5
#: The samples the sparkline shows (about one a second), and its width in characters.
SPARK_SAMPLES = 60
SPARK_WIDTH = 15
_BARS = "▁▂▃▄▅▆▇█"


@click.command(epilog=_EXAMPLES_STATUS, context_settings=CONTEXT)
@click.argument("url", callback=text_option)
@click.option("--no-color", is_flag=True, help="No colours, even on a terminal.")
def status(url: str, no_color: bool) -> None:
    """Print the processes of a running corral, through its monitor URL, and what each costs.

    One table, once: each process's state, pid, CPU (percent of one core),
    resident memory, GPU memory where there is some, a sparkline of its CPU
    over the last minute, uptime, restarts and exit code; the workers of
    other hosts too.  Exits 0; 1 if the monitor refuses it or cannot be
    reached.
    """
    target = websocket_url(url, "*", 100)  # the records are not wanted
    python_handles_ctrl_c()  # its loop handles Ctrl-C
    try:
        hello = anyio.run(_look, target, backend="asyncio")
    except KeyboardInterrupt:
        sys.exit(130)
    if isinstance(hello, str):
        say(f"corral status: {hello}")
        sys.exit(1)
    colour = False if no_color else None
    for line in table(hello, colour=colour):
        click.echo(line)


async def _look(url: str) -> dict[str, Any] | str:
    """The monitor's first message, with a sample if one comes soon; or what went wrong."""
    import msgspec
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    try:
        async with connect(url, open_timeout=10, max_size=MAX_TAIL_MESSAGE) as ws:
            hello = msgspec.json.decode(await ws.recv())
            if not isinstance(hello, dict) or hello.get("type") != "hello":
                return "the first message is not a corral monitor's hello"
            running = any(p.get("state") == "running" for p in hello.get("processes", []))
            if running and not hello.get("usage"):
                # No sample yet (a runner that just began): the next comes within a second.
                with anyio.move_on_after(FIRST_SAMPLE_WAIT):
                    async for text in ws:
                        message = msgspec.json.decode(text)
                        if message.get("type") == "usage":
                            hello.setdefault("usage", []).append(message)
                            break
                        if message.get("type") == "end":
                            break
            return hello
    except InvalidStatus as exc:
        return f"the monitor refused the connection ({exc.response.status_code}): wrong token?"
    except (OSError, ConnectionClosed, TimeoutError) as exc:
        return f"cannot reach the monitor: {exc or type(exc).__name__}"


def sparkline(values: Sequence[float], floor: float = 100.0, width: int = SPARK_WIDTH) -> str:
    """``values`` as a line of ``width`` block characters at most (each the mean of its share),
    scaled to ``floor`` or their largest, whichever is more."""
    if not values:
        return ""
    per = max(1, -(-len(values) // width))  # samples per character, rounded up
    means = [
        sum(values[i : i + per]) / len(values[i : i + per]) for i in range(0, len(values), per)
    ]
    top = max(floor, *means) or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int(v / top * len(_BARS)))] for v in means)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def table(hello: dict[str, Any], *, colour: bool | None = None, width: int = 200) -> list[str]:
    """The lines ``corral status`` prints for a monitor's hello (with its samples)."""
    from rich.console import Console
    from rich.table import Table

    samples = [s for s in hello.get("usage") or [] if isinstance(s, dict)]
    latest: dict[str, Any] = samples[-1]["processes"] if samples else {}
    history: dict[str, list[float]] = {}
    for sample in samples[-SPARK_SAMPLES:]:
        for name, figures in sample["processes"].items():
            history.setdefault(name, []).append(float(figures["cpu"]))
    processes = hello.get("processes", [])
    rows = _process_rows(processes, latest, history)
    rows += _remote_rows({str(p["name"]) for p in processes}, latest, history)
    columns = ["name", "state", "pid", "cpu", "mem", "gpu", "cpu, last minute"]
    columns += ["uptime", "restarts", "exit code"]
    if all(row[5] == "-" for row in rows):
        columns.remove("gpu")
        rows = [row[:5] + row[6:] for row in rows]
    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        grid.add_column(column, no_wrap=True)
    for row in rows:
        grid.add_row(*row, style={"running": "green", "failed": "red"}.get(row[1], ""))
    buffer = io.StringIO()
    terminal = sys.stdout.isatty() if colour is None else colour
    console = Console(
        file=buffer,
        width=width,
        force_terminal=terminal,
        color_system="standard" if terminal else None,
    )
    if not rows:
        return [f"{hello.get('runner', 'corral')}: no processes"]
    console.print(grid)
    return [line.rstrip() for line in buffer.getvalue().rstrip("\n").split("\n")]


def _remote_rows(
    known: set[str], latest: dict[str, Any], history: dict[str, list[float]]
) -> list[tuple[str, ...]]:
    """A row for each worker on another host: known by its figures alone."""
    rows: list[tuple[str, ...]] = []
    for name, figures in latest.items():
        if name not in known:
            where = f" on {figures['host']}" if figures.get("host") else ""
            cells = _cells(figures, history.get(name, []))
            rows.append((name + where, "running", str(figures["pid"]), *cells, "-", "-", "-"))
    return rows


def _process_rows(
    processes: list[dict[str, Any]], latest: dict[str, Any], history: dict[str, list[float]]
) -> list[tuple[str, ...]]:
    """A row for each of the runner's own processes (its figures only while it runs)."""
    rows: list[tuple[str, ...]] = []
    now = time.time()
    for info in processes:
        name = str(info["name"])
        running = info["state"] == "running"
        figures = latest.get(name) if running else None
        code = info.get("returncode")
        rows.append(
            (
                name,
                str(info["state"]),
                str(info["pid"]),
                *_cells(figures, history.get(name, []) if running else []),
                _duration(now - info["started"]) if running and info.get("started") else "-",
                str(info.get("restarts", 0)),
                "-" if code is None else str(code),
            )
        )
    return rows


def _cells(figures: dict[str, Any] | None, cpu: list[float]) -> tuple[str, str, str, str]:
    """The cpu, mem, gpu and sparkline cells of one process (``-`` for what is not known)."""
    from ._status import size  # with the status table's code: only when there are figures

    if figures is None:
        return "-", "-", "-", ""
    gpu = figures.get("gpu")
    return (
        f"{float(figures['cpu']):.1f}%",
        size(int(figures["rss"])),
        "-" if gpu is None else size(int(gpu)),
        sparkline(cpu),
    )
