"""A worker's traceback shows the source of functions sent by value, as it would locally.

cloudpickle sends a function defined in ``__main__``, in a notebook cell or by
``exec`` as code under the file name ``<dynamic-code>``; corral sends its file
name and its lines along (:mod:`corral._launch._source`).  The cases: a script
run as ``__main__`` (a real ``python script.py``), code compiled under a file
name only the launcher's :mod:`linecache` knows (what IPython does with a
notebook cell, ``/tmp/ipykernel_<pid>/<n>.py``; tests/sync/test_notebook.py has a
real kernel), ``exec`` of a file's text under its name, and ``exec`` of a
string (``<string>``: no line, as locally).
"""

from __future__ import annotations

import linecache
import pickle
import subprocess
import textwrap
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.loops import DEFAULT, OTHER_LOOP, one_loop
from tests.helpers.processes import TAG_VAR
from tests.programs import path, program

import corral
from corral import RemoteTraceback
from corral._launch import _source

pytestmark = pytest.mark.timeout(60)

# One loop (tests/helpers/loops.py): a traceback is made in a worker, which runs no loop.
anyio_backend = one_loop()

#: A notebook cell: the function fails in a helper, two frames deep.
CELL = """\
def helper(n):
    total = n * 2
    raise ValueError(f"cell failed with {total}")  # the failing line

def from_a_cell(n):
    return helper(n) + 1
"""


def define(source: str, filename: str, register: bool) -> dict[str, Any]:
    """Run ``source`` compiled under ``filename`` in a module nobody can import."""
    if register:  # as IPython registers a cell: no modification time
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
    namespace: dict[str, Any] = {"__name__": "a_notebook_cell"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture
def cell_name(tmp_path: Path) -> Iterator[str]:
    name = str(tmp_path / "ipykernel_123" / "456.py")  # a file that does not exist
    yield name
    linecache.cache.pop(name, None)


async def remote_traceback(func: Callable[..., Any], tag: str, *args: Any) -> str:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(ValueError) as caught:
            await r.launch(func, *args, workers_per_host=1, extra_env={TAG_VAR: tag})
    cause = caught.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    return cause.text


@pytest.mark.anyio
async def test_a_notebook_cell_shows_its_lines(cell_name: str, tag: str) -> None:
    func = define(CELL, cell_name, register=True)["from_a_cell"]
    text = await remote_traceback(func, tag, 4)
    assert "<dynamic-code>" not in text, text
    assert f'  File "{cell_name}", line 6, in from_a_cell\n    return helper(n) + 1\n' in text, text
    assert (
        f'  File "{cell_name}", line 3, in helper\n'
        '    raise ValueError(f"cell failed with {total}")  # the failing line\n'
    ) in text, text
    assert text.rstrip().endswith("ValueError: cell failed with 8"), text


@OTHER_LOOP
@pytest.mark.anyio
async def test_exec_of_a_file_shows_its_lines(tmp_path: Path, tag: str) -> None:
    path = tmp_path / "generated.py"
    path.write_text(CELL)
    func = define(path.read_text(), str(path), register=False)["from_a_cell"]
    text = await remote_traceback(func, tag, 1)
    assert f'  File "{path}", line 3, in helper\n    raise ValueError(' in text, text


@pytest.mark.anyio
async def test_exec_of_a_string_shows_what_it_would_locally(tag: str) -> None:
    func = define(CELL, "<string>", register=False)["from_a_cell"]
    try:
        func(1)
    except ValueError as exc:
        local = traceback.format_exception(exc)[-2:]  # the failing frame, and the error
    text = await remote_traceback(func, tag, 1)
    assert "<dynamic-code>" not in text, text
    assert text.endswith("".join(local)), (text, local)
    assert local[0] == '  File "<string>", line 3, in helper\n'


def line_of(path: Path, text: str) -> int:
    """The number of the line of ``path`` that holds ``text``."""
    lines = path.read_text().splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if text in line]
    return number


@pytest.mark.slow
def test_a_function_of_a_script_run_as_main_shows_its_lines(tmp_path: Path, tag: str) -> None:
    """And the script's own frames, down to the call, but none of corral's machinery."""
    script = path("train_fails")
    out = subprocess.run(
        program("train_fails", DEFAULT, TAG_VAR, tag),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert out.returncode == 1, out.stderr
    shown = "\n".join(line for line in out.stderr.split("\n") if line.strip(" ^~") or not line)
    remote, _, here = shown.partition("The above exception was the direct cause")
    assert remote.startswith("corral.RemoteTraceback: \nTraceback (most recent call last):\n")
    assert remote.split("\n")[2:5] == [
        f'  File "{script}", line {line_of(script, "raise ValueError")}, in fails',
        '    raise ValueError(f"main failed with {value}")  # shown from the script',
        "ValueError: main failed with 21",
    ], shown
    lines = here.split("\n")
    assert lines[3:8] == [
        f'  File "{script}", line {line_of(script, "    main()")}, in <module>',
        "    main()",
        f'  File "{script}", line {line_of(script, "corral.launch(")}, in main',
        "    corral.launch(",
        "ValueError: main failed with 21",
    ], shown
    assert str(Path(corral.__file__).parent) not in out.stderr, out.stderr


def test_the_lines_a_job_carries_are_bounded(cell_name: str) -> None:
    """A function of huge lines: at most MAX_SOURCE bytes of them travel; it still runs."""
    long_line = "x = 0  # " + "y" * (256 * 1024) + "\n"
    source = "def huge():\n" + long_line * 12 + "    return 42\n"
    source = source.replace("\nx = 0", "\n    x = 0")
    func = define(source, cell_name, register=True)["huge"]
    payload = _source.dumps(func)
    assert len(source) > 3 * _source.MAX_SOURCE
    assert len(payload) < _source.MAX_SOURCE + 64 * 1024
    linecache.cache.pop(cell_name)
    assert pickle.loads(payload)() == 42
    shipped = linecache.getlines(cell_name)
    assert shipped[0] == "def huge():\n"
    assert 0 < sum(map(len, shipped)) <= _source.MAX_SOURCE


def test_an_importable_function_travels_by_reference_without_lines() -> None:
    payload = _source.dumps(textwrap.dedent)
    assert len(payload) < 200
    assert pickle.loads(payload) is textwrap.dedent
