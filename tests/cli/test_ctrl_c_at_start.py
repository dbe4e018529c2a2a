"""A Ctrl-C at any instant of the command's start: 130, one line, nothing left.

From the moment the console script's module (``corral._cli.__main__``) runs, a SIGINT sent to
the command's process group at any instant of ``corral run -n 8`` or ``corral up`` starting
(its imports, the event loop's start, the runner's, the processes') ends it with 130 and one
line on stderr: never a ``KeyboardInterrupt`` traceback from an import, never 0, never 1.
The command runs through a one-line wrapper that says when the entry module has run, and the
SIGINT comes a swept delay after that: a few dozen instants spread over the whole start.
(Before that instant the interpreter starts, ``site`` included, which no program can guard.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.cli.test_cli import environ
from tests.helpers.processes import still_running, tagged_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PY = sys.executable

#: The console script, saying when its module has run (its SIGINT handler is in place).
ENTRY = (
    "import os\nimport corral._cli.__main__ as entry\nos.write(1, b'entered\\n')\nentry.main()\n"
)

#: Delays after the entry module ran, in seconds: dense where the command imports and the
#: runner starts, sparser once the processes run.
DELAYS = [i * 0.015 for i in range(16)] + [0.25 + i * 0.04 for i in range(14)]

#: What the one line may say: stopped before anything started, or what the runner stops.
SAID = ("corral: Ctrl-C: stopped before anything started", "corral: Ctrl-C: stopping ")


def _interrupt(argv: list[str], cwd: Path, tag: str, delay: float) -> tuple[int, str]:
    proc = subprocess.Popen(
        [PY, "-c", ENTRY, *argv],
        cwd=cwd,
        env=environ(tag),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"entered\n"
        time.sleep(delay)  # the instant swept, not a wait for anything
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err.decode("utf-8", "replace")


@pytest.mark.parametrize("command", ["run", "up"])
def test_a_ctrl_c_at_any_instant_of_the_start(tmp_path: Path, tag: str, command: str) -> None:
    (tmp_path / "Procfile").write_text("web: exec sleep 30\nworker: exec sleep 30\n")
    argv = ["run", "-n", "8", "--", "sh", "-c", "exec sleep 30"] if command == "run" else ["up"]
    wrong = []
    for delay in DELAYS:
        code, err = _interrupt(argv, tmp_path, tag, delay)
        lines = [line for line in err.splitlines() if line.strip()]
        if code != 130 or len(lines) != 1 or not lines[0].startswith(SAID):
            wrong.append((delay, code, err[-600:]))
        left = still_running(tagged_pids(tag))
        assert left == [], (delay, left)
    assert wrong == [], wrong
