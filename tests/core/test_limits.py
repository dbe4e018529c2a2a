"""Scale and resource limits: 1,000 children, and a clear error at the descriptor limit."""

from __future__ import annotations

import errno
import functools
import subprocess
import sys
import textwrap
import time

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, tagged_pids

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


NPROC_SCRIPT = textwrap.dedent(
    """
    import faulthandler; faulthandler.dump_traceback_later(20, exit=True)
    import os, resource, sys, anyio, corral
    tag_var, tag = sys.argv[2], sys.argv[3]
    NOBODY = 65534

    def tasks_of(uid):
        count = 0
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    count += int(fields["Threads"])
            except (OSError, KeyError, ValueError):
                pass
        return count

    async def main():
        async with corral.open_runner(name="burst", console=False) as r:
            # Root is never held to RLIMIT_NPROC: run as nobody for the burst, keeping
            # root as the saved user id to come back.
            limits = resource.getrlimit(resource.RLIMIT_NPROC)
            os.setresuid(NOBODY, NOBODY, 0)
            try:
                resource.setrlimit(resource.RLIMIT_NPROC, (tasks_of(NOBODY) + 3, limits[1]))
                for i in range(50):
                    await r.start(["sleep", "1000"], name=f"s{i}", extra_env={tag_var: tag})
            except corral.ResourceLimitError as exc:
                print("error:", exc)
                print("errno:", exc.errno)
                print("running:", len(r.processes))
                sys.stdout.flush()
                sys.stdin.readline()  # the test counts our children now
            finally:
                resource.setrlimit(resource.RLIMIT_NPROC, limits)
                os.setresuid(0, 0, 0)
            r.cancel()

    anyio.run(main, backend=sys.argv[1])
    """
)


@pytest.mark.slow
@pytest.mark.serial  # it counts the processes of user nobody, which other tests start too
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_process_limit_at_a_burst_of_starts_is_reported_clearly(backend: str, tag: str) -> None:
    """A real RLIMIT_NPROC reached (as a user it binds): ResourceLimitError naming it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", NPROC_SCRIPT, backend, TAG_VAR, tag],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        error = proc.stdout.readline()
        number = int(proc.stdout.readline().split()[1])
        running = int(proc.stdout.readline().split()[1])
        # Never a half-started child: every child alive is one the runner lists.
        assert len(tagged_pids(tag)) == running
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert number == errno.EAGAIN, error
    assert "RLIMIT_NPROC" in error and "ulimit -u" in error, error
    assert f"cannot start 's{running}' in runner 'burst'" in error, error
    assert f"has {running} children running" in error, error
    assert "user 65534 has" in error, error


def test_a_full_file_table_is_reported_clearly() -> None:
    """ENFILE (the whole system's file table, which no test may fill) names its limit."""
    from corral._core._spawn import Spawner

    spawner = Spawner("r", None, print, lambda: 7)  # type: ignore[arg-type]
    error = spawner._limit_error(errno.ENFILE)
    assert isinstance(error, corral.ResourceLimitError) and error.errno == errno.ENFILE
    assert "ENFILE" in str(error) and "fs.file-max=" in str(error), error
    assert "has 7 children running" in str(error), error


@pytest.mark.slow
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


# Children that wait for the gate (their stdin) to close, each its own way:
# one reports its start by closing the descriptor, one exits without
# reporting, one fails to be restarted, and the loggers hold a log
# connection open in a grandchild when they exit.  Each says it is up with
# one byte on the descriptor named by its argument.
UP = "import os, sys\nos.write(int(sys.argv[1]), b'x')\n"
CLOSER = UP + "sys.stdin.read()\nos.close(3)\nimport time\ntime.sleep(1000)\n"
QUITTER = UP + "sys.stdin.read()\nsys.exit(3)\n"
RESTARTER = UP + "sys.stdin.read()\nsys.exit(1)\n"
LOGGER = (
    UP + "import corral.child, logging, time\n"
    "corral.child.connect(logging.INFO)\n"
    "logging.info('up')\n"
    "corral.child.started()\n"
    "if os.fork() == 0:\n"
    "    time.sleep(1000)\n"  # in the group, holding the log connection
    "sys.stdin.read()\n"
)

EXHAUSTED_SCRIPT = textwrap.dedent(
    """
    import faulthandler; faulthandler.dump_traceback_later(40, exit=True)
    import logging, os, resource, signal, sys
    import anyio, corral

    backend, tag, soft = sys.argv[1], sys.argv[2], int(sys.argv[3])
    CLOSER, QUITTER, RESTARTER, LOGGER = sys.argv[4:8]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft))
    ENV = {%(tag_var)r: tag}
    errors = []
    wanted = {}  # the start of an error message -> an event to set when it comes


    class Errors(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR:
                message = record.getMessage()
                errors.append(message)
                for start, (token, event) in list(wanted.items()):
                    if message.startswith(start):
                        token.run_sync(event.set)


    async def main():
        gate_r, gate_w = os.pipe()
        restart_r, restart_w = os.pipe()  # the restarter's own gate
        note_r, note_w = os.pipe()
        outcomes = {}
        async with corral.open_runner(console=False, handlers=[Errors()]) as r:

            def child(code, stdin=gate_r, **options):
                return r.start(
                    [sys.executable, "-c", code, str(note_w)], stdin=stdin,
                    pass_fds=[note_w], extra_env=ENV, **options
                )

            async def start(name, code):
                try:
                    proc = await child(code, name=name, wait_started=True)
                    outcomes[name] = ("reported", proc.started_value)
                except corral.StartupFailed as exc:
                    outcomes[name] = ("StartupFailed", exc.returncode)

            async with anyio.create_task_group() as tg:
                tg.start_soon(start, "closer", CLOSER)
                tg.start_soon(start, "quitter", QUITTER)
                restarter = await child(
                    RESTARTER, name="restarter", stdin=restart_r, restart="on-failure",
                    backoff=0, check=False,
                )
                up = b""
                while len(up) < 3:  # the three are spawned and running
                    await anyio.wait_readable(note_r)
                    up += os.read(note_r, 3 - len(up))
                loggers = []
                try:
                    while True:
                        loggers.append(await child(LOGGER, wait_started=True))
                except corral.ResourceLimitError as exc:
                    print("limit:", exc, flush=True)
                print("loggers:", len(loggers), flush=True)
                assert len(loggers) >= 3
                # The application takes every descriptor that is left, then
                # lets every child go on.
                hog = []
                def take():
                    try:
                        while True:
                            hog.append(os.open(os.devnull, os.O_RDONLY))
                    except OSError:
                        pass
                take()
                os.close(gate_w)
                take()
                print("taken:", len(hog), flush=True)
                with anyio.fail_after(30):
                    codes = [await p.wait() for p in loggers]
                # Now the restarter exits, and cannot be spawned again.
                take()
                os.close(restart_w)
                take()
                with anyio.fail_after(30):
                    restarted = await restarter.wait()
            # Both starts have returned now; the closer runs on.
            print("codes:", sorted(set(codes)), "restarter:", restarted, flush=True)
            print("outcomes:", sorted(outcomes.items()), flush=True)
            print("running:", sorted(p.name for p in r.processes), flush=True)
            # The lifeline dies while no descriptor is left: it cannot be
            # replaced now, but is once there are descriptors again.
            lost = anyio.Event()
            wanted["cannot start a new lifeline"] = (r.token, lost)
            helper = r._lifeline.pid
            take()
            os.kill(helper, signal.SIGKILL)
            with anyio.fail_after(30):
                await lost.wait()
            for fd in hog:
                os.close(fd)
            await child("import time; time.sleep(1000)", name="sleeper", stdin=None)
            print("lifeline:", "replaced" if r._lifeline.pid not in (None, helper) else "gone",
                  flush=True)
            for p in r.processes:
                p.terminate()
        print("errors:", errors, flush=True)
        print("runner: exited cleanly", flush=True)


    anyio.run(main, backend=backend)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_out_of_descriptors_every_child_is_still_supervised(backend: str, tag: str) -> None:
    """At EMFILE the runner goes on: starts raise ResourceLimitError, exits are handled.

    The children are started until the runner runs out of descriptors, then
    the application takes every descriptor left, and only then do the
    children exit: a start decided by a closed handshake descriptor, a start
    that fails, a restart that cannot spawn, and children whose log
    connections are still open when they exit.
    """
    script = EXHAUSTED_SCRIPT % {"tag_var": TAG_VAR}
    out = subprocess.run(
        [sys.executable, "-c", script, backend, tag, "150", CLOSER, QUITTER, RESTARTER, LOGGER],
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert "RLIMIT_NOFILE" in lines["limit"]
    assert lines["codes"] == "[0] restarter: 1"
    assert (
        lines["outcomes"] == "[('closer', ('reported', None)), ('quitter', ('StartupFailed', 3))]"
    )
    assert lines["running"] == "['closer']"
    assert "cannot restart restarter" in lines["errors"], lines["errors"]
    assert "cannot start a new lifeline" in lines["errors"], lines["errors"]
    assert "runs again" in lines["errors"], lines["errors"]
    assert lines["lifeline"] == "replaced"
    assert lines["runner"] == "exited cleanly"
    assert tagged_pids(tag) == []
