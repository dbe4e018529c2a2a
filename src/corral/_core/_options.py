"""The options of a start: what :meth:`Runner.start` and :meth:`Runner.run` take."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import IO, Any, Literal

from .._checks import check_grace
from ._stdio import LogOption

__all__ = ["MAX_BACKOFF", "Input", "Output", "Restart", "RestartPolicy", "StrOrPath"]

StrOrPath = str | os.PathLike[str]
Output = LogOption | int | IO[Any] | None
Input = int | IO[Any] | None

Restart = Literal["never", "on-failure", "always"]

#: A restart policy's delay never grows beyond this many seconds.
MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class RestartPolicy:
    """When a child is started again after it exited (``restart=`` of :meth:`Runner.start`)."""

    restart: Restart = "never"
    max_restarts: int = 3
    backoff: float = 1.0

    @classmethod
    def make(cls, restart: object, max_restarts: object, backoff: object) -> RestartPolicy:
        if restart not in ("never", "on-failure", "always"):
            raise ValueError(f"restart={restart!r}: expected 'never', 'on-failure' or 'always'")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, not {max_restarts!r}")
        policy: Restart = restart
        return cls(policy, max_restarts, check_grace(backoff, "backoff"))

    def delay(self, attempt: int) -> float:
        """Seconds before restart number ``attempt`` (1-based): exponential, with jitter."""
        base = self.backoff * 2.0 ** (attempt - 1)
        return min(base * random.uniform(0.8, 1.2), MAX_BACKOFF)
