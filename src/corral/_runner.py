"""The runner: a scope that owns child processes, the way a nursery owns tasks.

:func:`open_runner` returns a :class:`Runner`; entering it opens a task
group, and everything the runner does in the background — supervising each
child, reading its output, handing log records to handler threads — runs
as a task in that group.  Nothing is spawned as a bare task, so a failure
anywhere has exactly one way out: up through the ``async with``.

The rules follow from that:

* The end of the block waits for every child to exit, as a nursery waits
  for its tasks.
* A child started with ``check=True`` that fails makes the group cancel
  everything else; each sibling is stopped (stop signal to its process
  group, up to ``grace`` seconds, then SIGKILL), and the ``async with``
  raises :class:`ProcessFailed` inside an :class:`ExceptionGroup`.
* :meth:`Runner.cancel`, an exception in the body, or the cancellation of
  any enclosing scope stops every child the same way.  Stopping is shielded
  from cancellation, so it always finishes and every child is reaped.
* A lifeline process (see :mod:`corral._lifeline`) kills every child's
  group if the launcher itself dies without a chance to clean up.

Runners keep no global state: several may be open at once, nested in one
another or in the application's own task groups, on either backend.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Literal, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskGroup

from . import _handshake, _platform
from ._collector import Collector
from ._errors import STDERR_TAIL_BYTES, ProcessFailed, ResourceLimitError, StartupFailed
from ._lifeline import Lifeline
from ._process import Process
from ._routing import ConsoleHandler, Route, Router
from ._streams import PipeReader, make_record
from ._token import LoopToken

__all__ = ["Runner", "open_runner"]

T = TypeVar("T")

StrOrPath = str | os.PathLike[str]
Output = Literal["capture", "inherit", "discard"]
Input = Literal["null", "inherit"]

_NAME_OK = re.compile(r"[^\s/\\]+")
_NAME_BAD_CHARS = re.compile(r"[\s/\\]+")

#: How many spawns may run in worker threads at once.
_SPAWN_CONCURRENCY = 4


class Runner:
    """A scope that owns child processes.  Create it with :func:`open_runner`.

    Inside ``async with``, :meth:`start` and :meth:`run` spawn children;
    leaving the block waits for them (or stops them, on error or
    cancellation).  A runner belongs to the event loop it was entered in;
    its methods raise :class:`WrongLoopError` when called from anywhere
    else.  Use :attr:`token` to reach it from another thread.
    """

    def __init__(
        self,
        *,
        name: str = "corral",
        grace: float = 5.0,
        stop_signal: int = signal.SIGTERM,
        console: bool = True,
        handlers: Sequence[logging.Handler | Route] = (),
    ) -> None:
        if grace < 0:
            raise ValueError("grace must be >= 0 seconds")
        _check_name(name, "runner")
        self._name = name
        self._grace = float(grace)
        self._stop_signal = stop_signal
        routes = [h if isinstance(h, Route) else Route(h) for h in handlers]
        if console:
            console_handler = ConsoleHandler()
            console_handler.setLevel(logging.INFO)
            routes.append(Route(console_handler))
        self._router = Router(routes)
        self._collector = Collector(self._router.dispatch)
        self._lifeline = Lifeline()
        self._token: LoopToken | None = None
        self._tg: TaskGroup | None = None
        self._live: dict[str, Process] = {}
        self._entered = False
        self._closing = False
        self._devnull = -1
        self._limiter = anyio.CapacityLimiter(_SPAWN_CONCURRENCY)

    # -- properties -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The runner's name: the first part of every log source it produces."""
        return self._name

    @property
    def grace(self) -> float:
        """Default seconds between the stop signal and SIGKILL."""
        return self._grace

    @property
    def token(self) -> LoopToken:
        """The :class:`LoopToken` of the loop this runner belongs to (captured on entry)."""
        if self._token is None:
            raise RuntimeError("the runner has not been entered yet (use 'async with')")
        return self._token

    @property
    def processes(self) -> tuple[Process, ...]:
        """The children that are running now, in the order they were started."""
        return tuple(self._live.values())

    def __repr__(self) -> str:
        return f"<corral.Runner {self._name!r} with {len(self._live)} running>"

    # -- scope ------------------------------------------------------------------------

    async def __aenter__(self) -> Runner:
        if self._entered:
            raise RuntimeError("a Runner can be entered only once; call open_runner() again")
        self._entered = True
        self._token = LoopToken.current()
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._lifeline.start_blocking)
            tg = anyio.create_task_group()
            await tg.__aenter__()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._lifeline.aclose()
            os.close(self._devnull)
            raise
        self._tg = tg
        tg.start_soon(self._collector.run, name=f"corral log collector {self._name}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        self._closing = True
        if not self._live:
            self._collector.close()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            with anyio.CancelScope(shield=True):
                await self._lifeline.aclose()
                await anyio.to_thread.run_sync(self._router.close)
            os.close(self._devnull)

    def cancel(self) -> None:
        """Cancel the runner's scope: stop every child and end the ``async with`` block.

        Like cancelling a nursery's cancel scope, this also cancels the body
        of the block; the block then exits without an error.
        """
        self.token.check("Runner.cancel")
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    # -- starting ---------------------------------------------------------------------

    async def start(
        self,
        argv: Sequence[StrOrPath],
        *,
        name: str | None = None,
        env: Mapping[str, str | None] | None = None,
        cwd: StrOrPath | None = None,
        check: bool = True,
        grace: float | None = None,
        stop_signal: int | None = None,
        stdin: Input = "null",
        stdout: Output = "capture",
        stderr: Output = "capture",
        wait_started: bool = False,
        start_timeout: float | None = None,
    ) -> Process:
        """Spawn ``argv`` as a managed child and return its :class:`Process` once it runs.

        Args:
            argv: the program and its arguments (no shell is involved).
            name: the child's name, unique among the runner's running children;
                defaults to the program's base name, made unique with a suffix.
            env: variables to set (or, with ``None`` as value, to remove) on
                top of the launcher's environment.  ``PYTHONUNBUFFERED=1`` is
                set by default so Python children's prints arrive promptly;
                pass ``{"PYTHONUNBUFFERED": None}`` to opt out.
            cwd: the child's working directory.
            check: whether a non-zero exit (or death by a signal nobody asked
                for) is a failure that stops the runner and raises
                :class:`ProcessFailed` out of its ``async with``.
            grace: seconds between the stop signal and SIGKILL when this child
                is stopped; defaults to the runner's.
            stop_signal: the signal that asks this child to stop; defaults to
                the runner's (SIGTERM).
            stdin: ``"null"`` (``/dev/null``, the default) or ``"inherit"``.
            stdout, stderr: ``"capture"`` (each line becomes a log record of
                source ``<runner>.<name>``: stdout at INFO, stderr at WARNING;
                the default), ``"inherit"`` (the launcher's own stream) or
                ``"discard"``.
            wait_started: return only once the child has reported that it
                started (see :func:`corral.child.started` and the
                ``CORRAL_STARTED_FD`` protocol); its value is then in
                :attr:`Process.started_value`.
            start_timeout: with ``wait_started``, seconds to wait for the
                report before stopping the child and raising
                :class:`TimeoutError`; ``None`` waits as long as it runs.

        Raises:
            FileNotFoundError, PermissionError, NotADirectoryError: the program
                or directory cannot be used; nothing was spawned.
            ResourceLimitError: the descriptor limit is exhausted even after
                raising the soft limit to the hard one; nothing was spawned.
            StartupFailed: with ``wait_started``, the child exited before
                reporting.
            HandshakeError: with ``wait_started``, the report was not JSON;
                the child was stopped.
            TimeoutError: with ``wait_started``, ``start_timeout`` passed; the
                child was stopped.
            WrongLoopError: called from outside the runner's event loop.
        """
        self.token.check("Runner.start")
        self._check_open()
        if grace is not None and grace < 0:
            raise ValueError("grace must be >= 0 seconds")
        argv_list = [os.fspath(a) for a in argv]
        if not argv_list:
            raise ValueError("argv must name a program")
        for value, what in ((stdout, "stdout"), (stderr, "stderr")):
            if value not in ("capture", "inherit", "discard"):
                raise ValueError(f"{what} must be 'capture', 'inherit' or 'discard', not {value!r}")
        if stdin not in ("null", "inherit"):
            raise ValueError(f"stdin must be 'null' or 'inherit', not {stdin!r}")
        name = self._claim_name(name, argv_list[0])
        cwd_str = os.fspath(cwd) if cwd is not None else None
        child_env = self._child_env(env)
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            # From here on, the child must end up either supervised or dead:
            # a cancellation waits until the spawn has been accounted for.
            with anyio.CancelScope(shield=True):
                pid, pidfd, pipes, started_at = await anyio.to_thread.run_sync(
                    self._spawn_blocking,
                    argv_list,
                    child_env,
                    cwd_str,
                    stdin,
                    stdout,
                    stderr,
                    wait_started,
                    limiter=self._limiter,
                )
        except BaseException:
            self._live.pop(name, None)
            raise
        readers = [
            PipeReader(
                fd,
                source=f"{self._name}.{name}",
                stream=stream,
                level=logging.INFO if stream == "stdout" else logging.WARNING,
                collector=self._collector,
                pid=pid,
                tail_bytes=STDERR_TAIL_BYTES if stream == "stderr" else 0,
            )
            for stream, fd in pipes.items()
            if stream != "handshake"
        ]
        handshake_fd = pipes.get("handshake")
        proc = Process(
            self,
            pid=pid,
            pidfd=pidfd,
            name=name,
            argv=argv_list,
            check=check,
            grace=self._grace if grace is None else float(grace),
            stop_signal=self._stop_signal if stop_signal is None else stop_signal,
            readers=readers,
            stderr_reader=next((r for r in readers if r.stream == "stderr"), None),
            handshake=(
                _handshake.HandshakeReader(handshake_fd) if handshake_fd is not None else None
            ),
            started_at=started_at,
        )
        self._live[name] = proc
        self._log(logging.DEBUG, f"started {name} (pid {pid}): {_quote(argv_list)}")
        assert self._tg is not None
        self._tg.start_soon(proc._supervise, name=f"corral supervisor {self._name}.{name}")
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            if wait_started:
                await self._wait_started(proc, start_timeout)
        except BaseException:
            # Whoever asked for this child is gone, or its start failed: do
            # not leave it running unowned.
            with anyio.CancelScope(shield=True):
                await proc.terminate()
            raise
        return proc

    async def _wait_started(self, proc: Process, limit: float | None) -> None:
        try:
            with anyio.fail_after(limit):
                await proc._started.wait()
        except TimeoutError:
            raise TimeoutError(
                f"process {proc.name!r} (pid {proc.pid}) did not report that it started "
                f"within {limit:g} s; it was stopped"
            ) from None
        error = proc._startup_error
        if error is None:
            return
        if isinstance(error, StartupFailed):
            # Wait for the exit to be complete so that the stderr tail is too.
            await proc._done.wait()
            assert proc.returncode is not None
            raise StartupFailed(
                proc.returncode, proc.argv, name=proc.name, pid=proc.pid, stderr=proc.stderr_tail
            )
        raise error

    async def run(
        self,
        argv: Sequence[StrOrPath],
        *,
        check: bool = True,
        **options: object,
    ) -> Process:
        """Start ``argv``, wait for it to exit, and return the finished :class:`Process`.

        Takes the same options as :meth:`start`.  With ``check=True`` (the
        default) a non-zero exit raises :class:`ProcessFailed` here, directly,
        not out of the runner.  If the calling task is cancelled, the child is
        stopped (stop signal, grace, SIGKILL) before the cancellation
        propagates.
        """
        self.token.check("Runner.run")
        proc = await self.start(argv, check=False, **options)  # type: ignore[arg-type]
        try:
            await proc.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await proc.terminate()
            raise
        returncode = proc.returncode
        assert returncode is not None
        if check and returncode != 0 and not proc._stop_requested:
            raise ProcessFailed(
                returncode, proc.argv, name=proc.name, pid=proc.pid, stderr=proc.stderr_tail
            )
        return proc

    # -- helpers ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._tg is None:
            raise RuntimeError("the runner has not been entered yet (use 'async with')")
        if self._closing:
            raise RuntimeError(f"runner {self._name!r} is closing; it starts no new processes")

    def _claim_name(self, name: str | None, program: str) -> str:
        if name is not None:
            _check_name(name, "process")
            if name in self._live:
                raise ValueError(f"a process named {name!r} is already running in this runner")
        else:
            base = _NAME_BAD_CHARS.sub("-", os.path.basename(program)) or "process"
            name, n = base, 1
            while name in self._live:
                n += 1
                name = f"{base}-{n}"
        # Reserve the name while spawning; the Process replaces this entry.
        self._live[name] = None  # type: ignore[assignment]
        return name

    def _child_env(self, overrides: Mapping[str, str | None] | None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if overrides:
            for key, value in overrides.items():
                if value is None:
                    env.pop(key, None)
                else:
                    env[key] = value
        return env

    def _spawn_blocking(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        stdin: Input,
        stdout: Output,
        stderr: Output,
        wait_started: bool,
    ) -> tuple[int, int, dict[str, int], float]:
        """Spawn in a worker thread; returns (pid, pidfd, {stream: read end}, start time)."""
        opened: list[int] = []  # everything to close if we fail
        child_ends: list[int] = []
        pipes: dict[str, int] = {}
        fds: dict[int, int] = {}
        try:
            # Reserve a descriptor for the pidfd *before* spawning, so that
            # running out of descriptors can never strand a spawned child.
            reserve = self._allocate(lambda: os.dup(self._devnull), opened)
            if stdin == "null":
                fds[0] = self._devnull
            for number, stream, mode in ((1, "stdout", stdout), (2, "stderr", stderr)):
                if mode == "capture":
                    read_end, write_end = self._allocate(os.pipe, opened)
                    pipes[stream] = read_end
                    child_ends.append(write_end)
                    fds[number] = write_end
                elif mode == "discard":
                    fds[number] = self._devnull
            if wait_started:
                read_end, write_end = self._allocate(os.pipe, opened)
                pipes["handshake"] = read_end
                child_ends.append(write_end)
                fds[_handshake.FD] = write_end
                env = {**env, _handshake.ENV_VAR: str(_handshake.FD)}
            started_at = time.monotonic()
            pid = _platform.spawn(argv, env=env, cwd=cwd, fds=fds)
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        self._lifeline.add(pid)
        for fd in child_ends:
            os.close(fd)
        os.close(reserve)
        try:
            pidfd = _platform.pidfd_open(pid)
        except OSError as exc:  # pragma: no cover - the reserved slot makes this unlikely
            _platform.signal_group(pid, signal.SIGKILL)
            _platform.wait_blocking(pid)
            _platform.reap(pid)
            self._lifeline.remove(pid)
            for fd in pipes.values():
                os.close(fd)
            raise self._limit_error(exc) from exc
        return pid, pidfd, pipes, started_at

    def _allocate(self, make: Callable[[], T], opened: list[int]) -> T:
        """Call ``make`` (which opens descriptors); on EMFILE raise the soft limit and retry."""
        while True:
            try:
                result = make()
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                if _platform.raise_fd_limit():
                    soft, hard = _platform.fd_limits()
                    self._log(
                        logging.INFO,
                        f"raised the soft RLIMIT_NOFILE to {soft} (hard limit {hard})",
                    )
                    continue
                raise self._limit_error(exc) from exc
            if isinstance(result, tuple):
                opened.extend(result)
            else:
                assert isinstance(result, int)
                opened.append(result)
            return result

    def _limit_error(self, exc: OSError) -> ResourceLimitError:
        soft, hard = _platform.fd_limits()
        return ResourceLimitError(
            errno.EMFILE,
            f"cannot start another child in runner {self._name!r}: out of file descriptors "
            f"(RLIMIT_NOFILE soft={soft}, hard={hard}; the runner holds up to "
            f"{_platform.FD_PER_CHILD} per running child and has {len(self._live)} running). "
            "Raise the hard limit (ulimit -Hn, or LimitNOFILE= under systemd) or run fewer "
            "children at once",
        )

    def _process_exited(self, proc: Process) -> None:
        if self._live.get(proc.name) is proc:
            del self._live[proc.name]
        record = proc._exit_record()
        self._collector.put_nowait([record])
        if self._closing and not self._live:
            self._collector.close()

    def _log(self, level: int, message: str) -> None:
        self._collector.put_nowait([make_record(self._name, level, message)])


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not _NAME_OK.fullmatch(name):
        raise ValueError(f"{what} name {name!r} must be non-empty, without spaces or slashes")


def _quote(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)


def open_runner(
    *,
    name: str = "corral",
    grace: float = 5.0,
    stop_signal: int = signal.SIGTERM,
    console: bool = True,
    handlers: Sequence[logging.Handler | Route] = (),
) -> Runner:
    """Create a :class:`Runner`; use it as ``async with corral.open_runner() as r:``.

    Args:
        name: the runner's name, the first part of every log source.
        grace: default seconds a child gets between the stop signal and
            SIGKILL when it is stopped.
        stop_signal: the default signal that asks a child to stop.
        console: print every child's output lines to the launcher's stderr
            with a ``HH:MM:SS source |`` prefix (coloured on a terminal).
        handlers: extra :class:`logging.Handler` objects (or :class:`Route`
            objects limiting a handler to some sources) that receive every
            record; they are called from a worker thread, never on the loop.
    """
    return Runner(
        name=name, grace=grace, stop_signal=stop_signal, console=console, handlers=handlers
    )
