"""A real tmux, with its default options: a server of its own, one window, its whole history.

tmux keeps in its history what scrolls off the top of its screen, and, with its
``scroll-on-clear`` option (on by default), the whole screen whenever a program
erases it from the top-left cell (``ESC[J`` there, or ``ESC[2J``).  When it is
narrowed it rewraps every line and keeps the bottom of its screen in place:
what the rewrapping adds pushes the top of the screen into the history.  A
test runs a command in :class:`Tmux` and reads the history with
:meth:`Tmux.history`.

:class:`ScrollOnClearScreen` is pyte's screen taught ``scroll-on-clear``, for the
tests that replay a terminal's output.

The server has its own socket (``tmux -L``) and no configuration (``-f
/dev/null``), so neither a user's tmux nor their ``.tmux.conf`` plays a part.
The window's output is copied (``pipe-pane``) to a FIFO the test reads, so a
test waits on what the command wrote, never by sleeping.  The server is stopped
by its recorded pid.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyte
import pytest
from pyte.screens import StaticDefaultDict
from tests.helpers.processes import wait_gone

#: The line the window's script writes once the command has ended: its exit code.
_END = re.compile(rb"@@corral-test-end (\d+)@@")


def tmux_program() -> str:
    """The ``tmux`` program (Debian's, in CI: ``.ci/apt-packages.txt``); skip without it."""
    path = shutil.which("tmux")
    if path is None:
        pytest.skip("tmux is not installed (Debian's tmux: .ci/apt-packages.txt)")
    return path


class Tmux:
    """``argv`` in the one window of a tmux server of its own, ``cols`` x ``rows``.

    The window starts on a cleared screen (``ESC[H ESC[2J``, as ``clear``
    does); the command starts once the window's output is being copied to
    the test, so none of it is missed.
    """

    def __init__(
        self, argv: list[str], *, cwd: Path, env: dict[str, str], cols: int, rows: int
    ) -> None:
        self.program = tmux_program()
        self.socket = f"corral-test-{uuid.uuid4().hex[:16]}"
        self.raw = bytearray()
        self.code: int | None = None
        self._env = env
        fifo = cwd / "pane-output"
        os.mkfifo(fifo)
        # Opened first, without waiting for a writer: pipe-pane's ``cat`` then opens at once.
        self._output = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        script = (
            "tmux wait-for go; printf '\\033[H\\033[2J'; \"$@\"; "
            "printf '\\n@@corral-test-end %s@@\\n' $?; exec tmux wait-for never"
        )
        self.pid: int | None = None
        try:
            self._tmux(
                "new-session", "-d", "-s", "test", "-x", str(cols), "-y", str(rows),
                "-c", str(cwd), "sh", "-c", script, "sh", *argv,
            )  # fmt: skip
            self.pid = int(self._tmux("display-message", "-p", "-t", "test", "#{pid}"))
            self._tmux("pipe-pane", "-O", "-t", "test", f"exec cat > {shlex.quote(str(fifo))}")
            self._tmux("wait-for", "-S", "go")
        except BaseException:
            self.close()
            raise

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            [self.program, "-L", self.socket, "-f", "/dev/null", *args],
            env=self._env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise AssertionError(f"tmux {shlex.join(args)} failed: {done.stderr}{done.stdout}")
        return done.stdout.strip()

    def until(self, what: str, predicate: Callable[[], bool], timeout: float = 30) -> None:
        """Read the window's output until ``predicate()`` holds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                tail = bytes(self.raw[-2000:]).decode("utf-8", "replace")
                raise AssertionError(f"{what} did not show; the output ended with:\n{tail!r}")
            if select.select([self._output], [], [], left)[0]:
                try:
                    self.raw += os.read(self._output, 65536)
                except BlockingIOError:
                    pass

    def finish(self, timeout: float = 30) -> int:
        """Read the output until the command has ended; its exit code."""
        self.until("the end of the command", lambda: _END.search(self.raw) is not None, timeout)
        match = _END.search(self.raw)
        assert match is not None
        self.code = int(match[1])
        return self.code

    def resize(self, cols: int, rows: int) -> None:
        """Make the window ``cols`` x ``rows`` (tmux rewraps its lines)."""
        self._tmux("resize-window", "-t", "test", "-x", str(cols), "-y", str(rows))

    def history(self) -> list[str]:
        """Every line tmux holds, its history then its screen; wrapped lines joined."""
        text = self._tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", "test")
        return [line.rstrip() for line in text.split("\n")]

    def close(self) -> None:
        """Stop the server (and the window's processes), by its recorded pid if it lingers."""
        try:
            if self.pid is not None:
                try:
                    self._tmux("kill-server")
                except (AssertionError, subprocess.TimeoutExpired):
                    pass
                if wait_gone([self.pid], 10):
                    os.kill(self.pid, signal.SIGKILL)
                    wait_gone([self.pid], 10)
        finally:
            os.close(self._output)


class ScrollOnClearScreen(pyte.HistoryScreen):
    """pyte's screen with tmux's ``scroll-on-clear``: an erase of the whole screen keeps it.

    An erase from the top-left cell to the end (``ESC[J`` there) or of the
    whole screen (``ESC[2J``) first moves the screen's lines, down to the last
    that holds anything, into the history, as tmux does by default.
    """

    def erase_in_display(self, how: int = 0, *args: object, **kwargs: object) -> None:
        top_left = self.cursor.x == 0 and self.cursor.y == 0
        if how == 2 or (how == 0 and top_left):
            used = [
                y
                for y in range(self.lines)
                if any(char.data != " " for char in self.buffer[y].values())
            ]
            for y in range(max(used) + 1 if used else 0):
                kept = StaticDefaultDict(self.default_char)
                kept.update(self.buffer[y])
                self.history.top.append(kept)
        super().erase_in_display(how, *args, **kwargs)  # type: ignore[arg-type]
