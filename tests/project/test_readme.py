"""The README's commands are the ones that run: CI runs its test command verbatim.

README.md holds exactly two commands for a fresh machine, each in a code block
between ``<!-- run-command -->`` / ``<!-- test-command -->`` markers and their
closing ``<!-- /... -->``.  ``.ci/run`` ends with the test command, character for
character; these tests keep the two from drifting apart.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.processes import TAG_VAR

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"


def marked_command(name: str) -> str:
    """The one-line command in the code block between ``<!-- name -->`` markers."""
    text = README.read_text()
    blocks = re.findall(
        rf"<!-- {name} -->\n```\w*\n(.*?)```\n<!-- /{name} -->", text, flags=re.DOTALL
    )
    assert len(blocks) == 1, f"README.md needs exactly one <!-- {name} --> block"
    lines = blocks[0].splitlines()
    assert len(lines) == 1, f"the {name} must be a single line, not {lines}"
    return lines[0]


def test_readme_has_exactly_two_commands() -> None:
    markers = re.findall(r"<!-- ([\w-]+-command) -->", README.read_text())
    assert markers == ["run-command", "test-command"]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    lines = [line for line in CI_RUN.read_text().splitlines() if line.strip()]
    assert lines[-1] == marked_command("test-command"), (
        "the last line of .ci/run must be the README's test command, verbatim"
    )


#: What .ci/run may install with pip besides the README's test command, each with its reason.
CI_PIP_INSTALLS = {
    # the type check without torch (see test_ci_type_checks_without_torch)
    "\"$notorch/bin/pip\" install -q -e '.[trio]' mypy pytest",
    # examples/launch_torch.py's gloo all-reduce (a skip without it, an error in CI)
    "pip install torch==2.13.0",
}


def ci_commands() -> list[str]:
    return [
        line.strip()
        for line in CI_RUN.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_ci_is_the_system_packages_and_the_readme_command() -> None:
    """Nothing else is installed on the way, so that CI cannot hide a missing install step."""
    *before, last = ci_commands()
    installs = {line for line in before if re.search(r"\bpip3?\"? +install\b", line)}
    assert installs == CI_PIP_INSTALLS
    assert last == marked_command("test-command")


def test_ci_type_checks_without_torch() -> None:
    """The README's checks hold on a machine without torch: mypy sees it as optional."""
    commands = ci_commands()
    torch = commands.index("pip install torch==2.13.0")
    step = commands[:torch]
    assert 'python -m venv "$notorch"' in step
    assert any('find_spec("torch") is not None' in line for line in step)
    assert '"$notorch/bin/mypy" --strict src' in step


def test_ci_script_is_strict_bash() -> None:
    text = CI_RUN.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(CI_RUN)], check=True)


def test_test_command_runs_every_check() -> None:
    command = marked_command("test-command")
    for check in (
        "pip install -e '.[test,docs]'",
        "ruff check .",
        "ruff format --check .",
        "mypy --strict src tests/programs",
        "vulture",
        "sphinx-build -W --keep-going",
        "python -m pytest",
    ):
        assert check in command


def test_the_test_command_shows_the_20_slowest_tests() -> None:
    """The suite's time is a budget (5.5 minutes on 2 cores): CI's output shows where it goes."""
    assert "python -m pytest -q --durations=20" in marked_command("test-command")


def test_run_command_names_an_existing_example() -> None:
    words = shlex.split(marked_command("run-command"))
    scripts = [w for w in words if w.endswith(".py")]
    assert scripts, "the run command runs no example"
    for script in scripts:
        assert (ROOT / script).is_file(), f"{script} does not exist"


def readme_programs() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    # (every block runs in tests/project/test_examples.py; this one checks what the first says)
    return [b for b in blocks if "build exited with" in b]


@pytest.mark.slow
@pytest.mark.parametrize("code", readme_programs())
def test_readme_program_runs(code: str, tmp_path: Path, tag: str) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, TAG_VAR: tag},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert result.returncode == 0, result.stderr
    assert "build exited with 0" in result.stdout


def test_contributing_says_how_to_run_suites_side_by_side() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert "CONTRIBUTING.md" in README.read_text()
    assert "CORRAL_TEST_SLOT=1 python -m pytest" in text
    assert 'os.environ.get("CORRAL_TEST_SLOT"' in (ROOT / "tests/helpers/hosts.py").read_text()
    for habit in ("python -m pytest -q tests/core", "bench/README.md", "sphinx-build"):
        assert habit in text
