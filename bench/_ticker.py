"""The 1 ms ticker every benchmark uses to measure loop stalls."""

from __future__ import annotations

import time
from typing import Any


class Ticker:
    """A 1 ms ticker; ``worst`` is the largest gap between wake-ups minus 1 ms (seconds)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._skip = False

    def skip(self) -> None:
        """Do not count the gap that is open now (the benchmark blocked the loop itself)."""
        self._skip = True

    async def run(self, *, task_status: Any) -> None:
        import anyio

        last = time.perf_counter()
        task_status.started()
        while True:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gap = now - last - 0.001
            if self._skip:
                self._skip = False
            elif gap > self.worst:
                self.worst = gap
            last = now
