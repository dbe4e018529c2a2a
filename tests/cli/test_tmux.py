"""The live block in a real tmux, with tmux's defaults: nothing of it reaches the history.

tmux moves its whole screen into its history when a program erases it from the
top-left cell (``scroll-on-clear``, on by default), and when it is narrowed it
rewraps from the bottom and pushes the top of its screen into the history.  A
live block redrawn by erasing, from the top row of a fresh or cleared window,
left a copy of itself there at each redraw (hundreds in a run).  These tests
run ``corral run`` in tmux (``tests/helpers/tmux.py``) with ranks that only
redraw a bar, so that the block sits at the top of a cleared window, and read
the whole history at the end: only the final lines may be there.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from tests.cli.test_cli import environ
from tests.helpers.commands import corral_argv
from tests.helpers.tmux import Tmux

pytestmark = pytest.mark.timeout(90)

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

DONE = re.compile(r"\d\d:\d\d:\d\d \[(\d)\] agent-0\.worker-\1 \| bar of rank \1 done")

#: Resizes, each drawn for before the next: narrower (to a third, once in two steps),
#: shorter, wider, taller, both at once.
RESIZES = [
    (70, 20), (40, 12), (120, 30), (60, 30), (120, 15), (42, 14), (100, 28), (50, 40),
    (120, 30), (40, 30),
]  # fmt: skip


def _frames(tmux: Tmux) -> int:
    return tmux.raw.count(b"\r")  # every frame has some, at any width


@pytest.mark.slow
@pytest.mark.parametrize("resizes", [[], RESIZES], ids=["still", "resized"])
def test_tmux_keeps_no_copy_of_the_live_block_in_its_history(
    tmp_path: Path, tag: str, resizes: list[tuple[int, int]]
) -> None:
    (tmp_path / "bar.py").write_text(FAST_BAR)
    argv = corral_argv("run", "-n", "6", "--no-color", "--", sys.executable, "bar.py")
    tmux = Tmux(argv, cwd=tmp_path, env=environ(tag), cols=120, rows=30)
    try:
        # Many redraws of bars and table, from the top row of the window.
        tmux.until("the bars", lambda: tmux.raw.count(b"%|") >= 300)
        for cols, rows in resizes:
            tmux.resize(cols, rows)
            drawn = _frames(tmux)
            tmux.until("frames at the new size", lambda drawn=drawn: _frames(tmux) >= drawn + 100)
        (tmp_path / "stop").touch()
        assert tmux.finish() == 0
        lines = [line for line in tmux.history() if line]
    finally:
        tmux.close()
    assert lines[-1] == "@@corral-test-end 0@@", lines
    lines = lines[:-1]
    done = [line for line in lines if DONE.fullmatch(line)]
    assert len(done) == 6 and lines[:6] == done, "\n".join(lines)
    # The summary, as wide as the window at the end (40 columns: cut).
    summary = lines[6:]
    if summary != ["6 processes in all: 6 exited"]:
        assert re.fullmatch(r"name\s+ended\s+how.*", summary[0]), "\n".join(lines)
        rows = [re.fullmatch(r"agent-0\.worker-(\d)\s+exit.*", line) for line in summary[1:]]
        assert sorted(m[1] for m in rows if m) == list("012345"), "\n".join(lines)
