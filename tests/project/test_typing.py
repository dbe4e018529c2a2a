"""A user's program type-checks as it reads: mypy --strict and pyright flag what is wrong.

:data:`PROGRAM` calls every public entry point once as it should be called
and once with a mistake (a misspelt keyword, a deprecated attribute, an
``Optional`` used as if it were not), each marked ``# wrong``.  Both checkers
must report an error on every marked line and on no other: a keyword that
one entry point takes and its twin does not, or an ``**options: Any`` that
lets typos through, fails here.

mypy runs from the repository, with its configuration and its cache (warm
after the README's ``mypy --strict src``); pyright is the PyPI package, its
JavaScript bundled, run by the system's ``node``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

PROGRAM = textwrap.dedent(
    """
    # mypy: enable-error-code="deprecated"
    import anyio

    import corral


    def square(x: int) -> int:
        return x * x


    async def main() -> None:
        async with corral.open_runner(name="app", grace=1.0, console=False) as r:
            p = await r.start(["sleep", "1"], service=True, wait_started=False)
            await r.start(["sleep", "1"], servise=True)  # wrong
            res = await r.run(["true"], stdout=corral.PIPE, check=False)
            await r.run(["true"], chek=False)  # wrong
            print(res.stdout.decode())  # wrong: None without stdout=PIPE
            if res.stdout is not None:
                print(res.stdout.decode())
            await r.launch(square, 2, workers_per_host=1)
            await r.launch(square, 2, worker_per_host=1)  # wrong
            await r.launch_command(["true"], hosts=None)
            await r.launch_command(["true"], host=None)  # wrong
            print(p.args)
            print(p.argv)  # wrong: deprecated
            await p.stop(grace=1.0)
            await p.stop(grac=1.0)  # wrong
        corral.open_runner(grase=1.0)  # wrong
        corral.Runner(name="x", monitor=False)
        corral.Runner(nme="x")  # wrong


    with corral.open_runner_sync(backend="trio", name="s", console=False) as s:
        sp = s.start(["true"], service=True)
        s.start(["true"], servise=True)  # wrong
        s.run(["true"], check=False)
        s.run(["true"], chek=False)  # wrong
        s.launch(square, 2, workers_per_host=1)
        s.launch(square, 2, worker_per_host=1)  # wrong
        s.launch_command(["true"], hosts=None)
        s.launch_command(["true"], host=None)  # wrong
        sp.wait(timeout=1.0)
        sp.wait(timout=1.0)  # wrong
        sp.stop(grace=1.0)
    corral.open_runner_sync(consol=False)  # wrong
    corral.launch(square, 3, workers_per_host=2, name="l", log_dir=None, grace=1.0)
    corral.launch(square, 3, worker_per_host=2)  # wrong
    corral.launch(square, 3, nme="l")  # wrong
    anyio.run(main)
    """
)

WRONG = {n for n, line in enumerate(PROGRAM.splitlines(), 1) if "# wrong" in line}


def test_the_program_has_mistakes_to_find() -> None:
    assert len(WRONG) == 17


def _mypy(program: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(program)],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(SRC)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _pyright(program: Path) -> subprocess.Popen[str]:
    config = program.parent / "pyrightconfig.json"
    config.write_text(json.dumps({"typeCheckingMode": "strict", "extraPaths": [str(SRC)]}))
    return subprocess.Popen(
        [
            shutil.which("pyright") or "pyright",
            "--outputjson",  # and so no look-up of a newer version either
            "--pythonpath",
            sys.executable,
            "-p",
            str(config),
            str(program),
        ],
        cwd=program.parent,
        env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_mypy_and_pyright_flag_every_mistake_and_nothing_else(tmp_path: Path) -> None:
    if shutil.which("pyright") is None or shutil.which("node") is None:
        pytest.skip("pyright (the test extra) and node (Debian's nodejs) are needed")
    program = tmp_path / "user_program.py"
    program.write_text(PROGRAM)
    mypy, pyright = _mypy(program), _pyright(program)  # side by side
    mypy_out, _ = mypy.communicate(timeout=170)
    pyright_out, pyright_err = pyright.communicate(timeout=170)

    assert mypy.returncode == 1, mypy_out
    mypy_lines = {
        int(m.group(1)) for m in re.finditer(r"^.*user_program\.py:(\d+): error:", mypy_out, re.M)
    }
    assert mypy_lines == WRONG, mypy_out

    assert pyright.returncode == 1, pyright_out + pyright_err
    diagnostics = json.loads(pyright_out)["generalDiagnostics"]
    errors = [d for d in diagnostics if d["severity"] == "error"]
    pyright_lines = {d["range"]["start"]["line"] + 1 for d in errors}
    assert pyright_lines == WRONG, json.dumps(diagnostics, indent=1)
