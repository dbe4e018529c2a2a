"""Programs the tests run: children, launchers, agents' stand-ins, each a module of its own.

A test runs one by path, as a user runs a script (it is then ``__main__``, which is what a
launch's functions defined in a script need)::

    from tests.programs import program

    await r.run(program("lines", 100, 80))  # [sys.executable, ".../tests/programs/lines.py", ...]

They are linted with the rest (``ruff``) and type-checked (``mypy --strict src tests/programs``,
the README's test command); each says what it does and what its arguments are in its
docstring.  A program imports the standard library, corral and its dependencies only, never
``tests``: it runs where the tests' own modules are not importable (a remote host's agent, a
child in another directory).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

__all__ = ["FOLDER", "as_python", "path", "program"]

#: This folder: the programs are its modules.
FOLDER = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The file of the program ``name``."""
    found = FOLDER / f"{name}.py"
    if not found.is_file():
        raise LookupError(f"no program {name!r} in {FOLDER}")
    return found


def program(name: str, *args: object) -> list[str]:
    """The argv that runs the program ``name`` with ``args`` in this interpreter."""
    return [sys.executable, str(path(name)), *map(str, args)]


def as_python(folder: Path, name: str, *args: object) -> Path:
    """An executable ``folder/python`` that runs the program ``name``: a stand-in for a host's
    interpreter (``SSH(python=...)``), which the program may hand over to the real one
    (``os.execv(sys.executable, ...)``).  With ``args``, the program gets them first, then
    ``--``, then the arguments the stand-in was given."""
    python = folder / "python"
    words = " ".join(shlex.quote(str(arg)) for arg in (*args, "--")) if args else ""
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {path(name)} {words} "$@"\n')
    python.chmod(0o755)
    return python
