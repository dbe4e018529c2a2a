"""Core runner benchmarks: corral against raw AnyIO, on asyncio and Trio.

Targets (issue 2, item 9):

(a) wall time of 200 concurrent ``/bin/true`` through ``r.run`` inside one
    already-open ``corral.open_runner(console=False)``, against 200 concurrent
    ``anyio.run_process(["/bin/true"])``.  Target: ratio <= 1.25.  The runner's
    own open and close are timed separately.
(b) the worst stall of a 1 ms ticker task (``await anyio.sleep(0.001)`` in a
    loop; the largest gap between wake-ups minus 1 ms) running beside the 200
    starts of (a), corral against raw.  Target: corral's worst gap no larger
    than raw's.
(c) launcher memory (VmRSS, after ``gc.collect()``) and open descriptors per
    live child with 500 sleeping children (``sleep 1000``), corral's
    ``r.start`` against ``anyio.open_process`` held open.

Absolute times drift on a shared machine, so every figure is compared with
its baseline measured in the same run: (a) and (b) alternate corral and raw
repetitions in one process per backend (ABBA order) and report medians; (c)
runs each variant in a fresh interpreter, alternating, and reports medians.

Usage::

    python bench/spawn.py                      # everything, both backends
    python bench/spawn.py --backend trio --reps 15 --targets ab
    python bench/spawn.py --markdown           # tables in Markdown (for RESULTS.md)
    python bench/spawn.py --smoke              # tiny sizes: only checks that it runs (CI)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import add_smoke, format_table, print_header  # bench/ is on sys.path
from _ticker import Ticker

BACKENDS = ("asyncio", "trio")


# --------------------------------------------------------------------------------------
# measurement helpers (run inside a worker process)


async def _with_ticker(body: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Run ``body`` beside a 1 ms ticker; return (wall seconds, worst stall seconds)."""
    import anyio

    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        t0 = time.perf_counter()
        await body()
        wall = time.perf_counter() - t0
        tg.cancel_scope.cancel()
    return wall, ticker.worst


async def raw_batch(n: int) -> tuple[float, float]:
    import anyio

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(anyio.run_process, ["/bin/true"])

    return await _with_ticker(body)


async def corral_batch(n: int) -> tuple[float, float, float, float]:
    """Returns (wall, stall, open seconds, close seconds)."""
    import anyio

    import corral

    t0 = time.perf_counter()
    runner = corral.open_runner(console=False)
    await runner.__aenter__()
    opened = time.perf_counter() - t0
    try:

        async def body() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(runner.run, ["/bin/true"])

        wall, stall = await _with_ticker(body)
    except BaseException:
        await runner.__aexit__(*sys.exc_info())
        raise
    t1 = time.perf_counter()
    await runner.__aexit__(None, None, None)
    closed = time.perf_counter() - t1
    return wall, stall, opened, closed


async def idle_stall(seconds: float) -> float:
    """The ticker's worst gap with nothing else running: the noise floor."""
    import anyio

    async def body() -> None:
        await anyio.sleep(seconds)

    return (await _with_ticker(body))[1]


async def timing_worker(n: int, reps: int) -> dict[str, Any]:
    # Warm up both paths (imports, worker threads, the child watcher) first.
    await raw_batch(20)
    await corral_batch(20)
    out: dict[str, list[float]] = {
        k: [] for k in ("raw_wall", "raw_stall", "c_wall", "c_stall", "c_open", "c_close", "idle")
    }
    for rep in range(reps):
        order = ("raw", "corral") if rep % 4 in (0, 3) else ("corral", "raw")
        for which in order:
            gc.collect()
            if which == "raw":
                wall, stall = await raw_batch(n)
                out["raw_wall"].append(wall)
                out["raw_stall"].append(stall)
            else:
                wall, stall, opened, closed = await corral_batch(n)
                out["c_wall"].append(wall)
                out["c_stall"].append(stall)
                out["c_open"].append(opened)
                out["c_close"].append(closed)
        out["idle"].append(await idle_stall(0.1))
    return out


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads")


def _snapshot() -> dict[str, int]:
    gc.collect()
    return {
        "rss_kib": _rss_kib(),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": _threads(),
    }


async def memory_worker(variant: str, n: int) -> dict[str, Any]:
    import subprocess as sp

    import anyio

    argv = ["sleep", "1000"]
    if variant == "raw":
        # Warm up: one child through the same path, fully finished.
        warm = await anyio.open_process(["/bin/true"], stdin=sp.DEVNULL)
        await warm.wait()
        await warm.aclose()
        before = _snapshot()
        procs: list[Any] = []

        async def start_raw() -> None:
            # Like corral's default: stdin from /dev/null, stdout and stderr piped.
            procs.append(await anyio.open_process(argv, stdin=sp.DEVNULL))

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(start_raw)
        await anyio.sleep(0.3)
        after = _snapshot()
        for p in procs:
            p.kill()
        with anyio.CancelScope(shield=True):
            for p in procs:
                await p.wait()
                await p.aclose()
        return {"before": before, "after": after}

    import corral

    async with corral.open_runner(console=False) as r:
        await r.run(["/bin/true"])  # warm up
        before = _snapshot()
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(r.start, argv)
        await anyio.sleep(0.3)
        after = _snapshot()
        assert len(r.processes) == n, len(r.processes)
        for p in r.processes:
            p.kill()
    return {"before": before, "after": after}


# --------------------------------------------------------------------------------------
# orchestration


def _worker_main(args: argparse.Namespace) -> None:
    import anyio

    if args.worker == "timing":
        result = anyio.run(timing_worker, args.n, args.reps, backend=args.backend)
    else:
        result = anyio.run(memory_worker, args.variant, args.children, backend=args.backend)
    print(json.dumps(result))


def _run_worker(*extra: str) -> Any:
    cmd = [sys.executable, os.path.abspath(__file__), *extra]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--targets", default="abc", help="any of a, b, c (a and b run together)")
    parser.add_argument("--n", type=int, default=200, help="concurrent /bin/true per batch")
    parser.add_argument("--reps", type=int, default=11, help="repetitions of each batch")
    parser.add_argument("--children", type=int, default=500, help="sleeping children for (c)")
    parser.add_argument("--mem-reps", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--worker", choices=("timing", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=("raw", "corral"), help=argparse.SUPPRESS)
    add_smoke(parser, n=10, reps=1, children=10, mem_reps=1)
    args = parser.parse_args()
    if args.worker:
        _worker_main(args)
        return

    backends = BACKENDS if args.backend == "both" else (args.backend,)
    md = args.markdown
    med = statistics.median
    print_header("corral core runner benchmarks", "spawn.py", ("anyio", "trio"))
    verdicts: list[str] = []

    if "a" in args.targets or "b" in args.targets:
        header = ["backend", "measure", "corral", "raw anyio", "ratio", "target", "met"]
        rows: list[list[str]] = []
        extra_header = ["backend", "runner open", "runner close", "idle ticker worst gap"]
        extra: list[list[str]] = []
        for backend in backends:
            r = _run_worker(
                "--worker",
                "timing",
                "--backend",
                backend,
                "--n",
                str(args.n),
                "--reps",
                str(args.reps),
            )
            cw, rw = med(r["c_wall"]), med(r["raw_wall"])
            ratio = cw / rw
            ok_a = ratio <= 1.25
            rows.append(
                [
                    backend,
                    f"(a) wall, {args.n} x /bin/true (median of {args.reps})",
                    _ms(cw),
                    _ms(rw),
                    f"{ratio:.2f}",
                    "<= 1.25",
                    "yes" if ok_a else "**NO**",
                ]
            )
            cs, rs = med(r["c_stall"]), med(r["raw_stall"])
            ok_b = cs <= rs
            rows.append(
                [
                    backend,
                    "(b) worst ticker stall (median of per-rep worst)",
                    _ms(cs),
                    _ms(rs),
                    f"{cs / rs:.2f}",
                    "<= 1.00",
                    "yes" if ok_b else "**NO**",
                ]
            )
            rows.append(
                [
                    backend,
                    "(b) worst ticker stall (max over reps)",
                    _ms(max(r["c_stall"])),
                    _ms(max(r["raw_stall"])),
                    f"{max(r['c_stall']) / max(r['raw_stall']):.2f}",
                    "",
                    "",
                ]
            )
            extra.append(
                [backend, _ms(med(r["c_open"])), _ms(med(r["c_close"])), _ms(med(r["idle"]))]
            )
            verdicts.append(f"{backend} (a) ratio {ratio:.2f}: {'met' if ok_a else 'NOT met'}")
            verdicts.append(
                f"{backend} (b) stall ratio {cs / rs:.2f}: {'met' if ok_b else 'NOT met'}"
            )
            sys.stdout.flush()
        print()
        print("## (a) wall time and (b) loop stall; corral and raw alternate in one process")
        print()
        print(format_table(header, rows, md))
        print()
        print("runner open/close overhead (medians), and the ticker's idle noise floor:")
        print()
        print(format_table(extra_header, extra, md))

    if "c" in args.targets:
        header = ["backend", "measure", "corral", "raw anyio", "ratio"]
        rows = []
        for backend in backends:
            res: dict[str, list[dict[str, Any]]] = {"raw": [], "corral": []}
            for rep in range(args.mem_reps):
                for variant in ("raw", "corral") if rep % 2 == 0 else ("corral", "raw"):
                    res[variant].append(
                        _run_worker(
                            "--worker",
                            "memory",
                            "--backend",
                            backend,
                            "--variant",
                            variant,
                            "--children",
                            str(args.children),
                        )
                    )

            def per_child(variant: str, key: str, res: dict[str, Any] = res) -> float:
                return float(
                    med((m["after"][key] - m["before"][key]) / args.children for m in res[variant])
                )

            for key, label, unit in (
                ("rss_kib", "RSS per live child", "KiB"),
                ("fds", "open fds per live child", ""),
                ("threads", "threads per live child", ""),
            ):
                c, rw = per_child("corral", key), per_child("raw", key)
                rows.append(
                    [
                        backend,
                        label,
                        f"{c:.2f} {unit}".strip(),
                        f"{rw:.2f} {unit}".strip(),
                        f"{c / rw:.2f}" if rw else "-",
                    ]
                )
            before = med(m["before"]["rss_kib"] for m in res["corral"]) / 1024
            before_raw = med(m["before"]["rss_kib"] for m in res["raw"]) / 1024
            rows.append(
                [
                    backend,
                    "launcher RSS before the children",
                    f"{before:.1f} MiB",
                    f"{before_raw:.1f} MiB",
                    "",
                ]
            )
            sys.stdout.flush()
        print()
        print(
            f"## (c) launcher cost per live child, {args.children} x `sleep 1000` "
            f"(median of {args.mem_reps} fresh processes each)"
        )
        print()
        print(format_table(header, rows, md))

    if verdicts:
        print()
        for v in verdicts:
            print("- " + v)


if __name__ == "__main__":
    main()
