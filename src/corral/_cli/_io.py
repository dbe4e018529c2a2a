"""What the command says: its stdout (whose reader going is a stop), one-line errors, exit codes.

And how a Ctrl-C ends the command's start.  The command imports most of what
it needs as it starts (click, AnyIO, the runner, the console), and a Ctrl-C
that lands in the middle of an import was a ``KeyboardInterrupt`` traceback
from a module nobody asked about, or, caught by the wrong ``except``, an exit
with 0 or 1.  So from the console script's first line (:func:`take_ctrl_c`,
in ``__main__``) until the runner holds SIGINT (``handle_signals=True``,
before it starts anything), the signal is this module's, in three stages:

* ``"start"``, until the event loop runs: nothing has been made yet, so a
  Ctrl-C says so in one line on stderr and ends the process at once with 130
  (``os._exit``: no exit handler runs half-imported modules' code);
* ``"pending"`` (:func:`ctrl_c_stage`), while the loop starts the runner (a log
  folder, the lifeline, a cgroup are being made, which a sudden end could
  leave behind): a Ctrl-C is only noted (:func:`ctrl_c_pending`), and the
  command stops as soon as the runner holds the signal, having started
  nothing;
* ``"ended"``, once the runner's block is over (it hands the signal back): a
  Ctrl-C is noted, and the command exits with 130 once it has said how the
  run went.

:func:`python_handles_ctrl_c` gives the signal back to Python
(``KeyboardInterrupt``), for what the command does after its loop and for
the commands that start no runner (``tail``, ``status``), whose loop handles it.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from .._logs._terminal import terminal_text, write_all, write_out

if TYPE_CHECKING:
    from .._sys._backend import LoopHandle

__all__ = [
    "EXIT_PIPE",
    "STOPPED_EARLY",
    "Stdout",
    "call_soon",
    "check_written",
    "ctrl_c_pending",
    "ctrl_c_stage",
    "exit_code",
    "fail",
    "python_handles_ctrl_c",
    "say",
    "shorten",
    "take_ctrl_c",
]

#: What a Ctrl-C before the runner holds the signal says.
STOPPED_EARLY = "corral: Ctrl-C: stopped before anything started"


class _Start:
    """Where the command's start is (see the module's docs), and whether a Ctrl-C came."""

    stage = "start"
    pending = False


def _on_ctrl_c(signum: int, frame: object) -> None:
    if _Start.stage == "start":
        try:
            os.write(2, STOPPED_EARLY.encode() + b"\n")
        finally:
            os._exit(130)
    _Start.pending = True


def take_ctrl_c() -> None:
    """The console script's first step: Ctrl-C is the command's own (not if it was ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)


def ctrl_c_stage(name: str) -> None:
    """The command's start is at stage ``name`` now: ``"pending"`` or ``"ended"``."""
    _Start.stage = name


def ctrl_c_pending() -> bool:
    """Whether a Ctrl-C came while the runner did not hold the signal (yet, or any more)."""
    return _Start.pending


def python_handles_ctrl_c() -> None:
    """Ctrl-C is Python's again (``KeyboardInterrupt``), if it is still the command's."""
    if signal.getsignal(signal.SIGINT) is _on_ctrl_c:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
        from anyio import wait_readable

        poller = select.poll()
        poller.register(fd, 0)  # only what is always reported: POLLERR, POLLHUP, POLLNVAL
        while not self._gone:
            await wait_readable(fd)
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
    from anyio import RunFinishedError

    try:
        loop.call_soon_threadsafe(fn)
    except RunFinishedError:
        pass
