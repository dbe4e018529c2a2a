"""What the log path's producers queue for the worker: :class:`Chunk` and its :class:`StreamState`.

Producers — the pipe readers (:mod:`corral._core._pipes`), the log server
(:mod:`corral._logs._server`), the hub's own records and what agents forward
(:mod:`corral._logs._hub`) — make these on the loop; the collector hands
them to the worker thread, where the router (:mod:`corral._logs._router`)
turns them into lines and records and hands back an :class:`Outcome`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ._sources import Source

if TYPE_CHECKING:
    from ._wire import FrameDecoder, Record

__all__ = ["FRAMES", "LINES", "RECORDS", "Chunk", "Delivery", "Outcome", "StreamState"]

LINES: Final = "lines"
FRAMES: Final = "frames"
RECORDS: Final = "records"


@dataclass(eq=False)
class StreamState:
    """One stream of one source as the worker side sees it: a pipe or a log connection.

    Created on the loop when the stream opens; from then on its mutable
    fields belong to the worker thread, except ``error``, which the loop
    reads to learn that a connection sent garbage.  (The collector reads
    and handles a batch on the loop only between two batches of the worker,
    when nothing runs there: see ``Router.is_silent``.)
    """

    source: Source
    kind: str  # LINES, FRAMES or RECORDS
    stream: str | None  # "stdout", "stderr", "logging" or None (the runner's own)
    level: int
    pid: int
    peer: str = ""  # for messages about a log connection
    pending: bytes = b""
    decoder: FrameDecoder | None = None
    delivered: int = 0
    error: str | None = None
    #: Called on the loop once ``error`` is set (the connection's reader hangs up).
    on_error: Callable[[], None] | None = None
    bar: bytes | None = None  # a progress bar's newest state
    bar_logged: bytes | None = None  # its state last logged to files and handlers
    bar_emitted: float = 0.0


@dataclass(eq=False, slots=True)
class Chunk:
    """One read from a stream (or a few records of the runner's own), for the worker."""

    state: StreamState
    data: bytes = b""
    created: float = 0.0
    final: bool = False
    records: list[logging.LogRecord] | None = None
    wire: list[Record] | None = None  # records already decoded (from an agent's link)

    @property
    def size(self) -> int:
        if self.records is not None:
            return sum(len(r.msg) for r in self.records) + 600 * len(self.records)
        if self.wire is not None:
            return sum(len(r.msg) for r in self.wire) + 200 * len(self.wire)
        return len(self.data) + 128


Delivery = tuple[Source, int, list[logging.LogRecord]]


@dataclass
class Outcome:
    """What the worker hands back to the loop after a batch."""

    deliveries: list[Delivery]
    failed: list[StreamState]
