"""A launcher that floods a slow handler with 1 GiB of lines and reports what it cost.

``slow_handler_flood.py BACKEND``: runs ``lines.py`` (32,768 lines of 32 KiB, as fast as the
pipe takes them) into a handler that sleeps 0.2 ms every 8 records (a disk of about
250 MB/s), then prints ``RECORDS BYTES GROWTH``: the records and message bytes the handler
got, and how far the launcher's peak resident size rose above where it was (bytes).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import anyio

import corral

LINES, LENGTH = 32 * 1024, 32 * 1024


class Slow(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0
        self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.bytes += len(record.msg)
        if self.count % 8 == 0:
            time.sleep(0.0002)  # a slow disk: about 250 MB/s


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


async def main() -> None:
    handler = Slow()
    child = [sys.executable, str(Path(__file__).with_name("lines.py")), str(LINES), str(LENGTH)]
    async with corral.open_runner(console=False, handlers=[handler]) as r:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS
        before = rss("VmRSS")
        await r.run(child, name="flood")
        peak = rss("VmHWM")
    print(handler.count, handler.bytes, peak - before)


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1])
