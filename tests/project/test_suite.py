"""The suite's own rules: what keeps it fast enough to run and honest about what it proves.

CONTRIBUTING.md says each rule; each is checked here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
