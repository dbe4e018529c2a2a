"""Prompt lines from block-buffered Python children: corral's start-up hook.

A Python child's stdout is a pipe, which Python block-buffers.  The runner puts its
start-up hook (``corral/_startup/sitecustomize.py``) first on a Python child's
``PYTHONPATH``: a thread flushes the child's stdout and stderr every 20 ms, at exit, before
``os._exit`` and ``os.abort``, and before a fork.  These tests run real children
(``tests/programs/prompt_child.py``) and check what that promises: lines come within a
bound of their print, nothing printed before a crash is lost, a SIGKILL loses only the
last moments, a fork writes nothing twice, and a ``sitecustomize`` of the user's still runs.
What it costs is measured by ``bench/prompt.py``, not here.

The event loop is not the subject (the hook lives in the child): one loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, ListHandler
from tests.programs import path

import corral
from corral._sys import _childenv

pytestmark = pytest.mark.anyio

CHILD = str(path("prompt_child"))
#: How long after its print a line may reach the handlers here: the hook flushes every
#: 20 ms; the rest is room for a loaded machine.  A block-buffered child without the hook
#: sends nothing until it has 8 KiB or exits.
PROMPT = 2.0


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def hooked(tag: str, pythonpath: str | None = None) -> dict[str, str | None]:
    """A child's ``extra_env``: its tag, and the hook as :func:`_childenv.prompt_lines` gives it
    (which the runner does for every child that names no ``PYTHONUNBUFFERED``)."""
    env = {} if pythonpath is None else {b"PYTHONPATH": os.fsencode(pythonpath)}
    _childenv.prompt_lines(env)
    made: dict[str, str | None] = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    return {TAG_VAR: tag, "PYTHONUNBUFFERED": None, **made}


async def start(r: corral.Runner, tag: str, *args: str) -> corral.Process:
    return await r.start(
        [sys.executable, CHILD, *args],
        name="child",
        stdin=subprocess.PIPE,
        check=False,
        extra_env=hooked(tag),
    )


@pytest.mark.parametrize("how", ["raise", "exit", "abort"])
async def test_a_line_comes_at_once_and_none_is_lost_at_a_crash(tag: str, how: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        proc = await start(r, tag, "crash", how)
        came = await logs.wait_for(lambda: "ready" in logs.lines("corral.child"), PROMPT + 5)
        assert came, "a line of a child that waits did not come: the hook did not flush"
        assert proc.stdin is not None
        await proc.stdin.send(b"go\n")
        await proc.wait()
    lines = [line for line in logs.lines("corral.child") if line.startswith("line ")]
    assert lines == [f"line {i}" for i in range(1000)]


async def test_each_line_comes_within_the_bound_of_its_print(tag: str) -> None:
    logs = ListHandler()
    arrived: dict[int, float] = {}
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        proc = await start(r, tag, "ticks", "10", "0.2")

        def ticks() -> list[list[str]]:
            return [m.split() for m in logs.lines("corral.child") if m.startswith("tick ")]

        for i in range(10):
            assert await logs.wait_for(lambda i=i: len(ticks()) > i, 10.0)
            arrived[i] = time.time()
        printed = {int(i): float(stamp) for _, i, stamp in ticks()}
        assert proc.stdin is not None
        await proc.stdin.aclose()
    late = {i: round(arrived[i] - printed[i], 3) for i in arrived}
    assert max(late.values()) < PROMPT, f"seconds from print to handler: {late}"


async def test_a_sigkill_loses_only_the_last_moments(tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        proc = await start(r, tag, "ticks", "100000", "0.01")

        def stamps() -> list[float]:
            lines = [m.split() for m in logs.lines("corral.child") if m.startswith("tick ")]
            return [float(words[2]) for words in lines if len(words) == 3]

        assert await logs.wait_for(lambda: len(stamps()) >= 20, PROMPT + 5)
        # The fault: killed while it prints, 1.5 s of lines later (a block-buffered child
        # sends its 8 KiB of lines here every 2.7 s: 1.5 s of them would be lost).
        await anyio.sleep(1.5)
        killed = time.time()
        proc.kill()
        await proc.wait()
    lost = killed - max(stamps())
    assert lost < 1.0, f"the lines of the last {lost:.2f} s before the SIGKILL are lost"


async def test_the_hooks_thread_takes_no_signal(tag: str) -> None:
    """A child that blocks a signal in its main thread to sigwait() for it gets it: the
    flushing thread blocks every signal, so the kernel never hands one to it (where the
    default action, for SIGUSR1, would have killed the process)."""
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        proc = await start(r, tag, "sigwait")
        assert await logs.wait_for(lambda: "ready" in logs.lines("corral.child"), PROMPT + 5)
        proc.send_signal(signal.SIGUSR1)
        assert await proc.wait() == 0
    assert logs.lines("corral.child") == ["ready", "got it"]


async def test_a_fork_writes_nothing_twice(tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        proc = await start(r, tag, "fork")
        await proc.wait()
    assert sorted(logs.lines("corral.child")) == ["child", "parent"]


async def test_the_users_sitecustomize_still_runs(tag: str, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the user hook ran', flush=True)\n")
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        proc = await r.start(
            [sys.executable, CHILD, "path"],
            name="child",
            check=False,
            extra_env=hooked(tag, str(tmp_path)),
        )
        await proc.wait()
    first, seen = logs.lines("corral.child")
    assert first == "the user hook ran"
    child = json.loads(seen)
    assert child["PYTHONPATH"].split(os.pathsep) == [_childenv.HOOK_DIR, str(tmp_path)]
    assert _childenv.HOOK_DIR not in child["path"]  # off sys.path once it ran
    assert str(tmp_path) in child["path"]


def test_the_hook_is_first_on_pythonpath_once() -> None:
    env = {b"PYTHONPATH": b"/a:/b"}
    _childenv.prompt_lines(env)
    _childenv.prompt_lines(env)  # a child of a child
    hook = os.fsencode(_childenv.HOOK_DIR)
    assert env[b"PYTHONPATH"] == b":".join([hook, b"/a", b"/b"])
    assert env[b"CORRAL_FLUSH_EVERY"] == b"0.02"
    empty: dict[bytes, bytes] = {}
    _childenv.prompt_lines(empty)
    assert empty[b"PYTHONPATH"] == hook


async def test_the_runner_gives_a_child_the_hook_unless_it_names_pythonunbuffered(
    tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default: a child that names no PYTHONUNBUFFERED gets the hook (and a launcher
    whose own environment has it passes it on, as it passes any variable)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        await r.run([sys.executable, CHILD, "path"], name="child", extra_env={TAG_VAR: tag})
        monkeypatch.setenv("PYTHONUNBUFFERED", "1")
        await r.run([sys.executable, CHILD, "path"], name="named", extra_env={TAG_VAR: tag})
    (hooked_child,) = logs.lines("corral.child")
    (named,) = logs.lines("corral.named")
    path = json.loads(hooked_child)["PYTHONPATH"].split(os.pathsep)
    assert path == [_childenv.HOOK_DIR, "/elsewhere"]
    assert json.loads(named)["PYTHONPATH"] == "/elsewhere"
