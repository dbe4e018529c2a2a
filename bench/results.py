"""A big ``launch()`` result: the launcher's loop and memory while it comes (issue 33, point 3).

One worker on this machine returns ``--size`` bytes (200 MB by default;
``b"x" * size``).  Each variant runs in a fresh interpreter, so that its peak
memory is its own; the variants alternate (ABBA) ``--reps`` times:

``corral``
    ``await r.launch(big, size, workers_per_host=1)`` in an open runner
    (``console=False``), after one small launch to warm it up.
``process pool`` (a baseline)
    a :class:`concurrent.futures.ProcessPoolExecutor` (spawn) of one worker
    returning the same bytes, awaited with ``anyio.to_thread.run_sync``.
``idle`` (the floor)
    the same interpreter and ticker with nothing to do for as long.

Figures: the **worst gap** of a 1 ms ticker in the launcher's loop during
the call (``bench/_ticker.py``; target <= 10 ms), and the launcher's **peak
memory** during the call (``VmHWM`` after resetting it through
``/proc/self/clear_refs``), as the peak's growth over the resident size
before the call, divided by the result's size (target <= 1.2x), and the
whole peak divided by it.  Medians over the repetitions.

Usage::

    python bench/results.py --markdown           # both backends (about 1 min)
    python bench/results.py --size 500000000 --reps 5
    python bench/results.py --smoke              # tiny sizes: only checks that it runs (CI)

Options: ``--backend asyncio|trio|both``, ``--reps`` (5), ``--size``
(200,000,000), ``--markdown``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

from _common import add_smoke, format_table, print_header  # bench/ is on sys.path
from _ticker import Ticker

BACKENDS = ("asyncio", "trio")
VARIANTS = ("corral", "process pool", "idle")
MAX_GAP_MS = 10.0
MAX_RSS_RATIO = 1.2


def big(size: int) -> bytes:
    """The worker's work: a result of ``size`` bytes."""
    return b"x" * size


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise RuntimeError(f"no {field} in /proc/self/status")


async def measure(variant: str, size: int) -> dict[str, float]:
    import anyio
    import anyio.to_thread

    import corral

    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        async with corral.open_runner(name="bench", console=False) as r:
            pool = None
            if variant == "corral":
                await r.launch(big, 1000, workers_per_host=1)  # warm up
            elif variant == "process pool":
                pool = concurrent.futures.ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn")
                )
                await anyio.to_thread.run_sync(lambda: pool.submit(big, 1000).result())
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak (VmHWM) starts again from here
            before = _status("VmRSS")
            ticker.skip()
            ticker.worst = 0.0
            began = time.perf_counter()
            if variant == "corral":
                value = (await r.launch(big, size, workers_per_host=1))[0]
            elif variant == "process pool":
                assert pool is not None
                value = await anyio.to_thread.run_sync(lambda: pool.submit(big, size).result())
            else:
                await anyio.sleep(float(os.environ.get("BENCH_IDLE_FOR", "1")))
                value = b"x" * size
            took = time.perf_counter() - began
            gap = ticker.worst
            peak = _status("VmHWM")
            if pool is not None:
                pool.shutdown()
        tg.cancel_scope.cancel()
    assert len(value) == size
    return {"gap": gap, "grew": peak - before, "peak": peak, "took": took}


def run_one(variant: str, backend: str, size: int, idle_for: float) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", variant, "--backend", backend, "--size", str(size)]
    env = {**os.environ, "BENCH_IDLE_FOR": f"{idle_for:.3f}"}
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each variant (5)")
    parser.add_argument("--size", type=int, default=200_000_000, help="the result, in bytes")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    add_smoke(parser, reps=1, size=1_000_000)
    args = parser.parse_args()
    if args.worker:
        import anyio

        result = anyio.run(measure, args.worker, args.size, backend=args.backend)
        print(json.dumps(result))
        return
    print_header("a big launch() result: loop gap and memory", "results.py", ("anyio", "trio"))
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    rows = []
    for backend in backends:
        res: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        idle_for = 1.0
        for rep in range(args.reps):
            order = VARIANTS if rep % 4 in (0, 3) else VARIANTS[::-1]
            for variant in order:
                got = run_one(variant, backend, args.size, idle_for)
                res[variant].append(got)
                if variant == "corral":
                    idle_for = got["took"]  # the floor idles as long as corral took
                print(
                    f"  [{backend}] rep {rep + 1} {variant}: {got['took']:.2f} s, gap "
                    f"{got['gap'] * 1e3:.1f} ms, grew {got['grew'] / args.size:.2f}x",
                    file=sys.stderr,
                    flush=True,
                )
        med = statistics.median
        floor = med(x["gap"] for x in res["idle"]) * 1e3
        for variant in VARIANTS:
            xs = res[variant]
            gap = med(x["gap"] for x in xs) * 1e3
            grew = med(x["grew"] for x in xs) / args.size
            judged = variant == "corral"
            ok = gap <= MAX_GAP_MS and grew <= MAX_RSS_RATIO
            rows.append(
                [
                    backend,
                    variant,
                    f"{med(x['took'] for x in xs):.2f} s",
                    f"{gap:.1f} ms (max {max(x['gap'] for x in xs) * 1e3:.1f})",
                    f"{gap / floor:.1f}" if floor else "-",
                    f"{grew:.2f}x",
                    f"{med(x['peak'] for x in xs) / args.size:.2f}x",
                    ("yes" if ok else "**NO**") if judged else "",
                ]
            )
    print()
    print(
        f"## one worker returns {args.size:,} bytes: the launcher's worst 1 ms-ticker gap and "
        f"peak memory during the call, median of {args.reps}; baselines in the same run: a "
        f"spawn process pool, an idle loop; targets: gap <= {MAX_GAP_MS:g} ms, peak growth "
        f"<= {MAX_RSS_RATIO}x the result"
    )
    print()
    header = ["backend", "variant", "time", "worst gap", "vs idle", "peak growth / result"]
    header += ["peak / result", "met"]
    print(format_table(header, rows, args.markdown))


if __name__ == "__main__":
    main()
