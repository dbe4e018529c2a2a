"""What the benchmark scripts share: a header, workers per backend, a table, waiting on exits."""

from __future__ import annotations

import select
import time
from collections.abc import Sequence
from typing import Any


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> None:
    """``rows`` under ``header``: a Markdown table, or columns padded with spaces."""
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


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


def print_header(title: str, script: str, packages: Sequence[str]) -> None:
    """The lines that open a results table: when, where, with what, and the command."""
    import importlib.metadata
    import importlib.util
    import os
    import sys

    spec = importlib.util.find_spec("corral")
    where = os.path.dirname(spec.origin) if spec and spec.origin else "?"
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in packages)
    print(
        f"# {title}  ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {versions})"
    )
    print(f"# command: python bench/{script} {' '.join(sys.argv[1:])}".rstrip())
    print(f"# corral measured: {where}")
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.stdout.flush()


def run_workers(script: str, backends: Sequence[str]) -> dict[str, Any]:
    """Run ``script --worker --backend B`` (with this run's arguments) in a fresh
    interpreter per backend; the JSON each prints last, by backend."""
    import json
    import subprocess
    import sys

    results: dict[str, Any] = {}
    for backend in backends:
        cmd = [sys.executable, script, *sys.argv[1:], "--worker", "--backend", backend]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        results[backend] = json.loads(done.stdout.strip().splitlines()[-1])
    return results
