"""Stopping always finishes, nothing escapes at any instant, bad input is refused.

Each test here is a regression test for a way a careless or hostile user
broke a promise: a tail nobody reads, a stop signal that cannot be sent, a
host application that reaps children itself, asyncio's final cancel-all, a
Ctrl-C during entry, a launcher SIGKILLed in the middle of a spawn, a killed
lifeline, a flood of megabyte lines, an endless start-up report, a ``str``
argv, names too long for a file system, a token used after its loop stopped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, ListHandler, tagged_pids, wait_gone

import corral

pytestmark = pytest.mark.timeout(60)

PY = sys.executable

# A child that prints ``count`` numbered lines as fast as it can, then sleeps.
FLOOD_THEN_SLEEP = (
    "import sys, time\nfor i in range({count}): print(i)\nsys.stdout.flush()\ntime.sleep(1000)"
)


def run_script(code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a launcher script in a process of its own (bounded)."""
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- 1. a tail never holds up a stop ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["unread", "dropped"])
async def test_a_tail_nobody_reads_never_holds_up_a_stop(tag: str, how: str) -> None:
    async with corral.open_runner(console=False, grace=5) as r:
        p = await r.start(
            [PY, "-c", FLOOD_THEN_SLEEP.format(count=20_000)],
            name="flood",
            extra_env={TAG_VAR: tag},
        )
        tail = p.logs(buffer=10)
        first = await tail.receive()  # the child is writing; the tail holds 10 more
        assert first.getMessage() == "0"
        if how == "dropped":
            del tail
        with anyio.fail_after(5):
            assert await p.stop() == -signal.SIGTERM
    assert tagged_pids(tag) == []


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_unread_tail_slows_the_child_and_then_loses_nothing(tag: str) -> None:
    """Backpressure while it runs: read it late and every line is still there, in order."""
    async with corral.open_runner(console=False) as r:
        p = await r.start(
            [PY, "-c", "for i in range(5000): print(i)"], name="lines", extra_env={TAG_VAR: tag}
        )
        async with p.logs(buffer=8) as tail:
            seen = [record.getMessage() async for record in tail]
        assert await p.wait() == 0
    assert seen == [str(i) for i in range(5000)]


# -- 3. grace and stop_signal are checked, and the stop path cannot fail -----------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"grace": math.nan}, ValueError),
        ({"grace": math.inf}, ValueError),
        ({"grace": -1}, ValueError),
        ({"grace": "5"}, TypeError),
        ({"grace": None}, TypeError),
        ({"stop_signal": 999}, ValueError),
        ({"stop_signal": "TERM"}, TypeError),
        ({"stop_signal": 33}, ValueError),  # reserved by the C library: not a signal here
        ({"stop_signal": signal.SIGSTOP}, ValueError),
        ({"handle_signals": "yes"}, TypeError),
    ],
)
def test_bad_runner_options_are_refused_at_once(options: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        corral.open_runner(**options)  # type: ignore[arg-type]


#: Bad keywords to ``start()``, and the error each gets.  Each is checked before anything
#: starts, without a thought of the backend: the test runs all of them through one runner per
#: backend, each as a subtest of its own.
BAD_START_OPTIONS: list[tuple[dict[str, object], type]] = [
    ({"grace": math.nan}, ValueError),
    ({"grace": "1"}, TypeError),
    ({"stop_signal": 999}, ValueError),
    ({"stop_signal": "TERM"}, TypeError),
    ({"start_timeout": 1.0}, ValueError),  # without wait_started
    ({"wait_started": True, "start_timeout": math.inf}, ValueError),
    ({"restart": "sometimes"}, ValueError),
    ({"max_restarts": -1}, ValueError),
    ({"name": "x" * 101}, ValueError),
    ({"name": "has space"}, ValueError),
    ({"name": "a/b"}, ValueError),
    ({"env": {"A=B": "1"}}, ValueError),
    ({"env": {"A": 1}}, TypeError),
    ({"pass_fds": [1]}, ValueError),
]


@pytest.mark.anyio
async def test_bad_start_options_are_refused_before_anything_starts(
    tag: str, subtests: pytest.Subtests
) -> None:
    async with corral.open_runner(console=False) as r:
        for options, error in BAD_START_OPTIONS:
            with subtests.test(repr(options)[:60]):
                with pytest.raises(error):
                    await r.start(["sleep", "1000"], extra_env={TAG_VAR: tag}, **options)  # type: ignore[arg-type]
                assert r.processes == ()
    assert tagged_pids(tag) == []


@pytest.mark.anyio
async def test_a_stop_signal_that_cannot_be_sent_still_ends_in_sigkill(tag: str) -> None:
    """Validation keeps bad signals out; if sending fails anyway, SIGKILL follows at once."""
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs], grace=30) as r:
        p = await r.start(["sleep", "1000"], name="s", extra_env={TAG_VAR: tag})
        p._sup._stop_signal = 999  # past validation, as a broken stop path would see it
        with anyio.fail_after(5):
            assert await p.stop() == -signal.SIGKILL
    assert any("cannot send its stop signal" in m for m in logs.messages("corral"))
    assert tagged_pids(tag) == []


# -- 4. a host that reaps children itself --------------------------------------------------

REAPING_HOST = """
import logging, os, signal, sys
import anyio, corral

def reap_everything(signum, frame):
    # What some hosts do: collect every child, theirs or not.
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

signal.signal(signal.SIGCHLD, reap_everything)

class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = []
    def emit(self, record):
        self.seen.append(record.getMessage())

async def main():
    warnings = Warnings()
    with anyio.fail_after(20):
        await run_all(warnings)
    lost = sum("collected elsewhere" in m for m in warnings.seen)
    print("codes", *codes, "lost", lost)

codes = []

async def run_all(warnings):
    async with corral.open_runner(console=False, handlers=[warnings]) as r:
        for _ in range(5):
            codes.append((await r.run(["sh", "-c", "exit 3"], check=False)).returncode)
        p = await r.start(["sleep", "0.2"])
        codes.append(await p.wait())

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_host_that_reaps_every_child_does_not_hang_the_runner(backend: str) -> None:
    out = run_script(REAPING_HOST, backend)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    codes = [int(w) for w in words[1:7]]
    lost = int(words[-1])
    # Whichever got to a status first: ours (the real code) or the host's (0, with a warning).
    assert all(code in (3, 0) for code in codes[:5]) and codes[5] == 0
    assert lost >= codes[:5].count(0)


# -- 5. asyncio's final cancel-all ------------------------------------------------------------

ASYNCIO_SHAPES = """
import asyncio, signal, sys, os
import corral

shape, tag = sys.argv[1], sys.argv[2]

async def worker(started):
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], extra_env={"CORRAL_TEST_TAG": tag})
        started.set()
        await p.wait()

async def main():
    started = asyncio.Event()
    task = asyncio.create_task(worker(started))
    await started.wait()
    print("ready", flush=True)
    if shape == "return":
        return
    if shape == "raise":
        raise RuntimeError("main failed")
    if shape == "cancel":
        asyncio.current_task().cancel()
        await asyncio.sleep(0)
    if shape == "interrupt":
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(1000)

if "uvloop" in sys.argv[3:]:
    import uvloop
    runner = lambda coro: uvloop.run(coro)
else:
    runner = asyncio.run
try:
    runner(main())
except BaseException as exc:
    print("ended with", type(exc).__name__)
print("exited", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("shape", ["return", "raise", "cancel", "interrupt"])
def test_asyncio_run_ending_with_a_runner_open_stops_its_children(
    tag: str, shape: str, loop: str
) -> None:
    pytest.importorskip(loop)
    out = run_script(ASYNCIO_SHAPES, shape, tag, loop, timeout=20)
    assert "ready" in out.stdout, out.stderr
    assert "exited" in out.stdout, out.stderr
    assert wait_gone(tagged_pids(tag), 5.0) == []


# -- 6. Ctrl-C during entry on Trio ------------------------------------------------------------

INTERRUPTED_ENTRY = """
import os, random, signal, sys, tempfile, threading
import anyio, anyio._backends._asyncio, anyio._backends._trio, corral

seed, backend = int(sys.argv[1]), sys.argv[2]
rng = random.Random(seed)
outcomes = {}

async def enter_and_leave():
    async with corral.open_runner(console=False) as r:
        await r.run(["true"])

anyio.run(enter_and_leave, backend=backend)  # warm up: imports, caches
for attempt in range(int(sys.argv[3])):
    timer = threading.Timer(rng.uniform(0, 0.005), os.kill, (os.getpid(), signal.SIGINT))
    try:
        try:
            timer.start()
            anyio.run(enter_and_leave, backend=backend)
            outcome = "finished"
        finally:
            timer.join()
    except KeyboardInterrupt:
        outcome = "interrupted"
    except BaseExceptionGroup as group:
        _, rest = group.split(KeyboardInterrupt)
        if rest is not None:
            raise
        outcome = "interrupted"
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
left = [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("corral-log-")]
print("outcomes", outcomes, "left", len(left))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_ctrl_c_at_any_point_of_entry_and_exit_is_safe(backend: str, tmp_path: Path) -> None:
    """SIGINT at a random moment of entering, using and leaving a runner, 30 times."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [PY, "-c", INTERRUPTED_ENTRY, "7", backend, "30"],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TrioInternalError" not in out.stderr
    assert out.stdout.strip().endswith("left 0"), out.stdout
    assert "interrupted" in out.stdout  # the signal did land inside, at least sometimes


# -- 7, 8, 9. the lifeline ------------------------------------------------------------------

WINDOW = """
import os, signal, sys
import anyio, corral, corral._sys._lifeline

tag = sys.argv[2]
# Die exactly in the window between the spawn and its registration: the child
# runs, the lifeline was told it is coming but not its pid.
def die(self, number, pgid):
    print("spawned", pgid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

corral._sys._lifeline.Lifeline.spawned = die

async def main():
    async with corral.open_runner(console=False) as r:
        print("folder", r._hub.server.folder, flush=True)
        print("lifeline", r._lifeline.pid, flush=True)
        await r.start(["sh", "-c", "sleep 1000 & sleep 1000"], extra_env={"CORRAL_TEST_TAG": tag})

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_launcher_killed_between_spawn_and_registration_leaves_no_child(
    backend: str, tag: str
) -> None:
    proc = subprocess.run(
        [PY, "-c", WINDOW, backend, tag], capture_output=True, text=True, timeout=20
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert "spawned" in lines, proc.stdout
    # The lifeline found the child (and its group) by its marker in /proc,
    assert wait_gone(tagged_pids(tag), 5.0) == []
    # ...removed the log socket's folder (9), and exited.
    assert wait_gone([int(lines["lifeline"])], 5.0) == []
    assert not os.path.exists(lines["folder"])


BURST = """
import os, sys
import anyio, corral

tag = sys.argv[2]

async def main():
    async with corral.open_runner(console=False) as r:
        print("folder", r._hub.server.folder, r._lifeline.pid, flush=True)
        for i in range(200):
            await r.start(["sleep", "1000"], name=f"s{i}", extra_env={"CORRAL_TEST_TAG": tag})
            print("started", i, flush=True)

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_launcher_killed_during_a_burst_of_starts_leaves_no_child(backend: str, tag: str) -> None:
    for attempt in range(5):
        proc = subprocess.Popen([PY, "-c", BURST, backend, tag], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        _, folder, lifeline = proc.stdout.readline().split()
        # Somewhere in the middle of the burst, at another child each attempt.
        kill_at = 10 + 37 * attempt
        while proc.stdout.readline().split() != ["started", str(kill_at)]:
            pass
        proc.kill()
        proc.wait()
        proc.stdout.close()
        assert wait_gone(tagged_pids(tag), 5.0) == [], f"attempt {attempt}"
        assert wait_gone([int(lifeline)], 5.0) == []
        assert not os.path.exists(folder), f"attempt {attempt}: {folder} left behind"


DEAD_LIFELINE = """
import os, signal, sys
import anyio, corral

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as some applications have it
tag = sys.argv[2]

async def main():
    import logging, threading
    seen = []
    got_error = threading.Event()

    class Catch(logging.Handler):  # called on the log worker thread
        def emit(self, record):
            seen.append(record)
            if "lifeline" in record.getMessage():
                got_error.set()

    async with corral.open_runner(console=False, handlers=[Catch(logging.ERROR)]) as r:
        first = await r.start(["sleep", "1000"], extra_env={"CORRAL_TEST_TAG": tag})
        lifeline = r._lifeline.pid
        os.kill(lifeline, signal.SIGKILL)  # an administrator, the OOM killer
        assert await anyio.to_thread.run_sync(got_error.wait, 5)
        # Starting another child must neither kill us (SIGPIPE) nor go unprotected.
        second = await r.start(["sleep", "1000"], extra_env={"CORRAL_TEST_TAG": tag})
        assert r._lifeline.pid not in (None, lifeline)
        print("children", first.pid, second.pid, flush=True)
        print("error", [rec.getMessage() for rec in seen][0], flush=True)
        await anyio.sleep_forever()

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_killed_lifeline_is_replaced_and_adopts_every_group(backend: str, tag: str) -> None:
    proc = subprocess.Popen(
        [PY, "-c", DEAD_LIFELINE, backend, tag],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("children"), line + (proc.stderr.read() if proc.stderr else "")
        error = proc.stdout.readline()
        assert "died" in error and "adopts" in error, error
        assert len(tagged_pids(tag)) == 2
        proc.kill()  # now the launcher dies: the new lifeline kills both
        proc.wait()
        assert wait_gone(tagged_pids(tag), 5.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# -- 10, 11. memory stays bounded ------------------------------------------------------------

BIG_LINES = """
import sys, anyio, corral

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024

CHILD = "import os\\nline = b'x' * (1 << 20) + b'\\\\n'\\nfor _ in range(150): os.write(1, line)"

async def main():
    async with corral.open_runner(console=False) as r:
        await r.run([sys.executable, "-c", "pass"])  # warm up
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = rss()
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(r.run, [sys.executable, "-c", CHILD])
        print(rss() - before)

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_megabyte_lines_with_no_consumer_keep_memory_bounded(backend: str) -> None:
    out = run_script(BIG_LINES, backend, timeout=50)
    assert out.returncode == 0, out.stderr
    growth = int(out.stdout)
    # 600 lines of 1 MiB: the backlog keeps at most 256 KiB per source, records
    # are built for nobody, the collector holds a few reads at a time.
    assert growth < 96 * 1024 * 1024, f"launcher grew by {growth / 2**20:.0f} MiB"


@pytest.mark.anyio
async def test_an_endless_start_up_report_is_refused(tag: str) -> None:
    endless = "import os\nchunk = b'x' * 65536\nwhile True: os.write(3, chunk)"
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(20), pytest.raises(corral.HandshakeError, match="without a newline"):
            await r.start([PY, "-c", endless], extra_env={TAG_VAR: tag}, wait_started=True)
    assert tagged_pids(tag) == []


# -- 12, 13. bad names and argv ----------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("argv", ["whoami", b"whoami"])
async def test_a_string_argv_is_refused_with_the_fix_named(argv: object) -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(TypeError, match=r"shlex\.split"):
            await r.start(argv)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="list of arguments"):
            await r.run(argv)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_source_too_long_for_a_file_name_still_reaches_every_handler(
    tmp_path: Path,
) -> None:
    logs = ListHandler()
    long = "w" * 300  # fine on the wire, too long for a file name
    code = (
        "import logging, os, corral.child\n"
        f"os.environ['CORRAL_SOURCE'] = 'corral.{long}'\n"
        "corral.child.connect(logging.INFO)\n"
        "for i in range(3): logging.info('record %d', i)\n"
    )
    async with corral.open_runner(console=False, handlers=[logs], log_dir=tmp_path) as r:
        await r.run([PY, "-c", code], name="short")
        folder = Path(r.log_path or "")
    assert logs.messages(f"corral.{long}") == ["record 0", "record 1", "record 2"]
    combined = (folder / "combined.log").read_text()
    assert combined.count(f"corral.{long} root: record") == 3
    assert "go to combined.log only" in combined
    assert not [e for e in logs.records if e.levelno >= logging.ERROR]


# -- 16. a token used after its asyncio loop stopped ---------------------------------------------


def test_token_after_the_loop_stopped_raises_at_once() -> None:
    loop = asyncio.new_event_loop()
    tokens: list[corral.LoopToken] = []

    async def main() -> None:
        async with corral.open_runner(console=False, handle_signals=False) as r:
            tokens.append(r.token)

    try:
        loop.run_until_complete(main())  # stopped, not closed
        results: list[BaseException] = []

        def call() -> None:
            try:
                tokens[0].run_sync(lambda: None)
            except BaseException as exc:
                results.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), "run_sync hung on a stopped loop"
        assert len(results) == 1 and isinstance(results[0], anyio.RunFinishedError)
    finally:
        loop.close()
