"""Where corral's time goes in benchmark (a): 200 concurrent ``/bin/true`` via ``r.run``.

Two views, each beside raw ``anyio.run_process`` in the same process:

1. A decomposition of the loop thread's wall time during a batch: time idle
   in ``epoll``, CPU time of the loop thread itself, and the rest -- time the
   loop thread was runnable but off the CPU, which here is almost all waiting
   for the GIL (held by a worker thread inside ``os.posix_spawn``) or blocked
   in ``vfork`` until the child has exec'd.
2. A cProfile of the loop thread (only that thread: cProfile is per thread)
   aggregated by package, then the top corral functions.

Usage::

    python bench/profile_spawn.py                 # both backends
    python bench/profile_spawn.py --backend trio --reps 9 --top 30
    python bench/profile_spawn.py --smoke         # tiny sizes: only checks that it runs (CI)

To measure a modified copy of the package without touching ``src/``::

    cp -r src/corral /tmp/x/corral && (edit) && PYTHONPATH=/tmp/x python bench/profile_spawn.py
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from typing import Any

import spawn  # bench/spawn.py: the batches themselves (bench/ is on sys.path)
from _common import add_smoke, print_header

_idle = [0.0]


def _install_idle_probe(backend: str) -> None:
    if backend == "asyncio":
        import selectors

        original = selectors.EpollSelector.select

        def select(self: Any, timeout: float | None = None) -> Any:
            t = time.perf_counter()
            try:
                return original(self, timeout)
            finally:
                _idle[0] += time.perf_counter() - t

        selectors.EpollSelector.select = select  # type: ignore[method-assign]
    else:
        import trio

        class IdleProbe(trio.abc.Instrument):
            t = 0.0

            def before_io_wait(self, timeout: float) -> None:
                self.t = time.perf_counter()

            def after_io_wait(self, timeout: float) -> None:
                _idle[0] += time.perf_counter() - self.t

        trio.lowlevel.add_instrument(IdleProbe())


async def _decompose(fn: Any, n: int) -> dict[str, float]:
    gc.collect()
    _idle[0] = 0.0
    c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
    result = await fn(n)
    wall = time.perf_counter() - t0
    loop_cpu = time.thread_time() - c0
    return {
        "wall": wall,
        "idle in epoll": _idle[0],
        "loop-thread CPU": loop_cpu,
        "loop off-CPU (GIL, vfork)": wall - _idle[0] - loop_cpu,
        "process CPU": time.process_time() - p0,
        "worst stall": result[1],
    }


async def _main(backend: str, n: int, reps: int, top: int) -> None:
    _install_idle_probe(backend)
    await spawn.corral_batch(20)
    await spawn.raw_batch(20)
    rows: dict[str, list[dict[str, float]]] = {"corral": [], "raw": []}
    for rep in range(reps):
        for which in ("raw", "corral") if rep % 2 else ("corral", "raw"):
            fn = spawn.corral_batch if which == "corral" else spawn.raw_batch
            rows[which].append(await _decompose(fn, n))
    print(f"\n## {backend}: loop-thread decomposition, median of {reps} (ms)\n")
    keys = list(rows["corral"][0])
    print(f"{'':8s}" + "".join(f"{k:>27s}" for k in keys))
    for which, rs in rows.items():
        print(
            f"{which:8s}"
            + "".join(f"{statistics.median(r[k] for r in rs) * 1e3:27.1f}" for k in keys)
        )

    for which in ("corral", "raw"):
        prof = cProfile.Profile()
        batches = 3
        for _ in range(batches):
            gc.collect()
            prof.enable()
            await (spawn.corral_batch(n) if which == "corral" else spawn.raw_batch(n))
            prof.disable()
        stats: Any = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        by_package: collections.Counter[str] = collections.Counter()
        for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.items():
            if filename == "~":
                key = (
                    name
                    if any(s in name for s in ("posix_spawn", "fork_exec", "poll"))
                    else ("other C calls (syscalls: read/write/close/waitpid/...)")
                )
            else:
                key = next(
                    (
                        p
                        for p in (
                            "corral",
                            "anyio",
                            "trio",
                            "asyncio",
                            "selectors",
                            "subprocess",
                            "<frozen os>",
                            "logging",
                            "threading",
                        )
                        if p in filename
                    ),
                    "other Python",
                )
            by_package[key] += tottime
        total = sum(by_package.values())
        print(
            f"\n## {backend}: cProfile of the loop thread, {which}, "
            f"{total / batches * 1e3:.1f} ms per batch under the profiler\n"
        )
        for key, t in by_package.most_common(10):
            print(f"  {t / batches * 1e3:7.1f} ms  {key}")
        if which == "corral":
            print("\n  top corral functions by own time (per batch):")
            ranked = sorted(
                ((v[2], k) for k, v in stats.items() if "corral" in k[0]), reverse=True
            )[:top]
            for tottime, (filename, line, name) in ranked:
                ncalls = stats[(filename, line, name)][1]
                print(
                    f"  {tottime / batches * 1e3:7.2f} ms  {ncalls // batches:5d} calls  "
                    f"{os.path.basename(filename)}:{line}({name})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("asyncio", "trio", "both"), default="both")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    add_smoke(parser, n=10, reps=1, top=5)
    args = parser.parse_args()
    if not args.one:
        print_header("where the time of spawn.py (a) goes", "profile_spawn.py", ("anyio", "trio"))
    backends = ("asyncio", "trio") if args.backend == "both" else (args.backend,)
    if args.one or len(backends) == 1:
        import anyio

        anyio.run(
            _main,
            args.one or backends[0],
            args.n,
            args.reps,
            args.top,
            backend=args.one or backends[0],
        )
        return
    import subprocess

    for backend in backends:  # a fresh interpreter per backend (the probes patch the loop)
        sys.stdout.flush()
        subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--one",
                backend,
                "--n",
                str(args.n),
                "--reps",
                str(args.reps),
                "--top",
                str(args.top),
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
