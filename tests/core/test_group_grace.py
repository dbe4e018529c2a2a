"""The one stop: the grace belongs to the whole process group, and a stop under way is hastened.

A shell that runs its program without ``exec`` (a Procfile line such as
``web: python app.py; echo after``) dies at once on SIGTERM, while the
program it started goes on cleaning up in the same group: the stop waits
for the group, up to the grace, before SIGKILL.  These run on both loops:
the stop's waits are the loop's.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, ListHandler, still_running, tagged_pids
from tests.programs import path as program_path

import corral

pytestmark = pytest.mark.anyio

GRACEFUL = program_path("graceful")


def _under_sh(out: Path, seconds: float) -> list[str]:
    """The graceful program as a shell runs it without ``exec``, in the shell's group."""
    return ["sh", "-c", f"{sys.executable} {GRACEFUL} {out} {seconds}; echo after"]


async def test_the_grace_runs_until_the_whole_group_is_gone(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    async with corral.open_runner(console=False) as r:
        proc = await r.start(_under_sh(out, 1.0), wait_started=True, extra_env={TAG_VAR: tag})
        began = time.monotonic()
        code = await proc.stop(grace=60)
        took = time.monotonic() - began
    # sh died at once of SIGTERM; the program it ran kept the grace and finished its clean-up.
    assert code == -signal.SIGTERM
    assert out.read_text().split("\n") == ["cleaning SIGTERM", "clean", ""]
    assert 1.0 <= took < 30, took  # its second of clean-up, not the grace's minute
    assert not still_running(tagged_pids(tag))


async def test_what_is_left_of_the_group_is_killed_when_the_grace_ends(
    tmp_path: Path, tag: str
) -> None:
    out = tmp_path / "out"
    async with corral.open_runner(console=False) as r:
        proc = await r.start(_under_sh(out, 600), wait_started=True, extra_env={TAG_VAR: tag})
        began = time.monotonic()
        await proc.stop(grace=0.5)
        took = time.monotonic() - began
    assert out.read_text() == "cleaning SIGTERM\n"  # killed mid-clean-up, at the grace's end
    assert took < 30, took
    assert not still_running(tagged_pids(tag))


async def test_terminate_gives_the_group_its_grace(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    async with corral.open_runner(console=False, grace=60) as r:
        proc = await r.start(_under_sh(out, 1.0), wait_started=True, extra_env={TAG_VAR: tag})
        proc.terminate()
        assert await proc.wait() == -signal.SIGTERM
    assert out.read_text().endswith("clean\n")
    assert not still_running(tagged_pids(tag))


async def test_a_stop_with_another_signal(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    async with corral.open_runner(console=False) as r:
        proc = await r.start(_under_sh(out, 0.1), wait_started=True, extra_env={TAG_VAR: tag})
        await proc.stop(signal=signal.SIGINT)
    assert out.read_text().split("\n")[0] == "cleaning SIGINT"
    assert out.read_text().endswith("clean\n")
    async with corral.open_runner(console=False) as r:
        proc = await r.start(["sleep", "60"], extra_env={TAG_VAR: tag})
        with pytest.raises(ValueError, match="signal"):
            await proc.stop(signal=0)  # checked before anything is sent
        assert proc.returncode is None
        proc.kill()


async def test_a_second_stop_with_a_shorter_grace_shortens_the_first(
    tmp_path: Path, tag: str
) -> None:
    out = tmp_path / "out"
    handler = ListHandler()
    async with corral.open_runner(console=False, handlers=[handler]) as r:
        proc = await r.start(_under_sh(out, 600), wait_started=True, extra_env={TAG_VAR: tag})
        first_done = anyio.Event()

        async def first() -> None:
            await proc.stop(grace=600)
            first_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            cleaning = await handler.wait_for(
                lambda: "cleaning SIGTERM" in handler.lines(proc.source), 30
            )
            assert cleaning  # the first stop's signal arrived; its grace runs
            began = time.monotonic()
            await proc.stop(grace=0.2)  # no second signal: only a sooner SIGKILL
            with anyio.fail_after(30):
                await first_done.wait()  # the first stop ended with it
            took = time.monotonic() - began
    assert out.read_text() == "cleaning SIGTERM\n"  # one signal, then SIGKILL mid-clean-up
    assert took < 30, took
    assert any("did not stop within" in m for m in handler.messages())


async def test_kill_ends_a_stop_under_way(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    handler = ListHandler()
    async with corral.open_runner(console=False, handlers=[handler]) as r:
        proc = await r.start(_under_sh(out, 600), wait_started=True, extra_env={TAG_VAR: tag})
        async with anyio.create_task_group() as tg:
            tg.start_soon(proc.stop, 600)
            assert await handler.wait_for(
                lambda: "cleaning SIGTERM" in handler.lines(proc.source), 30
            )
            began = time.monotonic()
            proc.kill()
            with anyio.fail_after(30):
                assert await proc.wait() == -signal.SIGTERM  # sh died of the SIGTERM
        took = time.monotonic() - began
    assert out.read_text() == "cleaning SIGTERM\n"
    assert took < 30, took
    assert not still_running(tagged_pids(tag))


async def test_a_runner_s_stop_gives_every_group_its_grace(tmp_path: Path, tag: str) -> None:
    """A failure elsewhere stops the siblings: each group keeps the grace, not just its leader."""
    outs = [tmp_path / f"out{i}" for i in range(3)]
    with pytest.raises(ExceptionGroup) as caught:
        async with corral.open_runner(console=False, grace=60) as r:
            for out in outs:
                await r.start(_under_sh(out, 1.0), wait_started=True, extra_env={TAG_VAR: tag})
            await r.start(["sh", "-c", "exit 3"], extra_env={TAG_VAR: tag})
    assert caught.group_contains(corral.ProcessFailed)
    assert [out.read_text() for out in outs] == ["cleaning SIGTERM\nclean\n"] * 3
    assert not still_running(tagged_pids(tag))
