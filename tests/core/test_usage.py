"""What each process costs, read from the real ``/proc``: CPU, memory, trees, GPU absence.

The sampler (``corral._sys._proc.TreeSampler``) is called here as the runner's sampler calls it,
on real processes.  CPU figures are checked as CPU *seconds* (percent times the interval), which
a loaded machine does not change: a child that burns 0.4 s of CPU between two samples shows
that much, whatever share of a core it got.  The runner, the monitor and the command show these
figures: tests/monitor/test_monitor.py (``test_usage_*``), tests/cli/test_cli.py
(``test_terminal_status_table_shows_cpu_and_memory``), tests/launch/test_launch.py (remote).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

import corral
from corral._sys import _proc

PY = sys.executable
MIB = 1 << 20

#: Prints "ready", waits for a line from the fifo argv[1], then burns argv[2] seconds of CPU,
#: prints "burnt" and goes on burning.
BURN = textwrap.dedent(
    """
    import sys, time
    print("ready", flush=True)
    with open(sys.argv[1]) as go:
        go.readline()
    until = time.process_time() + float(sys.argv[2])
    while time.process_time() < until:
        pass
    print("burnt", flush=True)
    while True:
        pass
    """
)
#: Holds argv[1] MiB of memory (touched), prints "ready" and sleeps (until it is killed).
HOLD = textwrap.dedent(
    """
    import sys, time
    held = b"x" * (int(sys.argv[1]) << 20)
    print("ready", flush=True)
    time.sleep(60)
    """
)


@contextmanager
def started(*argvs: list[str]) -> Iterator[list[subprocess.Popen[str]]]:
    """Each argv in a process group of its own, its stdout a pipe; all killed at the end."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for argv in argvs:
            procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    process_group=0,
                )
            )
        yield procs
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def wait_line(stream: IO[str] | None, wanted: str) -> None:
    assert stream is not None
    line = stream.readline()
    assert line.strip() == wanted, line


def cpu_seconds(usage: corral.ResourceUsage, at_most: float) -> float:
    """An upper bound of the CPU seconds behind a figure measured over at most ``at_most`` s."""
    return usage.cpu_percent / 100 * at_most


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_a_tree_counts_its_descendants_cpu_and_memory_and_an_idle_process_nothing(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    os.mkfifo(go)
    tree = f"{PY} -c '{HOLD}' 100 & {PY} -c '{BURN}' {go} 0.4 & wait"
    with started(["sh", "-c", tree], [PY, "-c", HOLD, "1"]) as (shell, idle):
        wait_line(shell.stdout, "ready")
        wait_line(shell.stdout, "ready")
        wait_line(idle.stdout, "ready")
        sampler = _proc.TreeSampler()
        began = _proc.clock()
        first = sampler.sample([shell.pid, idle.pid])
        assert first[shell.pid].processes == 3  # sh and both of its children
        assert first[idle.pid].processes == 1
        go.write_text("go\n")  # the burner burns 0.4 s of CPU from now
        wait_line(shell.stdout, "burnt")
        second = sampler.sample([shell.pid, idle.pid])
        interval = _proc.clock() - began  # at least the sampler's own interval
    busy, quiet = second[shell.pid], second[idle.pid]
    # 0.4 s of CPU between the samples (less two ticks each way: /proc counts user and
    # system time in whole ticks of 10 ms).
    assert cpu_seconds(busy, interval) >= 0.36, (busy, interval)
    assert busy.rss >= 100 * MIB, busy
    assert busy.processes == 3 and busy.pid == shell.pid
    # Asleep in a read: not one clock tick (10 ms) in the interval.
    assert cpu_seconds(quiet, interval) < 0.01, (quiet, interval)
    assert 1 * MIB <= quiet.rss < 60 * MIB, quiet
    assert busy.host is None and quiet.gpu_memory is None  # no GPU here


@pytest.mark.timeout(30)
def test_what_stays_in_a_childs_process_group_counts_and_a_root_that_is_gone_is_left_out() -> None:
    # The subshell starts `sleep` and exits: `sleep` is nobody's descendant any more, but it
    # is still in the group the shell leads (corral stops it with the group).
    orphan = "(sleep 60 &) ; echo ready; read x"
    with started(["sh", "-c", orphan]) as (shell,):
        wait_line(shell.stdout, "ready")
        sampler = _proc.TreeSampler()
        figures = sampler.sample([shell.pid])
        assert figures[shell.pid].processes == 2
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
        assert sampler.sample([shell.pid]) == {}


@pytest.mark.timeout(60)
def test_sampling_64_processes_costs_a_small_share_of_a_core() -> None:
    """The benchmark (bench/resources.py) measures it; this only keeps a generous bound."""
    with started(*[["sleep", "60"] for _ in range(64)]) as procs:
        pids = [p.pid for p in procs]
        sampler = _proc.TreeSampler()
        sampler.sample(pids)  # the first: a scan of every process, and NVML tried
        samples = 2 * _proc.DISCOVER_EVERY  # two scans among them
        began = time.thread_time()
        for _ in range(samples):
            figures = sampler.sample(pids)
        spent = (time.thread_time() - began) / samples
    assert sorted(figures) == sorted(pids)
    # At one sample a second, 1 % of a core is 10 ms a sample; the bound is five times that.
    assert spent < 0.05, f"{spent * 1000:.1f} ms of CPU a sample"


def test_without_a_gpu_the_gpu_figure_is_absent_nvml_is_not_loaded_and_nothing_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert not os.path.exists(_proc.NVIDIA_DRIVER)  # no GPU here
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    with warnings.catch_warnings(), caplog.at_level(logging.DEBUG):
        warnings.simplefilter("error")
        sampler = _proc.TreeSampler()
        figures = sampler.sample([os.getpid()])
        again = sampler.sample([os.getpid()])
    assert figures[os.getpid()].gpu_memory is None
    assert again[os.getpid()].gpu_memory is None
    assert "pynvml" not in sys.modules  # not even imported without NVIDIA's driver
    assert caplog.records == []


@pytest.mark.parametrize("pynvml", ["installed", "missing"])
def test_nvml_that_cannot_start_is_no_error(
    pynvml: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where a driver shows but NVML cannot be had: no module, or no library behind it."""
    if pynvml == "missing":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails
    else:
        import pynvml as module  # nvidia-ml-py, of the test extras; its library is not here

        assert module.nvmlInit is not None
    with warnings.catch_warnings(), caplog.at_level(logging.DEBUG):
        warnings.simplefilter("error")
        assert _proc._Nvml().start_nvml() == []
    assert caplog.records == []
