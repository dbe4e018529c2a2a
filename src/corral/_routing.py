"""Routing what children say to files, the console and :class:`logging.Handler` objects.

This is the worker side of the log path.  The event loop only reads bytes
(see :mod:`corral._streams` and :mod:`corral._logserver`) and queues them, a
whole read at a time; the collector hands every batch of reads to one worker
thread, which calls :meth:`Router.process`.  So the loop's work is
proportional to the number of *reads*, and everything proportional to the
number of *lines* happens here, off the loop.

For the destinations corral provides itself — the per-source and combined
files of ``log_dir`` (:class:`LogFiles`) and the console
(:class:`ConsoleHandler`) — a block of lines is written with a handful of
byte operations for the whole block: the lines are checked to be UTF-8 once,
a prefix (time stamp, level, source) is computed once, and
``prefix + block.replace(b"\\n", b"\\n" + prefix)`` makes the text of every
line in one C-level call.  :class:`logging.LogRecord` objects are built only
for destinations that need them: your own handlers, ``propagate=True``, live
tails, and the short backlog that tails start from (kept as raw lines).

Each record has a *source*: ``<runner>.<process>`` for a child,
``<runner>`` for the runner's own lifecycle records.  A :class:`Route`
limits a handler to some sources and a level; the router works out once per
source and level which destinations want a block, and caches it.

**Progress bars.**  Children often redraw a line with carriage returns
(tqdm does).  A ``\\r``-updated line never grows into one huge record: only
its newest state is kept.  On a terminal the console shows the bar updating
in place under its source prefix; files, handlers and tails get its state at
most once a second, and its last state when the line ends.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import math
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Final, TextIO

from ._records import make_record
from ._sources import BACKLOG_RECORDS, Backlogs, Source, line_block, record_block, wire_block
from ._wire import FrameDecoder, Hello, Record, WireError

__all__ = [
    "Chunk",
    "ConsoleHandler",
    "LogFiles",
    "Route",
    "Router",
    "StreamState",
    "source_of",
]

#: A "line" longer than this is cut and delivered in pieces.
MAX_LINE: Final = 1024 * 1024
#: The unfinished lines of all streams together are at most this long: beyond,
#: the one that grows is delivered as a piece (if it is :data:`MIN_PIECE` or more).
MAX_PENDING: Final = 8 * 1024 * 1024
MIN_PIECE: Final = 64 * 1024
#: The worker lets go of the GIL at least this often (seconds) during a batch.
_GIL_SLICE: Final = 0.001
#: Files, handlers and tails get a progress bar's state at most this often.
PROGRESS_INTERVAL: Final = 1.0

LINES: Final = "lines"
FRAMES: Final = "frames"
RECORDS: Final = "records"


def source_of(record: logging.LogRecord) -> str:
    """The source a record came from (its logger name when it has none)."""
    source = getattr(record, "corral_source", None)
    return source if isinstance(source, str) else record.name


@dataclass(frozen=True)
class Route:
    """Send the records of some sources to a :class:`logging.Handler`.

    ``pattern`` is a shell-style glob matched against the source *within
    the runner*: the process name (``"web"``, ``"train-*"``) or, for workers
    of a launch, ``"agent-<i>.worker-<j>"`` (``"agent-*.worker-0"``).  The
    runner's own lifecycle records have the empty name, which only ``"*"``
    matches.  ``level`` overrides the handler's own level; with neither set,
    the handler gets every record (the root logger's level does not apply:
    it governs only ``propagate=True``).
    """

    handler: logging.Handler
    pattern: str = "*"
    level: int | None = None


@dataclass(eq=False)
class StreamState:
    """One stream of one source as the worker side sees it: a pipe or a log connection.

    Created on the loop when the stream opens; from then on its mutable
    fields belong to the worker thread, except ``error``, which the loop
    reads to learn that a connection sent garbage.
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


class _Targets:
    """The destinations of one (source, level): block sinks and record handlers."""

    __slots__ = ("handlers", "live", "needs_records", "propagate", "sinks")

    def __init__(
        self,
        sinks: list[_BlockSink],
        handlers: list[logging.Handler],
        propagate: logging.Logger | None,
    ) -> None:
        self.sinks = sinks
        self.handlers = handlers
        self.propagate = propagate
        self.live = [s for s in sinks if s.live_progress]
        self.needs_records = bool(handlers) or propagate is not None


class Router:
    """Turns chunks into lines, files and records (on the collector's worker thread)."""

    def __init__(
        self,
        runner_name: str,
        routes: Sequence[Route],
        *,
        propagate: bool = False,
        warn: Callable[[str], None] | None = None,
        backlogs: Backlogs | None = None,
    ) -> None:
        self._runner_name = runner_name
        self._routes = [(route, _route_level(route)) for route in routes]
        self._propagate = propagate
        self._cache: dict[tuple[Source, int], _Targets] = {}
        self._runner_source = Source(runner_name, "", backlogs)
        self._warn_hook = warn
        self._broken: set[int] = set()
        self._pending = 0  # bytes of the unfinished lines of every stream
        #: Chunks handled so far (read by the collector's stall watchdog).
        self.chunks_done = 0

    @property
    def runner_source(self) -> Source:
        return self._runner_source

    @property
    def handlers(self) -> list[logging.Handler]:
        return [route.handler for route, _ in self._routes]

    def wants(self, level: int) -> bool:
        """Whether any destination takes records of ``level`` (tails aside)."""
        if self._propagate:
            return True
        return any(level >= min_level for _, min_level in self._routes)

    def _targets(self, source: Source, level: int) -> _Targets:
        key = (source, level)
        targets = self._cache.get(key)
        if targets is None:
            sinks: list[_BlockSink] = []
            handlers: list[logging.Handler] = []
            for route, min_level in self._routes:
                if level < min_level:
                    continue
                if route.pattern != "*" and not fnmatch.fnmatchcase(source.relative, route.pattern):
                    continue
                handler = route.handler
                if isinstance(handler, _BlockSink) and handler.fast:
                    sinks.append(handler)
                else:
                    handlers.append(handler)
            logger = logging.getLogger(source.name) if self._propagate else None
            targets = _Targets(sinks, handlers, logger)
            if len(self._cache) < 65536:
                self._cache[key] = targets
        return targets

    # -- the worker's job ----------------------------------------------------------------

    def process(self, batch: Sequence[Chunk]) -> Outcome:
        """Handle a batch of chunks in order; return what the loop must do next.

        That is: the records live tails should get, and the connections that
        sent garbage (their readers must hang up).
        """
        deliveries: list[Delivery] = []
        failed: list[StreamState] = []
        touched: set[_BlockSink] = set()
        held_since = time.perf_counter()
        for chunk in batch:
            kind = chunk.state.kind
            if kind == LINES:
                self._lines(chunk, deliveries, touched)
            elif kind == FRAMES and chunk.wire is not None:
                self._wire(chunk.state, chunk.wire, deliveries, touched)
            elif kind == FRAMES:
                had_error = chunk.state.error is not None
                self._frames(chunk, deliveries, touched)
                if not had_error and chunk.state.error is not None:
                    failed.append(chunk.state)
            else:
                assert chunk.records is not None
                self._records(chunk.state.source, chunk.records, deliveries, touched)
            self.chunks_done += 1
            now = time.perf_counter()
            if now - held_since > _GIL_SLICE:
                # Let the event loop's thread have the GIL: without this it would
                # wait up to the interpreter's switch interval (5 ms) at a time.
                time.sleep(0)
                held_since = time.perf_counter()
        for sink in touched:
            self._guard(sink, sink.flush_block)
        for route, _ in self._routes:
            if not isinstance(route.handler, _BlockSink):
                self._guard(route.handler, route.handler.flush)
        return Outcome(deliveries, failed)

    def _guard(self, handler: logging.Handler, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:
            self._report(handler)

    def _report(self, handler: logging.Handler) -> None:
        """A destination raised: say so once (on stderr, as logging does), and carry on.

        One broken destination must not cost the others their records.
        """
        if id(handler) not in self._broken:
            self._broken.add(id(handler))
            import traceback

            sys.stderr.write(f"corral: log destination {handler!r} failed:\n")
            traceback.print_exc(file=sys.stderr)

    # -- stdout and stderr ---------------------------------------------------------------

    def _lines(self, chunk: Chunk, deliveries: list[Delivery], touched: set[_BlockSink]) -> None:
        state = chunk.state
        self._pending -= len(state.pending)
        try:
            self._split_lines(chunk, deliveries, touched)
        finally:
            self._pending += len(state.pending)

    def _split_lines(
        self, chunk: Chunk, deliveries: list[Delivery], touched: set[_BlockSink]
    ) -> None:
        state = chunk.state
        data = state.pending + chunk.data if state.pending else chunk.data
        if chunk.final:
            if data.endswith(b"\n"):
                data = data[:-1]
            state.pending = b""
            complete = data if data else None
        else:
            cut = data.rfind(b"\n")
            if cut < 0:
                complete = None
                state.pending = data
            else:
                complete = data[:cut]
                state.pending = data[cut + 1 :]
                if len(complete) > MAX_LINE and b"\r" not in complete[:MAX_LINE]:
                    # Its first line (the unfinished one, ended now) may be longer.
                    end = complete.find(b"\n")
                    if end < 0 or end > MAX_LINE:
                        complete = complete[:MAX_LINE] + b"\n" + complete[MAX_LINE:]
            size = len(state.pending)
            if (
                size > MAX_LINE or (size >= MIN_PIECE and self._pending + size > MAX_PENDING)
            ) and b"\r" not in state.pending:
                piece, state.pending = state.pending[:MAX_LINE], state.pending[MAX_LINE:]
                complete = piece if complete is None else complete + b"\n" + piece
        if complete is not None:
            if b"\r" in complete:
                complete = _visible_lines(complete)
            if state.bar is not None:
                # The bar's line has ended: take the bar down first, and do not
                # log its last state twice if it was logged already.
                logged = state.bar_logged
                self._end_bar(state)
                first, newline, rest = complete.partition(b"\n")
                if first == logged:
                    complete = rest if newline else None
            if complete is not None:
                self._emit_lines(state, complete, chunk.created, deliveries, touched)
        pending = state.pending
        # A bar is a line redrawn after a carriage return; a lone trailing "\r"
        # may be the first half of a "\r\n" split between two reads.
        if pending and b"\r" in (pending[:-1] if pending.endswith(b"\r") else pending):
            state.pending = _newest_frame(pending)
            self._progress(state, chunk.created, deliveries, touched)

    def _emit_lines(
        self,
        state: StreamState,
        text: bytes,
        created: float,
        deliveries: list[Delivery],
        touched: set[_BlockSink],
        *,
        live: bool = True,
    ) -> None:
        source, level = state.source, state.level
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            text = text.decode("utf-8", "replace").encode("utf-8")
        count = text.count(b"\n") + 1
        first = source.number(count)
        targets = self._targets(source, level)
        stream = state.stream or "stdout"
        for sink in targets.sinks:
            if live or not sink.live_progress:
                try:
                    sink.write_lines(source, stream, level, created, text)
                except Exception:
                    self._report(sink)
                touched.add(sink)
        want_tails = source.tail_count > 0
        records: list[logging.LogRecord] | None = None
        if targets.needs_records or want_tails:
            name = source.name
            records = [
                make_record(name, level, line, created=created, stream=stream, pid=state.pid)
                for line in text.decode("utf-8").split("\n")
            ]
            self._hand_to_handlers(targets, records)
            if want_tails:
                deliveries.append((source, first, records))
        parts = text.rsplit(b"\n", BACKLOG_RECORDS)
        if len(parts) > BACKLOG_RECORDS:
            parts = parts[1:]
        block = line_block(source.name, created, level, stream, state.pid, parts)
        source.remember(first + count - len(parts), block)

    def _hand_to_handlers(self, targets: _Targets, records: list[logging.LogRecord]) -> None:
        for handler in targets.handlers:
            for record in records:
                try:
                    handler.handle(record)
                except Exception:
                    handler.handleError(record)
        logger = targets.propagate
        # Asked each time: the application may change its loggers' levels.
        if logger is not None and records and logger.isEnabledFor(records[0].levelno):
            for record in records:
                logger.handle(record)

    def _progress(
        self,
        state: StreamState,
        created: float,
        deliveries: list[Delivery],
        touched: set[_BlockSink],
    ) -> None:
        frame = _visible(state.pending)
        if frame == state.bar:
            return
        state.bar = frame
        targets = self._targets(state.source, state.level)
        stream = state.stream or "stdout"
        for sink in targets.live:
            try:
                sink.write_progress(state.source, stream, frame)
            except Exception:
                self._report(sink)
            touched.add(sink)
        if created - state.bar_emitted >= PROGRESS_INTERVAL:
            state.bar_emitted = created
            if frame:
                state.bar_logged = frame
                self._emit_lines(state, frame, created, deliveries, touched, live=False)

    def _end_bar(self, state: StreamState) -> None:
        targets = self._targets(state.source, state.level)
        for sink in targets.live:
            try:
                sink.write_progress(state.source, state.stream, None)
            except Exception:
                self._report(sink)
        state.bar = None
        state.bar_logged = None
        state.bar_emitted = 0.0

    # -- logging records -----------------------------------------------------------------

    def _frames(self, chunk: Chunk, deliveries: list[Delivery], touched: set[_BlockSink]) -> None:
        state = chunk.state
        decoder = state.decoder
        assert decoder is not None
        if state.error is not None:
            return  # the connection is being closed: ignore what was already read
        messages: list[Hello | Record]
        error: str | None = None
        try:
            if chunk.final:
                decoder.eof()
                messages = []
            else:
                messages = decoder.feed(chunk.data)
        except WireError as exc:
            messages, error = exc.messages, exc.reason
        wire: list[Record] = []
        for message in messages:
            if type(message) is not Record:
                error = "a second hello on the same connection"
                break
            wire.append(message)
        if wire:
            state.delivered += len(wire)
            self._wire(state, wire, deliveries, touched)
        if error is not None:
            state.error = error
            self.warn(
                f"log connection from {state.peer}: {error}; "
                f"closing it after {state.delivered} records"
            )

    def _wire(
        self,
        state: StreamState,
        wire: list[Record],
        deliveries: list[Delivery],
        touched: set[_BlockSink],
    ) -> None:
        """Records from a child's log connection: formatted straight from the wire."""
        source = state.source
        first = source.number(len(wire))
        batches: dict[_BlockSink, list[Record]] = {}
        wanted: list[tuple[Record, _Targets]] = []
        last_level = None
        targets = None
        for rec in wire:
            if rec.level != last_level:
                last_level = rec.level
                targets = self._targets(source, rec.level)
            assert targets is not None
            for sink in targets.sinks:
                batch = batches.get(sink)
                if batch is None:
                    batch = batches[sink] = []
                batch.append(rec)
            if targets.needs_records:
                wanted.append((rec, targets))
        for sink, batch in batches.items():
            try:
                sink.write_wire(source, batch)
            except Exception:
                self._report(sink)
            touched.add(sink)
        make = functools.partial(_from_wire, state=state)
        if source.tail_count > 0:
            records = [make(rec) for rec in wire]
            deliveries.append((source, first, records))
            if wanted:
                by_id = {id(rec): record for rec, record in zip(wire, records, strict=True)}
                for rec, targets in wanted:
                    self._hand_to_handlers(targets, [by_id[id(rec)]])
        else:
            for rec, targets in wanted:
                self._hand_to_handlers(targets, [make(rec)])
        source.remember(first, wire_block(wire, make))

    def _records(
        self,
        source: Source,
        records: list[logging.LogRecord],
        deliveries: list[Delivery],
        touched: set[_BlockSink],
    ) -> None:
        first = source.number(len(records))
        for record in records:
            targets = self._targets(source, record.levelno)
            for sink in targets.sinks:
                sink.handle(record)  # emit() reports its own errors (handleError)
                touched.add(sink)
            if targets.needs_records:
                self._hand_to_handlers(targets, [record])
        if source.tail_count > 0:
            deliveries.append((source, first, records))
        source.remember(first, record_block(records))

    def warn(self, message: str) -> None:
        """A WARNING of the runner's own, from the worker side (routed at once)."""
        record = make_record(self._runner_name, logging.WARNING, message)
        self._records(self._runner_source, [record], [], set())
        if self._warn_hook is not None:
            self._warn_hook(message)

    # -- closing ------------------------------------------------------------------------

    def close(self, owned: Sequence[logging.Handler]) -> None:
        """Flush every handler; close only ``owned`` ones (those the runner made).

        Handlers the application passed in stay open: it may use them again.
        """
        for route, _ in self._routes:
            self._guard(route.handler, route.handler.flush)
        for handler in owned:
            self._guard(handler, handler.close)


def _route_level(route: Route) -> int:
    if route.level is not None:
        return route.level
    return route.handler.level  # NOTSET (0): every record


def _visible(line: bytes) -> bytes:
    """What a terminal shows of a line redrawn with carriage returns: its newest frame."""
    if line.endswith(b"\r"):
        line = line[:-1]
    cut = line.rfind(b"\r")
    return line[cut + 1 :] if cut >= 0 else line


def _visible_lines(text: bytes) -> bytes:
    return b"\n".join(_visible(line) if b"\r" in line else line for line in text.split(b"\n"))


def _newest_frame(pending: bytes) -> bytes:
    """Drop the frames of an unfinished line that a newer frame replaced."""
    end = len(pending) - 1 if pending.endswith(b"\r") else len(pending)
    cut = pending.rfind(b"\r", 0, end)
    return pending[cut:] if cut > 0 else pending


_MAX_ABS_CREATED: Final = 1e11  # about the year 5138: further is nonsense


def _believable(created: float) -> float:
    """A sender's time stamp, or the arrival time if it is nonsense."""
    if math.isfinite(created) and abs(created) < _MAX_ABS_CREATED:
        return created
    return time.time()


def _wire_message(rec: Record) -> str:
    """The text of a record from the wire, as the files and the console show it."""
    message = f"{rec.name}: {rec.msg}" if rec.name else rec.msg
    if rec.exc_text:
        message = f"{message}\n{rec.exc_text}"
    if rec.stack_info:
        message = f"{message}\n{rec.stack_info}"
    return message


_PATH_NAMES: dict[str, tuple[str, str]] = {}


def _path_names(pathname: str) -> tuple[str, str]:
    names = _PATH_NAMES.get(pathname)
    if names is None:
        filename = os.path.basename(pathname)
        names = (filename, os.path.splitext(filename)[0])
        if len(_PATH_NAMES) < 1024:
            _PATH_NAMES[pathname] = names
    return names


def _from_wire(rec: Record, state: StreamState) -> logging.LogRecord:
    created = _believable(rec.created)
    record = make_record(
        rec.name or state.source.name,  # "": a runner's own record (an agent's)
        rec.level,
        rec.msg,
        created=created,
        source=state.source.name,
        stream="logging",
        pid=rec.pid or state.pid,
        levelname=rec.levelname,
    )
    fields = record.__dict__
    fields["msecs"] = math.floor((created - math.floor(created)) * 1000)
    fields["pathname"] = rec.pathname
    fields["filename"], fields["module"] = _path_names(rec.pathname)
    fields["exc_text"] = rec.exc_text
    fields["stack_info"] = rec.stack_info
    fields["lineno"] = rec.lineno
    fields["funcName"] = rec.func_name or None
    fields["threadName"] = rec.thread_name
    fields["processName"] = rec.process_name
    return record


# -- destinations ---------------------------------------------------------------------------


def _format_message(record: logging.LogRecord) -> str:
    message = record.getMessage()
    if getattr(record, "corral_stream", None) == "logging":
        message = f"{record.name}: {message}"
    if record.exc_text:
        message = f"{message}\n{record.exc_text}"
    elif record.exc_info:
        message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
    if record.stack_info:
        message = f"{message}\n{record.stack_info}"
    return message


class _Stamps:
    """Time stamps by the second, cached: ``strftime`` per line would cost ~2 µs."""

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._second = -1
        self._text = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._text = time.strftime(self._fmt, time.localtime(created))
            self._second = second
        return self._text


class _BlockSink(logging.Handler):
    """A destination that can write a whole block of lines at once (corral's own)."""

    #: Whether it draws progress bars live (a console on a terminal).
    live_progress = False

    @property
    def fast(self) -> bool:
        """Whether the block path applies (not when a subclass or filters change records)."""
        return not self.filters and self._plain()

    def _plain(self) -> bool:
        return True

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        raise NotImplementedError

    def write_progress(self, source: Source, stream: str | None, frame: bytes | None) -> None:
        """Draw (``frame``) or end (``None``) a live progress bar of ``source``."""

    def write_wire(self, source: Source, records: list[Record]) -> None:
        """Write records from a child's log connection (all of this sink's level)."""
        raise NotImplementedError

    def flush_block(self) -> None:
        self.flush()


class LogFiles(_BlockSink):
    """One file per source plus ``combined.log``, in one folder.

    Files are named after the full source (``corral.web.log``; the runner's
    own records go to ``corral.log``) and opened on their first record.  At
    most ``max_open`` files are open at once; the least recently written is
    closed (and reopened for appending when needed), so a thousand sources
    cost no more than ``max_open`` descriptors.  A source whose name cannot
    be a file name (too long, say) still reaches ``combined.log``.  Lines
    look like::

        2026-11-30 10:33:01.123 INFO     [stdout] listening on port 8080

    and, in ``combined.log``, carry the source::

        2026-11-30 10:33:01.123 INFO     corral.web [stdout] listening on port 8080
    """

    def __init__(self, folder: str | os.PathLike[str], *, max_open: int = 64) -> None:
        super().__init__(logging.DEBUG)
        self.folder = os.fspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self._max_open = max_open
        self._files: OrderedDict[str, IO[bytes] | None] = OrderedDict()
        self._combined = open(  # noqa: SIM115 - closed in close()
            os.path.join(self.folder, "combined.log"), "ab", buffering=1 << 16
        )
        self._stamps = _Stamps("%Y-%m-%d %H:%M:%S")
        self._prefixes: dict[tuple[str, int, str, int], tuple[bytes, bytes]] = {}
        self._write_lock = threading.Lock()

    def _file_for(self, source: str) -> IO[bytes] | None:
        if source in self._files:
            self._files.move_to_end(source)
            return self._files[source]
        if len(self._files) >= self._max_open:
            for name, oldest in list(self._files.items()):
                if oldest is not None:
                    oldest.close()
                    del self._files[name]
                    break
            else:
                self._files.popitem(last=False)
        safe = source.replace(os.sep, "_").replace("\0", "_") + ".log"
        try:
            file: IO[bytes] | None = open(  # noqa: SIM115 - closed in close()
                os.path.join(self.folder, safe), "ab", buffering=1 << 16
            )
        except OSError as exc:
            # Not a possible file name (too long, say): combined.log only.
            self._combined.write(
                f"{self._stamps(time.time())}.000 WARNING  corral [log files] records of "
                f"source {source[:200]!r} go to combined.log only: {exc.strerror}\n".encode()
            )
            file = None
        self._files[source] = file
        return file

    def _prefix(self, source: str, level: int, stream: str, created: float) -> tuple[bytes, bytes]:
        millis = int((created - int(created)) * 1000)
        key = (source, level, stream, int(created) * 1000 + millis)
        cached = self._prefixes.get(key)
        if cached is None:
            head = f"{self._stamps(created)}.{millis:03d} {logging.getLevelName(level):<8} "
            cached = (f"{head}[{stream}] ".encode(), f"{head}{source} [{stream}] ".encode())
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            self._prefixes[key] = cached
        return cached

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        own, combined = self._prefix(source.name, level, stream, created)
        with self._write_lock:
            file = self._file_for(source.name)
            if file is not None:
                file.write(own + text.replace(b"\n", b"\n" + own) + b"\n")
            self._combined.write(combined + text.replace(b"\n", b"\n" + combined) + b"\n")

    def write_wire(self, source: Source, records: list[Record]) -> None:
        name = source.name
        stamps = self._stamps
        own: list[str] = []
        combined: list[str] = []
        for rec in records:
            created = _believable(rec.created)
            millis = math.floor((created - math.floor(created)) * 1000)
            head = f"{stamps(created)}.{millis:03d} {rec.levelname:<8} "
            message = _wire_message(rec)
            own.append(f"{head}{message}\n")
            combined.append(f"{head}{name} {message}\n")
        with self._write_lock:
            file = self._file_for(name)
            if file is not None:
                file.write("".join(own).encode("utf-8", "backslashreplace"))
            self._combined.write("".join(combined).encode("utf-8", "backslashreplace"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            source = source_of(record)
            stream = getattr(record, "corral_stream", None)
            head = f"{self._stamps(record.created)}.{int(record.msecs):03d} {record.levelname:<8} "
            tail = f"[{stream}] " if stream in ("stdout", "stderr") else ""
            message = _format_message(record)
            with self._write_lock:
                file = self._file_for(source)
                if file is not None:
                    file.write(f"{head}{tail}{message}\n".encode("utf-8", "backslashreplace"))
                self._combined.write(
                    f"{head}{source} {tail}{message}\n".encode("utf-8", "backslashreplace")
                )
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self._write_lock:
            for file in self._files.values():
                if file is not None:
                    file.flush()
            self._combined.flush()

    def close(self) -> None:
        with self._write_lock:
            for file in self._files.values():
                if file is not None:
                    file.close()
            self._files.clear()
            self._combined.close()
        super().close()


class ConsoleHandler(_BlockSink, logging.StreamHandler):  # type: ignore[type-arg]
    """Writes ``HH:MM:SS source | message`` lines, with a coloured prefix on a terminal.

    Colour is used only when the stream is a terminal and ``NO_COLOR`` is not
    set, so files and pipes get plain text.  On a terminal, a child's
    progress bar (a line redrawn with carriage returns) is drawn in place
    under its prefix, below the scrolling lines.

    ``prefix`` chooses the prefix: ``"source"`` (the default: time and full
    source), ``"relative"`` (time and the source within the runner, as the
    ``corral`` command shows it) or ``"none"`` (the bare lines).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        colour: bool | None = None,
        prefix: str = "source",
    ) -> None:
        logging.StreamHandler.__init__(self, stream if stream is not None else sys.stderr)
        if prefix not in ("source", "relative", "none"):
            raise ValueError(f"prefix must be 'source', 'relative' or 'none', not {prefix!r}")
        self.prefix = prefix
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())
        if colour is None:
            colour = self.terminal and "NO_COLOR" not in os.environ
        self.colour = colour
        self.live_progress = self.terminal
        self._footer: list[bytes] = []
        self._stamps = _Stamps("%H:%M:%S")
        self._styles: _Styles | None = _Styles() if colour else None
        self._prefixes: dict[tuple[str, int], tuple[bytes, bytes]] = {}
        self._bars: OrderedDict[tuple[str, str | None], bytes] = OrderedDict()
        self._drawn = 0
        self._write_lock = threading.Lock()

    def _plain(self) -> bool:
        cls = type(self)
        return cls.emit is ConsoleHandler.emit and cls.format is ConsoleHandler.format

    # -- text --------------------------------------------------------------------------

    def _shown(self, source: str) -> str:
        if self.prefix == "relative":
            _, dot, rest = source.partition(".")
            return rest if dot else source
        return source

    def _source_prefix(self, source: str, created: float) -> tuple[bytes, bytes]:
        second = int(created)
        key = (source, second)
        cached = self._prefixes.get(key)
        if cached is None:
            stamp = self._stamps(created)
            source = self._shown(source)
            if self.prefix == "none":
                text = bare = ""
            elif self._styles is None:
                text = f"{stamp} {source} | "
                bare = text
            else:
                text = f"{self._styles.dim(stamp)} {self._styles.source(source)} | "
                bare = f"{stamp} {source} | "
            cached = (text.encode(), bare.encode())
            if len(self._prefixes) > 4096:
                self._prefixes.clear()
            self._prefixes[key] = cached
        return cached

    def format(self, record: logging.LogRecord) -> str:
        source = self._shown(source_of(record))
        stamp = self._stamps(record.created)
        message = _format_message(record)
        if self.prefix == "none":
            return message
        if self._styles is None:
            return f"{stamp} {source} | {message}"
        if record.levelno >= logging.WARNING and getattr(record, "corral_stream", None) != "stderr":
            message = self._styles.level(record.levelno, message)
        return f"{self._styles.dim(stamp)} {self._styles.source(source)} | {message}"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write((self.format(record) + self.terminator).encode("utf-8", "replace"))
        except Exception:
            self.handleError(record)

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        prefix, _ = self._source_prefix(source.name, created)
        self._write(prefix + text.replace(b"\n", b"\n" + prefix) + b"\n")

    def write_wire(self, source: Source, records: list[Record]) -> None:
        styles = self._styles
        parts: list[str] = []
        for rec in records:
            prefix, _ = self._source_prefix(source.name, _believable(rec.created))
            message = _wire_message(rec)
            if styles is not None and rec.level >= logging.WARNING:
                message = styles.level(rec.level, message)
            parts.append(f"{prefix.decode()}{message}\n")
        self._write("".join(parts).encode("utf-8", "replace"))

    def write_progress(self, source: Source, stream: str | None, frame: bytes | None) -> None:
        key = (source.name, stream)
        with self._write_lock:
            if frame is None:
                self._bars.pop(key, None)
            else:
                prefix, bare = self._source_prefix(source.name, time.time())
                width = self._width() - len(bare) - 1
                text = frame.decode("utf-8", "replace")[: max(width, 8)]
                self._bars[key] = prefix + text.encode()
            self._redraw(b"")

    # -- the terminal ------------------------------------------------------------------

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return 80

    def _height(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).lines
        except (OSError, ValueError, AttributeError):
            return 24

    def set_footer(self, lines: list[bytes]) -> None:
        """Pin ``lines`` (a status view) under the scrolling lines and the bars; redraw now.

        Blocking terminal I/O: call it where the log handlers run, not on the
        event loop.  On a stream that is not a terminal it does nothing.
        """
        if not self.terminal:
            return
        with self._write_lock:
            self._footer = list(lines)
            self._redraw(b"")

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            if self._bars or self._drawn:
                self._redraw(data)
            else:
                self._raw(data)

    def _redraw(self, data: bytes) -> None:
        """Clear the pinned lines, write ``data`` above them, draw them again (lock held)."""
        controls = _controls()
        out = [controls.clear_lines(self._drawn), data]
        pinned = [*self._bars.values(), *self._footer]
        # The cursor cannot go above the top of the screen: pinned lines that
        # scrolled off it could never be cleared, and would stay in the
        # scrollback.  So at most a screenful, less a line, is pinned.
        room = max(self._height() - 1, 1)
        if len(pinned) > room:
            hidden = len(pinned) - room + 1
            pinned = [*pinned[: room - 1], f"... and {hidden} more lines".encode()]
        out.append(b"\n".join(pinned))
        self._drawn = len(pinned)
        self._raw(b"".join(out))

    def _raw(self, data: bytes) -> None:
        stream = self.stream
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()

    def flush_block(self) -> None:
        pass  # every write is flushed

    def close(self) -> None:
        with self._write_lock:
            if self._drawn:
                self._raw(_controls().clear_lines(self._drawn))
                self._drawn = 0
            self._bars.clear()
            self._footer = []
        super().close()


class _Styles:
    """Colours for the console, rendered once per source by rich."""

    _PALETTE: Final = (
        "cyan",
        "yellow",
        "green",
        "magenta",
        "blue",
        "bright_cyan",
        "bright_yellow",
        "bright_green",
        "bright_magenta",
        "bright_blue",
    )

    def __init__(self) -> None:
        from rich.color import ColorSystem
        from rich.style import Style

        self._system = ColorSystem.STANDARD
        self._style = Style
        self._sources: dict[str, str] = {}
        self._dim = Style(dim=True)
        self._levels = {
            logging.WARNING: Style(color="yellow"),
            logging.ERROR: Style(color="red"),
            logging.CRITICAL: Style(color="red", bold=True),
        }

    def dim(self, text: str) -> str:
        return self._dim.render(text, color_system=self._system)

    def source(self, name: str) -> str:
        rendered = self._sources.get(name)
        if rendered is None:
            colour = self._PALETTE[len(self._sources) % len(self._PALETTE)]
            rendered = self._style(color=colour).render(name, color_system=self._system)
            self._sources[name] = rendered
        return rendered

    def level(self, level: int, text: str) -> str:
        for threshold in (logging.CRITICAL, logging.ERROR, logging.WARNING):
            if level >= threshold:
                return self._levels[threshold].render(text, color_system=self._system)
        return text


class _Controls:
    """Cursor movements for redrawing progress bars, from rich."""

    def __init__(self) -> None:
        from rich.control import Control
        from rich.segment import ControlType

        self._erase = str(Control((ControlType.ERASE_IN_LINE, 2))).encode()
        self._column0 = str(Control.move_to_column(0)).encode()
        self._up = str(Control.move(0, -1)).encode()

    def clear_lines(self, count: int) -> bytes:
        """Erase the ``count`` lines ending at the cursor, leaving it at the first's start."""
        if count <= 0:
            return b""
        one = self._column0 + self._erase
        return one + (self._up + one) * (count - 1)


_controls_instance: _Controls | None = None


def _controls() -> _Controls:
    global _controls_instance
    if _controls_instance is None:
        _controls_instance = _Controls()
    return _controls_instance
