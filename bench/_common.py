"""What the benchmark scripts share: printing a table, waiting for processes to exit."""

from __future__ import annotations

import select
import time
from collections.abc import Sequence


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
