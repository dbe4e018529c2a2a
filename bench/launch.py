"""``Runner.launch`` on this machine: start-up cost, and how fast a failure comes home.

Targets (the launch issue, item 9):

(a) wall time of ``await r.launch(noop, workers_per_host=N)`` for N = 1, 2
    and 4, inside an already-open ``corral.open_runner(console=False)``,
    against :class:`concurrent.futures.ProcessPoolExecutor` with
    ``max_workers=N`` and ``mp_context=multiprocessing.get_context("spawn")``
    running the same no-op once per worker.  The pool is created and shut
    down *inside* the timed region, as a launch starts and stops its
    workers; each of its N calls is submitted at once and every result
    awaited, then ``shutdown(wait=True)``.  Target: ratio <= 1.5.
(b) the time from a worker's ``raise`` (it stamps ``time.time()`` into its
    exception) to ``launch`` raising it in the launcher, with 4 workers of
    which the 3 others are asleep in ``time.sleep(1000)``: ``launch`` stops
    them before it raises, so the figure includes stopping and reaping them.
    Target: <= 1 s.  The baseline is the same pool of 4 (spawn) with the
    same function: the time until the launcher *sees* the exception
    (``concurrent.futures.wait(..., return_when=FIRST_EXCEPTION)``); the pool
    has no way to stop the sleeping siblings (``shutdown`` would wait 1000 s
    for them), so the script then kills them by hand, untimed.

For context, figures the issue quotes for torchrunx, the launcher this
replaces: a worker that raised made its launcher wait **29.5 s** for a
sleeping sibling; a no-op on 4 local workers took **5.1 s**; and about
**23 %** of a 20,000-line log burst was lost in 4 runs out of 16.  (The log
path is measured by ``bench/logs.py``; the burst over real ssh hosts is
checked line by line in ``tests/test_launch.py``.)

Method: each backend runs in a fresh interpreter (``--worker``).  In it both
variants are warmed up once, then repetitions alternate their order (ABBA)
and the medians are reported.  The no-op is a module-level function of this
file: corral sends it by value (cloudpickle, as for any ``__main__``
function), the spawn pool's children import this file as ``__mp_main__``
(which is why its top imports only the standard library).  The runner's own
open and close are reported apart, for reference; they are not in (a).

Usage::

    python bench/launch.py                    # both backends (about 30 s)
    python bench/launch.py --markdown         # the table in Markdown
    python bench/launch.py --backend trio --reps 21 --fail-reps 9
    python bench/launch.py --smoke            # tiny sizes: only checks that it runs (CI)

Options: ``--backend asyncio|trio|both``, ``--reps`` (11, per N and
variant), ``--fail-reps`` (7), ``--workers`` (``1,2,4``), ``--markdown``.
The header names the ``corral`` package measured: set ``PYTHONPATH`` to
measure another copy.  Per-repetition figures go to stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

from _common import add_smoke, format_table, print_header, run_workers  # bench/ is on sys.path

BACKENDS = ("asyncio", "trio")
NOOP_RATIO = 1.5  # (a): launch <= 1.5 x the spawn pool
RAISE_SECONDS = 1.0  # (b): a raise reaches the launcher (siblings stopped) within 1 s
FAIL_WORKERS = 4
FAILING_RANK = 1


def noop() -> None:
    """The work: nothing."""


def fail_or_sleep(rank: int | None = None) -> None:
    """Rank FAILING_RANK raises with a time stamp; every other rank sleeps 1000 s."""
    if rank is None:  # under launch, the rank comes from the environment
        rank = int(os.environ["RANK"])
    if rank != FAILING_RANK:
        time.sleep(1000)
        return
    time.sleep(0.3)  # let the siblings get to sleep first
    raise RuntimeError(f"raised at {time.time()!r}")


def _stamp(exc: BaseException) -> float:
    return float(str(exc).rsplit(" at ", 1)[1])


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------
# the pool baseline (blocking; run in a worker thread of the loop)


def _spawn() -> Any:
    return multiprocessing.get_context("spawn")


def pool_noop(n: int) -> float:
    """Create a spawn pool of n, run noop once per worker, shut it down: wall seconds."""
    t0 = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=n, mp_context=_spawn()) as pool:
        futures = [pool.submit(noop) for _ in range(n)]
        for future in futures:
            future.result()
    return time.perf_counter() - t0


def pool_raise() -> float:
    """Seconds from the raise to the launcher seeing it, with a pool of FAIL_WORKERS."""
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=FAIL_WORKERS, mp_context=_spawn())
    try:
        futures = [pool.submit(fail_or_sleep, rank) for rank in range(FAIL_WORKERS)]
        done, _ = concurrent.futures.wait(
            futures, timeout=60, return_when=concurrent.futures.FIRST_EXCEPTION
        )
        seen = time.time()
        failed = [f for f in done if f.exception() is not None]
        if not failed:
            raise RuntimeError("the pool reported no exception within 60 s")
        exc = failed[0].exception()
        assert exc is not None
        return seen - _stamp(exc)
    finally:
        # The pool cannot stop its sleeping workers: kill them (untimed).
        processes = list(getattr(pool, "_processes", {}).values())
        for process in processes:
            process.kill()
        pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------------------
# corral (inside the worker's event loop)


async def corral_noop(runner: Any, n: int) -> float:
    t0 = time.perf_counter()
    await runner.launch(noop, workers_per_host=n)
    return time.perf_counter() - t0


async def corral_raise(runner: Any) -> float:
    try:
        await runner.launch(fail_or_sleep, workers_per_host=FAIL_WORKERS)
    except RuntimeError as exc:
        return time.time() - _stamp(exc)
    raise RuntimeError("launch did not raise")


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    import anyio
    import anyio.to_thread

    import corral

    sizes = [int(n) for n in args.workers.split(",")]
    out: dict[str, Any] = {"noop": {}, "raise": {"corral": [], "pool": []}}
    t0 = time.perf_counter()
    async with corral.open_runner(name="bench", console=False) as runner:
        opened = time.perf_counter() - t0
        # Warm up: imports, the page cache, the pool's machinery.
        await corral_noop(runner, 1)
        await anyio.to_thread.run_sync(pool_noop, 1)
        for n in sizes:
            res: dict[str, list[float]] = {"corral": [], "pool": []}
            for rep in range(args.reps):
                order = ("pool", "corral") if rep % 4 in (0, 3) else ("corral", "pool")
                for which in order:
                    gc.collect()
                    if which == "corral":
                        wall = await corral_noop(runner, n)
                    else:
                        wall = await anyio.to_thread.run_sync(pool_noop, n)
                    res[which].append(wall)
                    _say(f"  [{args.backend}] noop x{n} rep {rep + 1} {which}: {wall * 1e3:.0f} ms")
            out["noop"][str(n)] = res
        for rep in range(args.fail_reps):
            order = ("pool", "corral") if rep % 4 in (0, 3) else ("corral", "pool")
            for which in order:
                gc.collect()
                if which == "corral":
                    late = await corral_raise(runner)
                else:
                    late = await anyio.to_thread.run_sync(pool_raise)
                out["raise"][which].append(late)
                _say(f"  [{args.backend}] raise rep {rep + 1} {which}: {late * 1e3:.0f} ms")
        t1 = time.perf_counter()
    out["open"] = opened
    out["close"] = time.perf_counter() - t1
    return out


def _worker_main(args: argparse.Namespace) -> None:
    import anyio

    print(json.dumps(anyio.run(worker, args, backend=args.backend)))


# --------------------------------------------------------------------------------------
# the table


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--reps", type=int, default=11, help="no-op launches per N and variant")
    parser.add_argument("--fail-reps", type=int, default=7, help="failing launches per variant")
    parser.add_argument("--workers", default="1,2,4", help="worker counts for (a)")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_smoke(parser, reps=1, fail_reps=1, workers="2")
    args = parser.parse_args()
    if args.worker:
        if args.backend == "both":
            parser.error("--worker needs --backend asyncio or --backend trio")
        _worker_main(args)
        return

    packages = ("anyio", "trio", "cloudpickle", "msgspec")
    print_header("corral launch benchmarks", "launch.py", packages)
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    results: dict[str, dict[str, Any]] = run_workers(os.path.abspath(__file__), backends)

    med = statistics.median
    header = ["backend", "measure", "measured", "baseline", "ratio", "target", "met"]
    rows = []
    for backend in backends:
        res = results[backend]
        for n, figures in res["noop"].items():
            c, p = med(figures["corral"]), med(figures["pool"])
            ok = c <= NOOP_RATIO * p
            rows.append(
                [
                    backend,
                    f"(a) no-op on {n} local worker{'s' if n != '1' else ''}, "
                    f"launch vs spawn pool (median of {len(figures['corral'])})",
                    _ms(c),
                    _ms(p),
                    f"{c / p:.2f}",
                    f"<= {NOOP_RATIO:g}x pool",
                    _yes(ok),
                ]
            )
        c_raise, p_raise = med(res["raise"]["corral"]), med(res["raise"]["pool"])
        worst = _ms(max(res["raise"]["corral"]))
        ok = c_raise <= RAISE_SECONDS
        rows.append(
            [
                backend,
                f"(b) raise -> launch raises, {FAIL_WORKERS - 1} siblings asleep and stopped; "
                f"baseline: raise -> pool reports it, siblings left asleep "
                f"(median of {len(res['raise']['corral'])}, max {worst})",
                _ms(c_raise),
                _ms(p_raise),
                f"{c_raise / p_raise:.2f}",
                f"<= {RAISE_SECONDS * 1e3:.0f} ms",
                _yes(ok),
            ]
        )
        rows.append(
            [
                backend,
                "runner open / close (not in (a); for reference)",
                f"{_ms(res['open'])} / {_ms(res['close'])}",
                "",
                "",
                "",
                "",
            ]
        )
    print()
    print(
        "## launch on this machine: corral vs concurrent.futures.ProcessPoolExecutor "
        "(spawn), same run"
    )
    print()
    print(format_table(header, rows, args.markdown))


if __name__ == "__main__":
    main()
