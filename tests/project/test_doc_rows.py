"""The tests that the documentation names (``test_file::test_name``) exist.

docs/howto/failures.rst and docs/howto/limits.rst name, on each row, the test that holds it;
a row whose test was renamed or removed would promise what nothing checks any more.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("**/*.rst"))
NAMED = re.compile(r"``(test_\w+)::(test_\w+)``")


@cache
def functions_of(module: str) -> frozenset[str]:
    """The test functions of every ``tests/**/<module>.py`` (several may share a name)."""
    names: set[str] = set()
    for path in (ROOT / "tests").glob(f"**/{module}.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)\(", path.read_text(), re.MULTILINE))
    return frozenset(names)


def test_the_failure_model_and_the_limits_name_their_tests() -> None:
    for page in ("failures.rst", "limits.rst"):
        assert NAMED.search((ROOT / "docs" / "howto" / page).read_text()), page


def test_every_test_the_docs_name_exists() -> None:
    missing = [
        f"{page.name}: {module}::{name}"
        for page in PAGES
        for module, name in NAMED.findall(page.read_text())
        if name not in functions_of(module)
    ]
    assert not missing, f"the docs name tests that do not exist: {missing}"
