"""A full disk under the log folder: one warning per file, counted losses, everything else on.

On a real, small tmpfs (mounted for the test, as root, and unmounted whatever happens): the
run's files fill it, each file that cannot be written is suspended with one WARNING naming it
and the error, the lines it misses are counted (``Runner.log_lines_lost``, the runner's last
record), the console and other handlers get every line, and a file written again says how
many lines it missed.  ``corral run`` exits 1 when lines were lost, 0 with ``--allow-log-loss``.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from tests.cli.test_cli import corral
from tests.helpers.processes import ListHandler
from tests.monitor.test_monitor import MonitorClient
from tests.programs import program

import corral as corral_lib

pytestmark = pytest.mark.timeout(60)

PY = sys.executable


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted at the end even if the test failed."""
    with tempfile.TemporaryDirectory(prefix="corral-full-") as where:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", where], check=True)
        try:
            yield Path(where)
        finally:
            subprocess.run(["umount", "-l", where], check=True)


@pytest.mark.anyio
async def test_a_full_disk_suspends_the_files_counts_and_resumes(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from corral._logs import _sinks

    monkeypatch.setattr(_sinks, "RETRY_INTERVAL", 0.0)  # tried again at the next write
    filler = small_disk / "filler"
    filler.write_bytes(b"x" * 40_000)
    every = ListHandler(logging.INFO)
    suspended = re.compile(r"log file (\S+): No space left on device; its lines are counted")
    async with (
        anyio.create_task_group() as tg,
        corral_lib.open_runner(
            name="full",
            console=False,
            handlers=[every],
            log_dir=small_disk / "logs",
            monitor="127.0.0.1:0",
        ) as r,
    ):
        assert r.monitor_url is not None
        watcher = await MonitorClient.connect(r.monitor_url)
        tg.start_soon(watcher.rest)  # to the monitor's end
        proc = await r.start(program("numbered_lines"), name="flood", stdin=subprocess.PIPE)
        assert proc.stdin is not None
        await proc.stdin.send(b"0 5000\n")  # 60 KB: more than is left
        assert await every.wait_for(
            lambda: sum(bool(suspended.match(m)) for m in every.messages("full")) == 2, 20
        ), every.messages("full")
        filler.unlink()  # room again
        await proc.stdin.send(b"5000 10\n")
        assert await every.wait_for(lambda: len(every.lines("full.flood")) == 5010, 20)
        assert await every.wait_for(
            lambda: any("is written again" in m for m in every.messages("full")), 20
        ), every.messages("full")
        await proc.stdin.aclose()
        await proc.wait()
    folder = Path(r.log_path or "")
    warnings = [m for m in every.messages("full") if "log file" in m or "missed" in m]
    # One warning per file when it is suspended, naming it and the error.
    named = sorted(suspended.match(m)[1] for m in warnings if suspended.match(m))  # type: ignore[index]
    assert named == sorted([str(folder / "combined.log"), str(folder / "full.flood.log")])
    # Every line reached the other handler; the file says where and how many it missed.
    assert every.lines("full.flood") == [f"line {i:06d}" for i in range(5010)]
    text = (folder / "full.flood.log").read_text()
    kept = re.findall(r"\[stdout\] line (\d{6})$", text, re.MULTILINE)
    gap = re.findall(r"WARNING  corral \[log files\] (\d+) lines missed here", text)
    assert len(gap) == 1 and kept[-10:] == [f"{i:06d}" for i in range(5000, 5010)]
    assert len(kept) + int(gap[0]) == 5010  # each line written or counted, none twice
    # The runner's last record gives the total, as log_lines_lost does.
    assert r.log_lines_lost > int(gap[0])
    last = every.messages("full")[-1]
    assert last.startswith(f"the log files in {folder} missed {r.log_lines_lost} lines ("), last
    assert f"full.flood.log {gap[0]}" in last
    # The monitor's clients were told too, the total before the monitor's end.
    told = [row[5] for row in watcher.rows("full")]
    assert sum(bool(suspended.match(m)) for m in told) == 2, told
    assert last in told and watcher.ending[-1] == {"type": "end", "status": 0, "failure": None}
    assert "Traceback" not in capfd.readouterr().err  # no destination broke


@pytest.mark.slow
@pytest.mark.parametrize("allow", [False, True], ids=["default", "allow-log-loss"])
def test_corral_run_exits_1_when_log_lines_were_lost(
    small_disk: Path, allow: bool, tmp_path: Path, tag: str
) -> None:
    options = ["--allow-log-loss"] if allow else []
    out = corral(
        "run",
        "--log-dir",
        str(small_disk),
        *options,
        "--",
        "sh",
        "-c",
        "seq 20000",
        cwd=tmp_path,
        tag=tag,
    )
    assert out.returncode == (0 if allow else 1), out
    assert "agent-0.worker-0 | 20000\n" in out.stdout, out.stdout[-500:]  # the console has all
    lost = re.search(r"corral: the log files missed (\d+) lines", out.stderr)
    assert lost is not None and int(lost[1]) > 0, out.stderr
    assert ("exit code 1 (--allow-log-loss: 0)" in out.stderr) is not allow
    # A warning per file, among the lines (the run's own records go with them, to stdout).
    assert out.stdout.count("No space left on device") == 2, out.stdout[-2000:]
    assert "Traceback" not in out.stderr + out.stdout
