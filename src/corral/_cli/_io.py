"""What the command says: its stdout (whose reader going is a stop), one-line errors, exit codes."""

from __future__ import annotations

import os
import select
import stat
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from .._logs._terminal import terminal_text, write_all, write_out

if TYPE_CHECKING:
    from .._sys._backend import LoopHandle

__all__ = [
    "EXIT_PIPE",
    "Stdout",
    "call_soon",
    "check_written",
    "exit_code",
    "fail",
    "say",
    "shorten",
]


def exit_code(returncode: int) -> int:
    """The shell's convention: a signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


#: The exit code after stdout was closed under the command: 128 + SIGPIPE, the
#: code a program killed by SIGPIPE at its next write has.
EXIT_PIPE = 141

#: What a write raises once the reader of a pipe or socket has gone.
_READER_GONE = (BrokenPipeError, ConnectionResetError)
#: What a pipe or socket reports once its reader has gone.
_HANG_UP = select.POLLERR | select.POLLHUP


def say(message: str) -> None:
    """One line of corral's own on stderr (nothing if nobody reads stderr any more).

    It may quote what others wrote (ssh's message about a host, a server's
    answer): the console's policy for a terminal applies to it.
    """
    try:
        line = terminal_text(message.replace("\n", " ")) + "\n"
        write_out(sys.stderr, line.encode("utf-8", "replace"))
    except _READER_GONE:
        _silence(sys.stderr)


def fail(message: str, code: int) -> NoReturn:
    say(f"corral: error: {message}")
    sys.exit(code)


def _silence(stream: Any) -> None:
    """Point the descriptor under ``stream`` at /dev/null, its reader being gone.

    What is left in the stream's buffer then goes nowhere instead of failing
    again when the interpreter flushes it at exit (which would print an
    "Exception ignored" message and turn the exit code into 120).
    """
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


def shorten(value: str, limit: int = 40) -> str:
    """``repr(value)``, cut to about ``limit`` characters: user input quoted on one line."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class Stdout:
    """``sys.stdout`` as the console writes to it: a reader that went away is a stop.

    A program whose stdout is a pipe (``corral run ... | head -1``) gets
    SIGPIPE at its first write after the reader has gone, and dies of it.
    Python ignores SIGPIPE and raises :class:`BrokenPipeError` instead, here
    on the log router's thread, where it would stop nothing.  This wrapper
    does what SIGPIPE would, in order: once the reader is gone (a write
    failed, or :meth:`watch` saw it go) it drops every later write (no
    error, no work), points the descriptor at /dev/null, and calls the
    :meth:`when_gone` callback once, which stops the run; the command then
    exits with :data:`EXIT_PIPE`.  Any other error writing to stdout (a full
    disk) stops the run the same way, and the command exits with 1 and says
    why (:attr:`error`), as ``echo hi > /dev/full`` does.
    """

    name = "<stdout>"

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        raw = getattr(stream, "buffer", None)
        self.buffer = None if raw is None else StdoutBytes(self, raw)
        self._lock = threading.Lock()
        self._gone = False
        self._on_closed: Callable[[], None] | None = None
        #: What a write raised that was not the reader going, if one did.
        self.error: OSError | None = None

    @property
    def gone(self) -> bool:
        """Whether the reader has gone (every write since was dropped)."""
        return self._gone

    def when_gone(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the reader goes (now, if it has gone already).

        It is called from the thread that found out: a log handler's, or the watch's.
        """
        with self._lock:
            self._on_closed = callback
            gone = self._gone
        if gone:
            callback()

    def guard(self, call: Callable[..., object], *args: Any) -> None:
        """``call(*args)``, unless the reader has gone; a write that finds it gone stops."""
        if self._gone:
            return
        try:
            call(*args)
        except _READER_GONE:
            self._went()
        except OSError as exc:
            self._went(exc)

    def _went(self, error: OSError | None = None) -> None:
        with self._lock:
            if self._gone:
                return
            self._gone = True
            self.error = error
            callback = self._on_closed
        _silence(self._stream)
        if callback is not None:
            callback()

    async def watch(self) -> None:
        """Notice the reader going even while nothing is written; run it in a task group.

        Only a pipe or a socket is watched: when its reader goes, the kernel
        reports an error or a hang-up on it, whatever events were asked for,
        and the loop wakes whoever waits for it to be readable.  A file never
        closes under the command, and a terminal that goes away sends SIGHUP.
        """
        try:
            fd = self._stream.fileno()
            mode = os.fstat(fd).st_mode
        except (OSError, ValueError, AttributeError):
            return
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return
        poller = select.poll()
        poller.register(fd, 0)  # only what is always reported: POLLERR, POLLHUP, POLLNVAL
        while not self._gone:
            await anyio.wait_readable(fd)
            if any(events & _HANG_UP for _, events in poller.poll(0)):
                self._went()
                return
            if stat.S_ISSOCK(mode):
                return  # a peer that writes back: its data is not ours to read

    def write(self, text: str) -> int:
        self.guard(self._stream.write, text)
        return len(text)

    def flush(self) -> None:
        self.guard(self._stream.flush)

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def fileno(self) -> int:
        return int(self._stream.fileno())


class StdoutBytes:
    """The binary side of :class:`Stdout` (``sys.stdout.buffer``), guarded the same way."""

    def __init__(self, owner: Stdout, raw: Any) -> None:
        self._owner = owner
        self._raw = raw

    def write(self, data: bytes) -> int:
        self._owner.guard(write_all, self._raw, data)  # all of it, a raw stream's too
        return len(data)

    def flush(self) -> None:
        self._owner.guard(self._raw.flush)


def check_written(stdout: Stdout) -> None:
    """Exit with 1 and say why if stdout failed otherwise than by its reader going."""
    if stdout.error is not None:
        fail(f"cannot write to stdout: {stdout.error.strerror or stdout.error}", 1)


def call_soon(loop: LoopHandle, fn: Callable[[], object]) -> None:
    """``fn()`` on ``loop`` soon, from any thread; nothing if the loop has finished."""
    try:
        loop.call_soon_threadsafe(fn)
    except anyio.RunFinishedError:
        pass
