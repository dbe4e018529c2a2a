"""What ``pyproject.toml`` declares is what the package is: its imports, its Pythons.

Every third-party module that ``src/`` imports belongs to a declared
dependency (or to the ``trio`` extra, or is one of the few optional imports
listed below with its reason), and every declared dependency is imported
somewhere: a dependency nothing uses is a download for nothing.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "corral"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

#: Modules ``src/`` may import without declaring them, each with its reason.
OPTIONAL_IMPORTS = {
    "pytest": "corral.testing is the pytest plugin: pytest itself loads it",
    "torch": "tried, to count the GPUs of a host; corral works without it",
    "pynvml": "the gpu extra (nvidia-ml-py): each rank's GPU memory where NVIDIA's driver is",
}

#: Distributions of an extra that ``src/`` does not import by name, each with its reason.
NOT_IMPORTED = {
    "trio": "AnyIO's Trio backend: anyio imports it when a runner is entered under trio.run",
}


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def imported_modules() -> set[str]:
    """The top-level names of every absolute import in ``src/``, standard library excluded."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"corral"}


def distributions_of(modules: set[str]) -> dict[str, str]:
    """The installed distribution (normalized name) that provides each module."""
    provided = importlib.metadata.packages_distributions()
    result = {}
    for module in modules:
        assert module in provided, f"src/ imports {module!r}, which no installed package provides"
        result[module] = _name(provided[module][0])
    return result


def test_every_import_is_declared_and_every_dependency_imported() -> None:
    declared = {_name(r) for r in PROJECT["dependencies"]}
    trio_extra = {_name(r) for r in PROJECT["optional-dependencies"]["trio"]}
    used = distributions_of(imported_modules() - set(OPTIONAL_IMPORTS))
    undeclared = sorted(m for m, d in used.items() if d not in declared | trio_extra)
    assert not undeclared, f"src/ imports these without declaring them: {undeclared}"
    unused = sorted((declared | trio_extra) - set(used.values()) - set(NOT_IMPORTED))
    assert not unused, f"declared but imported nowhere in src/: {unused}"


def test_each_optional_import_is_still_imported() -> None:
    assert set(OPTIONAL_IMPORTS) <= imported_modules()


def test_the_python_classifiers_match_requires_python() -> None:
    match = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert match, PROJECT["requires-python"]
    minors = sorted(
        int(c.rsplit(".", 1)[1])
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert minors, "no per-version Python classifiers"
    assert minors[0] == int(match.group(1)), "the oldest classifier is not requires-python's"
    assert minors == list(range(minors[0], minors[-1] + 1)), f"a gap among 3.{minors}"
    assert sys.version_info.minor in minors, "the Python running the tests is not declared"
    assert "Programming Language :: Python :: 3 :: Only" in PROJECT["classifiers"]
