"""Cancellation at arbitrary points never leaves a child behind (Hypothesis)."""

from __future__ import annotations

import sys
import uuid

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import TAG_VAR, tagged_pids

import corral

pytestmark = pytest.mark.anyio

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(
    delay=st.floats(min_value=0, max_value=0.03),
    wait_started=st.booleans(),
    via=st.sampled_from(["run", "start", "runner"]),
)
async def test_cancel_anywhere_leaves_nothing_behind(
    delay: float, wait_started: bool, via: str
) -> None:
    tag = uuid.uuid4().hex
    env = {TAG_VAR: tag}
    argv = [
        sys.executable,
        "-c",
        "import corral.child, subprocess, time\n"
        "subprocess.Popen(['sleep', '1000'])\n"
        "corral.child.started()\n"
        "time.sleep(1000)\n",
    ]
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
    assert tagged_pids(tag) == []
