"""Progress bars: lines redrawn with carriage returns, in records, in files and on a terminal.

A child drawing a bar (tqdm) must not turn into one huge record or a flood of
records: files and handlers get the bar's state at most once a second and its
last state when the line ends; on a terminal the console draws the bar in place
under the child's prefix.  The terminal tests run a launcher on a
pseudo-terminal and replay what it wrote in a terminal emulator (pyte).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import math
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest
from tests.helpers.loops import OTHER_LOOP, one_loop
from tests.helpers.processes import TAG_VAR, ListHandler
from tests.programs import program

import corral

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# One loop (tests/helpers/loops.py): lines are split, progress frames kept and the console
# drawn on a worker thread whatever the loop.  One end-to-end case runs on the other.
anyio_backend = one_loop()

PY = sys.executable

#: "At most once a second", as the requirement says.
INTERVAL = 1.0

#: One tqdm frame of ``desc="work", ncols=80``: nothing before it, nothing after it.
FRAME = re.compile(r"work: +\d{1,3}%\|[ ▏▎▍▌▋▊▉█]*\| +\d+/2000 \[[^\]\r\n]*\]")
FINAL_FRAME = re.compile(r"work: 100%\|█+\| 2000/2000 \[[^\]\r\n]*\]")


LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\w+) +\[(stdout|stderr)\] (.*)")
COMBINED_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\w+) +(\S+) \[(stdout|stderr)\] (.*)"
)


def _lines_of(logs: ListHandler, source: str, stream: str) -> list[str]:
    return [
        r.getMessage()
        for r in logs.records
        if getattr(r, "corral_source", None) == source
        and getattr(r, "corral_stream", None) == stream
    ]


def _created_of(logs: ListHandler, source: str, messages: list[str]) -> list[float]:
    wanted = set(messages)
    return [
        r.created
        for r in logs.records
        if getattr(r, "corral_source", None) == source and r.getMessage() in wanted
    ]


def _file_text(path: Path) -> str:
    # Bytes, not read_text(): universal newlines would turn a stray "\r" into a line break.
    return path.read_bytes().decode("utf-8")


def _file_lines(path: Path, stream: str) -> list[str]:
    """Messages of one stream in a per-source log file."""
    found = []
    for line in _file_text(path).split("\n"):
        if not line:
            continue
        match = LOG_LINE.fullmatch(line)
        assert match is not None, f"unexpected line in {path.name}: {line!r}"
        if match.group(2) == stream:
            found.append(match.group(3))
    return found


def _combined_lines(path: Path, source: str, stream: str) -> list[str]:
    """Messages of one source's stream in combined.log."""
    found = []
    for line in _file_text(path).split("\n"):
        match = COMBINED_LINE.fullmatch(line)
        if match is not None and match.group(2) == source and match.group(3) == stream:
            found.append(match.group(4))
    return found


# -- files and handlers ----------------------------------------------------------------------


@pytest.mark.slow
async def test_tqdm_bar_reaches_files_and_handlers_about_once_a_second(
    tmp_path: Path, tag: str
) -> None:
    logs = ListHandler()
    async with corral.open_runner(name="pb", console=False, handlers=[logs], log_dir=tmp_path) as r:
        started = time.monotonic()
        result = await r.run(
            program("tqdm_bar", 2000, "work", "both"), name="bar", extra_env={TAG_VAR: tag}
        )
        elapsed = time.monotonic() - started
        assert r.log_path is not None
        folder = Path(r.log_path)
    assert result.returncode == 0

    # Ordinary lines arrive whole and in order, on both streams.
    assert _lines_of(logs, "pb.bar", "stdout") == ["out before", "out after"]
    err = _lines_of(logs, "pb.bar", "stderr")
    assert err[0] == "err before", err
    assert err[-1] == "err after", err
    bars = err[1:-1]

    # Every bar record is one frame: no concatenated frames, no carriage returns.
    for message in bars:
        assert FRAME.fullmatch(message), f"not one bar frame: {message[:300]!r}"
        assert len(message) <= 80
    # The last one is the final state.
    assert FINAL_FRAME.fullmatch(bars[-1]), bars
    # A handful: at most one per second of the run, plus the last state at the end.
    bound = math.floor(elapsed / INTERVAL) + 2
    assert 2 <= len(bars) <= bound, f"{len(bars)} bar records in {elapsed:.2f} s: {bars}"
    # The states before the last one are at least a second apart.
    created = _created_of(logs, "pb.bar", bars[:-1])
    assert len(created) == len(bars) - 1
    gaps = [b - a for a, b in itertools.pairwise(created)]
    assert all(gap >= INTERVAL - 0.002 for gap in gaps), gaps

    # The per-source file and combined.log say the same, and nothing else.
    own = folder / "pb.bar.log"
    combined = folder / "combined.log"
    assert "\r" not in _file_text(own)
    assert "\r" not in _file_text(combined)
    assert _file_lines(own, "stderr") == err
    assert _file_lines(own, "stdout") == ["out before", "out after"]
    assert _combined_lines(combined, "pb.bar", "stderr") == err
    assert _combined_lines(combined, "pb.bar", "stdout") == ["out before", "out after"]


async def test_megabytes_of_frames_without_a_newline_stay_small(tmp_path: Path, tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(name="pb", console=False, handlers=[logs], log_dir=tmp_path) as r:
        started = time.monotonic()
        await r.run(program("raw_output", "frames"), name="flood", extra_env={TAG_VAR: tag})
        elapsed = time.monotonic() - started
        assert r.log_path is not None
        folder = Path(r.log_path)

    lines = logs.lines("pb.flood")
    assert lines, "no record at all"
    assert all(len(line) <= 10_000 for line in lines), [len(line) for line in lines]
    # Not even two frames glued together: each record is (part of) one frame.
    assert all(len(line) <= len("frame 0000000 ") for line in lines), lines
    assert all("\r" not in line and "\n" not in line for line in lines), lines
    # The final state arrives at exit, last.
    assert lines[-1] == "frame final", lines
    assert len(lines) <= math.floor(elapsed / INTERVAL) + 2, f"{lines} in {elapsed:.2f} s"

    own = folder / "pb.flood.log"
    assert own.stat().st_size < 10_000
    assert _file_lines(own, "stdout") == lines
    assert _combined_lines(folder / "combined.log", "pb.flood", "stdout") == lines


# -- CRLF is not a progress bar ---------------------------------------------------------------


@OTHER_LOOP
async def test_crlf_line_endings_are_ordinary_lines(tmp_path: Path, tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(name="pb", console=False, handlers=[logs], log_dir=tmp_path) as r:
        await r.run(program("raw_output", "crlf"), name="crlf", extra_env={TAG_VAR: tag})
        assert r.log_path is not None
        folder = Path(r.log_path)
    expected = [f"crlf line {i:04d}" for i in range(3000)] + ["last"]
    assert _lines_of(logs, "pb.crlf", "stdout") == expected
    assert _lines_of(logs, "pb.crlf", "stderr") == ["an error", "another error"]
    own = folder / "pb.crlf.log"
    assert "\r" not in _file_text(own)
    assert _file_lines(own, "stdout") == expected
    assert _file_lines(own, "stderr") == ["an error", "another error"]


async def test_crlf_split_between_reads_is_one_ordinary_line(tmp_path: Path, tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(name="pb", console=False, handlers=[logs], log_dir=tmp_path) as r:
        await r.run(program("raw_output", "crlf-split"), name="split", extra_env={TAG_VAR: tag})
        assert r.log_path is not None
        folder = Path(r.log_path)
    assert logs.lines("pb.split") == ["one", "two", "three"]
    assert _file_lines(folder / "pb.split.log", "stdout") == ["one", "two", "three"]


async def test_a_state_already_logged_is_not_logged_again_when_the_line_ends(tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(name="pb", console=False, handlers=[logs]) as r:
        await r.run(program("raw_output", "same-state"), name="same", extra_env={TAG_VAR: tag})
    assert logs.lines("pb.same") == ["download 100%", "next line"]


# -- on a terminal ----------------------------------------------------------------------------

COLUMNS, ROWS = 120, 30


STAMP = r"\d\d:\d\d:\d\d"
SCREEN_BAR = re.compile(
    STAMP + r" corral\.bar \| work: 100%\|█+\| 1000/1000 \[\d\d:\d\d<00:00, +[\d.]+it/s\]"
)


def _run_on_terminal(
    tmp_path: Path, backend: str, children: list[tuple[str, list[str]]], *, colour: bool, tag: str
) -> bytes:
    """Run ``console_runner.py`` (the ``children`` at once, under a runner with the default
    console) on a pseudo-terminal; return every byte it wrote there."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")
    }
    if not colour:
        env["NO_COLOR"] = "1"
    env[TAG_VAR] = tag
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        proc = subprocess.Popen(
            program("console_runner", backend, json.dumps(children)),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + 45
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"the launcher did not finish; it wrote {b''.join(chunks)[-2000:]!r}"
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError as exc:
                if exc.errno == errno.EIO:  # every holder of the terminal has closed it
                    break
                raise
            if not data:
                break
            chunks.append(data)
        returncode = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    raw = b"".join(chunks)
    assert returncode == 0, raw[-3000:]
    return raw


def _screen(raw: bytes) -> list[str]:
    """The terminal's final screen, row by row (trailing blanks removed)."""
    screen = pyte.Screen(COLUMNS, ROWS)
    stream = pyte.ByteStream(screen)
    stream.feed(raw)
    return [row.rstrip() for row in screen.display]


@pytest.mark.slow
def test_bar_is_drawn_in_place_on_a_terminal(anyio_backend: str, tmp_path: Path, tag: str) -> None:
    raw = _run_on_terminal(
        tmp_path,
        anyio_backend,
        [("bar", program("tqdm_bar", 1000, "work", "stderr"))],
        colour=True,
        tag=tag,
    )
    rows = _screen(raw)
    shown = [row for row in rows if row]
    # Exactly three lines: the line before, the bar's final state, the line after.
    assert len(shown) == 3, rows
    assert re.fullmatch(STAMP + r" corral\.bar \| before the bar", shown[0]), shown
    assert SCREEN_BAR.fullmatch(shown[1]), shown
    assert re.fullmatch(STAMP + r" corral\.bar \| after the bar", shown[2]), shown
    assert rows[:3] == shown, rows  # one after the other, from the top: no blank gaps
    # It was redrawn in place many times, not printed once.
    percents = re.findall(rb"work: +(\d+)%", raw)
    assert len(percents) >= 10, raw[-2000:]
    assert len(set(percents)) >= 3, set(percents)
    # The ordinary lines were written once each.
    assert raw.count(b"before the bar") == 1
    assert raw.count(b"after the bar") == 1


@pytest.mark.slow
def test_other_lines_are_not_garbled_by_bars(anyio_backend: str, tmp_path: Path, tag: str) -> None:
    """Two bars at once, and a third child's lines scrolling above them."""
    second_bar = program("tqdm_bar", 700, "more", "stderr")
    raw = _run_on_terminal(
        tmp_path,
        anyio_backend,
        [
            ("bar", program("tqdm_bar", 1000, "work", "stderr")),
            ("bar2", second_bar),
            ("talker", program("talker")),
        ],
        colour=False,
        tag=tag,
    )
    rows = _screen(raw)
    shown = [row for row in rows if row]
    talk = re.compile(STAMP + r" corral\.talker \| talk (\d\d) x{60}")
    said = []
    for row in shown:
        if "corral.talker" in row:
            match = talk.fullmatch(row)
            assert match is not None, f"garbled line {row!r} in {rows}"
            said.append(int(match.group(1)))
    assert sorted(said) == list(range(15)), rows
    # Each bar once, in its final state; each bar's own lines whole and in order.
    second_final = re.compile(
        STAMP + r" corral\.bar2 \| more: 100%\|█+\| 700/700 \[\d\d:\d\d<00:00, +[\d.]+it/s\]"
    )
    for source, final in (("bar", SCREEN_BAR), ("bar2", second_final)):
        own = [row for row in shown if f" corral.{source} | " in row]
        assert len(own) == 3, rows
        assert re.fullmatch(STAMP + rf" corral\.{source} \| before the bar", own[0]), rows
        assert final.fullmatch(own[1]), rows
        assert re.fullmatch(STAMP + rf" corral\.{source} \| after the bar", own[2]), rows
    assert len(shown) == 15 + 2 * 3, rows
    assert rows[: len(shown)] == shown, rows
    # In the raw output too, each line of the talker was written once, whole...
    talked = []
    for i in range(15):
        line = rb"\d\d:\d\d:\d\d corral\.talker \| talk %02d x{60}\r\n" % i
        found = list(re.finditer(line, raw))
        assert len(found) == 1, (i, raw[-2000:])
        talked.append(found[0].start())
    # ... while the bars were being redrawn (most of it, at least).
    redraws = [m.start() for m in re.finditer(rb"(work|more): +\d+%", raw)]
    assert len(redraws) >= 20
    assert sum(redraws[0] < at < redraws[-1] for at in talked) >= 5, (talked, redraws[::50])
