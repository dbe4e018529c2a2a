"""No orphans when the launcher dies, and no child dies early while it lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import anyio.to_thread
import pytest
from tests.helpers.processes import TAG_VAR, group_members, is_alive, wait_gone

import corral

LAUNCHER = textwrap.dedent(
    """
    import sys, anyio, corral

    async def main():
        env = {"%(tag_var)s": sys.argv[2]}
        async with corral.open_runner(console=False) as r:
            for _ in range(3):
                await r.start(["sh", "-c", "sleep 1000 & sleep 1000 & echo 1 >&3; wait"],
                              extra_env=env, wait_started=True)
            await r.start([sys.executable, "-c", "import corral.child, time; "
                           "corral.child.started(); time.sleep(1000)"], extra_env=env,
                          wait_started=True)
            print(" ".join(str(p.pid) for p in r.processes), flush=True)
            await anyio.sleep_forever()

    anyio.run(main, backend=sys.argv[1])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_children_and_grandchildren_die_with_a_sigkilled_launcher(backend: str, tag: str) -> None:
    script = LAUNCHER % {"tag_var": TAG_VAR}
    launcher = subprocess.Popen(
        [sys.executable, "-c", script, backend, tag], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        groups = [int(pid) for pid in launcher.stdout.readline().split()]
        # Three sh, six sleeps (forked before each sh reported), one Python child.
        pids = [pid for pgid in groups for pid in group_members(pgid)]
        assert len(pids) == 10
        launcher.kill()
        launcher.wait()
        killed_at = time.monotonic()
        assert wait_gone(pids, timeout=10.0) == []
        elapsed = time.monotonic() - killed_at
    finally:
        launcher.kill()
        launcher.wait()
    # The lifeline acts the moment the launcher's descriptors close: it should
    # take about as long as killing the same processes directly, measured now.
    baseline = _time_to_kill_directly(len(pids))
    assert elapsed < 10 * baseline + 0.5, f"{elapsed:.3f} s (direct kill: {baseline:.3f} s)"


def _time_to_kill_directly(count: int) -> float:
    sleepers = [subprocess.Popen(["sleep", "1000"]) for _ in range(count)]
    try:
        start = time.monotonic()
        for proc in sleepers:
            proc.kill()
        assert wait_gone([p.pid for p in sleepers], timeout=10.0) == []
        return time.monotonic() - start
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


def test_lifeline_exits_with_the_runner() -> None:
    async def main() -> int:
        async with corral.open_runner(console=False) as r:
            pid = r._lifeline.pid
            assert pid is not None and is_alive(pid)
        return pid

    pid = anyio.run(main)
    assert not is_alive(pid)


@pytest.mark.anyio
async def test_a_failure_is_out_without_waiting_for_the_lifeline() -> None:
    # Once every child is reaped the helper has nothing left to guard: the
    # runner's exit lets it go without waiting for it to read end-of-file and
    # exit (a scheduler turn away on a busy machine).  A stopped helper would
    # cost that wait's whole deadline (5 s).
    start = 0.0
    with pytest.raises(ExceptionGroup) as caught:
        async with corral.open_runner(console=False, handle_signals=False) as r:
            helper = r._lifeline.pid
            assert helper is not None
            os.kill(helper, signal.SIGSTOP)
            await r.start(["sleep", "1000"])
            start = time.monotonic()
            await r.start(["sh", "-c", "exit 3"])
            await anyio.sleep_forever()
    assert caught.group_contains(corral.ProcessFailed)
    assert time.monotonic() - start < 2.5
    assert not is_alive(helper)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.anyio
async def test_early_child_outlives_idle_worker_threads(tag: str) -> None:
    """PR_SET_PDEATHSIG would kill this child when the spawning thread retires (~10 s idle)."""
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], extra_env={TAG_VAR: tag})
        await anyio.sleep(11)
        # On asyncio an idle worker thread retires only when the next call arrives.
        await anyio.to_thread.run_sync(os.getpid)
        await anyio.sleep(4)
        assert p.returncode is None
        assert is_alive(p.pid)
        await p.stop()
    assert p.returncode == -signal.SIGTERM


@pytest.mark.timeout(30)
def test_a_child_still_on_its_way_to_exec_when_the_launcher_dies_is_found(tag: str) -> None:
    # Between fork and exec a child's environment is still its parent's, without
    # the lifeline's marker: a launcher killed in that window must not leave it
    # alive once it has exec'd.  Played out slowly here: a process that shows no
    # marker for 0.3 s and then execs into one that carries it.
    from corral._core._lifeline import Lifeline

    lifeline = Lifeline()
    lifeline.start()
    helper = lifeline.pid
    assert helper is not None
    env = {TAG_VAR.encode(): tag.encode()}
    lifeline.announce(env)
    code = (
        "import os, sys, time; time.sleep(0.3); "
        "os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)'], "
        "{k.encode(): v.encode() for k, v in eval(sys.argv[1]).items()})"
    )
    marked = {k.decode(): v.decode() for k, v in env.items()}
    child = subprocess.Popen(
        [sys.executable, "-c", code, repr(marked)], env={**os.environ, TAG_VAR: tag}
    )
    try:
        sock = lifeline._sock
        assert sock is not None
        sock.close()  # the launcher's end closes, as when it dies
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.waitpid(helper, 0)
        assert lifeline._pidfd is not None
        os.close(lifeline._pidfd)
