"""No orphans when the launcher dies, and no child dies early while it lives."""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import anyio
import anyio.to_thread
import pytest
import sniffio
from tests.helpers.processes import TAG_VAR, group_members, is_alive, is_dying, wait_gone

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


@pytest.mark.slow
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


# -- the event loops' worker threads retire: no child dies with the thread that spawned it -----
#
# PR_SET_PDEATHSIG fires when the *thread* that forked a child exits, and the worker threads of
# Trio and AnyIO retire once idle (10 s): a child armed with it from such a thread dies early.
# Rather than wait 10 s, the tests below make every worker thread retire at once, through the
# backends' own retirement (their idle time set to 0 for the test), and wait for each thread's
# exit as an event (a pidfd of the thread).  The control test shows that this retirement does
# kill a child armed with PR_SET_PDEATHSIG from a worker thread.


def _idle_threads() -> list[threading.Thread]:
    """The worker threads this event loop's backend keeps idle, which would retire.

    Only this loop's: a session runs other loops (a blocking facade's, another test's) whose
    worker threads are not this loop's to hand jobs to."""
    if sniffio.current_async_library() == "trio":
        from trio._core._thread_cache import THREAD_CACHE

        return [worker._thread for worker in THREAD_CACHE._idle_workers]
    from anyio._backends._asyncio import _threadpool_idle_workers

    return list(_threadpool_idle_workers.get(collections.deque()))


class Retirement:
    """The worker threads' retirement, held back for the test and then made to happen at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import trio._core._thread_cache
        from anyio._backends._asyncio import WorkerThread

        self._knobs = [(trio._core._thread_cache, "IDLE_TIMEOUT"), (WorkerThread, "MAX_IDLE_TIME")]
        self._monkeypatch = monkeypatch
        self._set(3600)  # no thread that works during the test retires before it is told to

    def _set(self, seconds: float) -> None:
        for owner, name in self._knobs:
            self._monkeypatch.setattr(owner, name, seconds)

    async def now(self) -> None:
        """Make every idle worker thread of this loop retire, and wait until each has exited.

        Trio's retire on their own once idle for ``IDLE_TIMEOUT``, read as each goes idle: so
        each is given a job (all held at a barrier, so that every idle one is taken) with the
        timeout 0 from now on.  AnyIO on asyncio stops its idle threads only when a call
        prunes them; this is that pruning, for all of them at once.
        """
        self._set(0)
        old = _idle_threads()
        if sniffio.current_async_library() == "trio":
            if old:
                barrier = threading.Barrier(len(old), timeout=10)
                limiter = anyio.CapacityLimiter(len(old))
                async with anyio.create_task_group() as tg:
                    for _ in old:
                        tg.start_soon(
                            functools.partial(anyio.to_thread.run_sync, limiter=limiter),
                            barrier.wait,
                        )
        else:
            from anyio._backends._asyncio import _threadpool_idle_workers

            idle = _threadpool_idle_workers.get()
            while idle:
                worker = idle.popleft()
                worker.root_task.remove_done_callback(worker.stop)
                worker.stop()
        deadline = time.monotonic() + 10
        for thread in old:
            _wait_thread_gone(thread, deadline)


@pytest.fixture
def retirement(monkeypatch: pytest.MonkeyPatch) -> Retirement:
    return Retirement(monkeypatch)


def _wait_thread_gone(thread: threading.Thread, deadline: float) -> None:
    """Block until the kernel is done with ``thread``'s exit (its children told of it)."""
    thread.join(max(0.0, deadline - time.monotonic()))
    assert not thread.is_alive(), f"{thread.name} did not retire"
    native = thread.native_id
    assert native is not None
    try:
        fd = os.pidfd_open(native, os.O_EXCL)  # PIDFD_THREAD: readable once the thread exited
    except ProcessLookupError:
        return  # gone already
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(max(0.0, deadline - time.monotonic()) * 1000), f"{native} lives on"
    finally:
        os.close(fd)


def _arm_pdeathsig() -> None:
    """In a child before exec: die with SIGKILL when the thread that forked it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


@pytest.mark.anyio
async def test_retiring_worker_threads_kill_a_child_armed_with_pdeathsig_from_one(
    tag: str, retirement: Retirement
) -> None:
    """The control: the field lesson, played out by the retirement the next test uses."""
    env = {**os.environ, TAG_VAR: tag}

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(["sleep", "1000"], env=env, preexec_fn=_arm_pdeathsig)

    child = await anyio.to_thread.run_sync(spawn)
    try:
        assert is_alive(child.pid)
        await retirement.now()
        assert wait_gone([child.pid], timeout=10) == [], "the thread retired, the child lives"
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


@pytest.mark.anyio
async def test_early_child_outlives_idle_worker_threads(tag: str, retirement: Retirement) -> None:
    """No child of a runner dies when the worker threads that were there at its start retire."""
    async with corral.open_runner(console=False) as r:
        await anyio.to_thread.run_sync(os.getpid)  # a worker thread of this loop, at least
        p = await r.start(["sleep", "1000"], extra_env={TAG_VAR: tag})
        assert _idle_threads()
        await retirement.now()
        assert p.returncode is None
        assert is_alive(p.pid) and not is_dying(p.pid)
        await p.stop()
    assert p.returncode == -signal.SIGTERM


@pytest.mark.timeout(30)
def test_a_child_still_on_its_way_to_exec_when_the_launcher_dies_is_found(tag: str) -> None:
    # Between fork and exec a child's environment is still its parent's, without
    # the lifeline's marker: a launcher killed in that window must not leave it
    # alive once it has exec'd.  Played out slowly here: a process that shows no
    # marker for 0.3 s and then execs into one that carries it.
    from corral._sys._lifeline import Lifeline

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
