"""``corral run`` and ``corral up``: nothing outlives the command, a daemon included.

The command contains with a cgroup of its runner's own (the suite runs as
root) and as a child subreaper; ``--no-contain`` turns both off.  The
processes are those of :mod:`tests.core.test_contain`: each starts a
double-forked daemon, a ``setsid`` grandchild and a daemon that ignores
SIGTERM, which report their pids once they are in sessions of their own.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from tests.cli.test_cli import Streaming, environ
from tests.core.test_contain import ESCAPES, escaped
from tests.helpers.commands import corral_argv
from tests.helpers.processes import TAG_VAR, is_alive, tagged_pids, wait_gone

from corral._sys import _cgroup

pytestmark = pytest.mark.timeout(30)


def _argv(command: str, tmp_path: Path, *more: str) -> list[str]:
    (tmp_path / "escapes.sh").write_text(ESCAPES)
    if command == "run":
        return corral_argv("run", "-n", "1", "--grace", "0.2", *more, "--", "sh", "escapes.sh")
    (tmp_path / "Procfile").write_text("web: sh escapes.sh\n")
    return corral_argv("up", "--grace", "0.2", *more)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "up"])
def test_ctrl_c_stops_what_left_the_process_groups(tmp_path: Path, tag: str, command: str) -> None:
    running = Streaming(_argv(command, tmp_path), cwd=tmp_path, env=environ(tag))
    try:
        running.until(lambda lines: len(escaped(lines)) == 3)
        pids = escaped(running.lines)
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines
        assert [kind for kind, pid in pids.items() if is_alive(pid)] == [], running.lines
        assert tagged_pids(tag) == []
        assert any("left outside their process groups" in line for line in running.lines)
    finally:
        running.close()


@pytest.mark.slow
def test_no_contain_leaves_what_left_the_process_groups(tmp_path: Path, tag: str) -> None:
    """``--no-contain``: the process groups are stopped, a daemon is not (as documented)."""
    running = Streaming(_argv("up", tmp_path, "--no-contain"), cwd=tmp_path, env=environ(tag))
    try:
        running.until(lambda lines: len(escaped(lines)) == 3)
        pids = escaped(running.lines)
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines
        assert all(is_alive(pid) for pid in pids.values())
    finally:
        running.close()
        left = tagged_pids(tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert wait_gone(left, 10) == []


def test_a_second_ctrl_c_ends_the_grace_of_what_is_left(tmp_path: Path, tag: str) -> None:
    _argv("up", tmp_path)
    running = Streaming(corral_argv("up", "--grace", "30"), cwd=tmp_path, env=environ(tag))
    try:
        running.until(lambda lines: len(escaped(lines)) == 3)
        pids = escaped(running.lines)
        os.killpg(running.proc.pid, signal.SIGINT)
        running.until(lambda lines: any("left outside their process groups" in x for x in lines))
        started = time.monotonic()
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines
        assert time.monotonic() - started < 10  # not the 30 s grace
        assert [kind for kind, pid in pids.items() if is_alive(pid)] == []
    finally:
        running.close()


@pytest.mark.slow
def test_without_a_cgroup_the_subreaper_stops_even_a_daemon_without_a_mark(
    tmp_path: Path, tag: str
) -> None:
    """A read-only cgroup file system (as in many containers): the subreaper alone.

    One more daemon clears its environment (but for the test's tag), so that
    nothing marks it as the runner's: the command, which owns its process,
    stops every child it still has once the runner is done.
    """
    hierarchy, _ = _cgroup.find_hierarchy()
    script = ESCAPES.replace(
        "echo ready",
        f"( env -i {TAG_VAR}=${TAG_VAR} setsid sh -c 'echo \"unmarked $$\"; exec sleep 1000' & )\n"
        "echo ready",
    )
    (tmp_path / "escapes.sh").write_text(script)
    (tmp_path / "Procfile").write_text("web: sh escapes.sh\n")
    argv = [
        "unshare", "-m", "sh", "-c",
        f"mount -o remount,bind,ro {hierarchy} && exec \"$@\"", "unshare",
        *corral_argv("up", "--grace", "0.2"),
    ]  # fmt: skip
    running = Streaming(argv, cwd=tmp_path, env=environ(tag))
    try:
        running.until(
            lambda lines: len(escaped(lines)) == 3 and any("unmarked" in x for x in lines)
        )
        unmarked = [int(x.split()[-1]) for x in running.lines if "unmarked" in x]
        pids = [*escaped(running.lines).values(), *unmarked]
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.finish() == 130, running.lines
        assert [pid for pid in pids if is_alive(pid)] == [], running.lines
        assert any("left behind" in line for line in running.lines), running.lines
    finally:
        running.close()
