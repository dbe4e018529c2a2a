"""Four CPU-bound ranks: ``corral run -n 4`` against ``torchrun --nproc-per-node 4``.

Target (issue 18, the OMP case): ratio <= 1.1 of the median wall time per round.

Each rank multiplies two float32 matrices with ``torch.mm`` on the CPU, a
fixed number of times: the honest case, since torch's CPU matmul uses one
OpenMP thread per core unless ``OMP_NUM_THREADS`` says otherwise.  Neither
launcher is given ``OMP_NUM_THREADS`` (it is removed from the environment, as
for a user who never set it): torchrun sets it to 1 for its workers, and so
must corral, or four ranks with a thread per core each overload the machine
(the issue measured 6.6-9.0 s per round against 1.2-1.5 s).

A round is one whole run of the launcher, from its start to its exit, workers'
``import torch`` included; the rounds alternate the launchers (ABBA) and the
medians are reported, with each launcher's slowest rank's compute time (the
matmul loop alone, as the rank measures it) beside its wall time.

Usage::

    python bench/omp.py                 # 5 rounds each, 384x384, 100 products per rank
    python bench/omp.py --markdown      # the table in Markdown
    python bench/omp.py --smoke         # one tiny round each, 2 ranks: checks that it runs

Options: ``--rounds`` (5), ``--size`` (384), ``--iters`` (100), ``--ranks``
(4), ``--markdown``, ``--smoke``.  torchrun is run as ``python -m
torch.distributed.run`` (its entry point) with this interpreter.
Per-round figures go to stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_smoke, print_header, print_table  # bench/ is on sys.path when a script runs

RANK = """
import os, sys, time
import torch
n, iters = int(sys.argv[1]), int(sys.argv[2])
a, b = torch.randn(n, n), torch.randn(n, n)
start = time.perf_counter()
for _ in range(iters):
    c = torch.mm(a, b)
print(f"rank {os.environ['RANK']} compute {time.perf_counter() - start:.4f}", flush=True)
"""

COMPUTE = re.compile(r"rank (\d+) compute ([0-9.]+)")


def corral_argv(ranks: int) -> list[str]:
    script = Path(sys.executable).with_name("corral")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "corral._cli"]
    return [*base, "run", "-n", str(ranks), "--no-status", "--no-prefix", "--"]


def torchrun_argv(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]


def one_round(argv: list[str], ranks: int, env: dict[str, str]) -> tuple[float, float]:
    """Wall time of one run of the launcher, and its slowest rank's compute time."""
    start = time.perf_counter()
    out = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({out.returncode}):\n{out.stderr}")
    computes = [float(m[2]) for m in COMPUTE.finditer(out.stdout)]
    if len(computes) != ranks:
        raise SystemExit(f"expected {ranks} ranks' figures, got:\n{out.stdout}\n{out.stderr}")
    return wall, max(computes)


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--markdown", action="store_true")
    add_smoke(parser, rounds=1, size=32, iters=3, ranks=2)
    args = parser.parse_args()
    print_header("OMP_NUM_THREADS: 4 CPU-bound ranks", "omp.py", ["corral", "torch"])
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with tempfile.TemporaryDirectory() as folder:
        rank = Path(folder) / "rank.py"
        rank.write_text(RANK)
        tail = [sys.executable, str(rank), str(args.size), str(args.iters)]
        launchers = {
            "corral run": [*corral_argv(args.ranks), *tail],
            "torchrun": [*torchrun_argv(args.ranks), *tail[1:]],
        }
        walls: dict[str, list[float]] = {name: [] for name in launchers}
        computes: dict[str, list[float]] = {name: [] for name in launchers}
        names = list(launchers)
        for i in range(args.rounds):
            order = names if i % 2 == 0 else names[::-1]  # ABBA
            for name in order:
                wall, compute = one_round(launchers[name], args.ranks, env)
                walls[name].append(wall)
                computes[name].append(compute)
                print(f"round {i} {name}: {wall:.3f} s (compute {compute:.3f} s)", file=sys.stderr)
    median = {name: statistics.median(walls[name]) for name in names}
    ratio = median["corral run"] / median["torchrun"]
    rows = [
        [
            name,
            f"{median[name]:.3f} s",
            f"{statistics.median(computes[name]):.3f} s",
            f"{median[name] / median['torchrun']:.2f}",
        ]
        for name in names
    ]
    print(
        f"# {args.ranks} ranks, torch.mm {args.size}x{args.size} x {args.iters}, "
        f"median of {args.rounds} rounds; target: ratio <= 1.1"
    )
    print_table(
        ["launcher", "wall per round", "slowest rank's compute", "ratio"], rows, args.markdown
    )
    print(f"# ratio {ratio:.2f}: {'within' if ratio <= 1.1 else 'ABOVE'} the target")


if __name__ == "__main__":
    main()
