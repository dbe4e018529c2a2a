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

import math
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from tests.helpers.processes import (
    TAG_VAR,
    ListHandler,
    children_of,
    still_running,
    tagged_pids,
    wait_gone,
)

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
    assert still_running(tagged_pids(tag)) == []
    return elapsed


async def _cancel_after(
    delay: float | None, wait_started: bool, via: str, marker: Path, tag: str
) -> None:
    """Cancel ``delay`` seconds after the start; ``None``: once ``start()`` has returned."""
    argv = [sys.executable, "-c", CHILD, str(marker)]
    env = {TAG_VAR: tag}
    with anyio.move_on_after(math.inf if delay is None else delay) as outer:
        async with corral.open_runner(console=False, grace=2) as r:
            if via == "run":
                await r.run(argv, extra_env=env, wait_started=wait_started)
            elif via == "start":
                with anyio.CancelScope() as inner:
                    inner.deadline = outer.deadline
                    await r.start(argv, extra_env=env, wait_started=wait_started)
                    if delay is None:
                        inner.cancel()
                    await anyio.sleep_forever()
                r.cancel()
            else:
                await r.start(argv, extra_env=env, wait_started=wait_started)
                await anyio.sleep_forever()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cancel_anywhere_leaves_nothing_behind(backend: str, tmp_path: Path) -> None:
    startup = anyio.run(_startup_time, tmp_path / "probe", backend=backend)
    reached: list[bool] = []

    # The moment is a fraction of the start-up measured above, which a busy
    # machine can stretch or shrink since: so one example is cancelled before
    # anything is spawned, and one only once the child has reported, whatever
    # the load, and the check below that both sides were reached cannot fail
    # by chance.
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
    @example(fraction=0.0, wait_started=False, via="runner")
    @example(fraction=None, wait_started=True, via="start")
    def cancel_at(fraction: float | None, wait_started: bool, via: str) -> None:
        tag = uuid.uuid4().hex
        marker = tmp_path / tag
        delay = None if fraction is None else fraction * startup
        anyio.run(_cancel_after, delay, wait_started, via, marker, tag, backend=backend)
        reached.append(marker.exists())
        # Killed a moment ago is not left behind: wait for the kernel's part.
        assert still_running(tagged_pids(tag)) == []

    cancel_at()
    assert any(reached), f"no example reached the grandchild (start-up {startup:.3f} s)"
    assert not all(reached), "every example was cancelled after the grandchild existed"


#: Seconds from start() to the child's report, per backend, measured once.
_STARTUP: dict[str, float] = {}

#: How a start is cancelled: a scope cancelled before it ("already"), a
#: deadline that passed before it ("past"), a deadline within the spawn itself
#: ("spawn": the spawn takes about a millisecond), a deadline during the
#: child's start-up ("deadline"), or another task cancelling the scope then
#: ("task").
START_CANCELS = ["already", "past", "spawn", "deadline", "task"]


@pytest.mark.slow
@pytest.mark.anyio
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    how=st.sampled_from(START_CANCELS),
    fraction=st.floats(min_value=0, max_value=1.5),
    wait_started=st.booleans(),
    via=st.sampled_from(["start", "run"]),
)
async def test_a_cancelled_start_leaves_nothing(
    anyio_backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    how: str,
    fraction: float,
    wait_started: bool,
    via: str,
) -> None:
    """The child of a cancelled start() or run() is stopped and reaped before it raises.

    As :func:`anyio.run_process` leaves nothing behind.  The runner stays open
    meanwhile, so nothing but the cancelled start can have stopped the child;
    and the runner's own exit must not wait for a child nobody holds.
    """
    marker = tmp_path_factory.mktemp("marker") / "grandchild"
    if anyio_backend not in _STARTUP:
        _STARTUP[anyio_backend] = await _startup_time(marker)
    startup = _STARTUP[anyio_backend]
    tag = uuid.uuid4().hex
    argv = [sys.executable, "-c", CHILD, str(marker)]
    records = ListHandler()
    with anyio.fail_after(30):
        async with corral.open_runner(console=False, grace=2, handlers=[records]) as r:
            before = set(children_of(os.getpid()))  # the runner's lifeline
            proc: corral.Process | None = None
            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as scope:
                    now = anyio.current_time()
                    if how == "already":
                        scope.cancel()
                    elif how == "past":
                        scope.deadline = now - 1
                    elif how == "spawn":
                        scope.deadline = now + fraction * 0.002
                    elif how == "deadline":
                        scope.deadline = now + fraction * startup
                    else:

                        async def cancel_later() -> None:
                            await anyio.sleep(fraction * startup)
                            scope.cancel()

                        tg.start_soon(cancel_later)
                    env = {TAG_VAR: tag}
                    if via == "start":
                        proc = await r.start(
                            argv, name="child", extra_env=env, wait_started=wait_started
                        )
                    else:
                        await r.run(argv, name="child", extra_env=env, wait_started=wait_started)
                tg.cancel_scope.cancel()
            event(f"{via}: {'returned' if proc is not None else 'cancelled'}")
            if proc is not None:
                # The start returned before its scope was cancelled: the child
                # is the caller's, who stops it.
                assert via == "start"
                await proc.stop()
            else:
                assert r.processes == ()
                assert still_running(tagged_pids(tag)) == [], (
                    "the child of a cancelled start still runs"
                )
                assert set(children_of(os.getpid())) == before, "the child was not reaped"
            if how in ("already", "past"):
                assert proc is None
                spawned = [m for m in records.messages() if m.startswith("started child ")]
                assert spawned == [], "a start in a cancelled scope spawned a child"
    assert still_running(tagged_pids(tag)) == []


# asyncio.run ending (returning, or its main task ending with KeyboardInterrupt,
# as uvicorn's force quit does) while a runner in another task is starting
# children.  The script prints what it left behind once asyncio.run is over.
ASYNCIO_RUN_ENDS = """
import asyncio, os, sys
import corral

end, loop, tag = sys.argv[1:4]
TAG = {"CORRAL_TEST_TAG": tag}


async def app(busy):
    async with corral.open_runner(console=False, grace=2.0) as r:
        for n in range(1_000_000):
            # A start under way at almost any moment; each child killed at
            # once, so that they do not pile up.
            proc = await r.start(["sleep", "1000"], extra_env=TAG)
            proc.kill()
            if n == 20:
                busy.set()


async def main():
    busy = asyncio.Event()
    apps = [asyncio.ensure_future(app(busy)) for _ in range(2)]
    await busy.wait()
    if end == "interrupt":
        raise KeyboardInterrupt


factory = None
if loop == "uvloop":
    import uvloop

    factory = uvloop.new_event_loop
try:
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
except KeyboardInterrupt:
    pass
try:
    left = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
except ChildProcessError:
    print("no child left", flush=True)
else:
    print("left a child:", left, flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("end", ["return", "interrupt"])
def test_asyncio_run_ending_mid_start_reaps_every_child(
    tmp_path: Path, tag: str, end: str, loop: str
) -> None:
    """asyncio.run's end cancels every task left, a start's brand-new tasks too: it still ends.

    A task cancelled natively before its first step runs none of its code;
    when it was a child's supervisor or the task that reaps it, the child was
    never reaped and asyncio.run waited for the runner forever.
    """
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    script = tmp_path / "ends.py"
    script.write_text(ASYNCIO_RUN_ENDS)
    proc = subprocess.Popen(
        [sys.executable, str(script), end, loop, tag],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its lifeline then kills the children
        out, err = proc.communicate()
        pytest.fail(f"asyncio.run did not end within 20 s; stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert out.strip() == "no child left", err[-3000:]
    assert "never awaited" not in err, err[-3000:]
    assert wait_gone(tagged_pids(tag), 10.0) == []
