"""The suite needs nothing but what ``pip install -e '.[test,docs]'`` installs.

A test that imports a package no extra declares passes on a machine that has it by chance
and fails on a fresh one.  So the suite's imports are checked in a virtual environment made
from the extras alone: its ``site-packages`` holds exactly the installed distributions that
corral's ``test`` and ``docs`` extras require, followed through their own requirements (and
corral itself, from this checkout), and nothing of the machine's other packages.  In it, every
test module must import, and every module any test imports, even inside a function, must be
found, except the optional ones below: a test that uses one of those skips where it is absent.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

#: Modules a test may use without an extra declaring them, each with its reason.  A test that
#: uses one calls ``pytest.importorskip`` for it first (see test_optional_modules_are_skipped).
OPTIONAL = {"torch": "one example and the torch rows of the docs; CI installs it on its own"}


def extras_closure(extras: frozenset[str] = frozenset({"test", "docs"})) -> set[str]:
    """The installed distributions that corral with ``extras`` needs (as pyproject.toml says,
    not as an older install recorded), requirements followed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = [*project["dependencies"]]
    for extra in extras:
        ours += project["optional-dependencies"][extra]
    wanted: dict[str, frozenset[str]] = {"corral": extras}
    todo = [
        (r.name, frozenset(r.extras))
        for r in map(Requirement, ours)
        if r.marker is None or r.marker.evaluate({"extra": ""})
    ]
    while todo:
        name, asked = todo.pop()
        key = canonicalize_name(name)
        if key in wanted and asked <= wanted[key]:
            continue
        wanted[key] = wanted.get(key, frozenset()) | asked
        for line in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(
                marker.evaluate({"extra": extra}) for extra in {"", *wanted[key]}
            ):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return set(wanted)


def make_venv(folder: Path) -> Path:
    """A venv whose site-packages links the extras' distributions and nothing else."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    purelib = Path(
        sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)})
    )
    for name in extras_closure() - {"corral"}:
        dist = importlib.metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "__pycache__"}
        for top in tops:
            target = purelib / top
            if not target.exists():
                target.symlink_to(Path(str(dist.locate_file(top))))
    # corral itself: this checkout's source, and its metadata for the pytest plugin.
    corral = importlib.metadata.distribution("corral")
    metadata = Path(str(corral.locate_file(""))) / f"corral-{corral.version}.dist-info"
    (purelib / metadata.name).symlink_to(metadata)
    (purelib / "corral-checkout.pth").write_text(f"{ROOT / 'src'}\n")
    return folder / "bin" / "python"


def all_test_modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in TESTS.rglob("test_*.py")
    )


def python_files() -> Iterator[Path]:
    yield from TESTS.rglob("*.py")


def imported_names() -> dict[str, set[str]]:
    """Every top-level module any file of ``tests/`` imports (at any depth), with its files."""
    found: dict[str, set[str]] = {}
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    for name in (*sys.stdlib_module_names, "tests", "corral"):
        found.pop(name, None)
    return found


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_suite_imports_in_a_venv_of_the_extras_alone(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv")
    imported = imported_names()
    probe = (
        "import importlib, importlib.util, json, sys\n"
        "for module in sys.argv[2:]:\n"
        "    importlib.import_module(module)\n"
        "missing = [m for m in json.loads(sys.argv[1]) if importlib.util.find_spec(m) is None]\n"
        "print(json.dumps(missing))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = subprocess.run(
        [str(python), "-c", probe, json.dumps(sorted(imported)), *all_test_modules()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, f"a test module fails to import from the extras:\n{out.stderr}"
    missing = set(json.loads(out.stdout)) - set(OPTIONAL)
    assert not missing, "no extra declares these, which the tests import: " + ", ".join(
        f"{name} ({', '.join(sorted(imported[name]))})" for name in sorted(missing)
    )


def test_the_venv_holds_the_extras_and_not_the_rest() -> None:
    """What the venv is made of: the extras' closure, without an optional module's package."""
    closure = extras_closure()
    assert {"pytest", "trio", "sphinx", "hypothesis", "python-dotenv", "msgspec"} <= closure
    assert "torch" not in closure


@functools.cache
def programs_needing_optional() -> frozenset[str]:
    """The programs of ``tests/programs/`` that import an optional module."""
    pattern = re.compile(rf"^\s*(import|from) ({'|'.join(OPTIONAL)})\b", re.MULTILINE)
    return frozenset(
        p.stem for p in (TESTS / "programs").glob("*.py") if pattern.search(p.read_text())
    )


def uses(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` imports one of ``names``, refers to a global defined as doing so, or
    runs a program that does (``program("torch_record")``, ``path("torch_record")``)."""
    needing = programs_needing_optional()
    for child in ast.walk(node):
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Name)
            and child.func.id in ("program", "path")
            and child.args
            and isinstance(child.args[0], ast.Constant)
            and child.args[0].value in needing
        ):
            return True
        if isinstance(child, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module]
            )
            if any(m and m.split(".")[0] in OPTIONAL for m in modules):
                return True
        if isinstance(child, ast.Name) and child.id in names:
            return True
    return False


def skips_for(node: ast.AST, module: str) -> bool:
    for child in ast.walk(node):
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute)
            and child.func.attr == "importorskip"
            and child.args
            and isinstance(child.args[0], ast.Constant)
            and child.args[0].value == module
        ):
            return True
    return False


def optional_users(tree: ast.Module, source: str) -> set[str]:
    """The module-level names whose definition imports an optional module (a function, or a
    program in a string), found again until no more are."""
    pattern = re.compile(rf"^\s*(import|from) ({'|'.join(OPTIONAL)})\b", re.MULTILINE)
    lines = source.splitlines()
    names: set[str] = set()
    while True:
        more = set()
        for node in tree.body:
            targets = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                targets = [node.name]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            segment = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            if any(t not in names for t in targets) and (
                pattern.search(segment) or uses(node, names)
            ):
                more |= set(targets)
        if not more - names:
            return names
        names |= more


@pytest.mark.slow
def test_optional_modules_are_skipped() -> None:
    """A test that needs torch (directly, through a function or a program that imports it)
    calls ``pytest.importorskip("torch")``: where torch is absent it skips, not fails."""
    unguarded = []
    for path in TESTS.rglob("test_*.py"):
        source = path.read_text()
        tree = ast.parse(source, str(path))
        users = optional_users(tree, source)
        for node in tree.body:
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name.startswith("test_")
                and uses(node, users)
                and not any(skips_for(node, m) for m in OPTIONAL)
            ):
                unguarded.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not unguarded, f"these use an optional module without importorskip: {unguarded}"


def test_the_scripts_that_need_an_optional_module_are_listed() -> None:
    """A benchmark or an example that imports torch (itself or in a program it writes) is
    in its test's ``NEEDS``, which skips it where torch is absent."""
    from tests.project import test_bench, test_examples

    pattern = re.compile(rf"^\s*(import|from) ({'|'.join(OPTIONAL)})\b", re.MULTILINE)
    for folder, listed in (("bench", test_bench.NEEDS), ("examples", test_examples.NEEDS)):
        needing = {
            p.name: match.group(2)
            for p in (ROOT / folder).glob("*.py")
            if (match := pattern.search(p.read_text()))
        }
        assert needing == listed, folder
