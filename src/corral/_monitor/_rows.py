"""The rows the monitor sends: a client's filter, and rows made in JSON from what the queue holds.

The monitor's queue (:mod:`corral._monitor._clients`) keeps output as it was
read; it is split into records only to be sent, here, in a worker thread.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Final

import msgspec

from .._logs._records import wire_message

if TYPE_CHECKING:
    from .._logs._wire import Record

__all__ = [
    "JSON",
    "MESSAGE_ROWS",
    "ROW_BYTES",
    "ROW_FRAMING",
    "ROW_NAME",
    "ROW_TEXT",
    "Entry",
    "Filter",
    "Held",
]

#: A record's text longer than this (characters) is sent cut in the middle;
#: files, handlers and tails have it whole.
ROW_TEXT: Final = 16 * 1024
#: Logger names longer than this (characters) are sent cut.
ROW_NAME: Final = 256
#: A record is at most this long in JSON (a text of control characters, each
#: escaped in six bytes, is cut further).
ROW_BYTES: Final = 32 * 1024
#: A ``logs`` message holds at most this many records...
MESSAGE_ROWS: Final = 2000

JSON = msgspec.json.Encoder()


#: What the log service hands the monitor, kept as it came (no line is split
#: until a client is sent it): ``("lines", source, stream, level, created,
#: text)`` for a read of output, ``("wire", source, records)`` for records of
#: a log connection, ``("row", row)`` for one record built for handlers.
Entry = tuple[Any, ...]
#: An entry as the monitor keeps it: with its count of rows and its size in bytes.
Held = tuple[Entry, int, int]


def to_held(entry: Entry) -> Held:
    kind = entry[0]
    if kind == "lines":
        text = entry[5]
        return entry, text.count(b"\n") + 1, len(text) + 200
    if kind == "wire":
        records = entry[2]
        size = sum(map(_record_size, records))
        return entry, len(records), size + 300 * len(records) + 200
    return entry, 1, len(entry[1][5]) + 400


def _record_size(rec: Record) -> int:
    return len(rec.msg) + len(rec.exc_text or "") + len(rec.stack_info or "")


#: About what a row costs in JSON beyond its text.
ROW_FRAMING: Final = 64


def _cut(text: str, keep: int = ROW_TEXT) -> str:
    """``text``, or its beginning and its end if it is longer than ``keep`` characters."""
    if len(text) <= keep:
        return text
    half = keep // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _encode_row(row: list[Any]) -> bytes:
    """A row in JSON, at most :data:`ROW_BYTES` long."""
    row[5] = _cut(row[5])
    if row[4] is not None:
        row[4] = _cut(row[4], ROW_NAME)
    data = JSON.encode(row)
    if len(data) > ROW_BYTES:  # escaped control characters: keep fewer
        row[0] = _cut(row[0], ROW_NAME)
        row[5] = _cut(row[5], ROW_BYTES // 8)
        data = JSON.encode(row)
    return data


class Filter:
    """What some clients follow (a source glob and a level), and what of it went unread.

    ``evicted`` counts the rows it matches among the entries the monitor let
    go since the filter was made: a client that knows how many rows it
    matched before its place in the queue can tell, once it finds that place
    gone, how many it lost, without the monitor doing anything per client
    when it lets an entry go.
    """

    __slots__ = ("_matches", "evicted", "level", "pattern", "users")

    def __init__(self, pattern: str, level: int) -> None:
        self.pattern = pattern
        self.level = level
        self.users = 0
        self.evicted = 0
        self._matches: dict[str, bool] = {}

    def source_ok(self, source: str) -> bool:
        wanted = self._matches.get(source)
        if wanted is None:
            pattern = self.pattern
            wanted = pattern == "*" or fnmatch.fnmatchcase(source, pattern)
            if len(self._matches) < 4096:
                self._matches[source] = wanted
        return wanted

    def row_ok(self, row: list[Any]) -> bool:
        return bool(row[2] >= self.level and self.source_ok(row[0]))

    def count(self, entry: Entry, rows: int, end: int | None = None) -> int:
        """How many of the rows of ``entry`` (of its first ``end`` rows) it matches."""
        kind = entry[0]
        if end is not None and end <= 0:
            return 0
        if kind == "lines":
            if entry[3] < self.level or not self.source_ok(entry[1]):
                return 0
            return rows if end is None else min(end, rows)
        if kind == "wire":
            if not self.source_ok(entry[1]):
                return 0
            records = entry[2] if end is None else entry[2][:end]
            level = self.level
            if level <= 0:
                return len(records)
            return sum(1 for rec in records if rec.level >= level)
        return 1 if self.row_ok(entry[1]) else 0

    def recent(self, entry: Entry, rows: int, wanted: int, nbytes: int) -> tuple[int, int]:
        """The newest rows of ``entry`` it matches, at most ``wanted`` of them and about
        ``nbytes`` bytes: where they begin, and how many they are."""
        kind = entry[0]
        if kind == "lines":
            if entry[3] < self.level or not self.source_ok(entry[1]):
                return rows, 0
            sizes: list[int] = [len(line) + ROW_FRAMING for line in entry[5].split(b"\n")]
        elif kind == "wire":
            if not self.source_ok(entry[1]):
                return rows, 0
            sizes = [
                _record_size(rec) + ROW_FRAMING if rec.level >= self.level else -1
                for rec in entry[2]
            ]
        else:
            sizes = [len(entry[1][5]) + ROW_FRAMING if self.row_ok(entry[1]) else -1]
        start, count = rows, 0
        for index in range(rows - 1, -1, -1):
            size = sizes[index]
            if size < 0:
                continue  # not wanted
            if count == wanted or size > nbytes:
                break
            start, count, nbytes = index, count + 1, nbytes - size
        return start, count


def logs_message(rows: list[bytes]) -> bytes:
    return b'{"type":"logs","records":[' + b",".join(rows) + b"]}"


def make_rows(
    entries: list[Held], entry: int, offset: int, wanted: Filter, limit: int
) -> tuple[list[bytes], int, int]:
    """Rows in JSON from ``entries`` (the first from its ``offset``-th row) that ``wanted``
    matches, up to :data:`MESSAGE_ROWS` of them and ``limit`` bytes (one at least).

    Returns them and the place after the last row looked at.
    """
    made: list[bytes] = []
    nbytes = 0

    def room(data: bytes) -> bool:
        return not made or (len(made) < MESSAGE_ROWS and nbytes + len(data) <= limit)

    for held, rows, _ in entries:
        kind = held[0]
        if kind == "lines":
            _, name, stream, level, created, text = held
            if level >= wanted.level and wanted.source_ok(name):
                lines = text.split(b"\n")
                for index in range(offset, rows):
                    data = _encode_row(
                        [
                            name,
                            stream,
                            level,
                            created,
                            None,
                            lines[index].decode("utf-8", "replace"),
                        ]
                    )
                    if not room(data):
                        return made, entry, index
                    made.append(data)
                    nbytes += len(data)
        elif kind == "wire":
            name, records = held[1], held[2]
            if wanted.source_ok(name):
                for index in range(offset, rows):
                    rec = records[index]
                    if rec.level < wanted.level:
                        continue
                    data = _encode_row(
                        [
                            name,
                            "logging",
                            rec.level,
                            rec.created,
                            rec.name or None,
                            wire_message(rec),
                        ]
                    )
                    if not room(data):
                        return made, entry, index
                    made.append(data)
                    nbytes += len(data)
        elif offset == 0 and wanted.row_ok(held[1]):
            data = _encode_row(list(held[1]))
            if not room(data):
                return made, entry, 0
            made.append(data)
            nbytes += len(data)
        entry, offset = entry + 1, 0
    return made, entry, offset
