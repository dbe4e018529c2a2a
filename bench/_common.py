"""What the benchmark scripts share: a header, ``--smoke``, workers per backend, a table, waits.

Every script in ``bench/`` (but the ``_*.py`` helpers) takes ``--smoke``: every size
at a tiny value, so that CI can check that the script still runs
(``tests/project/test_bench.py``).  A smoke run's figures mean nothing, and no timing target
ever decides a script's exit status; only a correctness check does (a line lost, a
record out of order).
"""

from __future__ import annotations

import argparse
import select
import sys
import time
from collections.abc import Sequence
from typing import Any


def add_smoke(parser: argparse.ArgumentParser, **tiny: Any) -> None:
    """Add ``--smoke``: the sizes in ``tiny`` (option destinations) become the defaults.

    Sizes given on the command line still win.  The workers a script starts with its
    own arguments (:func:`run_workers`) get ``--smoke`` too.
    """
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, figures meaningless: only checks that the script runs (for CI)",
    )
    if "--smoke" in sys.argv[1:]:
        parser.set_defaults(**tiny)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    """``rows`` under ``header``: a Markdown table, or columns padded with spaces."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> None:
    """Print :func:`format_table`."""
    print(format_table(header, rows, markdown))


def unignore_sigint() -> None:
    """Let the launchers this process starts get SIGINT, even if it came to us ignored.

    A process started by ``&`` in a non-interactive shell (or by ``nohup``) inherits
    SIGINT ignored, and hands it on so to every program it starts; corral, rightly,
    leaves an ignored signal alone, so a launcher started from such a shell would not
    stop on the SIGINT a benchmark sends it.  A handler of ours is reset to the default
    in every program this process execs.
    """
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_all(fds: list[int], timeout: float) -> dict[int, float]:
    """Block until every pidfd is readable (its process has exited); when each became so."""
    seen: dict[int, float] = {}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    remaining = set(fds)
    deadline = time.monotonic() + timeout
    while remaining:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(remaining)} processes still alive after {timeout} s")
        for fd, _ in poller.poll(left * 1000):
            seen[fd] = time.perf_counter()
            remaining.discard(fd)
            poller.unregister(fd)
    return seen


def print_header(title: str, script: str, packages: Sequence[str] = ()) -> None:
    """The lines that open a results table: when, where, with what, and the command."""
    import importlib.metadata
    import importlib.util
    import os

    spec = importlib.util.find_spec("corral")
    where = os.path.dirname(spec.origin) if spec and spec.origin else "?"
    versions = "".join(f", {name} {importlib.metadata.version(name)}" for name in packages)
    print(
        f"# {title}  ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}{versions})"
    )
    print(f"# command: python bench/{script} {' '.join(sys.argv[1:])}".rstrip())
    print(f"# corral measured: {where}")
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "--smoke" in sys.argv[1:]:
        print("# SMOKE RUN: tiny sizes; the figures below mean nothing")
    sys.stdout.flush()


def run_workers(script: str, backends: Sequence[str]) -> dict[str, Any]:
    """Run ``script --worker --backend B`` (with this run's arguments) in a fresh
    interpreter per backend; the JSON each prints last, by backend."""
    import json
    import subprocess

    results: dict[str, Any] = {}
    for backend in backends:
        cmd = [sys.executable, script, *sys.argv[1:], "--worker", "--backend", backend]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        results[backend] = json.loads(done.stdout.strip().splitlines()[-1])
    return results
