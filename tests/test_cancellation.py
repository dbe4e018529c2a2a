"""Cancellation at arbitrary points never leaves a child behind (Hypothesis).

The child is a Python program that starts a grandchild, then reports that it
started, then sleeps.  Hypothesis picks the moment of the cancellation as a
fraction of the child's real start-up time, measured first in the same test,
so the examples span every phase: before the spawn, while the interpreter
starts, after the grandchild exists, after the report.  The test checks that
the examples did reach the grandchild (and did not all reach it), so it
cannot pass by cancelling too early every time.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import TAG_VAR, tagged_pids

import corral

CHILD = (
    "import subprocess, sys, time\n"
    "subprocess.Popen(['sleep', '1000'])\n"
    "open(sys.argv[1], 'w').close()\n"  # the grandchild exists
    "import corral.child\n"
    "corral.child.started()\n"
    "time.sleep(1000)\n"
)


async def _startup_time(marker: Path) -> float:
    """Seconds from start() to the child's report, measured on this machine now."""
    tag = uuid.uuid4().hex
    async with corral.open_runner(console=False) as r:
        began = anyio.current_time()
        p = await r.start(
            [sys.executable, "-c", CHILD, str(marker)],
            extra_env={TAG_VAR: tag},
            wait_started=True,
        )
        elapsed = anyio.current_time() - began
        await p.stop()
    assert tagged_pids(tag) == []
    return elapsed


async def _cancel_after(delay: float, wait_started: bool, via: str, marker: Path, tag: str) -> None:
    argv = [sys.executable, "-c", CHILD, str(marker)]
    env = {TAG_VAR: tag}
    with anyio.move_on_after(delay):
        async with corral.open_runner(console=False, grace=2) as r:
            if via == "run":
                await r.run(argv, extra_env=env, wait_started=wait_started)
            elif via == "start":
                with anyio.CancelScope() as inner:
                    inner.deadline = anyio.current_time() + delay
                    await r.start(argv, extra_env=env, wait_started=wait_started)
                    await anyio.sleep_forever()
                r.cancel()
            else:
                await r.start(argv, extra_env=env, wait_started=wait_started)
                await anyio.sleep_forever()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cancel_anywhere_leaves_nothing_behind(backend: str, tmp_path: Path) -> None:
    startup = anyio.run(_startup_time, tmp_path / "probe", backend=backend)
    reached: list[bool] = []

    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        fraction=st.floats(min_value=0, max_value=1.5),
        wait_started=st.booleans(),
        via=st.sampled_from(["run", "start", "runner"]),
    )
    def cancel_at(fraction: float, wait_started: bool, via: str) -> None:
        tag = uuid.uuid4().hex
        marker = tmp_path / tag
        anyio.run(
            _cancel_after, fraction * startup, wait_started, via, marker, tag, backend=backend
        )
        reached.append(marker.exists())
        assert tagged_pids(tag) == []

    cancel_at()
    assert any(reached), f"no example reached the grandchild (start-up {startup:.3f} s)"
    assert not all(reached), "every example was cancelled after the grandchild existed"
