"""Signal fan-out benchmark: SIGINT to a launcher with 100 children, until all are gone.

Target (issue 3, item 3): a launcher with 100 children in one runner gets
SIGINT at its pid; measure from the ``kill`` until the launcher process has
exited *and* every child has exited (reaped by the launcher).  Median under
150 ms when the children obey the signal; ``grace`` + under 150 ms when they
ignore SIGINT and SIGTERM (they are SIGKILLed at the deadline).

Every launcher is a fresh interpreter, started in its own session, that
prints ``READY <pids>`` once every child is running and ready, then waits.
The bench process opens a pidfd on the launcher and on each child before
sending the signal, and waits on them with ``poll`` (no sleeping, no
polling loop).

Variants (all in the same run, interleaved repetition by repetition, so
that drift on a shared machine hits them alike):

* ``corral/<backend>``: ``corral.open_runner`` on asyncio or Trio, 100
  children started with ``wait_started=True``; the runner forwards SIGINT
  to every child's group and raises :class:`KeyboardInterrupt`, which ends
  the launcher.
* ``popen+killpg`` (baseline): the hand-rolled equivalent with no event
  loop at all: ``subprocess.Popen(start_new_session=True)`` per child and a
  SIGINT handler that ``killpg``\\ s every group, waits for each child up
  to the grace deadline, SIGKILLs the rest and exits.
* ``bare python`` (floor): a launcher that imports the same modules, runs
  ``anyio.run(anyio.sleep_forever)`` with no children, and exits on the
  SIGINT; the interpreter's own reaction and teardown time.

Children are ``/bin/sh`` scripts that become ``sleep 1000`` (the ignoring
kind first runs ``trap '' INT TERM HUP``; ignored dispositions survive
``exec``), so the measure is the launcher's, not the children's start-up.

Usage::

    python bench/signals.py                  # 100 children, 7 repetitions, grace 0.5 s
    python bench/signals.py --markdown       # tables in Markdown for bench/RESULTS.md
    python bench/signals.py --children 200 --reps 11 --grace 1.0
    python bench/signals.py --smoke          # tiny sizes: only checks that it runs (CI)
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_smoke, print_header, print_table, unignore_sigint, wait_all

TARGET_OVERHEAD = 0.150  # seconds

OBEY = "echo null >&$CORRAL_STARTED_FD; exec sleep 1000"
IGNORE = "trap '' INT TERM HUP; echo null >&$CORRAL_STARTED_FD; exec sleep 1000"

CORRAL_LAUNCHER = rf"""
import sys
import anyio
import corral

backend, n, mode, grace = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
script = {OBEY!r} if mode == "obey" else {IGNORE!r}

async def main():
    async with corral.open_runner(grace=grace, console=False, handle_signals=True) as r:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(lambda i=i: r.start(["sh", "-c", script], name=f"w{{i}}",
                                                  wait_started=True))
        print("READY", *(p.pid for p in r.processes), flush=True)
        await anyio.sleep_forever()

try:
    anyio.run(main, backend=backend)
except* KeyboardInterrupt:
    sys.exit(0)
"""

POPEN_LAUNCHER = rf"""
import os, signal, subprocess, sys, time

n, mode, grace = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
script = {OBEY!r} if mode == "obey" else {IGNORE!r}
script = script.replace("echo null >&$CORRAL_STARTED_FD", "echo ready")
procs = [subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
         for _ in range(n)]
for p in procs:
    p.stdout.readline()

def stop(signum, frame):
    for p in procs:
        os.killpg(p.pid, signum)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    sys.exit(0)

signal.signal(signal.SIGINT, stop)
print("READY", *(p.pid for p in procs), flush=True)
while True:
    signal.pause()
"""

BARE_LAUNCHER = r"""
import anyio, sys
import corral  # the same imports as the corral launcher

async def main():
    print("READY", flush=True)
    await anyio.sleep_forever()

try:
    anyio.run(main, backend=sys.argv[1])
except KeyboardInterrupt:
    sys.exit(0)
"""


def measure(argv: list[str], expect_children: int) -> tuple[float, float]:
    """Start a launcher, wait for READY, SIGINT it; seconds until it and its children are gone.

    Returns (until the launcher and every child have exited, until the last
    child has exited).
    """
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    fds: list[int] = []
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"launcher failed to start: {line!r}")
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == expect_children, (len(pids), expect_children)
        fds = [os.pidfd_open(launcher.pid)] + [os.pidfd_open(pid) for pid in pids]
        start = time.perf_counter()
        os.kill(launcher.pid, signal.SIGINT)
        seen = wait_all(fds, 60.0)
        elapsed = max(seen.values()) - start
        last_child = max((seen[fd] for fd in fds[1:]), default=start) - start
        launcher.wait()
        if launcher.returncode != 0:
            raise RuntimeError(f"launcher exited with {launcher.returncode}")
        return elapsed, last_child
    finally:
        for fd in fds:
            os.close(fd)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=100)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--markdown", action="store_true")
    add_smoke(parser, children=5, reps=1, grace=0.2)
    args = parser.parse_args()
    n, grace = args.children, args.grace
    print_header("corral signal fan-out benchmark", "signals.py", ("anyio", "trio"))
    unignore_sigint()

    with tempfile.TemporaryDirectory() as tmp:
        scripts = {}
        for name, text in (
            ("corral", CORRAL_LAUNCHER),
            ("popen", POPEN_LAUNCHER),
            ("bare", BARE_LAUNCHER),
        ):
            path = Path(tmp) / f"launch_{name}.py"
            path.write_text(text)
            scripts[name] = str(path)
        py = sys.executable
        variants: dict[tuple[str, str], tuple[list[str], int]] = {}
        for mode in ("obey", "ignore"):
            for backend in ("asyncio", "trio"):
                variants[(f"corral/{backend}", mode)] = (
                    [py, scripts["corral"], backend, str(n), mode, str(grace)],
                    n,
                )
            variants[("popen+killpg", mode)] = ([py, scripts["popen"], str(n), mode, str(grace)], n)
        for backend in ("asyncio", "trio"):
            variants[(f"bare python/{backend}", "-")] = ([py, scripts["bare"], backend], 0)

        times: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
        children_gone: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
        keys = list(variants)
        for rep in range(args.reps):
            order = keys if rep % 2 == 0 else keys[::-1]  # ABBA
            for key in order:
                argv, expect = variants[key]
                total, last_child = measure(argv, expect)
                times[key].append(total)
                children_gone[key].append(last_child)
            print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    med = {key: statistics.median(values) for key, values in times.items()}
    med_children = {key: statistics.median(values) for key, values in children_gone.items()}

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.1f} ms"

    print()
    print(f"## SIGINT to a launcher with {n} children, grace {grace:g} s, median of {args.reps}")
    print()
    rows = []
    for mode in ("obey", "ignore"):
        base = med[("popen+killpg", mode)]
        for backend in ("asyncio", "trio"):
            value = med[(f"corral/{backend}", mode)]
            overhead = value - (grace if mode == "ignore" else 0.0)
            target = (
                f"< {ms(TARGET_OVERHEAD)}" if mode == "obey" else f"grace + < {ms(TARGET_OVERHEAD)}"
            )
            rows.append(
                (
                    backend,
                    "children obey SIGINT" if mode == "obey" else "children ignore SIGINT/SIGTERM",
                    ms(value),
                    ms(overhead) if mode == "ignore" else "",
                    ms(med_children[(f"corral/{backend}", mode)]),
                    ms(base),
                    f"{value / base:.2f}",
                    ms(med[(f"bare python/{backend}", "-")]),
                    target,
                    "yes" if overhead < TARGET_OVERHEAD else "**NO**",
                )
            )
    header = (
        "backend",
        "children",
        "corral (median)",
        "corral - grace",
        "last child exited",
        "popen+killpg baseline",
        "ratio",
        "bare python exit",
        "target",
        "met",
    )
    print_table(header, rows, args.markdown)
    print()
    print("all samples (ms):")
    for key, values in times.items():
        print(f"  {key[0]:<20} {key[1]:<6} " + " ".join(f"{v * 1000:.0f}" for v in values))


if __name__ == "__main__":
    main()
