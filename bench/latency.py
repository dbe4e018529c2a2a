"""Latency of what a launcher waits on: failures, start-up reports, early exits.

Each figure is the time from a moment the *child* records (with
``time.monotonic()``, which is one clock for every process on Linux) to the
moment the launcher's code sees the result.  The baseline is the same child
under raw AnyIO in the same run, repetitions interleaved:

* failure: a child writes its clock to stderr and exits with code 3; corral
  raises ``ProcessFailed`` out of the runner block (target: within 100 ms);
  the baseline is ``anyio.run_process(check=True)`` raising
  ``CalledProcessError``.
* early exit: the same child started with ``wait_started=True``; corral's
  ``start`` raises ``StartupFailed`` (target: within 100 ms); same baseline.
* handshake: the child calls ``corral.child.started(clock)``; corral's
  ``start`` returns; the baseline reads one line from the child's stdout
  with ``anyio.open_process``.

Run: ``python bench/latency.py [--reps N] [--markdown]`` (``--smoke``: one
repetition, for CI).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import anyio
from _common import add_smoke, print_header, print_table  # bench/ is on sys.path

import corral

PY = sys.executable
FAIL = (
    "import os, sys, time; sys.stderr.write(repr(time.monotonic())); sys.stderr.flush(); "
    "os._exit(3)"
)
REPORT = "import corral.child, time; corral.child.started(time.monotonic()); time.sleep(30)"
REPORT_RAW = "import sys, time; print(time.monotonic(), flush=True); time.sleep(30)"


async def corral_failure() -> float:
    try:
        async with corral.open_runner(console=False, handle_signals=False) as r:
            await r.start([PY, "-c", FAIL])
            await anyio.sleep_forever()
    except ExceptionGroup as group:
        seen = time.monotonic()
        err = group.exceptions[0]
        assert isinstance(err, corral.ProcessFailed)
        return seen - float(err.stderr)
    raise AssertionError("no failure")


async def corral_early_exit() -> float:
    async with corral.open_runner(console=False, handle_signals=False) as r:
        try:
            await r.start([PY, "-c", FAIL], wait_started=True)
        except corral.StartupFailed as err:
            return time.monotonic() - float(err.stderr)
    raise AssertionError("no failure")


async def raw_failure() -> float:
    try:
        await anyio.run_process([PY, "-c", FAIL], check=True)
    except subprocess.CalledProcessError as err:
        return time.monotonic() - float(err.stderr)
    raise AssertionError("no failure")


async def corral_handshake() -> float:
    async with corral.open_runner(console=False, handle_signals=False) as r:
        p = await r.start([PY, "-c", REPORT], wait_started=True)
        latency = time.monotonic() - float(p.started_value)  # type: ignore[arg-type]
        p.terminate()
        await p.wait()
    return latency


async def raw_handshake() -> float:
    async with await anyio.open_process([PY, "-c", REPORT_RAW]) as p:
        assert p.stdout is not None
        line = b""
        async for chunk in p.stdout:
            line += chunk
            if b"\n" in line:
                break
        latency = time.monotonic() - float(line)
        p.terminate()
        await p.wait()
    return latency


PAIRS = [
    ("failure surfaces (ProcessFailed)", corral_failure, raw_failure, 0.100),
    ("exit before start-up report (StartupFailed)", corral_early_exit, raw_failure, 0.100),
    ("start-up report arrives", corral_handshake, raw_handshake, None),
]


async def measure(reps: int) -> list[tuple[str, float, float, float | None]]:
    rows = []
    for label, ours, theirs, target in PAIRS:
        a: list[float] = []
        b: list[float] = []
        for i in range(reps):
            first, second = (ours, theirs) if i % 2 == 0 else (theirs, ours)
            x = await first()
            y = await second()
            (a if first is ours else b).append(x)
            (b if first is ours else a).append(y)
        rows.append((label, statistics.median(a), statistics.median(b), target))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--markdown", action="store_true")
    add_smoke(parser, reps=1)
    args = parser.parse_args()
    print_header("corral latency benchmarks", "latency.py", ("anyio", "trio"))
    header = ["backend", "measure (median)", "corral", "raw anyio", "ratio", "target", "met"]
    rows = []
    for backend in ("asyncio", "trio"):
        for label, ours, theirs, target in anyio.run(measure, args.reps, backend=backend):
            met = "" if target is None else ("yes" if ours <= target else "**NO**")
            rows.append(
                [
                    backend,
                    label,
                    f"{ours * 1000:.2f} ms",
                    f"{theirs * 1000:.2f} ms",
                    f"{ours / theirs:.2f}",
                    "" if target is None else f"<= {target * 1000:.0f} ms",
                    met,
                ]
            )
    print()
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
