"""What sampling each child's CPU and memory costs the launcher (issue 25, item 6).

A runner holds ``--children`` children (64 ``sleep`` processes) for ``--seconds`` seconds,
sampling them (``usage=True``, the default: one ``/proc`` read per child a second, a scan
of every process every 5 s, in a worker thread) or not (``usage=False``, the baseline),
repetitions interleaved (ABBA) in one interpreter per backend.  Measured while the
children run, after they all started: the launcher's CPU time over the wall time (in
percent of one core, all its threads), then, for half as long, the worst gap of a 1 ms
ticker on the loop.
The cost of sampling is the difference; the target is under 1 % of a core for 64
children.  The scan reads every process of the machine: the header says how many there
are.

Run: ``python bench/resources.py [--children N] [--seconds S] [--reps R] [--markdown]``
(``--smoke``: 4 children for 1.5 s, one repetition, for CI).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import anyio
from _common import add_smoke, print_header, print_table, run_workers  # bench/ is on sys.path
from _ticker import Ticker

import corral


async def hold(children: int, seconds: float, usage: bool) -> dict[str, float]:
    """Launcher CPU (% of a core) and the worst loop gap (ms) while ``children`` sleep."""
    ticker = Ticker()
    async with (
        anyio.create_task_group() as tg,
        corral.open_runner(console=False, handle_signals=False, usage=usage) as r,
    ):
        for i in range(children):
            await r.start(["sleep", "1000"], name=f"sleeper-{i}")
        # The CPU first, with nothing else running (a 1 ms ticker costs more than what is
        # measured), then the loop's gaps, for half as long.
        cpu, wall = time.process_time(), time.perf_counter()
        await anyio.sleep(seconds)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await tg.start(ticker.run)
        await anyio.sleep(seconds / 2)
        worst = ticker.worst
        if usage:
            assert len(r.usage) == children, "not every child was sampled"
        r.cancel()
        tg.cancel_scope.cancel()
    return {"cpu": 100 * cpu / wall, "gap": 1000 * worst}


def worker(args: argparse.Namespace) -> None:
    figures: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for variant in (["on", "off", "off", "on"] * args.reps)[: 2 * args.reps]:  # ABBA
        figures[variant].append(
            anyio.run(hold, args.children, args.seconds, variant == "on", backend=args.backend)
        )
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--children", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=2, help="ABBA rounds (default 2)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_smoke(parser, children=4, seconds=1.5, reps=1)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print_header("sampling what each child costs", "resources.py")
    machine = sum(1 for name in os.listdir("/proc") if name.isdigit())
    print(f"# {args.children} children for {args.seconds:g} s; {machine} processes on the machine")
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    results = run_workers(os.path.abspath(__file__), backends)
    rows = []
    for backend, figures in results.items():
        on, off = figures["on"], figures["off"]

        def median(runs: list[dict[str, Any]], key: str) -> float:
            return statistics.median(run[key] for run in runs)

        cost = median(on, "cpu") - median(off, "cpu")
        rows.append(
            [
                backend,
                f"{median(on, 'cpu'):.2f} %",
                f"{median(off, 'cpu'):.2f} %",
                f"{cost:.2f} %" + ("" if cost < 1.0 else "  (target: < 1 %)"),
                f"{median(on, 'gap'):.1f} ms",
                f"{median(off, 'gap'):.1f} ms",
            ]
        )
    print_table(
        [
            "backend",
            "launcher CPU, sampling",
            "not sampling",
            "cost of sampling",
            "worst loop gap, sampling",
            "not sampling",
        ],
        rows,
        args.markdown,
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
