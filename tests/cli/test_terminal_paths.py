"""A child's escape sequences reach no terminal: every path, on a pseudo-terminal and a pipe.

The paths: a runner's own console (a launcher program, the console on its stderr),
``corral run``, ``corral up`` and ``corral tail``.  Each runs for real with its output (stdout
and stderr together) on a pseudo-terminal or a pipe, and a child that prints the hostile
sequences of the field (a window title, the clipboard, a screen clear, device queries, DCS, APC
and PM strings, a reset, NUL, BELs, a C1 CSI) among colours and a progress bar.  None of them
may reach the output; each shows escaped, colours and the bar's last frame pass; ``--raw``
lets them all through.  The filter itself is tested in tests/logs/test_terminal.py.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import pytest
from tests.cli.test_cli import environ
from tests.helpers.commands import corral_argv

pytestmark = pytest.mark.timeout(60)

#: The child: every hostile sequence on stdout, some on stderr, a bar, colours, then a marker.
HOSTILE_SH = r"""
printf 'title \033]0;pwned\007 clip \033]52;c;aGVsbG8=\007 clear \033[2J\033[3J home \033[H\n'
printf 'query \033[6n\033[c\033[>c\033[21t dcs \033Pq#0\033\\ apc \033_Ga=T\033\\ pm \033^x\033\\\n'
printf 'reset \033c nul \000 bells \007\007\007 c1 \302\233\062J back \010\010 \033[31mred\033[0m\n'
printf 'stderr \033]52;c;aGVsbG8=\007 \033[2J\n' >&2
printf '10%%\r50%%\r100%% done\n'
printf 'DONE-MARKER\n'
"""

#: What may never reach the output (as raw bytes), and what shows instead.
FORBIDDEN = [
    b"\x1b]",
    b"\x1b[2J",
    b"\x1b[3J",
    b"\x1b[H",
    b"\x1b[6n",
    b"\x1b[c",
    b"\x1b[>c",
    b"\x1b[21t",
    b"\x1bP",
    b"\x1b_",
    b"\x1b^",
    b"\x1bc",
    b"\x00",
    b"\x07",
    b"\x08",
    b"\xc2\x9b",
]
SHOWN = [
    b"title \\x1b]0;pwned\\x07 clip \\x1b]52;c;aGVsbG8=\\x07 clear  home",
    b"dcs \\x1bPq#0\\x1b\\ apc \\x1b_Ga=T\\x1b\\ pm \\x1b^x\\x1b\\",
    b"reset \\x1bc nul \\x00 bells \\x07\\x07\\x07 c1 \\x9b2J back \\x08\\x08",
    b"\x1b[31mred\x1b[0m",  # colours pass
    b"stderr \\x1b]52;c;aGVsbG8=\\x07",
    b"100% done",
]

#: A launcher with the runner's own console (on its stderr); with a monitor for the tail,
#: whose URL it prints, and then it waits for its stdin to close.
LAUNCHER = textwrap.dedent(
    """
    import sys, anyio, corral
    async def main():
        tail = sys.argv[2] == "tail"
        async with corral.open_runner(
            name="demo", console=not tail, monitor="127.0.0.1:0" if tail else None
        ) as r:
            if tail:
                print("url", r.monitor_url, flush=True)
            await r.run(["sh", sys.argv[1]])
            if tail:
                await anyio.to_thread.run_sync(sys.stdin.read)
    anyio.run(main)
    """
)


class Output:
    """A command whose stdout and stderr are one pseudo-terminal, or one pipe; all it wrote."""

    def __init__(self, argv: list[str], kind: str, cwd: Path, env: dict[str, str]) -> None:
        if kind == "pty":
            self.fd, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
            stdin: int = slave
        else:
            self.fd, slave = os.pipe()
            stdin = subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=stdin, stdout=slave, stderr=slave
            )
        finally:
            os.close(slave)
        self.data = bytearray()
        self.eof = False

    def until(self, marker: bytes | None, timeout: float = 20) -> None:
        """Read until ``marker`` has come (``None``: until the end)."""
        deadline = time.monotonic() + timeout
        while not self.eof and (marker is None or marker not in self.data):
            left = deadline - time.monotonic()
            assert left > 0, f"{marker!r} did not come: {bytes(self.data)!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError as exc:  # EIO: the pty's last slave was closed
                if exc.errno != errno.EIO:
                    raise
                chunk = b""
            self.eof = not chunk
            self.data += chunk
        assert marker is None or marker in self.data, bytes(self.data)

    def finish(self) -> int:
        self.until(None)
        return self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.fd)


def check(out: bytes, raw: bool = False) -> None:
    if raw:
        assert b"\x1b]52;c;aGVsbG8=\x07" in out and b"\x00" in out, out
        return
    leaked = [bad for bad in FORBIDDEN if bad in out]
    assert not leaked, (leaked, out)
    missing = [text for text in SHOWN if text not in out]
    assert not missing, (missing, out)


def command(path: str, tmp_path: Path, *extra: str) -> list[str]:
    script = tmp_path / "hostile.sh"
    script.write_text(HOSTILE_SH)
    if path == "runner":
        launcher = tmp_path / "launcher.py"
        launcher.write_text(LAUNCHER)
        return [sys.executable, str(launcher), str(script), "console"]
    if path == "run":
        return corral_argv("run", *extra, "--", "sh", str(script))
    (tmp_path / "Procfile").write_text(f"evil: sh {script}\n")
    return corral_argv("up", *extra)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pty", "pipe"])
@pytest.mark.parametrize("path", ["runner", "run", "up"])
def test_no_escape_reaches_the_output(path: str, kind: str, tmp_path: Path, tag: str) -> None:
    out = Output(command(path, tmp_path), kind, tmp_path, environ(tag))
    try:
        assert out.finish() == 0, bytes(out.data)
    finally:
        out.close()
    check(bytes(out.data))


@pytest.mark.slow
def test_raw_lets_every_sequence_through(tmp_path: Path, tag: str) -> None:
    out = Output(command("run", tmp_path, "--raw"), "pipe", tmp_path, environ(tag))
    try:
        assert out.finish() == 0, bytes(out.data)
    finally:
        out.close()
    check(bytes(out.data), raw=True)


@pytest.mark.slow
def test_no_escape_reaches_corral_tail(tmp_path: Path, tag: str) -> None:
    """Three tails of one runner: on a pty, on a pipe, and with --raw."""
    script = tmp_path / "hostile.sh"
    script.write_text(HOSTILE_SH)
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    runner = subprocess.Popen(
        [sys.executable, str(launcher), str(script), "tail"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environ(tag),
    )
    tails: list[Output] = []
    try:
        assert runner.stdout is not None and runner.stdin is not None
        url = runner.stdout.readline().split()[1].decode()
        for kind, extra in (("pty", []), ("pipe", []), ("pipe", ["--raw"])):
            tails.append(Output(corral_argv("tail", url, *extra), kind, tmp_path, environ(tag)))
        for tail in tails:
            tail.until(b"DONE-MARKER")
        runner.stdin.close()  # the runner ends: so do the tails
        for tail in tails:
            assert tail.finish() == 0, bytes(tail.data)
        assert runner.wait(10) == 0
    finally:
        for tail in tails:
            tail.close()
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    for tail, raw in zip(tails, (False, False, True), strict=True):
        check(bytes(tail.data), raw=raw)


def test_the_command_writes_all_of_what_a_raw_stdout_takes_in_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The command's stdout (its guard against a reader that went away) and its own lines on
    stderr write the rest of what a raw stream (``python -u``) did not take at once."""
    from tests.logs.test_terminal import _drained, _raw_stream_taking_part

    from corral._cli._io import Stdout, say

    text = "".join(f"line {i:06d} {'x' * 40}\n" for i in range(20_000))
    stream, read = _raw_stream_taking_part()
    stdout = Stdout(stream)
    assert stdout.buffer is not None
    buffer = stdout.buffer
    assert _drained(read, lambda: buffer.write(text.encode()), stream.close).decode() == text
    assert not stdout.gone and stdout.error is None

    stream, read = _raw_stream_taking_part()
    monkeypatch.setattr(sys, "stderr", stream)
    line = "y" * 1_000_000
    assert _drained(read, lambda: say(line), stream.close).decode() == line + "\n"
