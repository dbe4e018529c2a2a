"""Shared test fixtures.

Every async test runs on both backends through AnyIO's pytest plugin (the
``anyio_backend`` fixture below); Trio-only tests use pytest-trio's
``@pytest.mark.trio``.  Nothing is mocked: the tests start real processes
and look at the real process table.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import settings
from tests.helpers import reaper as _reaper
from tests.helpers.processes import still_running, tagged_pids

#: The signals the tests send and expect to act: a session started with one of them ignored
#: (``nohup``, ``&`` in a script) takes them back at once.
SESSION_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT)


def pytest_configure(config: pytest.Config) -> None:
    """Defend the session before anything runs.

    A process started by ``nohup`` or by ``&`` in a non-interactive shell inherits SIGHUP, or
    SIGINT and SIGQUIT, as ignored (or blocked); Python leaves them so, and so would every child
    a test starts: the tests that send them would fail or hang.  They get their defaults back
    (Python's KeyboardInterrupt for SIGINT).  Then the session's reaper starts (see
    ``tests/helpers/reaper.py``): whatever a fixture or a test started is killed, and every
    namespace removed, even when the session ends without its teardown (pytest-timeout's
    ``os._exit``).
    """
    for signum in SESSION_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, default)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SESSION_SIGNALS)
    _reaper.session()


# In CI: no per-example deadlines (a loaded machine is not a failing test), and
# the same examples every run, so that a failure can be reproduced.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    # Module scope, so that Hypothesis tests can use it too.
    return str(request.param)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In CI a skipped test is a failed test: every real part must be there."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run every test: {report.longrepr}"


# Threads of the event loops' own worker pools: idle ones retire on their own.
_POOL_THREADS = ("AnyIO worker thread", "Trio thread", "asyncio_")


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail any test that leaves a child process, a descriptor or a thread behind.

    corral's own pytest plugin does the work (:func:`corral.testing.corral_no_leaks`:
    children by any means, descriptors, non-daemon threads; leaked children are
    ended); on top of it, corral's suite counts daemon threads as leaks too, since
    corral's own threads are daemons.  A test that hands such a thing to a later
    one on purpose (a session-scoped fixture's daemons) marks itself
    ``@pytest.mark.leaks_allowed``.
    """
    if request.node.get_closest_marker("leaks_allowed"):
        yield
        return
    request.getfixturevalue("corral_no_leaks")
    threads_before = set(threading.enumerate())
    yield
    threads = [
        t
        for t in threading.enumerate()
        if t not in threads_before
        and t.is_alive()
        and t.daemon
        and not t.name.startswith(_POOL_THREADS)
    ]
    for thread in threads:
        thread.join(2.0)  # one finishing its last step is not a leak
    threads = [t for t in threads if t.is_alive()]
    if threads:
        pytest.fail(f"the test leaked daemon threads: {[t.name for t in threads]}", pytrace=False)


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique tag; pass ``env={TAG_VAR: tag}`` to children and check none outlives the test."""
    value = uuid.uuid4().hex
    yield value
    # A process killed a moment ago is still listed until the kernel ran its exit.
    leftovers = still_running(tagged_pids(value))
    for pid in leftovers:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not leftovers, f"processes outlived the test: {leftovers}"
