"""The pytest plugin ``corral.testing``, run on test files of its own with ``pytester``.

Each run is a separate pytest process (``runpytest_subprocess``), which loads
the plugin through its ``pytest11`` entry point as any project's suite would,
and runs the AnyIO tests on both backends (the AnyIO plugin's own
``anyio_backend``).  Every process a run's tests start carries this test's tag,
so that the ``tag`` fixture catches one the plugin failed to end.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from tests.helpers.processes import TAG_VAR

pytest_plugins = ["pytester"]

#: Seconds one inner pytest run may take.
RUN_TIMEOUT = 120


@pytest.fixture
def run(
    pytester: pytest.Pytester, tag: str, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., pytest.RunResult]:
    """Run pytest on one test file; everything it starts carries the test's tag."""
    monkeypatch.setenv(TAG_VAR, tag)

    def run(code: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_inner=textwrap.dedent(code))
        return pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-v", "-ra", *args, timeout=RUN_TIMEOUT
        )

    return run


def assert_passed(result: pytest.RunResult, *names: str) -> None:
    out = result.stdout.str()
    for name in names:
        assert f"test_inner.py::{name} PASSED" in out, f"{name} did not pass:\n{out}"


@pytest.mark.slow
def test_the_plugin_is_registered_through_its_entry_point(
    run: Callable[..., pytest.RunResult],
) -> None:
    result = run(
        """
        def test_registered(request):
            assert request.config.pluginmanager.has_plugin("corral")
        """,
        "--fixtures",
    )
    result.stdout.fnmatch_lines(
        [
            "*fixtures defined from corral.testing*",
            "corral_log -- *",
            "corral_runner_options -- *",
            "corral_runner -- *",
            "corral_no_leaks -- *",
        ]
    )
    result = run(
        "def test_registered(request):\n"
        "    assert request.config.pluginmanager.has_plugin('corral')\n"
    )
    result.assert_outcomes(passed=1)


def test_importing_the_plugin_loads_neither_anyio_nor_the_launcher() -> None:
    code = (
        "import sys, corral.testing\n"
        "print(' '.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('anyio', 'trio') or m.startswith('corral'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["corral", "corral._facade", "corral.testing"]


CLEAN = """
import pytest, sys

@pytest.mark.anyio
async def test_runner(corral_runner, corral_no_leaks, anyio_backend):
    done = await corral_runner.run(["sh", "-c", "echo hello"], stdout=__import__("corral").PIPE)
    assert done.stdout == b"hello\\n"
    sleeper = await corral_runner.start(["sleep", "1000"])  # stopped at the end of the test
    assert sleeper.returncode is None

@pytest.mark.anyio
async def test_log(corral_runner, corral_log):
    await corral_runner.run(["sh", "-c", "echo out; echo err >&2"], name="talk")
    assert sorted(corral_log.lines("corral.talk")) == ["err", "out"]

def test_plain(corral_no_leaks):
    import subprocess
    subprocess.run(["true"], check=True)
"""


# Under pytest-trio: ``{mark}`` is its marker, or nothing in trio_mode.
UNDER_PYTEST_TRIO = """
import pytest, trio, corral

{mark}
async def test_trio_runner(corral_runner, corral_log, corral_no_leaks):
    done = await corral_runner.run(["sh", "-c", "echo hello"], stdout=corral.PIPE, name="talk")
    assert done.stdout == b"hello\\n"
    await corral_runner.run(["sh", "-c", "echo out; echo err >&2"], name="talk")
    assert sorted(corral_log.lines("corral.talk")) == ["err", "out"]
    sleeper = await corral_runner.start(["sleep", "1000"])  # stopped at the end of the test
    assert sleeper.returncode is None
    assert corral_runner.token.backend == "trio"

{mark}
async def test_trio_child_fails(corral_runner):
    await corral_runner.start(["sh", "-c", "echo dying words >&2; exit 3"], name="doomed")
    with trio.fail_after(10):
        await corral_runner.run(["sleep", "1000"])  # stopped when doomed fails
"""


@pytest.mark.slow
def test_clean_tests_pass_on_both_backends_and_under_pytest_trio(
    run: Callable[..., pytest.RunResult],
) -> None:
    """Both plugins loaded: AnyIO's tests on both backends, pytest-trio's marked ones in its run.

    pytest-trio runs a test and its fixtures in one ``trio.run``: a child's
    failure fails the test itself (not its teardown, as under AnyIO).
    """
    result = run(CLEAN + UNDER_PYTEST_TRIO.format(mark="@pytest.mark.trio"))
    result.assert_outcomes(passed=6, failed=1)
    assert_passed(
        result,
        "test_runner[asyncio]",
        "test_runner[trio]",
        "test_log[trio]",
        "test_plain",
        "test_trio_runner",
    )
    _assert_child_failure_reported(result)


@pytest.mark.slow
def test_the_fixtures_work_in_pytest_trio_s_trio_mode(
    run: Callable[..., pytest.RunResult],
) -> None:
    """pytest-trio alone, ``trio_mode = true``: unmarked async tests, the same fixtures."""
    result = run(UNDER_PYTEST_TRIO.format(mark=""), "-p", "no:anyio", "-o", "trio_mode=true")
    result.assert_outcomes(passed=1, failed=1)
    assert_passed(result, "test_trio_runner")
    _assert_child_failure_reported(result)


def _assert_child_failure_reported(result: pytest.RunResult) -> None:
    result.stdout.fnmatch_lines(
        [
            "*_ test_trio_child_fails _*",
            "*ProcessFailed: process 'doomed' (pid *) exited with code 3*",
            "*- Captured corral call -*",
            "* WARNING corral.doomed | dying words",
        ]
    )


LEAKY = """
import os, subprocess, threading, pytest

def test_leaks_a_child(corral_no_leaks):
    subprocess.Popen(["sleep", "1000"])

def test_leaks_a_zombie(corral_no_leaks):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # it has exited; nobody reaps it

def test_leaks_a_descriptor(corral_no_leaks):
    global kept
    kept = open(os.devnull)

def test_leaks_a_thread(corral_no_leaks):
    threading.Thread(target=threading.Event().wait, name="forgotten").start()  # for ever

def test_daemon_threads_are_not_leaks(corral_no_leaks):
    threading.Thread(target=threading.Event().wait, daemon=True).start()

@pytest.mark.anyio
async def test_a_runner_that_leaks_nothing(corral_no_leaks, corral_runner):
    await corral_runner.start(["sleep", "1000"])
"""


@pytest.mark.slow
def test_a_leaking_test_fails_naming_the_leak(run: Callable[..., pytest.RunResult]) -> None:
    result = run(LEAKY)
    result.assert_outcomes(passed=7, errors=4)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_child*",
            "the test leaked 1 child process(es): pid * (sleep 1000)",
            "*ERROR at teardown of test_leaks_a_zombie*",
            "the test leaked 1 child process(es): pid * (zombie: exited, never reaped)",
            "*ERROR at teardown of test_leaks_a_descriptor*",
            "the test leaked 1 descriptor(s): * (/dev/null)",
            "*ERROR at teardown of test_leaks_a_thread*",
            "the test leaked 1 thread(s): 'forgotten'",
        ]
    )
    assert_passed(
        result,
        "test_daemon_threads_are_not_leaks",
        "test_a_runner_that_leaks_nothing[asyncio]",
        "test_a_runner_that_leaks_nothing[trio]",
    )
    # The leaked sleep was ended by the plugin (the tag fixture checks that too).
    # The thread that waits for ever does not hold pytest's process up: the run ended,
    # with pytest's status, and said so.
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.stderr.lines[-1] == (
        "corral.testing: not waiting for 1 leaked thread(s) still running: 'forgotten' "
        "(see the leak report)"
    ), result.stderr.str()


FAILING = """
import anyio, pytest

@pytest.mark.anyio
async def test_fails_after_output(corral_runner):
    await corral_runner.run(["sh", "-c", "for i in $(seq 1 50); do echo line $i; done; "
                                          "echo the last word >&2"], name="chatty")
    assert False, "the test itself failed"

@pytest.mark.anyio
async def test_a_child_fails(corral_runner):
    await corral_runner.start(["sh", "-c", "echo dying words >&2; exit 3"], name="doomed")
    with anyio.fail_after(10):
        await corral_runner.run(["sleep", "1000"])  # stopped when doomed fails

@pytest.mark.anyio
async def test_passes_quietly(corral_runner):
    await corral_runner.run(["echo", "not shown"])
"""


@pytest.mark.slow
def test_a_failing_test_shows_its_childrens_last_lines(
    run: Callable[..., pytest.RunResult],
) -> None:
    result = run(FAILING)
    result.assert_outcomes(passed=4, failed=2, errors=2)
    out = result.stdout.str()
    for backend in ("asyncio", "trio"):
        result.stdout.fnmatch_lines(
            [
                f"*_ test_fails_after_output[[]{backend}[]] _*",
                "*the test itself failed*",
                "*- Captured corral call -*",
                "* DEBUG   corral | started chatty (pid *)*",
                "* INFO    corral.chatty | line 1",
                "* INFO    corral.chatty | line 50",
                "* DEBUG   corral | chatty (pid *) exited with code 0*",
            ]
        )
        result.stdout.fnmatch_lines(
            [
                f"*_ ERROR at teardown of test_a_child_fails[[]{backend}[]] _*",
                "*ProcessFailed: process 'doomed' (pid *) exited with code 3*",
                "*- Captured corral call -*",
                "* WARNING corral.doomed | dying words",
            ]
        )
    assert "the last word" in out
    assert "not shown" not in out  # a passing test's output stays out of the report


@pytest.mark.slow
def test_options_fixture_changes_the_runner(run: Callable[..., pytest.RunResult]) -> None:
    result = run(
        """
        import pytest

        @pytest.fixture
        def corral_runner_options():
            return {"name": "mine", "grace": 0.5}

        @pytest.mark.anyio
        async def test_named(corral_runner, corral_log):
            assert corral_runner.name == "mine" and corral_runner.grace == 0.5
            await corral_runner.run(["echo", "hi"], name="p")
            assert corral_log.lines("mine.p") == ["hi"]
        """,
    )
    result.assert_outcomes(passed=2)


def test_the_capture_is_bounded() -> None:
    """A test's log keeps the newest records within its bounds, and says how many it dropped."""
    import logging

    from corral.testing import CAPTURE_BYTES, CAPTURE_RECORDS, CorralLog

    log = CorralLog()
    logger = logging.getLogger("corral-test-capture")
    logger.propagate = False
    logger.addHandler(log.handler)
    try:
        for i in range(CAPTURE_RECORDS * 2):
            logger.warning("record %d", i)
        assert len(log.records) == CAPTURE_RECORDS
        assert log.messages[-1] == f"record {CAPTURE_RECORDS * 2 - 1}"
        report = log._unreported()
        assert report.startswith(f"[{CAPTURE_RECORDS} earlier records dropped")
        assert log._unreported() == ""  # each record is reported once
        log.clear()
        for _ in range(20):
            logger.warning("x" * (CAPTURE_BYTES // 10))
        assert len(log.text) <= CAPTURE_BYTES + 20
        assert 1 <= len(log.records) < 10
        logger.warning("y" * (CAPTURE_BYTES * 3))  # one record beyond the bound alone
        assert len(log.records) == 1
        assert log.text.startswith("[...]") and len(log.text) <= CAPTURE_BYTES + 1
    finally:
        logger.removeHandler(log.handler)
