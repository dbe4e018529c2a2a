"""Every benchmark still runs: ``python bench/X.py --smoke`` exits 0 and prints its tables.

The scripts are found with a glob, so a new ``bench/*.py`` is run here without
touching this file; ``bench/_*.py`` are the scripts' helper modules, not scripts.
``--smoke`` gives every size option a tiny value (``bench/_common.py``): this checks
that a script works with today's corral, never how fast it is.  A smoke run must
not leave a process behind, and must not crash on the way (a traceback on stderr),
even where its exit status would hide it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.processes import TAG_VAR, tagged_pids


def _root() -> Path:
    here = Path(__file__).resolve().parent
    return next(p for p in (here, *here.parents) if (p / "pyproject.toml").exists())


ROOT = _root()
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))

#: Benchmarks that need an optional package (a skip, which is an error in CI).
NEEDS = {"omp.py": "torch"}

#: Seconds a smoke run may take (below pytest-timeout's, so that this one reports).
TIMEOUT = 90
pytestmark = pytest.mark.timeout(120)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def smoke(
    script: Path, tag: str, *, ignoring_sigint: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``script --smoke`` in its own session; on a timeout, kill all it started.

    With ``ignoring_sigint``, the script starts with SIGINT ignored, as from ``&`` in a
    non-interactive shell.
    """
    env = {**os.environ, "NO_COLOR": "1", TAG_VAR: tag}
    proc = subprocess.Popen(
        [sys.executable, str(script.relative_to(ROOT)), "--smoke"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if ignoring_sigint else None,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # Its launchers may sit in sessions of their own and hold its pipes: kill
        # every process it started, not only its session.
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in tagged_pids(tag):
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{script.name} --smoke took more than {TIMEOUT} s\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_the_benchmarks_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"spawn.py", "logs.py", "latency.py"}


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_bench_runs_at_a_tiny_size(script: Path, tag: str) -> None:
    # The ``tag`` fixture marks every process the script starts and fails the test
    # if any of them is still alive afterwards.
    if script.name in NEEDS:
        pytest.importorskip(NEEDS[script.name])
    result = smoke(script, tag)
    described = f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr[-4000:]}"
    assert result.returncode == 0, f"{script.name} exited with {result.returncode}\n{described}"
    assert "# SMOKE RUN" in result.stdout, f"{script.name} printed no header\n{described}"
    assert "Traceback (most recent call last)" not in result.stderr, described


@pytest.mark.slow
@pytest.mark.parametrize("name", ["signals.py", "cli.py"])
def test_a_bench_that_sends_sigint_works_from_a_shell_that_ignores_it(name: str, tag: str) -> None:
    # Its launchers would inherit SIGINT ignored, and corral leaves an ignored signal
    # alone: the benchmark gives them the default back.
    result = smoke(ROOT / "bench" / name, tag, ignoring_sigint=True)
    assert result.returncode == 0, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
