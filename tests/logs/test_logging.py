"""Captured output as log records: routing, files, live tails, nothing lost."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from tests.helpers.loops import OTHER_LOOP, one_loop
from tests.helpers.processes import ListHandler
from tests.programs import program

import corral

pytestmark = pytest.mark.anyio

# One loop (tests/helpers/loops.py): lines and records are routed, written and handled on a
# worker thread whatever the loop.  The gigabyte flood, end to end, runs on the other.
anyio_backend = one_loop()

PY = sys.executable


async def test_stdout_and_stderr_become_records_with_level_and_stream() -> None:
    logs = ListHandler()
    script = "import sys; print('out'); sys.stderr.write('err\\n'); sys.stdout.write('no newline')"
    async with corral.open_runner(name="app", console=False, handlers=[logs]) as r:
        await r.run([PY, "-c", script], name="p")
    got = {
        (r.getMessage(), r.levelno, r.corral_stream, r.name)  # type: ignore[attr-defined]
        for r in logs.records
        if getattr(r, "corral_source", None) == "app.p"
    }
    assert got == {
        ("out", logging.INFO, "stdout", "app.p"),
        ("err", logging.WARNING, "stderr", "app.p"),
        ("no newline", logging.INFO, "stdout", "app.p"),
    }


async def test_undecodable_bytes_are_replaced_not_lost() -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        await r.run(["printf", "caf\\351 ok\\n"], name="bytes")
    assert logs.messages("corral.bytes") == ["caf\ufffd ok"]


async def test_records_are_written_before_wait_returns() -> None:
    logs = ListHandler()
    script = "import os\nfor i in range(2000): print(i)\nos._exit(0)"
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        p = await r.start([PY, "-c", script], name="burst")
        await p.wait()
        # Inside the block, right after wait(): every line is with the handler.
        assert logs.messages("corral.burst") == [str(i) for i in range(2000)]


@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(3))
async def test_repeated_bursts_then_sigkill_lose_nothing(repeat: int) -> None:
    logs = ListHandler()
    script = (
        "import os, sys\n"
        "for i in range(5000): sys.stdout.write(f'{i}\\n')\n"
        "sys.stdout.flush()\n"
        "os.kill(os.getpid(), 9)\n"
    )
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        procs = [await r.start([PY, "-c", script], name=f"b{i}", check=False) for i in range(4)]
        for p in procs:
            assert await p.wait() == -9
            assert logs.messages(p.source) == [str(i) for i in range(5000)]


async def test_route_by_process_glob_and_level() -> None:
    web, errors, everything = ListHandler(), ListHandler(logging.WARNING), ListHandler()
    routes = [
        corral.Route(web, "web*"),
        corral.Route(errors, "*"),
        corral.Route(everything),
    ]
    async with corral.open_runner(name="svc", console=False, handlers=routes) as r:
        await r.run(["sh", "-c", "echo w; echo w2 >&2"], name="web-1")
        await r.run(["sh", "-c", "echo d; echo d2 >&2"], name="db")
    assert web.messages() == ["w", "w2"] or sorted(web.messages()) == ["w", "w2"]
    assert sorted(errors.messages()) == ["d2", "w2"]
    assert {"w", "w2", "d", "d2"} <= set(everything.messages())
    # The runner's own lifecycle records reach "*" routes only.
    assert any(m.startswith("started web-1") for m in everything.messages("svc"))
    assert not any(m.startswith("started") for m in web.messages())


async def test_a_handler_without_a_level_gets_every_line_whatever_the_root_level() -> None:
    """The root logger's level governs propagation only, not the runner's own handlers."""
    quiet = ListHandler(logging.NOTSET)
    leveled = ListHandler(logging.WARNING)
    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.WARNING)
    try:
        async with corral.open_runner(console=False, handlers=[quiet, leveled]) as r:
            await r.run(["sh", "-c", "echo info; echo warn >&2"], name="x")
    finally:
        root.setLevel(old)
    assert sorted(quiet.lines("corral.x")) == ["info", "warn"]
    assert leveled.lines("corral.x") == ["warn"]


async def test_records_do_not_propagate_unless_asked() -> None:
    caught = ListHandler()
    root = logging.getLogger()
    old = root.level
    root.addHandler(caught)
    root.setLevel(logging.DEBUG)
    try:
        async with corral.open_runner(name="quiet", console=False) as r:
            await r.run(["echo", "hidden"], name="e")
        assert "hidden" not in caught.messages()
        async with corral.open_runner(name="loud", console=False, propagate=True) as r:
            await r.run(["echo", "shown"], name="e")
        assert "shown" in caught.messages()
        shown = next(rec for rec in caught.records if rec.getMessage() == "shown")
        assert shown.name == "loud.e"
    finally:
        root.removeHandler(caught)
        root.setLevel(old)


async def test_log_dir_has_a_file_per_source_and_a_combined_file(tmp_path: Path) -> None:
    async with corral.open_runner(name="job", console=False, log_dir=tmp_path) as r:
        assert r.log_path is not None
        await r.run(["sh", "-c", "echo alpha; echo beta >&2"], name="a")
        await r.run(["sh", "-c", "echo gamma; exit 3"], name="b", check=False)
    folder = Path(r.log_path)
    assert folder.parent == tmp_path
    assert folder.name.endswith("-job")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["combined.log", "job.a.log", "job.b.log", "job.log"]
    a = (folder / "job.a.log").read_text().splitlines()
    # Order is kept per channel; stdout and stderr are two channels.
    assert sorted(line.split(" ", 2)[2] for line in a) == [
        "INFO     [stdout] alpha",
        "WARNING  [stderr] beta",
    ]
    combined = (folder / "combined.log").read_text()
    assert "job.a [stdout] alpha" in combined
    assert "job.b [stdout] gamma" in combined
    # The timeline is readable from the combined file alone.
    assert "job started a (pid " in combined
    assert "b (pid " in combined
    assert "exited with code 3" in combined


async def test_console_prefix(capfd: pytest.CaptureFixture[str]) -> None:
    async with corral.open_runner(name="con") as r:
        await r.run(["echo", "hello console"], name="say")
    err = capfd.readouterr().err
    line = next(line for line in err.splitlines() if "hello console" in line)
    stamp, rest = line.split(" ", 1)
    assert len(stamp) == 8
    assert stamp.count(":") == 2
    assert rest == "con.say | hello console"  # no colour codes: not a terminal


def on_signal_print(n: int) -> str:
    """A child that prints ``n`` lines only once it gets SIGUSR1 (after reporting started)."""
    return (
        "import corral.child, signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
        "corral.child.started()\n"
        "signal.sigwait({signal.SIGUSR1})\n"
        f"for i in range({n}): print(i)\n"
    )


async def test_live_tail_yields_records_and_ends_after_exit() -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", on_signal_print(1000)], name="t", wait_started=True)
        tail = p.logs()
        p.send_signal(signal.SIGUSR1)
        seen = [record.getMessage() async for record in tail]
        assert p.returncode == 0
        assert seen == [str(i) for i in range(1000)]
        # A tail opened after the exit replays the last 256 records and ends.
        assert [rec.getMessage() async for rec in p.logs()] == [str(i) for i in range(744, 1000)]


async def test_tail_opened_late_sees_the_backlog() -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sh", "-c", "echo one; echo two; exec sleep 1000"], name="late")
        records = p.logs()
        first = [await records.receive(), await records.receive()]
        assert [rec.getMessage() for rec in first] == ["one", "two"]
        await p.stop()
        assert [rec async for rec in records] == []


async def test_slow_tail_applies_backpressure_without_loss() -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", on_signal_print(3000)], name="slow", wait_started=True)
        seen = []
        async with p.logs(buffer=4) as records:
            p.send_signal(signal.SIGUSR1)
            async for record in records:
                seen.append(record.getMessage())
                if len(seen) % 500 == 0:
                    await anyio.sleep(0.01)
        assert seen == [str(i) for i in range(3000)]


async def test_closed_tail_does_not_block_the_child() -> None:
    script = "import corral.child\ncorral.child.started()\nfor i in range(5000): print(i)"
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", script], name="c", wait_started=True)
        records = p.logs(buffer=1)
        await records.aclose()
        with anyio.fail_after(20):
            assert await p.wait() == 0


async def test_handler_errors_do_not_stop_delivery(capfd: pytest.CaptureFixture[str]) -> None:
    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("handler broke")

    good = ListHandler()
    async with corral.open_runner(console=False, handlers=[Broken(logging.INFO), good]) as r:
        await r.run(["echo", "still here"], name="e")
    assert "still here" in good.messages()
    assert "handler broke" in capfd.readouterr().err


def test_log_files_cap_open_descriptors(tmp_path: Path) -> None:
    from corral._logs._records import make_record
    from corral._logs._sinks import LogFiles

    files = LogFiles(tmp_path, max_open=3)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(20):
        files.handle(make_record(f"r.p{i}", logging.INFO, f"m{i}"))
        files.handle(make_record(f"r.p{i % 5}", logging.INFO, f"again{i}"))
    assert len(os.listdir("/proc/self/fd")) - before <= 3
    files.close()
    assert (tmp_path / "r.p0.log").read_text().count("\n") == 5


@pytest.mark.slow
@pytest.mark.timeout(180)
@OTHER_LOOP
def test_gigabyte_flood_with_slow_handler_is_bounded_and_complete(anyio_backend: str) -> None:
    import subprocess

    out = subprocess.run(
        program("slow_handler_flood", anyio_backend), capture_output=True, text=True, timeout=170
    )
    assert out.returncode == 0, out.stderr
    count, nbytes, growth = map(int, out.stdout.split())
    assert count == 1024 * 32
    assert nbytes == 1024 * 32 * 32767
    assert growth < 64 * 1024 * 1024, f"launcher grew by {growth / 2**20:.1f} MiB"


async def test_python_logging_records_from_a_child_arrive_whole() -> None:
    logs = ListHandler()
    async with corral.open_runner(name="app", console=False, handlers=[logs]) as r:
        p = await r.start(program("logging_child"), name="db")
        await p.wait()
        records = [rec for rec in logs.records if getattr(rec, "corral_stream", None) == "logging"]
        # Everything arrived before wait() returned, in order.
        assert [rec.getMessage() for rec in records[1:3001]] == [f"record {i}" for i in range(3000)]
    first, last = records[0], records[-1]
    assert (first.name, first.levelno, first.getMessage()) == (
        "app.db",
        logging.DEBUG,
        "before start",
    )
    assert last.levelno == logging.ERROR
    assert last.getMessage() == "it broke"
    assert last.exc_text is not None
    assert "ZeroDivisionError" in last.exc_text
    assert {rec.process for rec in records} == {p.pid}
    assert records[1].threadName == "db-thread"
    assert {rec.corral_source for rec in records} == {"app.db"}  # type: ignore[attr-defined]
    # The child's own timestamps: increasing, and before the stamp it printed last.
    stamp = next(float(m.split()[1]) for m in logs.messages("app.db") if m.startswith("stamp"))
    created = [rec.created for rec in records]
    assert created == sorted(created)
    assert created[-1] <= stamp


async def test_connect_is_a_no_op_outside_corral() -> None:
    out = await anyio.run_process(
        [PY, "-c", "import corral.child; print(corral.child.connect())"],
        env={k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
    )
    assert out.stdout.strip() == b"None"


@pytest.mark.slow
async def test_logging_records_still_in_the_socket_at_exit_arrive_before_wait_returns() -> None:
    class SlowList(ListHandler):
        def emit(self, record: logging.LogRecord) -> None:
            time.sleep(0.0002)
            super().emit(record)

    logs = SlowList()
    child = (
        "import logging, os, corral.child\n"
        "corral.child.connect(logging.INFO)\n"
        "for i in range(2000): logging.info('%d %s', i, 'x' * 10000)\n"
        "os._exit(0)\n"
    )
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        p = await r.start([PY, "-c", child], name="big")
        await p.wait()
        got = [rec.getMessage().split()[0] for rec in logs.records if rec.name == "root"]
        assert got == [str(i) for i in range(2000)]


async def test_propagation_honours_the_logger_tree_levels() -> None:
    caught = ListHandler()
    root = logging.getLogger()
    old = root.level
    root.addHandler(caught)
    root.setLevel(logging.WARNING)
    try:
        async with corral.open_runner(name="lv", console=False, propagate=True) as r:
            await r.run(["sh", "-c", "echo quiet; echo loud >&2"], name="e")
    finally:
        root.removeHandler(caught)
        root.setLevel(old)
    assert "loud" in caught.messages()
    assert "quiet" not in caught.messages()


async def test_handlers_passed_in_stay_open(tmp_path: Path) -> None:
    mine = logging.FileHandler(tmp_path / "mine.log")
    mine.setLevel(logging.INFO)
    async with corral.open_runner(console=False, handlers=[mine]) as r:
        await r.run(["echo", "first"], name="a")
    assert mine.stream is not None  # not closed: still usable
    async with corral.open_runner(console=False, handlers=[mine]) as r:
        await r.run(["echo", "second"], name="b")
    mine.close()
    assert (tmp_path / "mine.log").read_text().split() == ["first", "second"]
