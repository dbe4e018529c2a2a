"""The start-up handshake: start returns when the child says so, never by polling."""

from __future__ import annotations

import json
import os
import sys
import time

import anyio
import pytest
from tests.conftest import TAG_VAR

import corral
import corral.child

pytestmark = pytest.mark.anyio

PY = sys.executable


async def test_python_child_reports_a_value_and_keeps_running(tag: str) -> None:
    code = "import corral.child, time\ncorral.child.started({'run_id': 'abc'})\ntime.sleep(1000)"
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", code], env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == {"run_id": "abc"}
        assert p.returncode is None
        await p.terminate()


async def test_shell_child_reports_through_the_descriptor(tag: str) -> None:
    script = "echo '{\"port\": 8080}' >&$CORRAL_STARTED_FD; exec sleep 1000"
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sh", "-c", script], env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == {"port": 8080}
        await p.terminate()


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
            ["sh", "-c", "exec 3>&-; exec sleep 1000"], env={TAG_VAR: tag}, wait_started=True
        )
        assert p.started_value is None
        assert p.returncode is None
        await p.terminate()


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
        p = await r.start([PY, "-c", code], env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == {"k": list(range(200))}
        await p.terminate()


async def test_one_megabyte_value_arrives_whole(tag: str) -> None:
    code = "import corral.child, time\ncorral.child.started('x' * 1_000_000)\ntime.sleep(1000)"
    async with corral.open_runner(console=False) as r:
        p = await r.start([PY, "-c", code], env={TAG_VAR: tag}, wait_started=True)
        assert p.started_value == "x" * 1_000_000
        await p.terminate()


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
                ["sleep", "1000"], env={TAG_VAR: tag}, wait_started=True, start_timeout=0.2
            )
        assert r.processes == ()


async def test_malformed_json_names_the_process_and_quotes_it(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(corral.HandshakeError) as info:
            await r.start(
                ["sh", "-c", "echo 'ready: yes' >&3; exec sleep 1000"],
                name="svc",
                env={TAG_VAR: tag},
                wait_started=True,
            )
        assert r.processes == ()
    assert "'svc'" in str(info.value)
    assert "ready: yes" in str(info.value)


async def test_cancelling_a_waiting_start_stops_the_child(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with anyio.move_on_after(0.2):
            await r.start(["sleep", "1000"], env={TAG_VAR: tag}, wait_started=True)
        assert r.processes == ()


def test_started_is_a_no_op_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_STARTED_FD", raising=False)
    assert corral.child.started({"x": 1}) is False


def test_started_rejects_unserialisable_values_before_writing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    monkeypatch.setenv("CORRAL_STARTED_FD", str(write_end))
    try:
        with pytest.raises(TypeError):
            corral.child.started(object())
        assert os.environ["CORRAL_STARTED_FD"] == str(write_end)  # still usable
        assert corral.child.started([1, 2]) is True
        assert corral.child.started("again") is False
        assert json.loads(os.read(read_end, 100)) == [1, 2]
    finally:
        os.close(read_end)


async def test_handshake_descriptor_is_released_once_the_report_is_in(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        before = len(os.listdir("/proc/self/fd"))
        p = await r.start(
            ["sh", "-c", "echo 1 >&3; exec sleep 1000"], env={TAG_VAR: tag}, wait_started=True
        )
        # pidfd, stdout and stderr; not the handshake pipe any more.
        assert len(os.listdir("/proc/self/fd")) - before == 3
        await p.terminate()
