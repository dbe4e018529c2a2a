"""Shared test fixtures.

Every async test runs on both backends through AnyIO's pytest plugin (the
``anyio_backend`` fixture below); Trio-only tests use pytest-trio's
``@pytest.mark.trio``.  Nothing is mocked: the tests start real processes
and look at the real process table.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import _reaper
import anyio
import anyio.to_thread
import pytest
from hypothesis import settings

TAG_VAR = "CORRAL_TEST_TAG"

#: The signals the tests send and expect to act: a session started with one of them ignored
#: (``nohup``, ``&`` in a script) takes them back at once.
SESSION_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT)


def pytest_configure(config: pytest.Config) -> None:
    """Defend the session before anything runs.

    A process started by ``nohup`` or by ``&`` in a non-interactive shell inherits SIGHUP, or
    SIGINT and SIGQUIT, as ignored (or blocked); Python leaves them so, and so would every child
    a test starts: the tests that send them would fail or hang.  They get their defaults back
    (Python's KeyboardInterrupt for SIGINT).  Then the session's reaper starts (see
    ``tests/_reaper.py``): whatever a fixture or a test started is killed, and every namespace
    removed, even when the session ends without its teardown (pytest-timeout's ``os._exit``).
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


class ListHandler(logging.Handler):
    """Keeps every record it is handed (DEBUG and up unless told otherwise).

    A test can wait for the records it expects with :meth:`wait_for`.
    """

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether ``predicate()`` came to hold within ``timeout`` seconds.

        Waits in a worker thread, so that the event loop (and the runner's log
        service, which calls :meth:`emit`) runs on meanwhile.
        """

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(predicate, timeout)

        return await anyio.to_thread.run_sync(wait)

    def messages(self, source: str | None = None) -> list[str]:
        """Messages of every record, or of one source's."""
        return [
            r.getMessage()
            for r in self.records
            if source is None or getattr(r, "corral_source", None) == source
        ]

    def lines(self, source: str) -> list[str]:
        """The stdout and stderr lines of one source."""
        return [
            r.getMessage()
            for r in self.records
            if getattr(r, "corral_source", None) == source
            and getattr(r, "corral_stream", None) in ("stdout", "stderr")
        ]


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


_GONE = (b"Z", b"X")  # zombie, dead: not running any more


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the name (state, ppid, pgid...), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every process there is: its pid and the fields of its stat."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None:
                yield int(entry), fields


def tagged_pids(tag: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries ``CORRAL_TEST_TAG=tag``."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for pid, fields in _processes():
        if fields[0] in _GONE:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(pid)
    return found


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid``."""
    return [pid for pid, f in _processes() if f[0] not in _GONE and int(f[2]) == pgid]


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Block until every pid has exited (via pidfds, no polling); return those still alive."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        remaining = set(fds)
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                remaining.discard(fd)
                poller.unregister(fd)
        return [fds[fd] for fd in remaining]
    finally:
        for fd in fds:
            os.close(fd)


def is_alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in _GONE


def children_of(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (zombies included: an unreaped child leaks too)."""
    return [child for child, fields in _processes() if int(fields[1]) == pid]


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


# Threads of the event loops' own worker pools: idle ones retire on their own.
_POOL_THREADS = ("AnyIO worker thread", "Trio thread", "asyncio_")


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail any test that leaves a child process, a descriptor or a thread behind.

    A test that hands such a thing to a later one on purpose (a session-scoped
    fixture's daemons) marks itself ``@pytest.mark.leaks_allowed``.
    """
    if request.node.get_closest_marker("leaks_allowed"):
        yield
        return
    children_before = set(children_of(os.getpid()))
    fds_before = open_fds()
    threads_before = set(threading.enumerate())
    yield
    leaked_children = [pid for pid in children_of(os.getpid()) if pid not in children_before]
    threads = [
        t
        for t in threading.enumerate()
        if t not in threads_before and t.is_alive() and not t.name.startswith(_POOL_THREADS)
    ]
    for thread in threads:
        thread.join(2.0)  # one finishing its last step is not a leak
    threads = [t for t in threads if t.is_alive()]
    leaked_fds = sorted(open_fds() - fds_before)
    described = {fd: _describe_fd(fd) for fd in leaked_fds}
    # Descriptors a library opens once and keeps for the process's life.
    described = {fd: what for fd, what in described.items() if not _is_cache(what)}
    problems = []
    if leaked_children:
        problems.append(f"child processes: {leaked_children}")
    if described:
        problems.append(f"descriptors: {described}")
    if threads:
        problems.append(f"threads: {[t.name for t in threads]}")
    if problems:
        for pid in leaked_children:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
        pytest.fail("the test leaked " + "; ".join(problems), pytrace=False)


def _describe_fd(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def _is_cache(what: str) -> bool:
    # /dev/urandom kept open by a library, the hypothesis database...
    return what in ("/dev/urandom", "/dev/random") or ".hypothesis" in what


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique tag; pass ``env={TAG_VAR: tag}`` to children and check none outlives the test."""
    value = uuid.uuid4().hex
    yield value
    leftovers = tagged_pids(value)
    for pid in leftovers:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not leftovers, f"processes outlived the test: {leftovers}"


def release(fifo: Path) -> None:
    """Let a child blocked in ``read x < fifo`` go on (blocks until it opened the FIFO)."""
    fd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
