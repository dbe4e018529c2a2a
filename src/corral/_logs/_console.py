"""The console: ``HH:MM:SS source | message`` lines, coloured on a terminal, live progress bars."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from typing import Final, TextIO

from ._records import believable, format_message, source_of, wire_message
from ._sinks import BlockSink, Stamps
from ._sources import Source
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
        self._stamps = Stamps("%H:%M:%S")
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
        message = format_message(record)
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
            prefix, _ = self._source_prefix(source.name, believable(rec.created))
            message = wire_message(rec)
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
                width = self.width - len(bare) - 1
                text = frame.decode("utf-8", "replace")[: max(width, 8)]
                self._bars[key] = prefix + text.encode()
            self._redraw(b"")

    # -- the terminal ------------------------------------------------------------------

    @property
    def width(self) -> int:
        """The width of the terminal it writes to, in columns (80 when it is not one)."""
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
