"""``corral run`` benchmark: Ctrl-C until everything has exited, 8 obedient workers.

Target (the command-line issue, item 1): ``corral run -n 8 -- sh -c '...'``
with 8 workers that obey SIGINT gets a Ctrl-C (SIGINT to its process group,
as a terminal sends it); measure from the signal until ``corral`` *and*
every worker have exited.  Median under 150 ms.

Variants, measured in the same run and interleaved repetition by repetition
(ABBA order), so that drift on a shared machine hits them alike:

* ``corral run``: the installed console script, as a user types it; it
  shows 8 ``ready <pid>`` lines once the workers run.
* ``popen+killpg`` (baseline): the hand-rolled launcher with no event loop
  and no output handling: ``subprocess.Popen(start_new_session=True)`` per
  worker, a SIGINT handler that ``killpg``\\ s every group, reaps them and
  exits with 130.
* ``bare python`` (floor): an interpreter that imports corral and click,
  waits in ``anyio.run`` and exits on the SIGINT: the interpreter's own
  reaction and teardown.

The workers are the same ``sh`` in every variant: ``echo ready $$; exec
sleep 1000`` (they die of the SIGINT that is forwarded to them).  Every
launcher runs in its own session; the bench process opens a pidfd on it and
on each worker before sending the signal and waits on them with ``poll``
(no sleeping, no polling loop).

Usage::

    python bench/cli.py                 # 8 workers, 15 repetitions
    python bench/cli.py --markdown      # the table in Markdown (for bench/RESULTS.md)
    python bench/cli.py --workers 16 --reps 21
    python bench/cli.py --smoke         # tiny sizes: only checks that it runs (CI)
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

from _common import add_smoke, format_table, print_header, unignore_sigint, wait_all
from _private import CLI_MODULE

TARGET = 0.150  # seconds, Ctrl-C to everything gone

WORKER = "echo ready $$; exec sleep 1000"

POPEN_LAUNCHER = rf"""
import os, signal, subprocess, sys

n = int(sys.argv[1])
procs = [subprocess.Popen(["sh", "-c", {WORKER!r}], stdout=subprocess.PIPE,
                          start_new_session=True) for _ in range(n)]
pids = [p.stdout.readline().split()[1].decode() for p in procs]

def stop(signum, frame):
    for p in procs:
        try:
            os.killpg(p.pid, signum)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()
    sys.exit(130)

signal.signal(signal.SIGINT, stop)
print("READY", *pids, flush=True)
while True:
    signal.pause()
"""

BARE_LAUNCHER = r"""
import sys
import anyio, click
import corral  # the imports of the corral command

async def main():
    print("READY", flush=True)
    await anyio.sleep_forever()

try:
    anyio.run(main)
except KeyboardInterrupt:
    sys.exit(130)
"""


def corral_argv() -> list[str]:
    script = Path(sys.executable).with_name("corral")
    return [str(script)] if script.exists() else [sys.executable, "-m", CLI_MODULE]


def ready_pids(launcher: subprocess.Popen[str], workers: int) -> list[int]:
    """Read the launcher's output until it says every worker runs; their pids."""
    assert launcher.stdout is not None
    pids: list[int] = []
    seen: list[str] = []  # the last lines, for the error
    while len(pids) < workers or (workers == 0 and not pids):
        line = launcher.stdout.readline()
        if not line:
            said = "".join(seen)
            raise RuntimeError(f"the launcher ended before its workers were ready: {pids}\n{said}")
        seen = [*seen[-19:], line]
        words = line.split()
        if words and words[0] == "READY":
            pids = [int(p) for p in words[1:]]
            if workers == 0:
                return []
        elif len(words) >= 2 and words[-2] == "ready":  # "HH:MM:SS agent-0.worker-3 | ready 123"
            pids.append(int(words[-1]))
    return pids


def measure(argv: list[str], workers: int) -> tuple[float, float, float]:
    """Start a launcher, wait until its workers are ready, Ctrl-C it.

    Returns (seconds from the start to every worker ready, from the signal
    until the launcher and every worker have exited, from the signal until
    the last worker has exited).
    """
    started = time.perf_counter()
    launcher = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    fds: list[int] = []
    try:
        pids = ready_pids(launcher, workers)
        ready = time.perf_counter() - started
        assert len(pids) == workers, (pids, workers)
        fds = [os.pidfd_open(launcher.pid)] + [os.pidfd_open(pid) for pid in pids]
        signalled = time.perf_counter()
        os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        seen = wait_all(fds, 60.0)
        total = max(seen.values()) - signalled
        last_worker = max((seen[fd] for fd in fds[1:]), default=signalled) - signalled
        launcher.communicate()
        if launcher.returncode != 130:
            raise RuntimeError(f"{argv[:2]} exited with {launcher.returncode}, not 130")
        return ready, total, last_worker
    finally:
        for fd in fds:
            os.close(fd)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        if launcher.stdout is not None and not launcher.stdout.closed:
            launcher.communicate()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--markdown", action="store_true")
    add_smoke(parser, workers=2, reps=1)
    args = parser.parse_args()
    n = args.workers
    print_header("corral command benchmark", "cli.py", ("click", "anyio"))
    print(f"# the command measured: {' '.join(corral_argv())}")
    unignore_sigint()

    with tempfile.TemporaryDirectory() as tmp:
        scripts = {}
        for name, text in (("popen", POPEN_LAUNCHER), ("bare", BARE_LAUNCHER)):
            path = Path(tmp) / f"launch_{name}.py"
            path.write_text(text)
            scripts[name] = str(path)
        variants: dict[str, tuple[list[str], int]] = {
            "corral run": ([*corral_argv(), "run", "-n", str(n), "--", "sh", "-c", WORKER], n),
            "popen+killpg": ([sys.executable, scripts["popen"], str(n)], n),
            "bare python": ([sys.executable, scripts["bare"]], 0),
        }
        ready: dict[str, list[float]] = {key: [] for key in variants}
        total: dict[str, list[float]] = {key: [] for key in variants}
        last: dict[str, list[float]] = {key: [] for key in variants}
        keys = list(variants)
        for rep in range(args.reps):
            for key in keys if rep % 2 == 0 else keys[::-1]:  # ABBA
                argv, workers = variants[key]
                r, t, w = measure(argv, workers)
                ready[key].append(r)
                total[key].append(t)
                last[key].append(w)
            print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    med = {key: statistics.median(values) for key, values in total.items()}
    value, base = med["corral run"], med["popen+killpg"]
    met = value < TARGET
    header, *rows = [
        [
            "measure",
            "corral run (median)",
            "corral run (max)",
            "last worker exited",
            "popen+killpg baseline",
            "ratio",
            "bare python exit",
            "target",
            "met",
        ],
        [
            f"Ctrl-C to exit, {n} obedient `sh` workers (median of {args.reps})",
            _ms(value),
            _ms(max(total["corral run"])),
            _ms(statistics.median(last["corral run"])),
            _ms(base),
            f"{value / base:.2f}",
            _ms(med["bare python"]),
            f"< {_ms(TARGET)}",
            "yes" if met else "**NO**",
        ],
    ]
    print()
    print(f"## Ctrl-C to exit: SIGINT to the launcher's process group until it and its {n}")
    print("## workers have exited (corral and the baseline alternate in one run)")
    print()
    print(format_table(header, rows, args.markdown))
    print()
    print("start-up, launch until every worker is ready (medians; no target):")
    print()
    startup = [[key, _ms(statistics.median(values))] for key, values in ready.items()]
    print(format_table(["variant", "launch to ready"], startup, args.markdown))
    print()
    print("all samples, Ctrl-C to exit (ms):")
    for key, values in total.items():
        print(f"  {key:<14} " + " ".join(f"{v * 1000:.0f}" for v in values))
    print()
    print(f"- Ctrl-C to exit {_ms(value)} (target < {_ms(TARGET)}): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
