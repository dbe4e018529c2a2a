"""Containment: what a child leaves outside its process group is stopped with the runner.

Each child here starts three descendants that leave its process group, each
in a session of its own: a daemon (double fork: its parent is gone at once),
a ``setsid`` grandchild (its parent, the child, stays), and a daemon that
ignores SIGTERM.  Each says its pid once it is in its new session, so that
nothing here waits by time: the runner's group kill can no longer reach it.
The application's own children (``subprocess.Popen``, one of them in a
session of its own too) must be left alone.

The cgroup path needs root and cgroup v2 (``/sys/fs/cgroup`` or, on a hybrid
host, ``/sys/fs/cgroup/unified``); the suite runs as root.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.helpers.processes import (
    TAG_VAR,
    ListHandler,
    children_of,
    is_alive,
    tagged_pids,
    wait_gone,
)
from tests.programs import path as program_path

import corral
from corral._sys import _cgroup, _contain

#: A child that starts three descendants outside its process group, then waits.
ESCAPES = textwrap.dedent(
    """\
    ( setsid sh -c 'echo "daemon $$"; exec sleep 1000' & )
    setsid sh -c 'echo "grandchild $$"; exec sleep 1000' &
    ( setsid sh -c 'trap "" TERM; echo "stubborn $$"; exec sleep 1000' & )
    echo ready
    exec sleep 1000
    """
)
KINDS = ("daemon", "grandchild", "stubborn")
LINE = re.compile(r"(daemon|grandchild|stubborn) (\d+)")


def escaped(lines: list[str]) -> dict[str, int]:
    """The pids the descendants reported, by kind."""
    found = {}
    for line in lines:
        match = LINE.search(line)
        if match:
            found[match[1]] = int(match[2])
    return found


def runner_cgroups(name: str) -> list[str]:
    """The cgroups of runners named ``name`` that exist now."""
    parent, _ = _cgroup.find_hierarchy()
    return [e for e in os.listdir(parent) if e.startswith(f"corral.{name}.")]


@pytest.fixture
def own_children(tag: str) -> list[subprocess.Popen[bytes]]:
    """Two children of the application's own, one in a session of its own; killed at the end."""
    env = {**os.environ, TAG_VAR: tag}
    procs = [
        subprocess.Popen(["sleep", "1000"], env=env),
        subprocess.Popen(["sleep", "1000"], env=env, start_new_session=True),
    ]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_cgroup_can_be_made_here() -> None:
    """The machine the suite runs on can contain (root, cgroup v2): the tests below mean it."""
    cgroup = _cgroup.Cgroup.create("probe")
    try:
        assert os.path.exists(cgroup.procs)
        assert not cgroup.populated()
    finally:
        assert cgroup.remove()
    assert not os.path.exists(cgroup.path)


@pytest.mark.anyio
async def test_what_leaves_its_group_is_stopped_with_the_runner(
    tag: str, own_children: list[subprocess.Popen[bytes]]
) -> None:
    handler = ListHandler()
    async with corral.open_runner(
        name="contained", console=False, handlers=[handler], grace=0.2
    ) as r:
        proc = await r.start(["sh", "-c", ESCAPES], extra_env={TAG_VAR: tag})
        assert await handler.wait_for(lambda: len(escaped(handler.lines("contained.sh"))) == 3, 10)
        pids = escaped(handler.lines("contained.sh"))
        assert runner_cgroups("contained")
        r.cancel()
    assert proc.returncode == -signal.SIGTERM
    assert [kind for kind in KINDS if is_alive(pids[kind])] == []
    assert any("left outside their process groups" in m for m in handler.messages())
    assert runner_cgroups("contained") == []
    # The application's own children were not touched.
    assert all(p.poll() is None for p in own_children)
    assert sorted(tagged_pids(tag)) == sorted(p.pid for p in own_children)


@pytest.mark.anyio
async def test_without_containment_what_leaves_its_group_outlives_the_runner(tag: str) -> None:
    """``contain=False``: as documented, only the process groups are stopped."""
    handler = ListHandler()
    try:
        async with corral.open_runner(
            name="loose", console=False, handlers=[handler], contain=False
        ) as r:
            await r.start(["sh", "-c", ESCAPES], extra_env={TAG_VAR: tag})
            assert await handler.wait_for(lambda: len(escaped(handler.lines("loose.sh"))) == 3, 10)
            pids = escaped(handler.lines("loose.sh"))
            assert runner_cgroups("loose") == []
            r.cancel()
        assert all(is_alive(pid) for pid in pids.values())
    finally:
        left = tagged_pids(tag)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert wait_gone(left, 10) == []


@pytest.mark.anyio
async def test_as_a_subreaper_without_a_cgroup_the_orphans_are_stopped_and_reaped(
    tag: str, own_children: list[subprocess.Popen[bytes]]
) -> None:
    """``subreaper=True`` (opt-in): the orphans that carry the runner's mark, no other child."""
    assert not _contain.is_subreaper()
    handler = ListHandler()
    async with corral.open_runner(
        name="adopter",
        console=False,
        handlers=[handler],
        grace=0.2,
        contain=False,
        subreaper=True,
    ) as r:
        assert _contain.is_subreaper()
        proc = await r.start(["sh", "-c", ESCAPES], extra_env={TAG_VAR: tag})
        assert await handler.wait_for(lambda: len(escaped(handler.lines("adopter.sh"))) == 3, 10)
        pids = escaped(handler.lines("adopter.sh"))
        # The double-forked daemons were handed to us, not to init.
        assert os.getpid() in (_parent(pids["daemon"]), _parent(pids["stubborn"]))
        await proc.stop()  # the grandchild is orphaned now too
    assert not _contain.is_subreaper()
    assert [kind for kind in KINDS if is_alive(pids[kind])] == []
    assert [pid for pid in pids.values() if pid in _contain.children()] == []  # reaped
    assert all(p.poll() is None for p in own_children)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


@pytest.mark.anyio
async def test_a_child_started_as_another_user_is_moved_in_by_the_launcher() -> None:
    """It cannot move itself (the cgroup is root's): the launcher does, before start() returns."""
    async with corral.open_runner(name="other-user", console=False) as r:
        proc = await r.start(["sleep", "1000"], user="nobody")
        with open(f"/proc/{proc.pid}/cgroup") as f:
            assert "/corral.other-user." in f.read().splitlines()[-1]
        await proc.stop()


@pytest.mark.anyio
async def test_the_environment_stays_exactly_the_one_given() -> None:
    """The step through ``/bin/sh`` that moves a child in adds nothing (dash exports PWD)."""
    async with corral.open_runner(name="env", console=False) as r:
        result = await r.run(["/usr/bin/env"], env={"ONLY": "this"}, stdout=corral.PIPE)
        with_pwd = await r.run(["/usr/bin/env"], env={"PWD": "/elsewhere"}, stdout=corral.PIPE)
    names = {line.split("=", 1)[0] for line in result.stdout.decode().splitlines()}
    assert "PWD" not in names and "ONLY" in names
    assert "PWD=/elsewhere" in with_pwd.stdout.decode().splitlines()


@pytest.mark.parametrize(
    "content",
    [
        b"\x7fELF\x02\x01\x01" + bytes(9) + b"not really an ELF file",
        b"echo no interpreter line\n",
        b"#!/no/such/interpreter\necho hi\n",
    ],
    ids=["broken-elf", "no-shebang", "missing-interpreter"],
)
@pytest.mark.anyio
async def test_a_program_that_cannot_run_fails_the_start_as_with_subprocess(
    tmp_path: Path, content: bytes
) -> None:
    """Through the shell step a failing ``exec`` would only be an exit code: checked first."""
    program = tmp_path / "prog"
    program.write_bytes(content)
    program.chmod(0o755)
    with pytest.raises(OSError) as expected:
        subprocess.Popen([str(program)])
    async with corral.open_runner(name="cannot", console=False) as r:
        with pytest.raises(OSError) as raised:
            await r.start([str(program)])
    assert type(raised.value) is type(expected.value)
    assert (raised.value.errno, raised.value.filename) == (expected.value.errno, str(program))


def test_bad_options_are_refused() -> None:
    with pytest.raises(TypeError, match="contain must be True or False"):
        corral.open_runner(contain="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="subreaper must be True or False"):
        corral.open_runner(subreaper=1)  # type: ignore[arg-type]


# -- the launcher SIGKILLed: the lifeline kills the cgroup ------------------------------------

LAUNCHER = textwrap.dedent(
    """
    import sys, anyio, corral

    async def main():
        async with corral.open_runner(name="orphaned", console=False) as r:
            await r.start(["sh", "-c", sys.argv[1]], extra_env={"%(tag_var)s": sys.argv[2]})
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


def test_the_lifeline_kills_the_cgroup_of_a_sigkilled_launcher(tag: str, tmp_path: Path) -> None:
    report = tmp_path / "report"
    os.mkfifo(report)
    # The descendants report into the FIFO, since nobody reads the launcher's pipes.
    script = f"exec >{report}\n{ESCAPES}"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER % {"tag_var": TAG_VAR}, script, tag]
    )
    try:
        with open(report) as fifo:
            lines = []
            while len(escaped(lines)) < 3:
                line = fifo.readline()
                assert line, lines
                lines.append(line)
        pids = escaped(lines)
        assert runner_cgroups("orphaned")
        helper = [p for p in children_of(launcher.pid) if b"-I\0-S" in _cmdline(p)]
        assert len(helper) == 1, children_of(launcher.pid)
        launcher.kill()
        launcher.wait()
        assert wait_gone(pids.values(), timeout=10.0) == []
        # The lifeline removes the cgroup once it is empty, then exits.
        assert wait_gone(helper, timeout=10.0) == []
        assert runner_cgroups("orphaned") == []
    finally:
        launcher.kill()
        launcher.wait()


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


# -- the parts, on their own ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mounts", "own", "expected"),
    [
        # A unified host.
        (
            "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw",
            "0::/user.slice/a.scope",
            "/sys/fs/cgroup/user.slice/a.scope",
        ),
        # A hybrid host: v1 controllers, v2 at unified.
        (
            "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
            "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw",
            "0::/",
            "/sys/fs/cgroup/unified",
        ),
        # A container that sees a subtree only, and a path with a space.
        (
            "41 31 0:38 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw",
            "0::/docker/x/my\\040app",
            None,
        ),
        (
            "41 31 0:38 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw",
            "0::/docker/x/app",
            "/sys/fs/cgroup/app",
        ),
        ("41 31 0:38 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw", "0::/elsewhere", None),
        # cgroup v1 only.
        ("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu", "1:cpu:/", None),
    ],
    ids=["unified", "hybrid", "escaped", "subtree", "outside", "v1-only"],
)
def test_the_hierarchy_is_found_from_mountinfo(
    tmp_path: Path, mounts: str, own: str, expected: str | None
) -> None:
    (tmp_path / "mountinfo").write_text(mounts + "\n")
    (tmp_path / "cgroup").write_text(own.replace("\\040", " ") + "\n")
    args = (str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))
    if expected is None and "\\040" not in own:
        with pytest.raises(_cgroup.CgroupUnavailable):
            _cgroup.find_hierarchy(*args)
    elif expected is None:
        assert _cgroup.find_hierarchy(*args)[0] == "/sys/fs/cgroup/my app"
    else:
        assert _cgroup.find_hierarchy(*args) == (expected, own[3:])


def test_members_are_killed_one_by_one_where_the_kernel_has_no_cgroup_kill(tag: str) -> None:
    """Linux before 5.14: every member by its pidfd, sub-cgroups included."""
    cgroup = _cgroup.Cgroup.create("fallback")
    inner = os.path.join(cgroup.path, "inner")
    os.mkdir(inner)
    env = {**os.environ, TAG_VAR: tag}
    procs = []
    try:
        for procs_file in (cgroup.procs, os.path.join(inner, "cgroup.procs")):
            proc = subprocess.Popen(
                ["sh", "-c", f"echo 0 >{procs_file} && echo in && exec sleep 1000"],
                env=env,
                stdout=subprocess.PIPE,
            )
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline() == b"in\n"
        assert sorted(cgroup.members()) == sorted(p.pid for p in procs)
        cgroup.kill_each()
        assert [p.wait(10) for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        assert cgroup.remove()


GRACEFUL = program_path("graceful")


@pytest.mark.anyio
async def test_a_stray_is_stopped_by_the_one_stop_and_keeps_its_grace(
    tag: str, tmp_path: Path
) -> None:
    """What left its group gets the stop signal and the runner's grace, as a child's group."""
    out = tmp_path / "out"
    handler = ListHandler()
    daemon = f"setsid {sys.executable} {GRACEFUL} {out} 1 & exec sleep 1000"
    async with corral.open_runner(name="strays", console=False, handlers=[handler], grace=30) as r:
        await r.start(["sh", "-c", daemon], extra_env={TAG_VAR: tag})
        assert await handler.wait_for(lambda: "ready" in handler.lines("strays.sh"), 30)
        began = time.monotonic()
        r.cancel()
    took = time.monotonic() - began
    assert out.read_text() == "cleaning SIGTERM\nclean\n"
    assert 1.0 <= took < 30, took
    assert any("left outside their process groups" in m for m in handler.messages())
    assert tagged_pids(tag) == []
