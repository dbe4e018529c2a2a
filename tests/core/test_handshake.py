"""The start-up handshake: start returns when the child says so, never by polling."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import pytest
from tests.helpers.processes import TAG_VAR, ListHandler

import corral
import corral.child

pytestmark = pytest.mark.anyio

PY = sys.executable


@pytest.mark.slow
async def test_python_child_reports_a_value_and_keeps_running(tag: str) -> None:
    code = "import corral.child, time\ncorral.child.started({'run_id': 'abc'})\ntime.sleep(1000)"
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", code], extra_env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == {"run_id": "abc"}
        assert p.returncode is None
        await p.stop()


async def test_shell_child_reports_through_the_descriptor(tag: str) -> None:
    script = "echo '{\"port\": 8080}' >&$CORRAL_STARTED_FD; exec sleep 1000"
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sh", "-c", script], extra_env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == {"port": 8080}
        await p.stop()


async def test_descriptor_is_a_single_digit_for_dash() -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(
            ["sh", "-c", 'printf "%s\\n" "\\"$CORRAL_STARTED_FD\\"" >&$CORRAL_STARTED_FD'],
            wait_started=True,
        )
        assert p.started_value == "3"


async def test_closing_the_descriptor_reports_null(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(
            ["sh", "-c", "exec 3>&-; exec sleep 1000"], extra_env={TAG_VAR: tag}, wait_started=True
        )
        assert p.started_value is None
        assert p.returncode is None
        await p.stop()


@pytest.mark.slow
async def test_value_written_in_many_small_pieces_arrives_whole(tag: str) -> None:
    code = (
        "import os, time, json\n"
        "fd = int(os.environ['CORRAL_STARTED_FD'])\n"
        "data = json.dumps({'k': list(range(200))}).encode() + b'\\n'\n"
        "for i in range(len(data)):\n"
        "    os.write(fd, data[i:i+1])\n"
        "    time.sleep(0.0005)\n"
        "time.sleep(1000)\n"
    )
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", code], extra_env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == {"k": list(range(200))}
        await p.stop()


async def test_one_megabyte_value_arrives_whole(tag: str) -> None:
    code = "import corral.child, time\ncorral.child.started('x' * 1_000_000)\ntime.sleep(1000)"
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", code], extra_env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == "x" * 1_000_000
        await p.stop()


async def test_child_exiting_before_reporting_raises_startup_failed() -> None:
    async with corral.open_runner(console=False) as r:
        start = time.monotonic()
        with pytest.raises(corral.StartupFailed) as info:
            await r.start(["sh", "-c", "echo 'no config' >&2; exit 2"], wait_started=True)
        assert time.monotonic() - start < 2  # within 100 ms, measured by the benchmark
    err = info.value
    assert isinstance(err, corral.ProcessFailed)
    assert err.returncode == 2
    assert err.stderr == b"no config\n"
    assert "before reporting that it started" in str(err)


async def test_startup_failure_with_code_zero_does_not_also_fail_the_runner() -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(corral.StartupFailed):
            await r.start(["true"], wait_started=True)
        assert r.processes == ()


async def test_start_timeout_stops_the_child(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(TimeoutError, match="did not report"):
            await r.start(
                ["sleep", "1000"], extra_env={TAG_VAR: tag}, wait_started=True, start_timeout=0.2
            )
        assert r.processes == ()


async def test_malformed_json_names_the_process_and_quotes_it(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(corral.HandshakeError) as info:
            await r.start(
                ["sh", "-c", "echo 'ready: yes' >&3; exec sleep 1000"],
                name="svc",
                extra_env={TAG_VAR: tag},
                wait_started=True,
            )
        assert r.processes == ()
    assert "'svc'" in str(info.value)
    assert "ready: yes" in str(info.value)


async def test_cancelling_a_waiting_start_stops_the_child(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with anyio.move_on_after(0.2):
            await r.start(["sleep", "1000"], extra_env={TAG_VAR: tag}, wait_started=True)
        assert r.processes == ()


def test_started_is_a_no_op_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_STARTED_FD", raising=False)
    assert corral.child.started({"x": 1}) is False


def _handshake_env(monkeypatch: pytest.MonkeyPatch, fd: int) -> None:
    info = os.fstat(fd)
    monkeypatch.setenv("CORRAL_STARTED_FD", str(fd))
    monkeypatch.setenv("CORRAL_STARTED_PIPE", f"{info.st_dev}:{info.st_ino}")


def test_started_rejects_unserialisable_values_before_writing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    _handshake_env(monkeypatch, write_end)
    try:
        with pytest.raises(TypeError):
            corral.child.started(object())
        assert os.environ["CORRAL_STARTED_FD"] == str(write_end)  # still usable
        assert corral.child.started([1, 2]) is True
        assert corral.child.started("again") is False
        assert json.loads(os.read(read_end, 100)) == [1, 2]
        assert "CORRAL_STARTED_FD" not in os.environ
        assert "CORRAL_STARTED_PIPE" not in os.environ
    finally:
        os.close(read_end)


def test_started_writes_only_into_the_pipe_the_variables_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A grandchild inherits the variables, not the pipe: its own descriptor is left alone."""
    read_end, write_end = os.pipe()
    _handshake_env(monkeypatch, write_end)
    os.close(write_end)
    other_read, other_write = os.pipe()  # another pipe, at the same number perhaps
    log = open(tmp_path / "log", "wb")  # noqa: SIM115
    try:
        os.dup2(log.fileno(), write_end)  # the number now names a log file
        assert corral.child.started({"port": 1}) is False
        assert (tmp_path / "log").read_bytes() == b""
        _handshake_env(monkeypatch, write_end)
        os.dup2(other_write, write_end)  # a pipe, but not the launcher's
        monkeypatch.setenv("CORRAL_STARTED_PIPE", "0:0")
        assert corral.child.started({"port": 1}) is False
    finally:
        log.close()
        for fd in (read_end, other_read, other_write):
            os.close(fd)
        try:
            os.close(write_end)
        except OSError:
            pass


async def test_grandchild_with_inherited_variables_cannot_report(tag: str, tmp_path: Path) -> None:
    """The grandchild's descriptor 3 is a file of its own; started() must not write there."""
    grandchild = (
        "import corral.child, sys; "
        "print('grandchild:', corral.child.started('from the grandchild'), flush=True)"
    )
    script = f'exec 3>&-; exec 3>{tmp_path / "own.log"}; {PY} -c "{grandchild}"; exec sleep 1000'
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        p = await r.start(
            ["sh", "-c", script], name="sh", extra_env={TAG_VAR: tag}, wait_started=True
        )
        # The shell closed the real descriptor: that reports null...
        assert p.started_value is None
        async with p.logs() as records:
            async for record in records:
                if record.getMessage().startswith("grandchild:"):
                    break
        await p.stop()
    # ...and the grandchild's call wrote nothing into its own descriptor 3.
    assert "grandchild: False" in logs.lines("corral.sh")
    assert (tmp_path / "own.log").read_bytes() == b""


async def test_a_second_report_from_a_shell_is_discarded_not_a_sigpipe(tag: str) -> None:
    """The runner reads the descriptor until the child exits: writing again is harmless."""
    script = "echo 1 >&3; echo 2 >&3; echo '{\"x\": 3}' >&3; exit 0"
    async with corral.open_runner(console=False) as r:
        before = len(os.listdir("/proc/self/fd"))
        p = await r.start(["sh", "-c", f"{script}"], extra_env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == 1
        assert await p.wait() == 0  # not -SIGPIPE
        # Everything the child held is released once it has exited.
        assert len(os.listdir("/proc/self/fd")) == before


async def test_the_handshake_descriptor_is_held_only_while_the_child_runs(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        before = len(os.listdir("/proc/self/fd"))
        p = await r.start(
            ["sh", "-c", "echo 1 >&3; exec sleep 1000"], extra_env={TAG_VAR: tag}, wait_started=True
        )
        # pidfd, stdout, stderr and the handshake pipe (read and discarded until exit).
        assert len(os.listdir("/proc/self/fd")) - before == 4
        await p.stop()
        assert len(os.listdir("/proc/self/fd")) == before
