"""The terminal filter: a child's text reaches a terminal as text and colours, nothing that acts.

Pure functions first (:mod:`corral._logs._terminal`), with Hypothesis: whatever the input,
the output holds no control character but tab and newline and no ``ESC`` that does not begin
an SGR sequence, and text, SGR and the newest frame of a ``\\r``-redrawn line survive.  Then
every path of :class:`corral.ConsoleHandler` (lines, records, records from the wire, source
names, progress bars) on an in-memory stream, and ``raw=True``.  The paths through a real
terminal and a pipe (a runner's console, ``corral run``, ``corral up``, ``corral tail``) are
in tests/cli/test_terminal_paths.py.
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
from corral._logs._records import make_record
from corral._logs._sources import Source
from corral._logs._terminal import RESET, terminal_bytes, terminal_text
from corral._logs._wire import Record

#: What the filter must never let through: a control character but tab, newline and an
#: ESC that begins an SGR sequence; a C1 control.
FORBIDDEN = re.compile("\x1b(?!\\[[0-9;:]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]")

#: The hostile sequences of the field, each with what the terminal is sent instead.
HOSTILE = [
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # window title
    ("\x1b]2;pwned\x1b\\", "\\x1b]2;pwned\\x1b\\"),  # window title, ST-terminated
    ("\x1b]52;c;aGVsbG8=\x07", "\\x1b]52;c;aGVsbG8=\\x07"),  # clipboard
    ("\x1b[2J", ""),  # clear the screen
    ("\x1b[3J", ""),  # clear the scrollback
    ("\x1b[H", ""),  # cursor home
    ("\x1b[10;10H", ""),  # cursor jump
    ("\x1b[5A", ""),  # cursor up, over other lines
    ("\x1b[100D", ""),  # cursor back, over the prefix
    ("\x1b[6n", ""),  # device status report: the terminal "types" an answer
    ("\x1b[c", ""),  # primary device attributes
    ("\x1b[>c", ""),  # secondary device attributes
    ("\x1b[21t", ""),  # report the window title
    ("\x1b[?1049h", ""),  # the alternate screen
    ("\x1bPq#0;2;0;0;0\x1b\\", "\\x1bPq#0;2;0;0;0\\x1b\\"),  # DCS (sixel)
    ("\x1b_Gf=100;AAAA\x1b\\", "\\x1b_Gf=100;AAAA\\x1b\\"),  # APC (kitty graphics)
    ("\x1b^pm\x1b\\", "\\x1b^pm\\x1b\\"),  # PM
    ("\x1bXsos\x1b\\", "\\x1bXsos\\x1b\\"),  # SOS
    ("\x1bc", "\\x1bc"),  # full reset
    ("\x1b7\x1b8", "\\x1b7\\x1b8"),  # save and restore the cursor
    ("\x1b(0", "\\x1b(0"),  # line-drawing characters
    ("\x9b2J", "\\x9b2J"),  # the C1 CSI
    ("\x9d0;t\x9c", "\\x9d0;t\\x9c"),  # the C1 OSC and ST
    ("a\x00b", "a\\x00b"),  # NUL
    ("\x07" * 3, "\\x07" * 3),  # BELs
    ("abc\x08\x08\x08xyz", "abc\\x08\\x08\\x08xyz"),  # backspaces over the text
    ("\x0b\x0c\x0e\x0f\x7f", "\\x0b\\x0c\\x0e\\x0f\\x7f"),  # VT FF SO SI DEL
    ("\x1b", "\\x1b"),  # a lone ESC
    ("\x1b[\u00e9", "\\x1b[\u00e9"),  # a CSI cut short
    ("\x1b\x1b[2J]0;t\x07", "\\x1b]0;t\\x07"),  # what a drop would have joined
]


@pytest.mark.parametrize(("hostile", "shown"), HOSTILE, ids=[repr(h)[1:20] for h, _ in HOSTILE])
def test_every_hostile_sequence_is_dropped_or_shown_escaped(hostile: str, shown: str) -> None:
    line = f"before {hostile} after"
    assert terminal_text(line) == f"before {shown} after"
    assert terminal_bytes(line.encode()) == f"before {shown} after".encode()


def test_text_colours_and_tabs_pass_and_a_coloured_line_ends_reset() -> None:
    assert terminal_bytes(b"plain text\twith a tab\nand a second line") == (
        b"plain text\twith a tab\nand a second line"
    )
    assert terminal_text("caf\u00e9 \u2713 \u6f22\u5b57") == "caf\u00e9 \u2713 \u6f22\u5b57"
    coloured = "\x1b[1;31mred\x1b[0m \x1b[38;5;208morange\x1b[m \x1b[38:2::1:2:3mrgb"
    assert terminal_text(coloured) == coloured + RESET
    assert terminal_text(f"{coloured}\nplain") == f"{coloured}{RESET}\nplain{RESET}"


def test_a_redrawn_line_shows_its_newest_frame() -> None:
    assert terminal_bytes(b" 10%\r 50%\r100%") == b"100%"
    assert terminal_bytes(b"one\r\ntwo\r") == b"one\ntwo"
    assert terminal_text("bar 1\rbar 2\nnext") == "bar 2\nnext"
    # The frame cannot reach back over the prefix: only what follows the last \r is left.
    assert terminal_text("12:00:00 other | forged\rmine") == "mine"


def test_a_line_without_controls_is_returned_as_it_is() -> None:
    text = b"x" * 1000
    assert terminal_bytes(text) is text
    line = "y" * 1000
    assert terminal_text(line) is line


#: Characters that make up hostile input: text, the controls, and the pieces of sequences.
PIECES = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(["\x1b", "[", "]", "m", ";", ":", "0", "2", "J", "?", "\x07", "\r", "\n"]),
    st.sampled_from([h for h, _ in HOSTILE] + ["\x1b[31m", "\x1b[0m", "\x1b\\"]),
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(PIECES, max_size=40).map("".join))
def test_nothing_forbidden_gets_through_whatever_the_input(text: str) -> None:
    out = terminal_text(text)
    assert FORBIDDEN.search(out) is None, (text, out)
    assert out.count("\n") == text.count("\n")  # a line stays a line
    raw = text.encode("utf-8", "surrogatepass")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert terminal_bytes(raw) == out.encode()  # one policy, for bytes and str


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=20)
SGR = st.builds("\x1b[{}m".format, st.lists(st.integers(0, 255).map(str), max_size=4).map(";".join))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(TEXT, SGR, st.just("\t")), max_size=12), st.lists(TEXT, max_size=3))
def test_text_and_colours_survive_and_so_does_the_newest_frame(
    parts: list[str], frames: list[str]
) -> None:
    line = "".join(parts)
    expected = line + RESET if "\x1b" in line else line
    assert terminal_text(line) == expected
    if not line:
        return  # "0\r" shows "0": a lone "\r" at the end is the first half of a "\r\n"
    redrawn = "\r".join([*frames, line])
    assert terminal_text(redrawn) == expected
    assert terminal_bytes(redrawn.encode()) == expected.encode()


# -- every path of the console ------------------------------------------------------------------


class _Console:
    """A ConsoleHandler on an in-memory stream, as the router calls it."""

    def __init__(self, *, raw: bool = False, prefix: str = "relative") -> None:
        self.stream = io.StringIO()
        self.handler = corral.ConsoleHandler(self.stream, colour=False, prefix=prefix, raw=raw)

    def text(self) -> str:
        return self.stream.getvalue()


EVIL = "\x1b]52;c;aGk=\x07\x1b[2J\x07\x00"
EVIL_SHOWN = "\\x1b]52;c;aGk=\\x07\\x07\\x00"


@pytest.mark.parametrize("raw", [False, True], ids=["filtered", "raw"])
def test_every_console_path_filters_unless_raw(raw: bool) -> None:
    console = _Console(raw=raw)
    handler = console.handler
    source = Source(f"run.{EVIL}", EVIL)
    handler.write_lines(source, "stdout", logging.INFO, 0.0, f"line {EVIL}".encode())
    handler.write_wire(
        source, [Record(0.0, logging.WARNING, "WARNING", f"app{EVIL}", f"wire {EVIL}")]
    )
    handler.handle(make_record(f"run.{EVIL}", logging.INFO, f"record {EVIL}", created=0.0))
    handler.close()
    text = console.text()
    if raw:
        assert text.count(EVIL) == 7, repr(text)  # 3 messages, their sources, a logger
    else:
        assert FORBIDDEN.search(text.replace("\n", "")) is None, repr(text)
        assert text.count(EVIL_SHOWN) == 7, repr(text)  # and the logger's name
        assert f"| line {EVIL_SHOWN}\n" in text
        assert f"| app{EVIL_SHOWN}: wire {EVIL_SHOWN}\n" in text
        assert f"| record {EVIL_SHOWN}\n" in text


def test_a_source_that_is_only_controls_is_still_filtered() -> None:
    console = _Console(prefix="source")
    console.handler.handle(make_record("\x1b[2J", logging.INFO, "hi", created=0.0))
    assert "\x1b" not in console.text()


def test_a_progress_bar_is_drawn_filtered_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    handler = corral.ConsoleHandler(stream, colour=False, prefix="relative")
    handler.write_progress(Source("run.a", "a"), "stderr", f"50% {EVIL}".encode())
    handler.close()
    drawn = stream.getvalue()
    assert "50% \\x1b]52;c;aGk=\\x07\\x07\\x00" in drawn, repr(drawn)
    assert not any(bad in drawn for bad in ("\x07", "\x00", "\x1b]", "\x1b[2J")), repr(drawn)


def test_what_the_command_says_is_filtered_too(capsys: pytest.CaptureFixture[str]) -> None:
    """corral's own one-liners quote others' text (ssh's message about a host, say)."""
    from corral._cli._io import say

    say(f"corral: error: host said {EVIL}")
    assert capsys.readouterr().err == f"corral: error: host said {EVIL_SHOWN}\n"


# -- all of it, whatever a write takes ----------------------------------------------------------


def _raw_stream_taking_part() -> tuple[io.TextIOWrapper, int]:
    """``sys.stdout`` as ``python -u`` makes it: a text layer on a raw stream (one write(2) per
    write, which returns how much it took); its pipe non-blocking, so that a write bigger than
    the pipe takes part at once, as a terminal not yet emptied does when a signal comes."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    return io.TextIOWrapper(io.FileIO(write, "w"), write_through=True), read


def _drained(read: int, write: Callable[[], object], close: Callable[[], object]) -> bytes:
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read, 65536):
            received.extend(chunk)

    thread = threading.Thread(target=drain)
    thread.start()
    try:
        write()
    finally:
        close()
        thread.join(30)
        os.close(read)
    return bytes(received)


@pytest.mark.parametrize("how", ["record", "say"])
def test_the_console_writes_all_of_what_a_raw_stream_takes_in_parts(how: str) -> None:
    """Under ``python -u`` or ``PYTHONUNBUFFERED=1``, ``sys.stdout.buffer`` is raw: the
    console writes what a write did not take (it was lost: the end of a frame of the live
    block, which then left a copy of its first rows on the screen)."""
    stream, read = _raw_stream_taking_part()
    console = corral.ConsoleHandler(stream, colour=False, prefix="none")
    text = "".join(f"line {i:06d} {'x' * 40}\n" for i in range(20_000))  # ~1 MB

    def write() -> None:
        if how == "record":
            console.emit(logging.makeLogRecord({"msg": text.rstrip("\n"), "name": "t"}))
        else:
            console.say(text, stream)

    assert _drained(read, write, stream.close).decode() == text
