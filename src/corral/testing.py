"""corral's pytest plugin: a runner fixture, captured child output, and leak checks.

Installed with corral and loaded by pytest through its ``pytest11`` entry
point, it only adds fixtures; a suite that uses none of them behaves as
before.  See :doc:`/howto/testing`.

* :func:`corral_runner` — an open :class:`~corral.Runner` for an async test,
  run by AnyIO's plugin (on every backend the test runs on) or by
  pytest-trio (its marker or ``trio_mode``); its children's output is captured
  per test (:func:`corral_log`) and shown in the report of a failing test,
  in a ``Captured corral`` section, as pytest shows captured stdout.
* :func:`corral_no_leaks` — fails a test that leaves behind a child process
  (started by any means: corral, :mod:`subprocess`, :func:`os.fork`; a
  zombie too), a file descriptor or a non-daemon thread, names what leaked,
  and ends the leaked processes; pytest's process does not wait for a leaked
  thread at its end (:func:`pytest_unconfigure`).

Importing this module is cheap: it loads neither AnyIO nor the launcher
until a fixture is used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from corral import Runner

__all__ = [
    "CAPTURE_BYTES",
    "CAPTURE_RECORDS",
    "CorralLog",
    "corral_log",
    "corral_no_leaks",
    "corral_runner",
    "corral_runner_options",
]

#: The most records a test's :class:`CorralLog` keeps (the newest).
CAPTURE_RECORDS = 4096
#: The most bytes of formatted text a test's :class:`CorralLog` keeps (the newest).
CAPTURE_BYTES = 256 * 1024

#: Seconds a thread that a test started gets to finish before it counts as leaked.
THREAD_JOIN_WAIT = 2.0
#: Seconds a leaked process gets to die after SIGKILL before it is given up on.
REAP_WAIT = 5.0

# Threads of the event loops' own worker pools: idle ones retire on their own.
_POOL_THREADS = ("AnyIO worker thread", "Trio thread", "asyncio_")

_LOG_KEY = pytest.StashKey["CorralLog"]()


# -- captured output ------------------------------------------------------------------------


class CorralLog:
    """The log records of one test's children, as :func:`corral_log` hands it out.

    Like pytest's ``caplog``: :attr:`records`, :attr:`messages`,
    :attr:`text`.  It keeps the newest :data:`CAPTURE_RECORDS` records and
    :data:`CAPTURE_BYTES` bytes of their text (a longer one is kept cut to its
    end, after ``[...]``), and the report says how many older ones it
    dropped.  Give :attr:`handler` to any runner (``handlers=[...]``) to
    capture its children too; :func:`corral_runner` does.
    """

    def __init__(self) -> None:
        self._entries: deque[tuple[logging.LogRecord, str]] = deque()
        self._bytes = 0
        self._count = 0  # records ever kept
        self._reported = 0  # of those, how many a report section showed already
        self._changed = threading.Condition()
        self.handler: logging.Handler = _CaptureHandler(self._add)
        """A :class:`logging.Handler` that adds every record it gets to this log."""

    def _add(self, record: logging.LogRecord, line: str) -> None:
        if len(line) > CAPTURE_BYTES:
            line = "[...]" + line[len(line) - CAPTURE_BYTES + 5 :]
        with self._changed:
            self._entries.append((record, line))
            self._bytes += len(line)
            self._count += 1
            while len(self._entries) > 1 and (
                len(self._entries) > CAPTURE_RECORDS or self._bytes > CAPTURE_BYTES
            ):
                _, old = self._entries.popleft()
                self._bytes -= len(old)
            self._changed.notify_all()

    @property
    def records(self) -> list[logging.LogRecord]:
        """The records kept, oldest first."""
        with self._changed:
            return [record for record, _ in self._entries]

    @property
    def messages(self) -> list[str]:
        """Each kept record's message (a child's output line, for its stdout and stderr)."""
        return [record.getMessage() for record in self.records]

    @property
    def text(self) -> str:
        """The kept records formatted as the report shows them, one per line."""
        with self._changed:
            return "".join(line + "\n" for _, line in self._entries)

    def lines(self, source: str | None = None) -> list[str]:
        """The stdout and stderr lines of one source (``<runner>.<process>``), or of all."""
        return [
            record.getMessage()
            for record in self.records
            if getattr(record, "corral_stream", None) in ("stdout", "stderr")
            and (source is None or getattr(record, "corral_source", None) == source)
        ]

    def clear(self) -> None:
        """Forget every record kept so far."""
        with self._changed:
            self._entries.clear()
            self._bytes = 0
            self._reported = self._count

    async def wait_for(
        self,
        predicate: Callable[[CorralLog], bool],
        timeout: float,  # noqa: ASYNC109 - the wait is a worker thread's, bounded here
    ) -> bool:
        """Whether ``predicate(log)`` came to hold within ``timeout`` seconds.

        Waits in a worker thread, so that the event loop runs on meanwhile
        (records arrive from the runner's log thread).
        """
        import anyio.to_thread

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(lambda: predicate(self), timeout)

        return await anyio.to_thread.run_sync(wait)

    def _unreported(self) -> str:
        """What no report section showed yet (with a note of what was dropped)."""
        with self._changed:
            fresh = self._count - self._reported
            self._reported = self._count
            if fresh <= 0:
                return ""
            kept = list(self._entries)[-fresh:]
        lost = fresh - len(kept)
        note = f"[{lost} earlier records dropped: only the newest are kept]\n" if lost > 0 else ""
        return note + "".join(line + "\n" for _, line in kept)

    def __repr__(self) -> str:
        return f"<CorralLog with {len(self._entries)} records>"


class _CaptureHandler(logging.Handler):
    """Formats each record and hands it to ``add`` (a :class:`CorralLog`'s)."""

    def __init__(self, add: Callable[[logging.LogRecord, str], None]) -> None:
        super().__init__(logging.NOTSET)
        self._add = add

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = _format(record)
        except Exception:
            self.handleError(record)
            return
        self._add(record, line)


def _format(record: logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    source = getattr(record, "corral_source", None) or record.name
    text = f"{stamp}.{int(record.msecs):03d} {record.levelname:<7} {source} | {record.getMessage()}"
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        text += "\n" + record.exc_text
    return text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Put what a test's children wrote in its report, as "Captured corral <phase>"."""
    log = item.stash.get(_LOG_KEY, None)
    if log is not None:
        text = log._unreported()
        if text:
            item.add_report_section(call.when, "corral", text)
    return (yield)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def corral_log(request: pytest.FixtureRequest) -> CorralLog:
    """The log records of this test's children; :func:`corral_runner` writes here.

    What it holds when a test fails (or errors) is shown in the report.
    """
    if "corral_no_leaks" in request.fixturenames:
        # Set the leak check up first, so that it is torn down last: after
        # the runner, whose children are not leaks while it is open.
        request.getfixturevalue("corral_no_leaks")
    log = CorralLog()
    request.node.stash[_LOG_KEY] = log
    return log


@pytest.fixture
def corral_runner_options() -> dict[str, Any]:
    """The keywords :func:`corral_runner` opens its runner with; override it to change them.

    ``{}`` by default; the runner always gets ``console=False`` (unless given
    here) and the test's :attr:`CorralLog.handler` on top of any ``handlers``.
    """
    return {}


@pytest.fixture
async def corral_runner(
    corral_log: CorralLog, corral_runner_options: dict[str, Any]
) -> AsyncIterator[Runner]:
    """An open :class:`~corral.Runner` for an async test, on the loop the test runs on.

    For a test of AnyIO's plugin (``@pytest.mark.anyio``, on every backend
    the test runs on) or of pytest-trio (``@pytest.mark.trio``, or
    ``trio_mode``): the fixture asks for no plugin's fixture of its own, so
    the test's plugin runs it, inside the test's own event loop.

    Its children's output goes to :func:`corral_log` (and so to the report
    of a failing test) instead of the console.  At the end of the test the
    runner is cancelled, as pytest-trio's ``nursery`` is: every child still
    running is stopped (stop signal, grace period, SIGKILL).  A child that
    fails (``check=True``) stops every other child at once; the runner then
    refuses new work, and the test errors at teardown with the
    :class:`~corral.ProcessFailed` (in an :class:`ExceptionGroup`, as out of
    ``async with``).  The runner leaves SIGINT to pytest
    (``handle_signals=False``): Ctrl-C interrupts the run as usual.
    """
    import anyio
    import anyio.abc

    import corral

    options = dict(corral_runner_options)
    options.setdefault("console", False)
    options.setdefault("handle_signals", False)
    options["handlers"] = [*options.get("handlers", ()), corral_log.handler]
    outcome: list[BaseException] = []
    done = anyio.Event()

    async def host(*, task_status: anyio.abc.TaskStatus[Runner]) -> None:
        # The runner lives in a task of its own: if its scope is cancelled (a
        # child failed), the test itself must not be, nor the plugin's task.
        started = False
        try:
            async with corral.open_runner(**options) as runner:
                task_status.started(runner)
                started = True
                await done.wait()
                runner.cancel()
        except BaseException as exc:
            if not started or isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        runner = await tg.start(host)
        try:
            yield runner
        finally:
            done.set()
    if outcome:
        raise outcome[0]


@pytest.fixture
def corral_no_leaks() -> Iterator[None]:
    """Fail the test if it leaves a child process, a descriptor or a non-daemon thread behind.

    Compares the state after the test's teardown with the state before it:

    * child processes of the test process, however they were started,
      zombies included (read from ``/proc``); each is killed (with its
      process group when it leads one) and reaped;
    * open file descriptors (but ``/dev/urandom`` and Hypothesis's database,
      which libraries keep open for good);
    * non-daemon threads still alive two seconds after the teardown
      (but the idle worker threads of AnyIO, Trio and asyncio).

    Use it per test, or for a whole suite with ``usefixtures = corral_no_leaks``
    in the pytest configuration.
    """
    children_before = set(_children_of(os.getpid()))
    fds_before = _fd_table()
    threads_before = set(threading.enumerate())
    yield
    problems = [
        problem
        for problem in (
            _leaked_children(children_before),
            _leaked_threads(threads_before),
            _leaked_descriptors(fds_before),
        )
        if problem
    ]
    if problems:
        pytest.fail("the test leaked " + "; ".join(problems), pytrace=False)


def _leaked_children(before: set[int]) -> str:
    """The children that were not there before, killed and reaped; what they were."""
    children = [pid for pid in _children_of(os.getpid()) if pid not in before]
    if not children:
        return ""
    described = [_describe_process(pid) for pid in children]
    for pid in children:
        _end(pid)
    return f"{len(children)} child process(es): " + ", ".join(described)


def _leaked_threads(before: set[threading.Thread]) -> str:
    """The non-daemon threads still alive :data:`THREAD_JOIN_WAIT` seconds from now."""
    threads = [
        t
        for t in threading.enumerate()
        if t not in before
        and t.is_alive()
        and not t.daemon
        and not t.name.startswith(_POOL_THREADS)
    ]
    deadline = time.monotonic() + THREAD_JOIN_WAIT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    threads = [t for t in threads if t.is_alive()]
    if not threads:
        return ""
    _LEAKED.extend(threads)
    return f"{len(threads)} thread(s): " + ", ".join(repr(t.name) for t in threads)


def _leaked_descriptors(before: dict[int, str]) -> str:
    """The descriptors that are new: a number free before, or open on something else now."""
    fds = {
        fd: what
        for fd, what in sorted(_fd_table().items())
        if before.get(fd) != what and not _is_cache(what)
    }
    if not fds:
        return ""
    return f"{len(fds)} descriptor(s): " + ", ".join(f"{fd} ({what})" for fd, what in fds.items())


# -- the end of the process, which a leaked thread must not hold up ----------------------------

#: Non-daemon threads a test leaked (reported already): the interpreter would
#: wait for each at its end, however long it runs.
_LEAKED: list[threading.Thread] = []
#: The sessions under way, outermost first (pytester runs some inside others).
_SESSIONS: list[pytest.Session] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSIONS.append(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """At the end of the outermost session: the process will not wait for leaked threads.

    Every test that leaked one has failed, naming it.  Once pytest is done
    (its reports, every plugin's end, the interpreter's end under way), if
    any still runs, the process says so on stderr and exits at once with
    pytest's exit status, as a process whose threads are all daemons would:
    its ``atexit`` handlers do not run then.
    """
    session = next((s for s in _SESSIONS if s.config is config), None)
    if session is not None:
        _SESSIONS.remove(session)
    if session is None or _SESSIONS or not any(t.is_alive() for t in _LEAKED):
        return
    threading.Thread(
        target=_exit_past_leaked_threads,
        args=(session,),
        name="corral.testing: leaked threads",
        daemon=True,
    ).start()


def _exit_past_leaked_threads(session: pytest.Session) -> None:
    # The main thread is joined once the interpreter's end begins, before it
    # joins the other non-daemon threads (and before the atexit handlers).
    threading.main_thread().join()
    alive = [t for t in _LEAKED if t.is_alive()]
    if not alive:
        return
    names = ", ".join(repr(t.name) for t in alive)
    with contextlib.suppress(OSError, ValueError):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stderr.write(
            f"corral.testing: not waiting for {len(alive)} leaked thread(s) still running: "
            f"{names} (see the leak report)\n"
        )
        sys.stderr.flush()
    os._exit(int(session.exitstatus))


# -- /proc ------------------------------------------------------------------------------------


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the name (state, ppid, pgid...), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _children_of(parent: int) -> list[int]:
    """Pids of the direct children of ``parent``, zombies included."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None and int(fields[1]) == parent:
                children.append(int(entry))
    return children


def _describe_process(pid: int) -> str:
    fields = _stat(pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    command = " ".join(argv)[:200] or "no command line"
    if fields is not None and fields[0] == b"Z":
        return f"pid {pid} (zombie: exited, never reaped)"
    return f"pid {pid} ({command})"


def _end(pid: int) -> None:
    """Kill a leaked child (and the group it leads) and reap it, within :data:`REAP_WAIT`."""
    fields = _stat(pid)
    with contextlib.suppress(OSError):
        if fields is not None and int(fields[2]) == pid and pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = None
    if pidfd is not None:
        try:
            select.select([pidfd], [], [], REAP_WAIT)
        finally:
            os.close(pidfd)
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def _fd_table() -> dict[int, str]:
    """Every open descriptor and what it is open on."""
    table = {}
    for entry in os.listdir("/proc/self/fd"):
        what = _describe_fd(int(entry))
        if what is not None:  # None: closed meanwhile (listdir's own, for one)
            table[int(entry)] = what
    return table


def _describe_fd(fd: int) -> str | None:
    """What ``fd`` is open on; ``None`` if it closed meanwhile."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return None
    except OSError:
        return "?"


def _is_cache(what: str) -> bool:
    return what in ("/dev/urandom", "/dev/random") or ".hypothesis" in what
