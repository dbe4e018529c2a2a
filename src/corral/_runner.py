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
* Entered on the main thread, the runner forwards SIGINT, SIGTERM and SIGHUP
  to every child at once and then raises :class:`KeyboardInterrupt` or
  :class:`Signalled` (see ``corral._signals``).

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

from . import _handshake, _platform, _signals
from ._collector import Collector
from ._errors import STDERR_TAIL_BYTES, ProcessFailed, ResourceLimitError, StartupFailed
from ._lifeline import Lifeline
from ._logserver import LogServer
from ._process import Process
from ._routing import ConsoleHandler, LogFiles, Route, Router
from ._streams import PipeReader, make_record
from ._token import LoopToken

__all__ = ["Runner", "open_runner"]

T = TypeVar("T")

StrOrPath = str | os.PathLike[str]
Output = Literal["capture", "inherit", "discard"]
Input = Literal["null", "inherit"]

_NAME_OK = re.compile(r"[^\s/\\]+")
_NAME_BAD_CHARS = re.compile(r"[\s/\\]+")


class Runner:
    """A scope that owns child processes.  Create it with :func:`open_runner`.

    Inside ``async with``, :meth:`start` and :meth:`run` spawn children;
    leaving the block waits for them (or stops them, on error or
    cancellation).  A runner belongs to the event loop it was entered in;
    its methods raise :class:`WrongLoopError` when called from anywhere
    else.  Use :attr:`token` to reach it from another thread.
    """

    # Built on entry (see _prepare_blocking), once the log folder exists.
    _router: Router
    _collector: Collector

    def __init__(
        self,
        *,
        name: str = "corral",
        grace: float = 5.0,
        stop_signal: int = signal.SIGTERM,
        console: bool = True,
        handlers: Sequence[logging.Handler | Route] = (),
        log_dir: StrOrPath | None = None,
        propagate: bool = False,
        handle_signals: bool | None = None,
    ) -> None:
        if grace < 0:
            raise ValueError("grace must be >= 0 seconds")
        _check_name(name, "runner")
        self._name = name
        self._grace = float(grace)
        self._stop_signal = stop_signal
        self._routes = [h if isinstance(h, Route) else Route(h) for h in handlers]
        self._owned_handlers: list[logging.Handler] = []
        if console:
            console_handler = ConsoleHandler()
            console_handler.setLevel(logging.INFO)
            self._routes.append(Route(console_handler))
            self._owned_handlers.append(console_handler)
        self._log_dir = os.fspath(log_dir) if log_dir is not None else None
        self._log_path: str | None = None
        self._propagate = propagate
        self._lifeline = Lifeline()
        self._token: LoopToken | None = None
        self._tg: TaskGroup | None = None
        self._live: dict[str, Process] = {}
        self._entered = False
        self._closing = False
        self._devnull = -1
        self._spawn_lock = anyio.Lock()
        self._all_exited = anyio.Event()
        self._logserver: LogServer | None = None
        self._log_env: dict[bytes, bytes] = {}
        self._name_counters: dict[str, int] = {}
        self._handle_signals = handle_signals
        self._signals: _signals.Subscription | None = None

    # -- properties -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The runner's name, the first part of every log source it produces."""
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
    def log_path(self) -> str | None:
        """The folder of this run's log files (with ``log_dir=``), created on entry."""
        return self._log_path

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
        handle_signals = _signals.wanted(self._handle_signals)
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._prepare_blocking)
            tg = anyio.create_task_group()
            await tg.__aenter__()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._lifeline.aclose()
            os.close(self._devnull)
            raise
        self._tg = tg
        tg.start_soon(self._collector.run, name=f"corral log collector {self._name}")
        # Not tg.start(): a start() cancelled at the wrong moment cancels the
        # started task and waits for it, and this one is shielded.
        server_ready = anyio.Event()
        tg.start_soon(self._serve_logs, server_ready, name=f"corral log server {self._name}")
        with anyio.CancelScope(shield=True):
            await server_ready.wait()
        if handle_signals:
            self._signals = _signals.subscribe(self)
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
            self._all_exited.set()
        error: BaseException | None = None
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        except BaseException as caught:
            error = caught
            raise
        finally:
            try:
                if self._signals is not None:
                    # Raises KeyboardInterrupt or Signalled if a signal stopped us.
                    self._signals.close(error)
            finally:
                del error
                with anyio.CancelScope(shield=True):
                    await self._lifeline.aclose()
                    await anyio.to_thread.run_sync(self._router.close, self._owned_handlers)
                os.close(self._devnull)

    def _prepare_blocking(self) -> None:
        """Entry work that touches the disk or spawns: runs in a worker thread."""
        if self._log_dir is not None:
            self._log_path = _make_run_folder(self._log_dir, self._name)
            files = LogFiles(self._log_path)
            self._routes.append(Route(files))
            self._owned_handlers.append(files)
        self._router = Router(self._name, self._routes, propagate=self._propagate)
        self._collector = Collector(self._router.dispatch, min_level=self._router.min_level)
        self._lifeline.start_blocking()

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
        # Spawning runs on the loop thread, one child at a time: CPython
        # holds the GIL through os.posix_spawn, so a worker thread would
        # stall the loop just as long and add hand-offs on top.  The lock
        # puts concurrent starts in a queue and the yield inside it gives
        # the loop a turn after every spawn, so a burst of starts never
        # runs as one long batch.
        async with self._spawn_lock:
            # No await from here until the child is supervised: the name
            # stays free, and no cancellation can strand the child.
            name = self._unique_name(name, argv_list[0])
            pid, pidfd, pipes, started_at = self._spawn_now(
                argv_list,
                self._child_env(env, f"{self._name}.{name}"),
                os.fspath(cwd) if cwd is not None else None,
                stdin,
                stdout,
                stderr,
                wait_started,
            )
            proc = self._adopt(
                pid, pidfd, pipes, started_at, name, argv_list, check, grace, stop_signal
            )
            await anyio.lowlevel.cancel_shielded_checkpoint()
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

    def _adopt(
        self,
        pid: int,
        pidfd: int,
        pipes: dict[str, int],
        started_at: float,
        name: str,
        argv_list: list[str],
        check: bool,
        grace: float | None,
        stop_signal: int | None,
    ) -> Process:
        """Wrap a freshly spawned child in a Process and start its supervisor task."""
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

    def _unique_name(self, name: str | None, program: str) -> str:
        taken = self._live
        if name is not None:
            _check_name(name, "process")
            if name in taken:
                raise ValueError(f"a process named {name!r} is already running in this runner")
        else:
            base = _NAME_BAD_CHARS.sub("-", os.path.basename(program)) or "process"
            name = base
            if name in taken:
                # Suffixes count up per base name, so naming stays linear even
                # with a thousand children of one program.
                n = self._name_counters.get(base, 1)
                while name in taken:
                    n += 1
                    name = f"{base}-{n}"
                self._name_counters[base] = n
        return name

    def _child_env(
        self, overrides: Mapping[str, str | None] | None, source: str
    ) -> dict[bytes, bytes]:
        # Bytes all the way: os.environb is the cheapest copy, and
        # posix_spawn takes bytes without re-encoding.
        env = dict(os.environb)
        env[b"PYTHONUNBUFFERED"] = b"1"
        if self._logserver is not None:
            env.update(self._log_env)
            env[b"CORRAL_SOURCE"] = source.encode()
        if overrides:
            for key, value in overrides.items():
                if value is None:
                    env.pop(os.fsencode(key), None)
                else:
                    env[os.fsencode(key)] = os.fsencode(value)
        return env

    def _spawn_now(
        self,
        argv: list[str],
        env: dict[bytes, bytes],
        cwd: str | None,
        stdin: Input,
        stdout: Output,
        stderr: Output,
        wait_started: bool,
    ) -> tuple[int, int, dict[str, int], float]:
        """Spawn the child; returns (pid, pidfd, {stream: read end}, start time)."""
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
                env[_handshake.ENV_VAR.encode()] = b"%d" % _handshake.FD
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
        if record.levelno >= self._collector.min_level:
            self._collector.put_nowait([record])
        if self._closing and not self._live:
            self._all_exited.set()

    async def _serve_logs(self, ready: anyio.Event) -> None:
        """Run the log server for the runner's whole life, then close the collector.

        Shielded: it ends when the body of the block is over and every child
        has exited (each child's connections were drained by then), so the
        server's own exit finds only connections of processes that escaped
        their group; then no record can arrive any more and the collector
        may close.
        """
        with anyio.CancelScope(shield=True):
            try:
                async with LogServer(
                    self._deliver_remote, deliver_many=self._deliver_remote_many
                ) as server:
                    self._logserver = server
                    self._log_env = {
                        os.fsencode(k): os.fsencode(v) for k, v in server.env("").items()
                    }
                    ready.set()
                    await self._all_exited.wait()
            finally:
                ready.set()  # also when the server could not start: never hang entry
                self._logserver = None
                self._collector.close()

    async def _deliver_remote(self, record: logging.LogRecord) -> None:
        await self._deliver_remote_many([record])

    async def _deliver_remote_many(self, records: list[logging.LogRecord]) -> None:
        """Records from one read of a child's connection (one source): to tails and handlers."""
        source = getattr(records[0], "corral_source", "") or ""
        proc = self._live.get(source[len(self._name) + 1 :]) if "." in source else None
        if proc is not None and proc.source == source:
            await proc._tails.publish(records)
        min_level = self._collector.min_level
        wanted = [r for r in records if r.levelno >= min_level]
        if wanted:
            size = sum(len(r.msg) + len(r.exc_text or "") for r in wanted)
            await self._collector.put(wanted, size)

    async def _drain_logs(self, proc: Process) -> None:
        if self._logserver is not None:
            await self._logserver.drain(proc.source, proc.pid)

    def _log(self, level: int, message: str) -> None:
        if level >= self._collector.min_level:
            self._collector.put_nowait([make_record(self._name, level, message)])


def _make_run_folder(log_dir: str, runner_name: str) -> str:
    """Create ``<log_dir>/<YYYYmmdd-HHMMSS>-<runner>`` (with a suffix if taken)."""
    os.makedirs(log_dir, exist_ok=True)
    base = os.path.join(log_dir, time.strftime("%Y%m%d-%H%M%S") + f"-{runner_name}")
    path, n = base, 1
    while True:
        try:
            os.mkdir(path)
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"
            continue
        return path


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
    log_dir: StrOrPath | None = None,
    propagate: bool = False,
    handle_signals: bool | None = None,
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
            objects limiting a handler to some sources and levels) that
            receive the records; they are called from a worker thread, never
            on the loop.  A handler with no level of its own takes the root
            logger's level.
        log_dir: write logs under this folder: each run gets a timestamped
            subfolder (:attr:`Runner.log_path`) with one file per source and
            a ``combined.log`` holding everything, lifecycle records included.
        propagate: also hand every record to the standard logging tree, to the
            logger named after its source (``<runner>.<process>``), from where
            it propagates to the application's root logger.
        handle_signals: forward SIGINT, SIGTERM and SIGHUP to every child while
            the runner is open, then raise :class:`KeyboardInterrupt` (SIGINT) or
            :class:`Signalled` out of the ``async with`` (see
            the signals how-to).  ``None``, the default, handles them when
            the runner is entered on the main thread; ``False`` installs nothing
            (for embedding: the host application cancels the runner instead).
    """
    return Runner(
        name=name,
        grace=grace,
        stop_signal=stop_signal,
        console=console,
        handlers=handlers,
        log_dir=log_dir,
        propagate=propagate,
        handle_signals=handle_signals,
    )
