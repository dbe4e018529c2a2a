"""What a terminal is sent of a child's text: the text and its colours, nothing that acts.

A child's output is data.  Written to a terminal as it is, some of it would
be commands to the terminal: ``ESC]0;...BEL`` retitles the window,
``ESC]52;c;...`` writes the clipboard (kitty, iTerm2, tmux with
``set-clipboard``), ``ESC[2J`` clears the screen, ``ESC[6n`` makes the
terminal type an answer as if the user had, ``ESC c`` resets it, a
backspace or a cursor move writes over the prefix that tells whose line it
is.  The console (:class:`~corral.ConsoleHandler`, so ``corral run``,
``corral up`` and ``corral tail``) passes every child's text, source names
included, through :func:`terminal_bytes` or :func:`terminal_text`, which
apply one policy:

* text, tabs and newlines pass;
* SGR sequences (``ESC[`` digits, ``;`` and ``:``, then ``m``: colours,
  bold, underline) pass, and when a text has any, each of its lines ends
  with a reset (``ESC[0m``), so that no colour runs into the next line;
* a line redrawn with carriage returns (a progress bar) shows its newest
  frame, as the child's own terminal would (the console draws a bar live
  in place; see :class:`~corral.ConsoleHandler`);
* every other CSI sequence (``ESC[`` ... a final byte: cursor moves,
  erasing, scrolling, modes, device queries) is dropped;
* every other control character is shown escaped as ``\\xNN``: an ``ESC``
  that begins anything else (OSC ``ESC]``, DCS ``ESC P``, APC ``ESC _``, PM
  ``ESC ^``, SOS ``ESC X``, the two-byte ``ESC c``, ``ESC 7``...), BEL, NUL,
  backspace and the other C0 controls, DEL, and the C1 controls U+0080 to
  U+009F.  So ``ESC]52;c;aGk=BEL`` shows as the text ``\\x1b]52;c;aGk=\\x07``.

What reaches the terminal then holds no control character but tab and
newline, and no ``ESC`` that does not begin an SGR sequence.  Lines without
any control character (nearly all) cost one scan in C and come back as they
are.  ``ConsoleHandler(raw=True)`` and ``corral run/up/tail --raw`` skip the
filter, for those who want a child's sequences to reach their terminal.

:func:`write_out` and :func:`write_all` send it, all of it (a raw stream's
write may take part only).
"""

from __future__ import annotations

import re
import select
from typing import BinaryIO, Final, TextIO

__all__ = ["RESET", "is_text", "terminal_bytes", "terminal_text", "write_all", "write_out"]

#: What ends a line that set colours.
RESET: Final = "\x1b[0m"

#: The bytes that are plain text: all but the controls (tab and newline aside; carriage
#: return included), DEL and C2, the first byte of a C1 control (C2 80 to C2 9F) in UTF-8.
#: ``text.translate(None, _TEXT)`` is empty for a line that is text alone: one pass in C,
#: ten times as fast as a regular expression's search.
_TEXT: Final = bytes(
    b for b in range(256) if not (b < 0x20 and b not in (9, 10)) and b not in (0x7F, 0xC2)
)
_C1_B: Final = re.compile(rb"\xc2[\x80-\x9f]")
_SUSPECT_S: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: A CSI sequence that is not SGR (which is ``ESC[`` digits ; : and ``m``).
_CSI_B: Final = re.compile(rb"\x1b\[(?![0-9;:]*m)[0-?]*[ -/]*[@-~]")
_CSI_S: Final = re.compile("\x1b\\[(?![0-9;:]*m)[0-?]*[ -/]*[@-~]")
#: What is shown escaped: an ESC that does not begin an SGR sequence, every other
#: control character but tab and newline, DEL, C1.
_ESCAPED_B: Final = re.compile(
    rb"\x1b(?!\[[0-9;:]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f]|\xc2[\x80-\x9f]"
)
_ESCAPED_S: Final = re.compile("\x1b(?!\\[[0-9;:]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]")
#: An ESC that does not begin an SGR sequence.
_LONE_ESC_B: Final = re.compile(rb"\x1b(?!\[[0-9;:]*m)")
_RESET_B: Final = RESET.encode()


def _escape_b(match: re.Match[bytes]) -> bytes:
    return b"\\x%02x" % match[0][-1]  # C1's second byte is its code


def _escape_s(match: re.Match[str]) -> str:
    return f"\\x{ord(match[0]):02x}"


def _newest_frames_b(text: bytes) -> bytes:
    lines = text.split(b"\n")
    for index, line in enumerate(lines):
        if b"\r" in line:
            line = line.removesuffix(b"\r")
            lines[index] = line[line.rfind(b"\r") + 1 :]
    return b"\n".join(lines)


def _newest_frames_s(text: str) -> str:
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if "\r" in line:
            line = line.removesuffix("\r")
            lines[index] = line[line.rfind("\r") + 1 :]
    return "\n".join(lines)


def is_text(text: str) -> bool:
    """Whether ``text`` has no control character but tab and newline: it needs no filter.

    Faster than ``str.isprintable()`` (one encoding and one ``translate``, in C).
    """
    suspect = text.encode("utf-8", "surrogatepass").translate(None, _TEXT)
    return not suspect or (not suspect.strip(b"\xc2") and _SUSPECT_S.search(text) is None)


def terminal_bytes(text: bytes) -> bytes:
    """``text`` (UTF-8 lines, ``\\n`` between them) as a terminal may be sent it.

    See the module's docs for the policy.
    """
    suspect = text.translate(None, _TEXT)
    if not suspect:
        return text
    if b"\r" in suspect:
        text = _newest_frames_b(text)
    if b"\x1b" in suspect:
        text = _CSI_B.sub(b"", text)
    if suspect.translate(None, b"\x1b\r\xc2") or (b"\xc2" in suspect and _C1_B.search(text)):
        text = _ESCAPED_B.sub(_escape_b, text)  # rare: controls of every kind
    elif b"\x1b" in suspect:
        if _LONE_ESC_B.search(text) is not None:  # colours alone, most often
            text = _LONE_ESC_B.sub(rb"\\x1b", text)
    else:
        return text  # redrawn lines, or C2 A0 to C2 BF: no-break space, degree, micro
    if b"\x1b" in text:  # SGR sequences only, now
        text = text.replace(b"\n", _RESET_B + b"\n") + _RESET_B
    return text


def terminal_text(text: str) -> str:
    """:func:`terminal_bytes` for ``str`` (a record's message, a source's name)."""
    if is_text(text):
        return text
    if "\r" in text:
        text = _newest_frames_s(text)
    if "\x1b" in text:
        text = _CSI_S.sub("", text)
    text = _ESCAPED_S.sub(_escape_s, text)
    if "\x1b" in text:
        text = text.replace("\n", RESET + "\n") + RESET
    return text


def write_out(stream: TextIO | None, data: bytes) -> None:
    """All of ``data`` to ``stream``, through its bytes buffer if it has one; flushed.

    See :func:`write_all`: a text stream's own ``write`` would lose the same bytes.
    """
    if stream is None:
        return
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(data.decode("utf-8", "replace"))
        stream.flush()
        return
    stream.flush()
    write_all(buffer, data)
    while True:
        try:
            buffer.flush()
            return
        except BlockingIOError:
            _wait_writable(buffer)


def write_all(binary: BinaryIO, data: bytes) -> None:
    """All of ``data`` to ``binary``, however little each of its writes takes.

    A buffered stream takes all it is given.  A raw one makes one ``write(2)``
    and says how much it took: under ``python -u`` or ``PYTHONUNBUFFERED=1``
    ``sys.stdout.buffer`` and ``sys.stderr.buffer`` are raw, and a terminal
    that the reader has not emptied may take part of a write only.  The rest
    is written here; ignored (as by ``TextIOWrapper.write``), it was lost: the
    end of a frame of the live block, leaving a copy of its first rows on the
    screen.  A descriptor someone made non-blocking is waited on until it
    takes more.
    """
    view = memoryview(data)
    while view:
        try:
            written = binary.write(view)
        except BlockingIOError as exc:
            written = exc.characters_written
            _wait_writable(binary)
        if written is None:  # a raw stream, non-blocking, full
            _wait_writable(binary)
            written = 0
        view = view[written:]


def _wait_writable(binary: BinaryIO) -> None:
    select.select([], [binary.fileno()], [])
