"""Routing what children say to files, the console and :class:`logging.Handler` objects.

This is the worker side of the log path.  The event loop only reads bytes
(see :mod:`corral._core._pipes` and :mod:`corral._logs._server`) and queues them, a
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from ._chunks import FRAMES, LINES, Chunk, Delivery, Outcome, StreamState
from ._records import believable, make_record
from ._route import Route
from ._sinks import BlockSink
from ._sources import BACKLOG_RECORDS, Backlogs, Source, line_block, record_block, wire_block

if TYPE_CHECKING:
    from ._wire import Hello, Record

__all__ = ["MAX_LINE", "PROGRESS_INTERVAL", "Router"]

#: A "line" longer than this is cut and delivered in pieces.
MAX_LINE: Final = 1024 * 1024
#: The unfinished lines of all streams together are at most this long: beyond,
#: the one that grows is delivered as a piece (if it is :data:`MIN_PIECE` or more).
MAX_PENDING: Final = 8 * 1024 * 1024
MIN_PIECE: Final = 64 * 1024
#: Files, handlers and tails get a progress bar's state at most this often.
PROGRESS_INTERVAL: Final = 1.0


class _Targets:
    """The destinations of one (source, level): block sinks and record handlers."""

    __slots__ = ("handlers", "live", "needs_records", "propagate", "sinks")

    def __init__(
        self,
        sinks: list[BlockSink],
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
            sinks: list[BlockSink] = []
            handlers: list[logging.Handler] = []
            for route, min_level in self._routes:
                if level < min_level:
                    continue
                if route.pattern != "*" and not fnmatch.fnmatchcase(source.relative, route.pattern):
                    continue
                handler = route.handler
                if isinstance(handler, BlockSink) and handler.fast:
                    sinks.append(handler)
                else:
                    handlers.append(handler)
            logger = logging.getLogger(source.name) if self._propagate else None
            targets = _Targets(sinks, handlers, logger)
            if len(self._cache) < 65536:
                self._cache[key] = targets
        return targets

    # -- the worker's job ----------------------------------------------------------------

    @staticmethod
    def is_silent(batch: Sequence[Chunk]) -> bool:
        """Whether handling ``batch`` reaches no destination: only empty reads, nothing pending.

        Such a batch (the end-of-file of pipes whose last line was complete,
        which is what a stop produces) calls no handler and blocks on
        nothing: the collector may handle it on the loop, between two
        batches of the worker (see :meth:`process_silent`).
        """
        return all(
            chunk.state.kind == LINES
            and not chunk.data
            and not chunk.state.pending
            and chunk.state.bar is None
            for chunk in batch
        )

    def process_silent(self, batch: Sequence[Chunk]) -> None:
        """Handle a batch :meth:`is_silent` accepted, on the caller's thread (no handler called)."""
        for chunk in batch:
            self._lines(chunk, [], set())
            self.chunks_done += 1

    def process(self, batch: Sequence[Chunk]) -> Outcome:
        """Handle a batch of chunks in order; return what the loop must do next.

        That is: the records live tails should get, and the connections that
        sent garbage (their readers must hang up).
        """
        deliveries: list[Delivery] = []
        failed: list[StreamState] = []
        touched: set[BlockSink] = set()
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
        for sink in touched:
            self._guard(sink, sink.flush_block)
        for route, _ in self._routes:
            if not isinstance(route.handler, BlockSink):
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

    def _lines(self, chunk: Chunk, deliveries: list[Delivery], touched: set[BlockSink]) -> None:
        state = chunk.state
        self._pending -= len(state.pending)
        try:
            self._split_lines(chunk, deliveries, touched)
        finally:
            self._pending += len(state.pending)

    def _split_lines(
        self, chunk: Chunk, deliveries: list[Delivery], touched: set[BlockSink]
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
                    # Files and handlers have it; a terminal showed it as a bar, taken
                    # down now: there it becomes a line, as on the child's terminal.
                    self._live_line(state, first, chunk.created, touched)
                    complete = rest if newline else None
            if complete is not None:
                self._emit_lines(state, complete, chunk.created, deliveries, touched)
        pending = state.pending
        # A bar is a line redrawn after a carriage return; a lone trailing "\r"
        # may be the first half of a "\r\n" split between two reads.
        if pending and b"\r" in (pending[:-1] if pending.endswith(b"\r") else pending):
            state.pending = _newest_frame(pending)
            self._progress(state, chunk.created, deliveries, touched)

    def _live_line(
        self, state: StreamState, text: bytes, created: float, touched: set[BlockSink]
    ) -> None:
        """A bar's last state, logged already, to the sinks that draw bars: as a line."""
        stream = state.stream or "stdout"
        text = text.decode("utf-8", "replace").encode("utf-8")
        for sink in self._targets(state.source, state.level).sinks:
            if sink.live_progress:
                try:
                    sink.write_lines(state.source, stream, state.level, created, text)
                except Exception:
                    self._report(sink)
                touched.add(sink)

    def _emit_lines(
        self,
        state: StreamState,
        text: bytes,
        created: float,
        deliveries: list[Delivery],
        touched: set[BlockSink],
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
        touched: set[BlockSink],
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

    def _frames(self, chunk: Chunk, deliveries: list[Delivery], touched: set[BlockSink]) -> None:
        # Loaded by the log server, which decodes every hello: no file is read here.
        from ._wire import Record, WireError

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
        touched: set[BlockSink],
    ) -> None:
        """Records from a child's log connection: formatted straight from the wire."""
        source = state.source
        first = source.number(len(wire))
        level = wire[0].level
        if all(rec.level == level for rec in wire):
            # The usual batch: one level, so one set of destinations for all of it.
            targets = self._targets(source, level)
            batches = {sink: wire for sink in targets.sinks}
            wanted = [(rec, targets) for rec in wire] if targets.needs_records else []
        else:
            batches, wanted = self._by_level(source, wire)
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
        # Only what the backlog can keep is measured for it: the newest records.
        kept = wire[-BACKLOG_RECORDS:]
        source.remember(first + len(wire) - len(kept), wire_block(kept, make))

    def _by_level(
        self, source: Source, wire: list[Record]
    ) -> tuple[dict[BlockSink, list[Record]], list[tuple[Record, _Targets]]]:
        """Records of several levels: each sink's share, and those handlers want."""
        batches: dict[BlockSink, list[Record]] = {}
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
        return batches, wanted

    def _records(
        self,
        source: Source,
        records: list[logging.LogRecord],
        deliveries: list[Delivery],
        touched: set[BlockSink],
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
    created = believable(rec.created)
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
