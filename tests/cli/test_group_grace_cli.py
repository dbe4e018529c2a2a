"""``corral up`` and ``corral run`` give a command that a shell runs without ``exec`` its grace.

A Procfile line without ``exec`` (``web: python app.py; echo after``) and ``corral run --
sh -c "..."`` run the program as a child of ``sh``, in the same process group.  On SIGTERM,
Ctrl-C or a sibling's exit, ``sh`` dies at once; the program keeps the grace for its
clean-up (as under honcho), and only what is left when the grace ends gets SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from tests.cli.test_cli import environ
from tests.helpers.commands import Child, corral_argv
from tests.helpers.processes import release, still_running, tagged_pids
from tests.programs import path as program_path

pytestmark = pytest.mark.timeout(60)

GRACEFUL = program_path("graceful")


def _graceful(out: Path, seconds: float) -> str:
    return f"{sys.executable} {GRACEFUL} {out} {seconds}; echo after"


def _ready(line: str) -> bool:
    return line.rstrip().endswith("ready")


def test_up_gives_a_line_without_exec_its_grace_when_a_sibling_exits(
    tmp_path: Path, tag: str
) -> None:
    out, fifo = tmp_path / "out", tmp_path / "go"
    os.mkfifo(fifo)
    (tmp_path / "Procfile").write_text(f"web: {_graceful(out, 1.0)}\nquit: read x < {fifo}\n")
    argv = corral_argv("up", "--no-status", "--grace", "30")
    with Child(argv, tmp_path / "err", env=environ(tag), cwd=tmp_path) as up:
        up.wait_line(_ready, timeout=30)
        release(fifo)  # quit exits: every other process is stopped
        up.finish(timeout=40)
    assert out.read_text() == "cleaning SIGTERM\nclean\n", up.text()
    assert not still_running(tagged_pids(tag))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_up_gives_a_line_without_exec_its_grace_on_a_signal(
    tmp_path: Path, tag: str, signum: int
) -> None:
    out = tmp_path / "out"
    (tmp_path / "Procfile").write_text(f"web: {_graceful(out, 1.0)}\n")
    argv = corral_argv("up", "--no-status", "--grace", "30")
    with Child(argv, tmp_path / "err", env=environ(tag), cwd=tmp_path) as up:
        up.wait_line(_ready, timeout=30)
        up.proc.send_signal(signum)
        up.finish(timeout=40)
    name = signal.Signals(signum).name
    assert out.read_text() == f"cleaning {name}\nclean\n", up.text()
    assert not still_running(tagged_pids(tag))


def test_run_gives_sh_c_its_grace_on_sigterm(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    argv = corral_argv("run", "--no-status", "--grace", "30", "--", "sh", "-c", _graceful(out, 1))
    with Child(argv, tmp_path / "err", env=environ(tag), cwd=tmp_path, merge=True) as run:
        run.wait_line(_ready, timeout=30)
        run.proc.send_signal(signal.SIGTERM)
        run.finish(timeout=40)
    assert out.read_text() == "cleaning SIGTERM\nclean\n", run.text()
    assert not still_running(tagged_pids(tag))
