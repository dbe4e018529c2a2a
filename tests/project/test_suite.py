"""The suite's own rules: what keeps it fast enough to run and honest about what it proves.

CONTRIBUTING.md says each rule; each is checked here.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "corral"


def test_the_suites_interpreters_read_corral_from_bytecode() -> None:
    """tests/conftest.py compiles the checkout once per run (``compile_once``): an interpreter
    the tests start loads every corral module it imports from up-to-date bytecode, even where
    ``PYTHONDONTWRITEBYTECODE`` is set (as here and in CI), which it keeps."""
    out = subprocess.run(
        [sys.executable, "-v", "-c", "import corral; corral.open_runner"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    imported = set(re.findall(r"^import '(corral[\w.]*)'", out.stderr, re.MULTILINE))
    from_bytecode = set(
        re.findall(r"^# code object from '.*/src/(corral/.*)\.cpython-\d+\.pyc'", out.stderr, re.M)
    )
    read = {name.replace("/__pycache__/", "/").replace("/", ".") for name in from_bytecode}
    read = {name.removesuffix(".__init__") for name in read}
    assert len(imported) > 10, out.stderr[-3000:]
    assert imported <= read, f"compiled from source: {sorted(imported - read)}"


def _decorator_names(node: ast.AST) -> set[str]:
    names = set()
    for decorator in getattr(node, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        names.add(ast.unparse(target))
        if isinstance(decorator, ast.Call) and "anyio_backend" in ast.unparse(decorator):
            names.add("parametrize(anyio_backend)")
    return names


@pytest.mark.slow
def test_a_module_on_one_loop_keeps_a_case_on_the_other() -> None:
    """CONTRIBUTING.md, "Which loop a test runs on": a module whose tests run on one loop
    (``anyio_backend = one_loop()``) keeps at least one test on the other loop."""
    modules = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        one_loop = any(
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["anyio_backend"]
            and ast.unparse(node.value).startswith("one_loop(")
            for node in tree.body
        )
        if not one_loop:
            continue
        modules.append(path.name)
        others = [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
            and _decorator_names(node) & {"OTHER_LOOP", "BOTH_LOOPS", "parametrize(anyio_backend)"}
        ]
        assert others, f"{path.relative_to(ROOT)} runs on one loop and keeps no case on the other"
    assert modules, "no module runs on one loop: is tests/helpers/loops.py still used?"


def test_every_program_is_run_by_a_test() -> None:
    """``tests/programs/``: each program is named (``program("lines", ...)``, or its file)
    somewhere else."""
    programs = ROOT / "tests" / "programs"
    texts = {p: p.read_text() for p in (ROOT / "tests").rglob("*.py")}
    for path in sorted(programs.glob("*.py")):
        if path.name == "__init__.py":
            continue
        names = (f'"{path.stem}"', f'"{path.name}"')
        used = any(n in text for p, text in texts.items() if p != path for n in names)
        assert used, f"tests/programs/{path.name} is run by no test"


def test_tmp_path_leaves_room_for_the_runners_log_socket(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """tests/conftest.py's short_basetemp: a test that sets TMPDIR to its ``tmp_path`` in a
    pytest-xdist worker still gets a log socket under the 107 bytes a Unix socket path holds."""
    base = str(tmp_path_factory.getbasetemp())
    worker = "" if "popen-gw" in base else "/popen-gw19"
    longest = f"{base}{worker}/{'t' * 30}10/corral-log-abcdefgh/log.sock"
    assert len(longest.encode()) <= 107 - 10, longest  # and ten bytes to spare


def test_the_fast_tier_is_documented_and_leaves_out_the_slow_fixtures() -> None:
    """CONTRIBUTING.md names the fast tier's marker expression; tests/conftest.py marks every
    test that uses the sshd hosts or the Slurm cluster ``slow``."""
    assert 'python -m pytest -q -n 2 -m "not slow"' in (ROOT / "CONTRIBUTING.md").read_text()
    from tests.conftest import SLOW_FIXTURES

    assert {"ssh_hosts", "slurm_cluster"} <= SLOW_FIXTURES
