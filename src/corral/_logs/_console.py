"""The console: ``HH:MM:SS source | message`` lines, coloured on a terminal, live progress bars."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TextIO

from ._records import believable, format_message, source_of, wire_message
from ._sinks import BlockSink, Stamps
from ._sources import Source
from ._terminal import is_text, terminal_bytes, terminal_text, write_out

if TYPE_CHECKING:
    from ._wire import Record

__all__ = ["ConsoleHandler"]


class ConsoleHandler(BlockSink, logging.StreamHandler):  # type: ignore[type-arg]
    """Writes ``HH:MM:SS source | message`` lines, with a coloured prefix on a terminal.

    Colour is used only when the stream is a terminal and ``NO_COLOR`` is not
    set, so files and pipes get plain text.  On a terminal, a child's
    progress bar (a line redrawn with carriage returns) is drawn in place
    under its prefix, below the scrolling lines.

    ``prefix`` chooses the prefix: ``"source"`` (the default: time and full
    source), ``"relative"`` (time and the source within the runner, as the
    ``corral`` command shows it) or ``"none"`` (the bare lines).

    A child's text, and the names of sources, reach the stream through one
    filter: colours (SGR) and text
    pass, a progress bar shows its newest frame, and nothing else that
    could act on a terminal does (see :ref:`terminal-safety`), whatever the
    stream is (a pipe may lead to a terminal too).  ``raw=True`` writes the
    children's text as it is, control sequences and all.

    ``label``, if given, is called once with each source's name as the
    prefix would show it; it returns the text to show instead (the
    ``corral`` command shows ``[2] agent-1.worker-0`` for global rank 2),
    or ``None`` to keep that source's lines, records and bars off this
    console (``corral run --ranks``).  Other handlers are not affected.

    ``errors``, if given, is where the lines children wrote to their stderr
    go, with the same prefix (coloured if ``errors`` is a terminal and
    colour is not off), as torchrun's workers' stderr reaches its stderr:
    ``corral run ... 2> err.log`` keeps the tracebacks.  Everything else
    (stdout lines, records, bars, the footer) goes to ``stream``.  Without
    it, every line goes to ``stream``, merged as honcho merges them.

    The pinned lines (bars, and a footer such as the ``corral`` command's
    status table) take at most a third of the terminal's height, and never a
    line wider than it.  Between two draws the cursor waits at their start,
    and their rows are deleted from there to the end of the screen (never
    erased: tmux keeps an erased screen in its history), however the
    resizes since rewrapped them (most terminals rewrap: VTE, iTerm2, kitty,
    tmux, Windows Terminal; a line drawn 120 columns wide takes three rows
    once the terminal is 40 columns wide, and the block may then be taller
    than the screen: a terminal keeps its cursor on the screen, so none of
    it is out of reach in the scrollback).  On a fresh or cleared screen,
    blank rows above them stand in for the lines of text not written yet:
    a terminal that rewraps keeps the bottom of its screen in place and
    pushes the top into its history, which must get text or blank rows,
    never pinned lines.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        colour: bool | None = None,
        prefix: str = "source",
        label: Callable[[str], str | None] | None = None,
        raw: bool = False,
        errors: TextIO | None = None,
    ) -> None:
        logging.StreamHandler.__init__(self, stream if stream is not None else sys.stderr)
        #: Whether children's text is written as it is (see above).
        self.raw = bool(raw)
        if prefix not in ("source", "relative", "none"):
            raise ValueError(f"prefix must be 'source', 'relative' or 'none', not {prefix!r}")
        self.prefix = prefix
        self._label = label
        self._labels: dict[str, str | None] = {}
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())
        if colour is None:
            colour = self.terminal and "NO_COLOR" not in os.environ
        self.colour = colour
        self.live_progress = self.terminal
        self._footer: list[bytes] = []
        self._stamps = Stamps("%H:%M:%S")
        self._styles: _Styles | None = _Styles() if colour else None
        #: Where children's stderr lines go (``None``: :attr:`stream`).
        self.errors = errors
        self._errors_terminal = _isatty(errors)
        if errors is None:
            errors_colour = False
        elif colour is None:
            errors_colour = self._errors_terminal and "NO_COLOR" not in os.environ
        else:
            errors_colour = colour
        self._errors_colour = errors_colour
        #: The colours of the errors stream when it alone has colours, and its prefixes.
        self._errors_styles = _Styles() if errors_colour and not colour else None
        self._error_prefixes: dict[tuple[str, int], bytes] = {}
        self._prefixes: dict[tuple[str, int], tuple[bytes, bytes]] = {}
        #: Each bar: its prefix as drawn (coloured), as text, and the bar's text.
        self._bars: OrderedDict[tuple[str, str | None], tuple[bytes, str, str]] = OrderedDict()
        #: The display width of each pinned line drawn last (the cursor waits
        #: at the first one's start).
        self._drawn: list[int] = []
        #: The blank rows drawn between the text and the pinned lines (see :meth:`_redraw`).
        self._gap = 0
        #: How many lines of text this console wrote (capped): the rows above them, at least.
        self._written = 0
        self._write_lock = threading.Lock()

    def _plain(self) -> bool:
        cls = type(self)
        return cls.emit is ConsoleHandler.emit and cls.format is ConsoleHandler.format

    # -- text --------------------------------------------------------------------------

    def _shown(self, source: str) -> str | None:
        """What the prefix shows of ``source``; ``None`` if it is not shown at all."""
        shown = self._labels.get(source, "")
        if shown == "":
            shown = source
            if self.prefix == "relative":
                _, dot, rest = source.partition(".")
                shown = rest if dot else source
            if self._label is not None:
                shown = self._label(shown)
            if shown is not None and not self.raw:
                shown = terminal_text(shown)
            if len(self._labels) > 4096:
                self._labels.clear()
            self._labels[source] = shown
        return shown

    def _source_prefix(self, source: str, created: float) -> tuple[bytes, bytes] | None:
        second = int(created)
        key = (source, second)
        cached = self._prefixes.get(key)
        if cached is None:
            stamp = self._stamps(created)
            shown = self._shown(source)
            if shown is None:
                return None
            source = shown
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
        name = source_of(record)
        shown = self._shown(name)
        source = shown if shown is not None else name if self.raw else terminal_text(name)
        stamp = self._stamps(record.created)
        message = format_message(record)
        if not self.raw:
            message = terminal_text(message)
        if self.prefix == "none":
            return message
        if self._styles is None:
            return f"{stamp} {source} | {message}"
        if record.levelno >= logging.WARNING and getattr(record, "corral_stream", None) != "stderr":
            message = self._styles.level(record.levelno, message)
        return f"{self._styles.dim(stamp)} {self._styles.source(source)} | {message}"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._label is not None and self._shown(source_of(record)) is None:
                return
            self._write((self.format(record) + self.terminator).encode("utf-8", "replace"))
        except Exception:
            self.handleError(record)

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        prefixes = self._source_prefix(source.name, created)
        if prefixes is None:
            return
        if not self.raw:
            text = terminal_bytes(text)
        if stream == "stderr" and self.errors is not None:
            self._write_errors(self._errors_prefix(prefixes, source.name, created), text)
            return
        prefix = prefixes[0]
        self._write(prefix + text.replace(b"\n", b"\n" + prefix) + b"\n")

    def _errors_prefix(self, prefixes: tuple[bytes, bytes], source: str, created: float) -> bytes:
        """The prefix of a line on :attr:`errors`: coloured there only if it is a terminal."""
        if not self._errors_colour or self.prefix == "none":
            return prefixes[1]
        if self._styles is not None:
            return prefixes[0]
        styles = self._errors_styles
        assert styles is not None  # coloured on the errors stream alone
        key = (source, int(created))
        cached = self._error_prefixes.get(key)
        if cached is None:
            if len(self._error_prefixes) > 4096:
                self._error_prefixes.clear()
            shown = self._shown(source) or source
            cached = f"{styles.dim(self._stamps(created))} {styles.source(shown)} | ".encode()
            self._error_prefixes[key] = cached
        return cached

    def _write_errors(self, prefix: bytes, text: bytes) -> None:
        """Lines for :attr:`errors`; the pinned lines make way if they are on its terminal."""
        data = prefix + text.replace(b"\n", b"\n" + prefix) + b"\n"
        with self._write_lock:
            shared = self.terminal and self._errors_terminal
            pinned = shared and bool(self._drawn)
            if pinned:
                self._raw(self._clear())
                self._drawn = []
            try:
                write_out(self.errors, data)
            except (OSError, ValueError):
                pass  # nobody reads it any more
            if shared:
                self._wrote(data.count(b"\n"))
            if pinned or (shared and self._bars):
                self._redraw(b"")

    def write_wire(self, source: Source, records: list[Record]) -> None:
        styles = self._styles
        parts: list[str] = []
        messages = [wire_message(rec) for rec in records]
        # One check for the whole batch (nearly always text alone), each if it fails.
        if not self.raw and not is_text("".join(messages)):
            messages = [terminal_text(message) for message in messages]
        for rec, message in zip(records, messages, strict=True):
            prefixes = self._source_prefix(source.name, believable(rec.created))
            if prefixes is None:
                return
            prefix = prefixes[0]
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
                prefixes = self._source_prefix(source.name, time.time())
                if prefixes is None:
                    return
                prefix, bare = prefixes
                if not self.raw:
                    frame = terminal_bytes(frame)
                text = frame.decode("utf-8", "replace")
                self._bars[key] = (prefix, bare.decode(), _CONTROL.sub("", text))
            self._redraw(b"")

    # -- the terminal ------------------------------------------------------------------

    @property
    def width(self) -> int:
        """The width of the terminal it writes to, in columns (80 when it is not one)."""
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return 80

    @property
    def height(self) -> int:
        """The height of the terminal it writes to, in rows (24 when it is not one)."""
        try:
            return os.get_terminal_size(self.stream.fileno()).lines
        except (OSError, ValueError, AttributeError):
            return 24

    @property
    def bars(self) -> int:
        """How many progress bars are drawn in place now."""
        return len(self._bars)

    @property
    def room(self) -> int:
        """The rows the pinned lines (bars and footer) may take: a third of the terminal's.

        So that they still fit on the screen when a resize to half the width
        rewraps each of them onto two rows.
        """
        height = self.height
        return max(min(height - 1, max(height // 3, 3)), 1)

    def set_footer(self, lines: list[bytes]) -> None:
        """Pin ``lines`` (a status view) under the scrolling lines and the bars; redraw now.

        Blocking terminal I/O: call it where the log handlers run, not on the
        event loop.  On a stream that is not a terminal it does nothing.
        Lines wider than the terminal are cut; the footer and the bars take
        ``room`` rows at most, the footer first.
        """
        if not self.terminal:
            return
        with self._write_lock:
            self._footer = list(lines)
            self._redraw(b"")

    def say(self, text: str, stream: TextIO | None = None) -> None:
        """Write ``text`` (a line of the program's own) to ``stream`` (stderr by default).

        The pinned lines are cleared first and drawn again after it when
        ``stream`` shows on the same terminal, so they are not garbled.
        Blocking I/O, as :meth:`set_footer`.
        """
        target = stream if stream is not None else sys.stderr
        with self._write_lock:
            pinned = bool(self._drawn)
            if pinned:
                self._raw(self._clear())
                self._drawn = []
            try:
                line = text if text.endswith("\n") else text + "\n"
                write_out(target, line.encode("utf-8", "replace"))
            except (OSError, ValueError):
                pass  # nobody reads it any more: nothing to say it on
            if target is self.stream or _isatty(target):
                self._wrote(text.rstrip("\n").count("\n") + 1)
            if pinned or self._bars:
                self._redraw(b"")

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            if self._bars or self._drawn:
                self._redraw(data)
            else:
                self._raw(data)
                self._wrote(data.count(b"\n"))

    def _wrote(self, lines: int) -> None:
        self._written = min(self._written + lines, _ENOUGH)

    def _clear(self) -> bytes:
        """From the start of the pinned lines: up over the gap, and remove it all."""
        return b"\r" + (b"\x1b[%dA" % self._gap if self._gap else b"") + _DELETE_BELOW

    def _redraw(self, data: bytes) -> None:
        """Clear the pinned lines, write ``data`` above them, draw them again (lock held).

        The pinned lines are removed by deleting rows (``_DELETE_BELOW``), never
        by erasing them: no terminal keeps what it deletes.  While fewer than
        twice as many lines of text as the pinned lines take are on the screen
        above them (a fresh or cleared screen), blank rows fill the difference
        (the gap), written first and removed with them.  A terminal that rewraps
        when it is narrowed (tmux, kitty, VTE) keeps the bottom of its screen in
        place and pushes the top into its history: what it pushes there must be
        text, or those blank rows, never pinned lines (up to a narrowing to a
        third of the width before the next draw).
        """
        out = [self._clear() if self._drawn else b"", data]
        self._wrote(data.count(b"\n"))
        columns = max(self.width - 1, 1)  # never the last column: no wrap pending
        height = self.height
        # The cursor cannot go above the top of the screen: pinned lines that
        # scrolled off it could never be cleared, and would stay in the
        # scrollback.  So they take a third of the screen at most.
        room = self.room
        footer = [_cut(line, columns) for line in self._footer[:room]]
        bars = [_bar(*bar, columns) for bar in list(self._bars.values())[:height]]
        space = room - len(footer)
        if len(bars) > space:
            hidden = len(bars) - max(space - 1, 0)
            bars = bars[: max(space - 1, 0)]
            if space > 0:
                more = f"... and {hidden} more progress bar{'s' if hidden != 1 else ''}"
                bars.append(_cut(more.encode(), columns))
        pinned = [*bars, *footer]
        self._gap = 0
        if pinned:
            self._gap = max(min(2 * len(pinned) - self._written, height - len(pinned)), 0)
            # Autowrap off while they are drawn: a frame made for the width read
            # above may reach a terminal made narrower since, and a line that
            # wrapped there would take more rows than the move back counts.
            out += [b"\n" * self._gap, _NO_WRAP, b"\n".join(line for line, _ in pinned)]
            # Back to their start, where the next draw clears them from.
            out += [_back_to_start(len(pinned)), _WRAP]
        self._drawn = [width for _, width in pinned]
        self._raw(b"".join(out))

    def _raw(self, data: bytes) -> None:
        write_out(self.stream, data)

    def flush_block(self) -> None:
        pass  # every write is flushed

    def close(self) -> None:
        with self._write_lock:
            if self._drawn:
                self._raw(self._clear())
                self._drawn = []
            self._bars.clear()
            self._footer = []
        super().close()


def _isatty(stream: TextIO | None) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


#: What is not text on a terminal: escape sequences and control characters.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x1f\x7f]")


def _cut(line: bytes, columns: int) -> tuple[bytes, int]:
    """``line`` as drawn, cut to ``columns`` cells, and the cells it takes.

    A line that is too wide is drawn as its text alone, without colours.
    """
    from rich.cells import cell_len

    shown = _CONTROL.sub("", line.decode("utf-8", "replace"))
    width = cell_len(shown)
    if width <= columns:
        return line, width
    return _chop(shown, columns)


def _bar(prefix: bytes, bare: str, text: str, columns: int) -> tuple[bytes, int]:
    """A bar's line: its prefix and as much of its text as ``columns`` cells hold."""
    from rich.cells import cell_len

    used = cell_len(bare)
    if used + 8 > columns:
        return _chop(bare + text, columns)
    chopped, width = _chop(text, columns - used)
    return prefix + chopped, used + width


def _chop(text: str, columns: int) -> tuple[bytes, int]:
    """The start of ``text`` (no controls in it) that fits in ``columns`` cells, and its width."""
    from rich.cells import get_character_cell_size

    width = 0
    for index, char in enumerate(text):
        size = get_character_cell_size(char)
        if width + size > columns:
            return text[:index].encode(), width
        width += size
    return text.encode(), width


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


#: Remove the rows from the cursor's to the end of the screen: delete lines (DL,
#: ``ESC[M``, VT102), not erase below (ED, ``ESC[J``).  Some terminals keep what an
#: erase clears: tmux (``scroll-on-clear``, on by default) moves the whole screen into
#: its history when ``ESC[J`` comes at the top-left cell, so pinned lines redrawn from
#: the top row ~16 times a second would fill the scrollback with copies of themselves.
#: Deleted rows go nowhere, in every terminal; a count beyond the rows left is cut to
#: them, so one count serves every height.
_DELETE_BELOW: Final = b"\x1b[9999M"

#: Lines of text enough to count (:attr:`ConsoleHandler._written` stops there).
_ENOUGH: Final = 1 << 20


#: Autowrap (DECAWM) off, and on again: a line wider than the terminal is cut
#: at its edge instead of taking a second row.
_NO_WRAP: Final = b"\x1b[?7l"
_WRAP: Final = b"\x1b[?7h"


def _back_to_start(count: int) -> bytes:
    """From the end of the ``count`` lines just drawn to the start of the first."""
    return b"\r" + (b"\x1b[%dA" % (count - 1) if count > 1 else b"")
