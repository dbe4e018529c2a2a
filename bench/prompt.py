"""Prompt lines from a Python child without the unbuffered tax (issue 33, point 2).

A Python child's stdout is a pipe under a runner, which Python block-buffers:
its lines would come in lumps, late, and die with it.  ``PYTHONUNBUFFERED=1``
(corral's default before) makes every ``print`` one or two ``write(2)``
calls instead.  This script measures the ways out side by side, each child
started by a corral runner (``console=False``, a handler that notes when
each line reaches the handlers), in the same run:

``unbuffered``
    ``PYTHONUNBUFFERED=1``.
``block-buffered`` (the baseline)
    nothing: Python's own buffering of a pipe.
``line-buffered``
    the child calls ``sys.stdout.reconfigure(line_buffering=True)`` first.
``timer hook``
    corral's start-up hook (``corral/_startup/sitecustomize.py``, first on
    ``PYTHONPATH``) with ``CORRAL_FLUSH_EVERY=0.02``: block-buffered, flushed
    by a thread every 20 ms, at exit, before ``os._exit`` and before a fork.
``corral default``
    whatever the runner gives a child that names none of these.

Figures, for each (``bench/_prompt_child.py`` is the child):

* **print cost**: ``--prints`` (200,000) prints of a short line in a tight
  loop, the loop's own CPU and wall time per print (median of ``--reps``,
  ABBA order), and their ratios to block-buffered (target: CPU <= 1.5x; the
  wall time of a child on a loaded machine is mostly the scheduler's);
* **line latency**: ``--ticks`` (40) lines 25 ms apart, from each line's
  ``time.time()`` in the child to its arrival at the launcher's handlers:
  median, 99th percentile and worst over every repetition (target: the 99th
  percentile <= 100 ms; on a loaded machine the worst of every variant,
  unbuffered included, is the scheduler's);
* **crash**: lines of 1,000 printed before an uncaught exception that
  arrive (target: all), and before ``os._exit(3)``;
* **SIGKILL**: a child printing a time-stamped line every millisecond is
  killed at a random moment (0-200 ms) after ``--kill-after`` (300) of its
  lines have arrived,
  ``--reps`` times: the most milliseconds of its
  output before the kill never arrive (the kill's time minus the newest
  line that came; ``PYTHONUNBUFFERED=1`` keeps all; target: <= 100 ms).

Usage::

    python bench/prompt.py --markdown            # both backends (about 1 min)
    python bench/prompt.py --backend trio --reps 9
    python bench/prompt.py --smoke               # tiny sizes: only checks that it runs (CI)

Options: ``--backend asyncio|trio|both``, ``--reps`` (5), ``--prints``
(200,000), ``--ticks`` (40), ``--kill-after`` (300), ``--variants`` (all;
the baseline always; a smoke run measures the hook alone beside it),
``--markdown``.  A variant that loses lines
where its target says none is reported, never an exit status.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import add_smoke, format_table, print_header, run_workers  # bench/ is on sys.path

BACKENDS = ("asyncio", "trio")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_prompt_child.py")
PRINT_RATIO = 1.5  # a print under corral's default <= 1.5x block-buffered
LATENCY_MS = 100.0  # a line reaches the launcher within 100 ms of its print
KILL_LOSS_MS = 100.0  # a SIGKILL loses at most the last 100 ms
CRASH_LINES = 1000

UNBUFFERED, BLOCK, LINE, HOOK, DEFAULT = (
    "unbuffered",
    "block-buffered",
    "line-buffered",
    "timer hook",
    "corral default",
)
VARIANTS = (UNBUFFERED, BLOCK, LINE, HOOK, DEFAULT)


def extra_env(variant: str) -> dict[str, str | None] | None:
    """What the runner is given for ``variant`` (``None``: nothing at all)."""
    if variant == DEFAULT:
        return None
    if variant == UNBUFFERED:
        return {"PYTHONUNBUFFERED": "1"}
    if variant == LINE:
        return {"PYTHONUNBUFFERED": None, "BENCH_LINE_BUFFERED": "1"}
    if variant == BLOCK:
        return {"PYTHONUNBUFFERED": None}
    from corral._sys import _childenv  # the hook's variables, as the runner makes them

    env: dict[bytes, bytes] = {}
    if "PYTHONPATH" in os.environ:
        env[b"PYTHONPATH"] = os.fsencode(os.environ["PYTHONPATH"])
    _childenv.prompt_lines(env)
    made: dict[str, str | None] = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    return made | {"PYTHONUNBUFFERED": None}


class Arrivals(logging.Handler):
    """Each stdout line of the children, with when it reached the handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "corral_stream", None) == "stdout":
            self.lines.append((record.getMessage(), time.time()))


async def run_child(variant: str, *args: str, handler: Arrivals) -> None:
    import corral

    options: dict[str, Any] = {"check": False}
    env = extra_env(variant)
    if env is not None:
        options["extra_env"] = env
    async with corral.open_runner(name="bench", console=False, handlers=[handler]) as r:
        await r.run([sys.executable, CHILD, *args], **options)


async def print_cost(variant: str, n: int) -> dict[str, float]:
    tmp = tempfile.mkdtemp(prefix="corral-bench-prompt-")
    result = os.path.join(tmp, "cost.json")
    try:
        await run_child(variant, "print", str(n), result, handler=Arrivals())
        with open(result) as f:
            cost: dict[str, float] = json.load(f)
        return cost
    finally:
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


async def latency(variant: str, ticks: int) -> list[float]:
    handler = Arrivals()
    await run_child(variant, "tick", str(ticks), "0.025", handler=handler)
    return [(at - float(text.split()[2])) * 1000 for text, at in handler.lines]


async def crash(variant: str, how: str) -> int:
    handler = Arrivals()
    await run_child(variant, how, str(CRASH_LINES), handler=handler)
    return sum(1 for text, _ in handler.lines if text.startswith("line "))


async def killed(variant: str, kill_after: int) -> float:
    """Milliseconds of output printed before the SIGKILL that never arrived."""
    import anyio

    import corral

    handler = Arrivals()
    options: dict[str, Any] = {"check": False}
    env = extra_env(variant)
    if env is not None:
        options["extra_env"] = env
    async with corral.open_runner(name="bench", console=False, handlers=[handler]) as r:
        proc = await r.start([sys.executable, CHILD, "flood"], **options)
        while len(handler.lines) < kill_after:
            await anyio.sleep(0.005)
        # At a moment that has nothing to do with when lines arrive.
        await anyio.sleep(random.uniform(0.0, 0.2))
        at = time.time()
        proc.kill()
        await proc.wait()
    # The newest whole line (the last one may be cut where the kill caught it).
    newest = max(float(words[2]) for text, _ in handler.lines if len(words := text.split()) == 3)
    return (at - newest) * 1000


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    variants = args.variants
    out: dict[str, Any] = {v: {"print": [], "latency": []} for v in variants}
    if not args.smoke:  # a smoke run checks its variants once, cold
        for v in variants:  # warm up: imports, the page cache
            await print_cost(v, max(args.prints // 50, 1))
    for rep in range(args.reps):
        order = variants if rep % 4 in (0, 3) else variants[::-1]
        for v in order:
            cost = await print_cost(v, args.prints)
            out[v]["print"].append(cost)
            lat = await latency(v, args.ticks)
            out[v]["latency"] += lat
            sys.stderr.write(
                f"  [{args.backend}] rep {rep + 1} {v}: {cost['wall'] / cost['n'] * 1e6:.2f} us"
                f"/print, latency max {max(lat):.1f} ms\n"
            )
    for v in variants:
        out[v]["crash"] = await crash(v, "crash")
        out[v]["exit"] = await crash(v, "exit")
        out[v]["killed"] = [await killed(v, args.kill_after) for _ in range(args.reps)]
    return out


def _worker_main(args: argparse.Namespace) -> None:
    import anyio

    print(json.dumps(anyio.run(worker, args, backend=args.backend)))


def _p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]


def _yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


HEADER = ["backend", "variant", "µs/print (CPU)", "vs block-buffered"]
HEADER += ["µs/print (wall)", "vs block"]
HEADER += ["latency median / p99 / max", "crash: lines kept", "os._exit: kept", "SIGKILL: ms lost"]
HEADER += ["meets targets"]


def rows(backend: str, res: dict[str, Any]) -> list[list[str]]:
    med = statistics.median
    out = []
    base = med(x["cpu"] / x["n"] for x in res[BLOCK]["print"]) * 1e6
    base_wall = med(x["wall"] / x["n"] for x in res[BLOCK]["print"]) * 1e6
    for v in (v for v in VARIANTS if v in res):
        r = res[v]
        wall = med(x["wall"] / x["n"] for x in r["print"]) * 1e6
        cpu = med(x["cpu"] / x["n"] for x in r["print"]) * 1e6
        lat = r["latency"]
        lost = max(r["killed"])
        met = (
            cpu <= PRINT_RATIO * base
            and _p99(lat) <= LATENCY_MS
            and r["crash"] == CRASH_LINES
            and lost <= KILL_LOSS_MS
        )
        out.append(
            [
                backend,
                v,
                f"{cpu:.2f}",
                f"{cpu / base:.2f}",
                f"{wall:.2f}",
                f"{wall / base_wall:.2f}",
                f"{med(lat):.1f} / {_p99(lat):.1f} / {max(lat):.1f} ms",
                f"{r['crash']} of {CRASH_LINES}",
                f"{r['exit']} of {CRASH_LINES}",
                f"{lost:.0f}",
                _yes(met),
            ]
        )
    return out


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each variant (5)")
    parser.add_argument("--prints", type=int, default=200_000, help="prints per cost run")
    parser.add_argument("--ticks", type=int, default=40, help="lines per latency run")
    parser.add_argument(
        "--kill-after", type=int, default=300, help="lines of the flood before its SIGKILL"
    )
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    parser.add_argument("--worker", action="store_true", help="run one backend, print JSON")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated (block-buffered always)"
    )
    add_smoke(parser, reps=1, prints=2000, ticks=4, kill_after=10, variants=HOOK)
    args = parser.parse_args()
    args.variants = [BLOCK] + [v for v in args.variants.split(",") if v in VARIANTS and v != BLOCK]
    if args.worker:
        if args.backend == "both":
            parser.error("--worker needs --backend asyncio or --backend trio")
        _worker_main(args)
        return
    print_header("prompt lines without the unbuffered tax", "prompt.py", ("anyio", "trio"))
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    results = run_workers(os.path.abspath(__file__), backends)
    print()
    print(
        f"## a print-heavy Python child ({args.prints:,} prints), line latency ({args.ticks} "
        "lines 25 ms apart), lines kept at a crash and a SIGKILL; baseline: block-buffered, "
        f"same run; targets: <= {PRINT_RATIO}x block-buffered, <= {LATENCY_MS:g} ms, all "
        f"kept at a crash, <= {KILL_LOSS_MS:g} ms lost at a SIGKILL"
    )
    print()
    table = [row for backend in backends for row in rows(backend, results[backend])]
    print(format_table(HEADER, table, args.markdown))


if __name__ == "__main__":
    main()
