"""The public face: every name says it is ``corral``'s, and ``Process`` is an AnyIO process."""

from __future__ import annotations

import pickle
import subprocess
import sys
import typing
import warnings

import anyio.abc
import pytest

import corral

CLAIMS = """
import sys, typing
import corral
from corral import ProcessFailed  # a name a user reaches first
failures = []
for name in corral.__all__:
    value = getattr(corral, name)
    if isinstance(value, type) or callable(value):
        if value.__module__ != "corral":
            failures.append(f"{name}: {value.__module__}")
        if isinstance(value, type):
            typing.get_type_hints(value)  # annotations still resolve
print("\\n".join(failures) or "ok")
"""


@pytest.mark.slow
def test_every_public_class_and_function_is_corral_s() -> None:
    # In a fresh interpreter: what a user's tracebacks and reprs show.
    done = subprocess.run(
        [sys.executable, "-c", CLAIMS], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


@pytest.mark.slow
def test_an_error_raised_inside_before_the_facade_names_it_says_corral() -> None:
    script = (
        "import anyio, corral\n"
        "async def main():\n"
        "    async with corral.open_runner(console=False) as r:\n"
        "        await r.run(['false'])\n"
        "anyio.run(main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "corral.ProcessFailed: " in done.stderr, done.stderr
    assert "corral._errors" not in done.stderr


def test_public_objects_pickle_by_their_public_name() -> None:
    error = corral.ProcessFailed(1, ["false"], name="false", pid=1)
    assert b"ccorral\nProcessFailed\n" in pickle.dumps(error, protocol=0)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is corral.ProcessFailed
    assert (again.returncode, again.cmd, again.name) == (1, ["false"], "false")
    assert typing.get_type_hints(corral.SSH)["user"] == str | None


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_process_is_an_anyio_process() -> None:
    assert issubclass(corral.Process, anyio.abc.Process)
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"])
        assert isinstance(p, anyio.abc.Process)
        handle: anyio.abc.Process = p  # what code written for anyio.open_process takes
        assert handle.returncode is None
        assert p.args == ["sleep", "1000"]
        with pytest.warns(DeprecationWarning, match="Process.args"):
            assert p.argv == ("sleep", "1000")
        handle.terminate()
        assert await handle.wait() == -15
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert p.args == ["sleep", "1000"]  # args itself never warns


def test_dir_shows_the_public_names_only() -> None:
    names = [n for n in dir(corral) if not n.startswith("__")]
    assert set(names) - {"child", "testing"} == set(corral.__all__)
    for module in ("sys", "typing", "importlib", "annotations", "TYPE_CHECKING", "Any"):
        assert module not in dir(corral)
