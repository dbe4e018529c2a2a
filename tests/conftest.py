"""Shared test fixtures.

Every async test runs on both backends through AnyIO's pytest plugin (the
``anyio_backend`` fixture below); Trio-only tests use pytest-trio's
``@pytest.mark.trio``.  Nothing is mocked: the tests start real processes
and look at the real process table.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

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
    if not hasattr(config, "workerinput"):
        compile_once()
        if config.option.basetemp is None:
            config.option.basetemp = short_basetemp()
    _reaper.session()
    if not hasattr(config, "workerinput") and _parallel(config):
        # The controller of a parallel session: its workers, started after this, inherit it.
        folder = tempfile.mkdtemp(prefix="corral-turns-")
        os.environ[TURNS_VAR] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


# -- bytecode: compiled once per run, read by every interpreter the tests start ---------------

#: The folders whose modules the suite's interpreters import: the package (an editable
#: install's, so read from here), the tests' programs and helpers, the benchmarks, the examples.
COMPILED = ("src", "tests", "bench", "examples")


def compile_once() -> None:
    """Write the bytecode of this checkout's modules next to them, once, before any test runs.

    These machines (CI's too) set ``PYTHONDONTWRITEBYTECODE=1``: after an editable install no
    ``.pyc`` is ever written, and each of the suite's hundreds of interpreters (children,
    workers, agents, ``corral`` commands, programs) would compile corral from source again
    (0.43 s of CPU for ``import corral; corral.open_runner`` against 0.28 s from bytecode,
    measured here).  Nothing about the interpreters changes: their environment is the user's,
    ``PYTHONDONTWRITEBYTECODE`` included; they find bytecode that is up to date, as after a
    wheel install (pip compiles it), and Python's own timestamp check keeps it so.
    ``compileall`` writes only what is missing or older than its source.
    """
    root = Path(__file__).resolve().parents[1]
    for folder in COMPILED:
        compileall.compile_dir(root / folder, quiet=1)


# -- a short temporary root: Unix socket paths have room --------------------------------------

#: Sessions' temporary roots of a slot kept after they ended (the newest), for a look after.
KEPT_ROOTS = 3


def short_basetemp() -> Path:
    """``/tmp/ct<slot>.<pid>``: the session's ``tmp_path`` root, 16 characters shorter than
    pytest's ``/tmp/pytest-of-root/pytest-<N>``.

    A Unix socket's path holds at most 107 bytes.  The runner's log socket lives in a folder of
    its own under ``TMPDIR`` (``corral-log-XXXXXXXX/log.sock``, 28 characters), and tests that
    set ``TMPDIR`` to their ``tmp_path`` (a pytest-xdist worker's adds ``/popen-gw<N>``) put it
    near that limit.  The roots of this slot's sessions that are no longer running are removed
    but the newest few (pytest keeps three too).
    """
    slot = os.environ.get("CORRAL_TEST_SLOT", "0")
    parent = Path(tempfile.gettempdir())
    ended = []
    for old in parent.glob(f"ct{slot}.*"):
        pid = old.name.rpartition(".")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            ended.append(old)
    ended.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in ended[KEPT_ROOTS - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
    return parent / f"ct{slot}.{os.getpid()}"


# -- a parallel session (pytest-xdist): the tests that must run alone ---------------------------

#: The folder where the workers of a parallel session take turns (set by its controller).
TURNS_VAR = "CORRAL_TEST_TURNS"


def _parallel(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and bool(config.getoption("numprocesses"))


@contextlib.contextmanager
def _turn(folder: Path, *, alone: bool) -> Iterator[None]:
    """Run a test beside the other workers' tests, or (``alone``) while none of them runs.

    Every test holds the ``turn`` lock shared; one that runs alone holds it exclusive, and
    first the ``gate`` lock exclusive, which every test takes (shared) on its way in: so while
    it waits for the tests under way to end, no other test starts.
    """
    with open(folder / "gate", "a") as gate, open(folder / "turn", "a") as turn:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(turn, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(turn, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # both are let go when the files close


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """In a parallel session, a test marked ``serial`` runs while no other test does.

    For a test that counts or changes what the whole machine shares (the processes of a user,
    a limit of the process table): the other workers' tests would change its figures.
    """
    folder = os.environ.get(TURNS_VAR)
    if folder is None or not hasattr(item.config, "workerinput"):
        return (yield)
    with _turn(Path(folder), alone=item.get_closest_marker("serial") is not None):
        return (yield)


# -- the fast tier: ``-m "not slow"`` ---------------------------------------------------------

#: Fixtures whose tests are slow whatever they do: real hosts and clusters to set up and reach.
SLOW_FIXTURES = frozenset({"ssh_hosts", "slurm_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a slow fixture (sshd hosts in namespaces, a Slurm cluster) is ``slow``:
    ``-m "not slow"`` (CONTRIBUTING.md, "The fast tier") leaves it out."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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
