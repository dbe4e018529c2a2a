"""The console of ``corral run`` and ``corral up``: ranks in the prefix, and a quiet Ctrl-C.

Python prints a ``KeyboardInterrupt`` traceback in every worker that Ctrl-C
reaches: four workers, four copies of the same lines (each prefixed with
``[rankN]:`` once torch's process group is initialised).  After Ctrl-C the
command's console keeps those tracebacks to itself (they still reach the log
files, the monitor and every other handler) and says once, at the end, how
many it did not show.

torchrun's ``--redirects`` keeps some streams of some local ranks off the
console (:func:`redirected`); they still go to the log files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, TextIO

from .._logs._console import ConsoleHandler

if TYPE_CHECKING:
    from .._logs._sources import Source

__all__ = ["HELD_BYTES", "CommandConsole", "rank_label", "redirected"]

#: The most bytes of a traceback the console holds back for one source while
#: it finds out whether it is a KeyboardInterrupt's; a longer one is shown.
HELD_BYTES = 64 * 1024

_TRACEBACK = b"Traceback (most recent call last):"
_WORKER = re.compile(r"agent-([0-9]+)\.worker-([0-9]+)")
#: What torch puts before each line of a traceback once a process group is initialised.
_RANK_PREFIX = re.compile(rb"\[rank[0-9]+\]: ?")


def rank_label(
    per_host: int, ranks: Collection[int] | None, local_ranks: Collection[int] | None
) -> Callable[[str], str | None]:
    """The console's label of each source: ``[2] agent-1.worker-0`` for global rank 2.

    ``per_host`` is the number of workers on each host (the same on every
    host, as ``corral run`` starts them), so agent ``i``'s worker ``j`` is
    global rank ``i * per_host + j``.  A worker whose global rank is not in
    ``ranks``, or whose local rank is not in ``local_ranks``, is not shown
    (``None``); sources that are not workers (the run, an agent) always are.
    """

    def label(source: str) -> str | None:
        match = _WORKER.fullmatch(source)
        if match is None:
            return source
        local = int(match[2])
        rank = int(match[1]) * per_host + local
        if ranks is not None and rank not in ranks:
            return None
        if local_ranks is not None and local not in local_ranks:
            return None
        return f"[{rank}] {source}"

    return label


def redirected(streams: Mapping[int | None, frozenset[str]]) -> Callable[[str, str], bool]:
    """Whether a line of a source on a stream is kept off the console (torchrun's ``-r``).

    ``streams`` maps a local rank (``None``: every one) to the streams
    (``"stdout"``, ``"stderr"``) of its workers that go to the files alone.
    """

    def quiet(source: str, stream: str) -> bool:
        match = _WORKER.search(source)
        if match is None:
            return False
        chosen = streams.get(int(match[2]), streams.get(None, frozenset()))
        return stream in chosen

    return quiet


class CommandConsole(ConsoleHandler):
    """The :class:`ConsoleHandler` of the command, which hides tracebacks of Ctrl-C.

    ``interrupted()`` tells whether Ctrl-C has reached the run: from then on
    a traceback a source writes to stderr is held back until its last line,
    and dropped if that says ``KeyboardInterrupt`` (:attr:`hidden` counts
    them); any other traceback is shown whole.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        colour: bool | None,
        prefix: str,
        label: Callable[[str], str | None] | None,
        raw: bool = False,
        errors: TextIO | None = None,
        quiet: Callable[[str, str], bool] | None = None,
    ) -> None:
        super().__init__(stream, colour=colour, prefix=prefix, label=label, raw=raw, errors=errors)
        self.interrupted: Callable[[], bool] = lambda: False
        self._quiet = quiet
        #: The KeyboardInterrupt tracebacks not shown.
        self.hidden = 0
        self._held: dict[str, tuple[Source, float, list[bytes], int]] = {}

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        if self._quiet is not None and self._quiet(source.name, stream):
            return
        if stream != "stderr" or (source.name not in self._held and not self.interrupted()):
            super().write_lines(source, stream, level, created, text)
            return
        shown: list[bytes] = []
        for line in text.split(b"\n"):
            held = self._held.get(source.name)
            rank = _RANK_PREFIX.match(line)
            bare = line[rank.end() :] if rank is not None else line
            if held is None:
                if bare == _TRACEBACK:
                    self._held[source.name] = (source, created, [line], len(line))
                else:
                    shown.append(line)
                continue
            _, first, lines, size = held
            lines.append(line)
            size += len(line) + 1
            if bare[:1] in (b" ", b"\t"):  # a frame of the traceback
                if size > HELD_BYTES:
                    del self._held[source.name]
                    shown.extend(lines)
                else:
                    self._held[source.name] = (source, first, lines, size)
                continue
            del self._held[source.name]  # the traceback's last line
            if bare == b"KeyboardInterrupt" or bare.startswith(b"KeyboardInterrupt:"):
                self.hidden += 1
            else:
                shown.extend(lines)
        if shown:
            super().write_lines(source, stream, level, created, b"\n".join(shown))

    def write_progress(self, source: Source, stream: str | None, frame: bytes | None) -> None:
        if self._quiet is not None and stream is not None and self._quiet(source.name, stream):
            return
        super().write_progress(source, stream, frame)

    def close(self) -> None:
        held, self._held = self._held, {}
        for source, created, lines, _ in held.values():
            super().write_lines(source, "stderr", 0, created, b"\n".join(lines))
        super().close()
