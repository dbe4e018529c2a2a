"""What ``corral run`` and ``corral up`` show: ranks, the end of a run, the live block.

The command runs for real, in subprocesses, as in ``test_cli.py`` (whose
helpers these tests use): on pipes and files, and on pseudo-terminals whose
output is replayed into ``pyte`` or into :class:`Reflowing`, a small terminal
that rewraps its lines when it is resized, as most terminals do (VTE, iTerm2,
kitty, tmux; ``pyte`` and xterm cut them instead, and so cannot show what a
resize leaves behind on the others).
"""

from __future__ import annotations

import codecs
import errno
import fcntl
import io
import logging
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pyte
import pytest
from tests.cli.test_cli import (
    HEADER,
    PREFIXED,
    SUMMARY_HEADER,
    SUMMARY_ROW,
    Streaming,
    Terminal,
    corral,
    environ,
    messages,
    sh,
    ssh_args,
)
from tests.helpers.commands import corral_argv
from tests.helpers.processes import TAG_VAR, ListHandler
from tests.helpers.tmux import ScrollOnClearScreen

import corral as corral_lib

if TYPE_CHECKING:
    from tests.helpers import hosts as _hosts

pytest_plugins = ["tests.helpers.hosts"]

pytestmark = pytest.mark.timeout(60)

PY = sys.executable


def file_lines(log_dir: Path, source: str) -> list[str]:
    """The messages of ``source``'s log file in the one run folder under ``log_dir``."""
    [folder] = list(log_dir.iterdir())
    text = (folder / f"{source}.log").read_text()
    return [line.split("] ", 1)[1] for line in text.splitlines() if "] " in line]


# -- which rank said it -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "kept"),
    [(["--ranks", "0,3"], {0, 3}), (["--local_ranks_filter", "1"], {1}), ([], {0, 1, 2, 3})],
    ids=["ranks", "local-ranks-filter", "all"],
)
def test_ranks_limit_the_console_not_the_files(
    tmp_path: Path, tag: str, option: list[str], kept: set[int]
) -> None:
    logs = tmp_path / "logs"
    script = 'echo "out $RANK"; echo "err $RANK" >&2'
    out = corral(
        "run", "-n", "4", "--log-dir", str(logs), *option, "--", *sh(script), cwd=tmp_path, tag=tag
    )
    assert out.returncode == 0, out.stderr
    lines, errors = out.stdout.splitlines(), out.stderr.splitlines()
    for rank in range(4):
        source = f"agent-0.worker-{rank}"
        # Each stream where the worker wrote it, as torchrun's: stdout lines on stdout...
        assert messages(lines, source) == ([f"out {rank}"] if rank in kept else []), lines
        # ... and stderr lines on stderr, prefixed alike.
        assert messages(errors, source) == ([f"err {rank}"] if rank in kept else []), errors
        assert sorted(file_lines(logs, f"run.{source}")) == [f"err {rank}", f"out {rank}"]
    assert [line for line in lines + errors if not PREFIXED.fullmatch(line)] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "option", "split"),
    [("up", [], False), ("up", ["--split-stderr"], True), ("run", ["--merge-stderr"], False)],
    ids=["up-merges-as-honcho", "up-split", "run-merged"],
)
def test_where_the_stderr_lines_go(
    tmp_path: Path, tag: str, command: str, option: list[str], split: bool
) -> None:
    """corral run splits the streams (test above), corral up merges them, as honcho; or asked."""
    script = 'echo "out here"; echo "err here" >&2'
    if command == "up":
        (tmp_path / "Procfile").write_text(f"web: {script}\n")
        out = corral("up", *option, cwd=tmp_path, tag=tag)
        source = "web.1"
    else:
        out = corral("run", *option, "--", *sh(script), cwd=tmp_path, tag=tag)
        source = "agent-0.worker-0"
    assert out.returncode == 0, out.stderr
    lines, errors = out.stdout.splitlines(), out.stderr.splitlines()
    # (two pipes: their lines' order between them is the reader's)
    assert sorted(messages(lines, source)) == (["out here"] if split else ["err here", "out here"])
    assert messages(errors, source) == (["err here"] if split else [])


@pytest.mark.slow
@pytest.mark.parametrize("value", ["", "a", "1,x", "-1", "1.5"])
def test_bad_ranks_are_a_usage_error(tmp_path: Path, value: str) -> None:
    for option in ("--ranks", "--local-ranks-filter"):
        out = corral("run", option, value, "--", "true", cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert "is not a comma-separated list of ranks" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) <= 3  # usage, hint, error


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ranks_on_two_ssh_hosts(ssh_hosts: _hosts.SshHosts, tmp_path: Path, tag: str) -> None:
    """Global ranks count across hosts; torchrun's filter takes local ranks, on each host."""
    a, b = ssh_hosts.addresses
    command = ["env", f"{TAG_VAR}={tag}", *sh('echo "hello $RANK"')]
    base = ["run", "-n", "2", "--hosts", f"{a},{b}", *ssh_args(ssh_hosts)]
    for option, kept in ((["--local-ranks-filter", "1"], {1, 3}), (["--ranks", "2"], {2})):
        out = corral(*base, *option, "--", *command, cwd=tmp_path, tag=tag, timeout=50)
        assert out.returncode == 0, out.stderr
        shown = {}
        for match in map(PREFIXED.fullmatch, out.stdout.splitlines()):
            assert match is not None
            if match["source"].startswith("agent-") and ".worker-" in match["source"]:
                shown[int(match["rank"])] = (match["source"], match["message"])
        assert shown == {
            rank: (f"agent-{rank // 2}.worker-{rank % 2}", f"hello {rank}") for rank in kept
        }, out.stdout


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_console_label_hides_and_renames_only_on_that_console(tmp_path: Path) -> None:
    """The library's side of it: ``ConsoleHandler(label=...)``; other handlers get everything."""
    stream = io.StringIO()
    shown_names: list[str] = []

    def label(source: str) -> str | None:
        shown_names.append(source)
        return None if source.endswith(".b") else f"<{source}>"

    console = corral_lib.ConsoleHandler(stream, label=label)
    everything = ListHandler(logging.INFO)
    async with corral_lib.open_runner(
        name="lab", console=False, handlers=[console, everything]
    ) as r:
        for name in ("a", "b"):
            await r.run(
                [PY, "-c", f"print('hello {name}'); import sys; sys.stderr.write('e\\n')"],
                name=name,
            )
    text = stream.getvalue()
    assert re.search(r"^\d\d:\d\d:\d\d <lab\.a> \| hello a$", text, re.M), text
    assert "| hello b" not in text and "<lab.b>" not in text and "| e\n" in text, text
    assert sorted(everything.lines("lab.a")) == ["e", "hello a"]
    assert sorted(everything.lines("lab.b")) == ["e", "hello b"]
    assert shown_names.count("lab.a") == 1  # asked once per source


# -- the end of a run, said on stderr ---------------------------------------------------------

TALK_AND_FAIL = (
    '[ "$RANK" = 1 ] && { i=0; while [ $i -lt 12 ]; do echo "trouble $i" >&2; '
    "i=$((i + 1)); done; exit 5; }; exec sleep 30"
)


@pytest.mark.slow
def test_a_failure_is_said_on_stderr_whatever_stdout_is(tmp_path: Path, tag: str) -> None:
    """``> train.log 2> err.log``: stderr keeps the worker's stderr lines, then who failed, how.

    As under torchrun, whose workers' stderr reaches its stderr: the traceback
    is in ``err.log``, not among the stdout lines of ``train.log``.
    """
    with open(tmp_path / "train.log", "w") as log, open(tmp_path / "err.log", "w") as err:
        code = subprocess.run(
            corral_argv("run", "-n", "3", "--", *sh(TALK_AND_FAIL)),
            cwd=tmp_path,
            env=environ(tag),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=err,
            timeout=20,
        ).returncode
    assert code == 5
    errors = (tmp_path / "err.log").read_text().splitlines()
    assert messages(errors, "agent-0.worker-1") == [f"trouble {i}" for i in range(12)], errors
    assert errors[12:] == [
        "corral: rank 1 (local rank 1 on host localhost) exited with code 5; "
        "its last stderr lines:",
        *(f"  trouble {i}" for i in range(2, 12)),
    ]
    logged = (tmp_path / "train.log").read_text().splitlines()
    assert not any("trouble" in line or "last stderr lines" in line for line in logged), logged


@pytest.mark.slow
def test_up_says_its_failure_on_stderr(tmp_path: Path, tag: str) -> None:
    (tmp_path / "Procfile").write_text("web: exec sleep 30\nbad: echo 'no database' >&2; exit 4\n")
    out = corral("up", cwd=tmp_path, tag=tag)
    assert out.returncode == 4
    assert out.stderr == (
        "corral: bad.1 exited with code 4; its last stderr lines:\n  no database\n"
    )


# -- Ctrl-C ------------------------------------------------------------------------------------

#: A Python worker that says it is ready, then waits; with IGNORE set it ignores SIGINT.
WAITER = """
import os, signal, sys, time
if os.environ.get("IGNORE"):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", os.environ.get("RANK", os.environ.get("PORT")), flush=True)
time.sleep(60)
"""


def _ready(term: Terminal, count: int) -> bool:
    return bytes(term.raw).count(b"| ready ") == count and len(term.table()) == count


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "up"])
def test_ctrl_c_says_once_what_it_stops_and_keeps_the_tracebacks_off_the_console(
    tmp_path: Path, tag: str, command: str
) -> None:
    (tmp_path / "waiter.py").write_text(WAITER)
    logs = tmp_path / "logs"
    if command == "run":
        argv = corral_argv("run", "-n", "4", "--log-dir", str(logs), "--", PY, "waiter.py")
        names = [f"agent-0.worker-{rank}" for rank in range(4)]
        what = "4 workers"
    else:
        (tmp_path / "Procfile").write_text(f"web: {PY} waiter.py\nworker: {PY} waiter.py\n")
        argv = corral_argv("up", "-c", "web=2,worker=2", "--log-dir", str(logs))
        names = ["web.1", "web.2", "worker.1", "worker.2"]
        what = "4 processes"
    term = Terminal(argv, cwd=tmp_path, env=environ(tag), cols=300, rows=40)
    try:
        term.until("every process ready", lambda: _ready(term, 4))
        os.killpg(term.proc.pid, signal.SIGINT)
        assert term.finish() == 130
    finally:
        term.close()
    lines = [line for line in term.lines() if line]
    said = [line for line in lines if line.startswith("corral: Ctrl-C")]
    assert said == [
        f"corral: Ctrl-C: stopping {what} (SIGKILL in 5 s); Ctrl-C again kills them now"
    ], lines
    assert not any("Traceback" in line or line.endswith("| KeyboardInterrupt") for line in lines)
    # The summary stays: each one, stopped by the SIGINT.
    header = max(i for i, line in enumerate(lines) if SUMMARY_HEADER.fullmatch(line))
    ended = [SUMMARY_ROW.fullmatch(line) for line in lines[header + 1 : header + 5]]
    assert sorted((m["name"], m["ended"]) for m in ended if m) == [
        (name, "stopped") for name in names
    ], lines[header:]
    # Python's own way to end on an uncaught KeyboardInterrupt (sh's, under corral up).
    assert {m["how"] for m in ended if m} <= {"SIGINT", "code 130"}, lines[header:]
    [folder] = list(logs.iterdir())
    assert lines[header + 5 :] == [
        f"corral: 4 KeyboardInterrupt tracebacks of the stop not shown (in {folder})"
    ], lines[header:]
    # The files have them, each once.
    for name in names:
        text = (folder / f"{command}.{name}.log").read_text()
        assert text.count("Traceback (most recent call last):") == 1, text
        assert text.rstrip().endswith("KeyboardInterrupt"), text


@pytest.mark.slow
def test_ctrl_c_the_table_shows_each_stopping_then_one_kill_message_each(
    tmp_path: Path, tag: str
) -> None:
    """Workers that ignore SIGINT: the table counts the grace down, SIGKILL is said once each."""
    (tmp_path / "waiter.py").write_text(WAITER)
    argv = corral_argv("run", "-n", "3", "--grace", "3", "--", PY, "waiter.py")
    term = Terminal(argv, cwd=tmp_path, env=environ(tag, IGNORE="1"), cols=120, rows=40)
    try:
        term.until("every worker ready", lambda: _ready(term, 3))
        os.killpg(term.proc.pid, signal.SIGINT)

        def stopping() -> bool:
            rows = term.table()
            return len(rows) == 3 and all(
                re.fullmatch(r"stopping, [123] s left", row["state"]) for row in rows.values()
            )

        term.until("every worker stopping, with the grace left", stopping)
        assert term.finish() == 130
    finally:
        term.close()
    lines = [line for line in term.lines() if line]
    for rank in range(3):
        killing = [line for line in lines if f"agent-0.worker-{rank} (pid" in line]
        assert len(killing) == 1 and killing[0].endswith("did not stop within 3 s; killing it")
    header = max(i for i, line in enumerate(lines) if SUMMARY_HEADER.fullmatch(line))
    ended = [SUMMARY_ROW.fullmatch(line) for line in lines[header + 1 :]]
    assert [(m["ended"], m["how"]) for m in ended if m] == [("stopped", "SIGKILL")] * 3, lines


def test_a_second_ctrl_c_kills_at_once(tmp_path: Path, tag: str) -> None:
    (tmp_path / "waiter.py").write_text(WAITER)
    argv = corral_argv("run", "-n", "2", "--grace", "30", "--", PY, "waiter.py")
    running = Streaming(argv, cwd=tmp_path, env=environ(tag, IGNORE="1"))
    try:
        running.until(lambda lines: sum(" | ready " in line for line in lines) == 2)
        os.killpg(running.proc.pid, signal.SIGINT)
        running.until(lambda lines: any("Ctrl-C again kills them now" in x for x in lines))
        started = time.monotonic()
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines
        assert time.monotonic() - started < 5  # not the 30 s grace
    finally:
        running.close()
    assert sum("Ctrl-C again" in line for line in running.lines) == 1, running.lines


@pytest.mark.anyio
async def test_the_kill_after_the_grace_is_said_once() -> None:
    """A stop asked for, and the runner's own stop under way with it: one message, not two."""
    records = ListHandler(logging.INFO)
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    async with corral_lib.open_runner(name="k", console=False, handlers=[records]) as r:
        proc = await r.start([PY, "-c", script], name="stubborn", grace=0.5)
        assert await records.wait_for(lambda: "ready" in records.lines("k.stubborn"), 10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(proc.stop)
            r.cancel()
    assert proc.returncode == -signal.SIGKILL
    said = [m for m in records.messages("k") if "did not stop within" in m]
    assert len(said) == 1, records.messages("k")


# -- the live block on a terminal -------------------------------------------------------------

#: A worker with a tqdm bar; its lines and its bar fit in ``BAR_COLUMNS`` columns.
#: A rank with a tqdm bar: drawn at 0 %, held there until the test lets it go (one byte
#: on the gate, a FIFO the test holds open), then drawn to its end.
BAR_WORKER = """
import os, sys
from tqdm import tqdm
rank = os.environ["RANK"]
print(f"step 0 of {rank}", flush=True)
gate = os.open(sys.argv[1], os.O_RDONLY)
for step in tqdm(range(10), file=sys.stderr, desc=f"r{rank}", mininterval=0, ncols=NCOLS,
                 bar_format="{desc} {percentage:3.0f}%|{bar}|"):
    if step == 0:
        os.read(gate, 1)
print(f"done {rank}", flush=True)
"""


class Gate:
    """The FIFO the bar workers wait on; :meth:`open` lets ``count`` of them go."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "gate"
        os.mkfifo(self.path)
        self._fd = os.open(self.path, os.O_RDWR)  # workers' opens do not wait for a writer

    def open(self, count: int) -> None:
        os.write(self._fd, b"x" * count)

    def close(self) -> None:
        os.close(self._fd)


LIVE_LINE = re.compile(
    r"\d\d:\d\d:\d\d \[(?P<rank>\d+)\] agent-0\.worker-(?P=rank) \| "
    r"(?:step 0 of (?P=rank)|done (?P=rank)|r(?P=rank) 100%\|█+\|)"
    r"|40 processes in all: 40 exited"
)


def _check_the_end(lines: list[str]) -> None:
    """Every line whole, each said once, no copy of the live block left, the summary last."""
    shown = [line for line in lines if line]
    assert [line for line in shown if not LIVE_LINE.fullmatch(line)] == [], "\n".join(lines)
    said = {
        (int(m["rank"]), m.group(0).split("| ", 1)[1].split()[0])
        for m in map(LIVE_LINE.fullmatch, shown[:-1])
        if m is not None
    }
    expected = {(rank, what) for rank in range(40) for what in ("step", "done", f"r{rank}")}
    assert expected - said == set(), "\n".join(lines)
    assert len(shown) == 3 * 40 + 1, "\n".join(lines)
    assert shown[-1] == "40 processes in all: 40 exited"
    assert not any(HEADER.fullmatch(line) for line in lines)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cols", "rows"), [(60, 20), (80, 24), (120, 30)])
def test_forty_workers_with_a_bar_each_at_several_sizes(
    tmp_path: Path, tag: str, cols: int, rows: int
) -> None:
    (tmp_path / "bar.py").write_text(BAR_WORKER.replace("NCOLS", "20"))
    gate = Gate(tmp_path)
    argv = corral_argv("run", "-n", "40", "--no-color", "--", PY, "bar.py", str(gate.path))
    term = Terminal(argv, cwd=tmp_path, env=environ(tag), cols=cols, rows=rows)
    try:
        term.until("bars and the table", lambda: b"more progress bars" in term.raw, 60)
        gate.open(40)
        assert term.finish(60) == 0
    finally:
        term.close()
        gate.close()
    _check_the_end(term.lines())


class Reflowing:
    """A terminal that rewraps its lines when it is resized (VTE, iTerm2, kitty, tmux do).

    It understands what the console writes: text, CR, LF, cursor up (CSI A),
    to a column (CSI G), erase in line (CSI K), erase below (CSI J), delete
    lines (CSI M), autowrap
    off and on (CSI ?7l, CSI ?7h: off, a line is cut at the right edge); other
    sequences are ignored.  Rows that scroll off the top go to the
    scrollback, which the cursor cannot reach.  A resize rewraps every line,
    those below the cursor too, and keeps the cursor on the screen.
    """

    _CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")
    _PARTIAL = re.compile(r"\x1b(\[[0-9;?]*)?")

    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.buffer: list[list[str]] = [[]]
        self.wrapped = [False]
        self.y = self.x = 0
        self.autowrap = True
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @property
    def top(self) -> int:
        return min(max(0, len(self.buffer) - self.rows), self.y)

    def feed(self, data: bytes) -> None:
        text = self._pending + self._decoder.decode(data)
        self._pending = ""
        i = 0
        while i < len(text):
            char = text[i]
            if char == "\x1b":
                match = self._CSI.match(text, i)
                if match is None:
                    if self._PARTIAL.fullmatch(text, i):
                        self._pending = text[i:]
                        return
                    i += 1
                    continue
                self._csi(match[1], match[2])
                i = match.end()
                continue
            if char == "\r":
                self.x = 0
            elif char == "\n":
                self._down()
            elif char >= " ":
                self._put(char)
            i += 1

    def _down(self) -> None:
        self.y += 1
        if self.y == len(self.buffer):
            self.buffer.append([])
            self.wrapped.append(False)

    def _put(self, char: str) -> None:
        if self.x >= self.cols and not self.autowrap:
            self.x = self.cols - 1  # the last column is written over
        elif self.x >= self.cols:
            self.wrapped[self.y] = True
            self._down()
            self.x = 0
        row = self.buffer[self.y]
        row.extend(" " * (self.x - len(row)))
        if self.x < len(row):
            row[self.x] = char
        else:
            row.append(char)
        self.x += 1

    def _csi(self, params: str, final: str) -> None:
        number = int(params) if params.isdigit() else None
        if params == "?7" and final in "hl":
            self.autowrap = final == "h"
        elif final == "A":
            self.y = max(self.top, self.y - (number or 1))
        elif final == "G":
            self.x = (number or 1) - 1
        elif final == "K":
            if number == 2:
                self.buffer[self.y] = []
            else:
                del self.buffer[self.y][self.x :]
            self.wrapped[self.y] = False
        elif final == "J" and not number:
            del self.buffer[self.y][self.x :]
            del self.buffer[self.y + 1 :]
            del self.wrapped[self.y + 1 :]
            self.wrapped[self.y] = False
        elif final == "M":  # delete lines: those below move up; to the left margin
            end = self.y + (number or 1)
            del self.buffer[self.y : end]
            del self.wrapped[self.y : end]
            if self.y == len(self.buffer):
                self.buffer.append([])
                self.wrapped.append(False)
            self.x = 0

    def logical(self) -> tuple[list[list[str]], int, int]:
        """The lines as written (wrapped rows joined); the cursor's line and offset in it."""
        lines: list[list[str]] = []
        line: list[str] = []
        at = (0, 0)
        for y, row in enumerate(self.buffer):
            if y == self.y:
                at = (len(lines), len(line) + self.x)
            line.extend(row)
            if not self.wrapped[y]:
                lines.append(line)
                line = []
        if line:
            lines.append(line)
        return lines, at[0], at[1]

    def resize(self, cols: int, rows: int) -> None:
        lines, cursor_line, offset = self.logical()
        while len(lines) > cursor_line + 1 and not lines[-1]:
            lines.pop()  # blank rows below the cursor
        self.cols, self.rows = cols, rows
        self.buffer, self.wrapped = [], []
        for index, line in enumerate(lines):
            start = len(self.buffer)
            pieces = [line[i : i + cols] for i in range(0, len(line), cols)] or [[]]
            self.buffer.extend(pieces)
            self.wrapped.extend([True] * (len(pieces) - 1) + [False])
            if index == cursor_line:
                self.y, self.x = start + offset // cols, offset % cols
                if offset and offset % cols == 0 and offset == len(line):
                    self.y, self.x = self.y - 1, cols
                while self.y >= len(self.buffer):
                    self.buffer.append([])
                    self.wrapped.append(False)

    def lines(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.logical()[0]]


class ReplayTerminal(Terminal):
    """:class:`Terminal` whose output is kept and replayed at the end into :class:`Reflowing`.

    A resize takes effect where the output read so far ends, once what was
    on its way is read (a frame still on its way, written for the old size,
    would meet the new one: the race every terminal has, made smaller).
    Nothing is replayed while the command runs, so a fast stream of frames
    costs the test little; :meth:`replay_pyte` replays it into pyte, which
    cuts lines on a resize instead of rewrapping them.
    """

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str], cols: int, rows: int):
        super().__init__(argv, cwd=cwd, env=env, cols=cols, rows=rows)
        self.size = (cols, rows)
        self.resizes: list[tuple[int, int, int]] = []  # (offset, cols, rows)

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return
        try:
            chunk = os.read(self.master, 65536)
        except OSError as exc:  # EIO: no slave descriptor is open any more
            if exc.errno != errno.EIO:
                raise
            chunk = b""
        if not chunk:
            self.eof = True
        self.raw += chunk

    def resize(self, cols: int, rows: int) -> None:
        size = -1
        while size != len(self.raw) and not self.eof:
            size = len(self.raw)
            self._read(0)
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.resizes.append((len(self.raw), cols, rows))
        os.killpg(self.proc.pid, signal.SIGWINCH)

    def replay(self) -> list[str]:
        screen = Reflowing(*self.size)
        done = 0
        for offset, cols, rows in self.resizes:
            screen.feed(bytes(self.raw[done:offset]))
            screen.resize(cols, rows)
            done = offset
        screen.feed(bytes(self.raw[done:]))
        return screen.lines()

    def replay_pyte(self) -> list[str]:
        cols, rows = self.size
        screen = ScrollOnClearScreen(cols, rows, history=10_000)
        stream = pyte.ByteStream(screen)
        done = 0
        for offset, cols, rows in self.resizes:
            stream.feed(bytes(self.raw[done:offset]))
            screen.resize(rows, cols)
            done = offset
        stream.feed(bytes(self.raw[done:]))
        history = [
            "".join(line[x].data for x in range(screen.columns)).rstrip()
            for line in screen.history.top
        ]
        return history + [line.rstrip() for line in screen.display]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("before", "after"), [((120, 30), (60, 24)), ((60, 24), (120, 30))], ids=["narrower", "wider"]
)
def test_the_live_block_survives_a_resize(
    tmp_path: Path, tag: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """Bars and table drawn wide, the terminal made narrower (or wider) meanwhile.

    A rewrapping terminal then shows each wide pinned line on two rows; the
    console must clear all of them, and leave no stale copy of the block.
    """
    # Bars drawn wide before a narrowing; lines that fit the narrow size before widening.
    ncols = "70" if before[0] > after[0] else "20"
    (tmp_path / "bar.py").write_text(BAR_WORKER.replace("NCOLS", ncols))
    gate = Gate(tmp_path)
    argv = corral_argv("run", "-n", "40", "--no-color", "--", PY, "bar.py", str(gate.path))
    term = ReplayTerminal(argv, cwd=tmp_path, env=environ(tag), cols=before[0], rows=before[1])
    try:
        term.until("bars and the table", lambda: b"more progress bars" in term.raw, 60)
        drawn = len(term.raw)
        term.until("a redraw", lambda: term.raw.count(b"more progress bars", drawn) >= 2, 30)
        term.resize(*after)
        gate.open(40)  # every bar goes on to its end at the new size
        assert term.finish(60) == 0
    finally:
        term.close()
        gate.close()
    _check_the_end(term.replay())
    if after[0] > before[0]:  # wider: what a terminal that does not rewrap shows
        _check_the_end(term.replay_pyte())


#: A rank that redraws a wide bar as fast as a busy program would, until told to stop.
FAST_BAR = """
import os, sys, time
rank = os.environ["RANK"]
i = 0
while not os.path.exists("stop"):
    i += 1
    fill = "#" * (i % 64) + " " * (63 - i % 64)
    sys.stderr.write(f"\\rbar of rank {rank} {i % 100:3d}%|{fill}|")
    sys.stderr.flush()
    time.sleep(0.01)
sys.stderr.write(f"\\rbar of rank {rank} done\\n")
"""
#: Eight sizes, two at a time: the second comes before the command has drawn for the first,
#: and together they narrow the screen to a third (each pinned line drawn 120 columns wide
#: then takes three rows, the block more than the screen), or widen it again.
SIZES = [((70, 20), (40, 12)), ((90, 26), (120, 30)), ((60, 18), (42, 14)), ((100, 28), (120, 30))]


def test_a_frame_made_for_a_wider_terminal_is_still_cleared() -> None:
    """The race of every resize, made certain: the console reads 120 columns and
    draws for them, but the terminal is 40 columns wide when the frame arrives.

    Each pinned line is cut at the edge (autowrap off while they are drawn), so
    the move back to their start counts the rows they took, and the next draw
    clears all of them: no row of an old frame stays above the lines."""
    from corral._logs._console import ConsoleHandler

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    stream = open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    screen = Reflowing(40, 12)  # narrowed before any of it arrived

    def arrived() -> None:
        while select.select([master], [], [], 0)[0]:
            screen.feed(os.read(master, 65536))

    try:
        console = ConsoleHandler(stream, colour=False)
        for frame in range(3):
            console.set_footer([f"{frame} {'x' * 100}".encode(), b"y" * 100])
            arrived()
            console.say(f"line {frame}", stream)
            arrived()
        console.close()
        arrived()
    finally:
        stream.close()
        os.close(master)
    assert [line for line in screen.lines() if line] == ["line 0", "line 1", "line 2"]


def test_pinned_lines_redrawn_from_the_top_row_leave_nothing_in_a_history_kept_on_clear() -> None:
    """tmux keeps its whole screen in its history when a program erases it from the top-left
    cell (``scroll-on-clear``, its default): pinned lines drawn on a cleared screen and drawn
    again and again, with and without lines above them, must leave nothing of theirs there."""
    from corral._logs._console import ConsoleHandler

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    stream = open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    screen = ScrollOnClearScreen(80, 24, history=1000)
    feed = pyte.ByteStream(screen)

    def arrived() -> None:
        while select.select([master], [], [], 0)[0]:
            feed.feed(os.read(master, 65536))

    try:
        console = ConsoleHandler(stream, colour=False)
        for frame in range(30):
            console.set_footer([f"table {frame}".encode(), b"row a", b"row b"])
            arrived()
            if frame % 10 == 9:
                console.say(f"line {frame}", stream)
                arrived()
        console.close()
        arrived()
    finally:
        stream.close()
        os.close(master)
    history = ["".join(line[x].data for x in range(80)).rstrip() for line in screen.history.top]
    shown = [line.rstrip() for line in screen.display]
    assert [line for line in history + shown if line] == ["line 9", "line 19", "line 29"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_rapid_resizes_leave_no_stale_lines(tmp_path: Path, tag: str) -> None:
    """Eight resizes while six ranks redraw their bars: on a terminal that rewraps (replayed
    with each resize where the output read then ended), nothing of the live block stays."""
    (tmp_path / "bar.py").write_text(FAST_BAR)
    argv = corral_argv("run", "-n", "6", "--no-color", "--", PY, "bar.py")
    term = ReplayTerminal(argv, cwd=tmp_path, env=environ(tag), cols=120, rows=30)
    try:
        term.until("the bars", lambda: term.raw.count(b"%|") >= 30)
        for first, second in SIZES:
            term.resize(*first)
            term.resize(*second)
            drawn = term.raw.count(b"\r")  # every frame has some (at any width)
            term.until("frames", lambda drawn=drawn: term.raw.count(b"\r") >= drawn + 100)
        (tmp_path / "stop").touch()
        assert term.finish(30) == 0
    finally:
        term.close()
    shown = [line for line in term.replay() if line]
    done = [line for line in shown if re.fullmatch(r"\S+ \[\d\] \S+ \| bar of rank \d done", line)]
    summary = shown.index(next(line for line in shown if SUMMARY_HEADER.fullmatch(line)))
    assert len(done) == 6 and shown[:summary] == done, "\n".join(shown)
    ended = [SUMMARY_ROW.fullmatch(line) for line in shown[summary + 1 :]]
    assert len(ended) == 6 and all(m and m["ended"] == "exited" for m in ended), "\n".join(shown)


#: On SIGINT, each rank writes a traceback: rank 0 a KeyboardInterrupt's, rank 1 another
#: exception's, rank 2 a KeyboardInterrupt's longer than the console holds back, rank 3 one
#: as torch prints it once a process group is initialised (distributed_c10d's excepthook:
#: ``[rank3]: `` before every line).
TRACEBACKS = """
import os, signal, sys, time
rank = os.environ["RANK"]
def on_interrupt(*_):
    count = 4000 if rank == "2" else 3
    frames = "".join(f'  File "x.py", line {i}, in f\\n' for i in range(count))
    end = "ValueError: not an interrupt" if rank == "1" else "KeyboardInterrupt"
    text = "Traceback (most recent call last):\\n" + frames + end + "\\n"
    if rank == "3":
        text = "\\n".join(f"[rank3]: {line}" if line else "" for line in text.split("\\n"))
    sys.stderr.write(text)
    sys.stderr.flush()
    os._exit(1)
signal.signal(signal.SIGINT, on_interrupt)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_only_keyboard_interrupt_tracebacks_are_held_back_and_only_so_much(
    tmp_path: Path, tag: str
) -> None:
    (tmp_path / "tb.py").write_text(TRACEBACKS)
    argv = corral_argv("run", "-n", "4", "--", PY, "tb.py")
    running = Streaming(argv, cwd=tmp_path, env=environ(tag))
    try:
        running.until(lambda lines: sum(line.endswith("| ready") for line in lines) == 4)
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines[-20:]
    finally:
        running.close()
    said = {rank: messages(running.lines, f"agent-0.worker-{rank}") for rank in range(4)}
    assert said[0] == said[3] == ["ready"]
    assert said[1] == [
        "ready",
        "Traceback (most recent call last):",
        *(f'  File "x.py", line {i}, in f' for i in range(3)),
        "ValueError: not an interrupt",
    ]
    # Longer than HELD_BYTES: shown whole, in order, once.
    assert said[2][:2] == ["ready", "Traceback (most recent call last):"]
    assert said[2][2:-1] == [f'  File "x.py", line {i}, in f' for i in range(4000)]
    assert said[2][-1] == "KeyboardInterrupt"
    assert running.lines[-1] == (
        "corral: 2 KeyboardInterrupt tracebacks of the stop not shown "
        "(not kept; --log-dir keeps them)"
    )


@pytest.mark.slow
def test_the_summary_tells_the_failure_from_the_workers_stopped_for_it(
    tmp_path: Path, tag: str
) -> None:
    script = '[ "$RANK" = 1 ] && { sleep 0.5; exit 3; }; echo "up $RANK"; exec sleep 30'
    argv = corral_argv("run", "-n", "3", "--", *sh(script))
    term = Terminal(argv, cwd=tmp_path, env=environ(tag), cols=200, rows=40)
    try:
        assert term.finish() == 3
    finally:
        term.close()
    lines = [line for line in term.lines() if line]
    header = max(i for i, line in enumerate(lines) if SUMMARY_HEADER.fullmatch(line))
    ended = [SUMMARY_ROW.fullmatch(line) for line in lines[header + 1 : header + 4]]
    assert [(m["name"], m["ended"], m["how"]) for m in ended if m] == [
        ("agent-0.worker-0", "stopped", "SIGTERM"),
        ("agent-0.worker-1", "failed", "code 3"),
        ("agent-0.worker-2", "stopped", "SIGTERM"),
    ], lines[header:]
    assert lines[header + 4 :] == [
        "corral: rank 1 (local rank 1 on host localhost) exited with code 3 "
        "(it wrote nothing to stderr)"
    ], lines[header:]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ctrl_c_on_two_ssh_hosts(ssh_hosts: _hosts.SshHosts, tmp_path: Path, tag: str) -> None:
    """Remote workers too: one line says what stops, no traceback reaches the console."""
    a, b = ssh_hosts.addresses
    command = ["env", f"{TAG_VAR}={tag}", PY, "-c", WAITER]
    argv = corral_argv(
        "run", "-n", "2", "--hosts", f"{a},{b}", *ssh_args(ssh_hosts), "--", *command
    )
    running = Streaming(argv, cwd=tmp_path, env=environ(tag))
    try:
        running.until(lambda lines: sum(" | ready " in line for line in lines) == 4)
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish(30) == 130, running.lines
    finally:
        running.close()
    said = [line for line in running.lines if line.startswith("corral: Ctrl-C")]
    assert said == [
        "corral: Ctrl-C: stopping 4 workers on 2 hosts (SIGKILL in 5 s); "
        "Ctrl-C again kills them now"
    ], running.lines
    assert not any("Traceback" in line for line in running.lines), running.lines


#: A bar drawn once, in its final state, and ended a moment later: its state was
#: logged to files at once (the first frame is), and the terminal must still keep it.
@pytest.mark.slow
def test_a_bar_logged_already_stays_on_the_terminal_as_a_line(
    anyio_backend: str, tmp_path: Path, tag: str
) -> None:
    from tests.logs.test_progress import _run_on_terminal, _screen
    from tests.programs import program

    raw = _run_on_terminal(
        tmp_path,
        anyio_backend,
        [("bar", program("raw_output", "one-frame-bar"))],
        colour=False,
        tag=tag,
    )
    shown = [row for row in _screen(raw) if row]
    assert len(shown) == 1 and re.fullmatch(r"\d\d:\d\d:\d\d corral\.bar \| copied 100%", shown[0])
