"""Scale and resource limits: 1,000 children, and a clear error at the descriptor limit."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import time

import anyio
import pytest
from tests.conftest import TAG_VAR, tagged_pids

import corral

FD_SCRIPT = textwrap.dedent(
    """
    import faulthandler; faulthandler.dump_traceback_later(20, exit=True)
    import resource, sys, anyio, corral
    soft, hard = int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    async def main():
        async with corral.open_runner(console=False) as r:
            try:
                while True:
                    await r.start(["sleep", "1000"], extra_env={"%(tag_var)s": sys.argv[4]})
            except corral.ResourceLimitError as exc:
                print("error:", exc)
                print("running:", len(r.processes))
                print("soft:", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
                sys.stdout.flush()
                sys.stdin.readline()  # the test counts our children now
                r.cancel()

    anyio.run(main, backend=sys.argv[1])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_descriptor_limit_is_raised_then_reported_clearly(backend: str, tag: str) -> None:
    script = FD_SCRIPT % {"tag_var": TAG_VAR}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, backend, "40", "160", tag],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        error = proc.stdout.readline()
        running = int(proc.stdout.readline().split()[1])
        soft = int(proc.stdout.readline().split()[1])
        # Never a half-started child: every child alive is one the runner lists.
        assert len(tagged_pids(tag)) == running
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert "RLIMIT_NOFILE" in error
    assert "soft=160, hard=160" in error
    assert soft == 160  # raised from 40 to the hard limit
    assert running > 40  # more than the original soft limit allowed


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.anyio
async def test_a_thousand_sleeping_children(tag: str) -> None:
    n = 1000
    env = {TAG_VAR: tag}
    async with corral.open_runner(console=False, grace=5) as r:
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(
                    functools.partial(r.start, ["sleep", "1000"], name=f"s{i}", extra_env=env)
                )
        spawn_time = time.monotonic() - started
        procs = r.processes
        assert len(procs) == n
        assert {p.name for p in procs} == {f"s{i}" for i in range(n)}
        assert all(p.returncode is None for p in procs)
        stop_started = time.monotonic()
        r.cancel()
    stop_time = time.monotonic() - stop_started
    assert all(p.returncode == -15 for p in procs)
    assert r.processes == ()
    print(f"started {n} in {spawn_time:.2f} s, stopped in {stop_time:.2f} s")
    assert stop_time < 30
