"""The runner: a scope that owns child processes, the way a nursery owns tasks.

:func:`open_runner` returns a :class:`Runner`; entering it opens a task
group, and everything the runner does in the background — supervising each
child, serving its log socket, handing output to the log handlers, watching
the lifeline — runs as a task in that group.  Nothing is spawned as a bare
task, so a failure anywhere has exactly one way out: up through the
``async with``.

The rules follow from that:

* The end of the block waits for every child to exit, as a nursery waits
  for its tasks.
* A child started with ``check=True`` that fails makes the group cancel
  everything else; each sibling is stopped (stop signal to its process
  group, up to ``grace`` seconds, then SIGKILL), and the ``async with``
  raises :class:`ProcessFailed` inside an :class:`ExceptionGroup`.
* :meth:`Runner.cancel`, an exception in the body, or the cancellation of
  any enclosing scope (``asyncio.run`` cancelling every task at its end
  included) stops every child the same way.  Only "signal, grace, SIGKILL,
  reap" is shielded from cancellation; everything else the exit waits for
  (log connections, the log handlers) has a deadline.
* A lifeline process (see :mod:`corral._sys._lifeline`) kills every child's
  group if the launcher itself dies without a chance to clean up.
* Signals the application does not hold are forwarded to every child at
  once (see :mod:`corral._core._signals`).

Runners keep no global state: several may be open at once, nested in one
another or in the application's own task groups, on either backend.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple, Unpack

import anyio

# What the runner's signatures name, so that they resolve (typing.get_type_hints, the API
# pages); what a runner is made of loads with the first one (see Runner.__init__).
from .._checks import with_keywords
from .._core._options import ProcessOptions, StartOptions, StrOrPath
from .._core._process import Process
from .._core._stdio import DEVNULL, PIPE
from .._core._token import LoopToken
from .._logs._route import Route
from .._results import CompletedProcess, LaunchResult
from .._scaleout import LaunchOptions, LaunchSpec, check_launch_name
from .._sys._proc import ResourceUsage
from ._options import RunnerOptions, RunnerSpec

if TYPE_CHECKING:
    from .._launch._context import LaunchContext
    from .._monitor._server import Monitor

__all__ = ["Runner", "open_runner"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Runner:
    """A scope that owns child processes.  Create it with :func:`open_runner`.

    Inside ``async with``, :meth:`start` and :meth:`run` spawn children;
    leaving the block waits for them (or stops them, on error or
    cancellation).  A runner belongs to the event loop it was entered in;
    its methods raise :class:`WrongLoopError` when called from anywhere
    else.  Use :attr:`token` to reach it from another thread.
    """

    @with_keywords(RunnerSpec)
    def __init__(self, **options: Unpack[RunnerOptions]) -> None:
        spec = RunnerSpec.of(options, "Runner").checked()
        # What a runner is made of loads with the first one: a program that names the
        # runner (its signatures, its options) and never opens one loads none of it.
        from .._logs._hub import LogHub, routes_of
        from .._sys._lifeline import Lifeline
        from ._children import Children
        from ._scope import Scope

        name = spec.name
        self._name = name
        self._grace = spec.grace
        self._stop_signal = spec.stop_signal
        handle_signals = spec.handle_signals
        routes = routes_of(spec.handlers)
        monitor = spec.monitor
        self._monitor: Monitor | None = None
        if monitor is not None and monitor is not False:
            # On first use: a runner without a monitor loads none of its code.
            from .._monitor._clients import MonitorSink
            from .._monitor._server import Monitor

            self._monitor = Monitor(monitor, name, spec.monitor_origins)
            routes.append(Route(MonitorSink(self._monitor)))
        self._hub = LogHub(
            name,
            routes=routes,
            console=bool(spec.console),
            log_dir=os.fspath(spec.log_dir) if spec.log_dir is not None else None,
            propagate=bool(spec.propagate),
        )
        self._lifeline = Lifeline(on_error=self._lifeline_error)
        self._entered = False
        self._scope = Scope(
            name,
            hub=self._hub,
            lifeline=self._lifeline,
            monitor=self._monitor,
            handle_signals=handle_signals,
            live=lambda: self._children.live,
            usage=spec.usage,
            contain=(spec.contain, spec.subreaper),
            stop=(self._stop_signal, self._grace),
        )
        self._children = Children(
            name, hub=self._hub, scope=self._scope, grace=self._grace, stop_signal=self._stop_signal
        )
        if self._monitor is not None:
            self._children.add_observer(self._monitor.process_event)
        #: The names of the launches under way ("": the one without a name).
        self._launches: set[str] = set()

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
        token = self._scope.token
        if token is None:
            raise RuntimeError("the runner has not been entered yet (use 'async with')")
        return token

    @property
    def log_path(self) -> str | None:
        """The folder of this run's log files (with ``log_dir=``), created on entry."""
        return self._hub.log_path

    @property
    def log_lines_lost(self) -> int:
        """The lines and records the log files (``log_dir=``) could not write (a full disk).

        Counted while such a file is suspended; see :ref:`log-loss`.  0 if none was lost.
        """
        return self._hub.lines_lost

    @property
    def monitor_url(self) -> str | None:
        """``http://HOST:PORT/?token=...``, the monitor's page (with ``monitor=``), once entered.

        The same address with ``ws://`` is its WebSocket endpoint; see
        :doc:`howto/monitor`.
        """
        if self._monitor is None or not self._monitor.ready.is_set() or self._monitor.error:
            return None
        return self._monitor.url

    @property
    def usage(self) -> Mapping[str, ResourceUsage]:
        """Each running child's :attr:`Process.usage` by name, and a launch's remote workers'."""
        return MappingProxyType({} if self._scope.usage is None else self._scope.usage.latest)

    @property
    def received_signal(self) -> signal.Signals | None:
        """The stop signal that reached the runner (set before its children get it), or None."""
        received = None if self._scope.signals is None else self._scope.signals.received
        return None if received is None else signal.Signals(received)

    @property
    def processes(self) -> tuple[Process, ...]:
        """The children that are running now, in the order they were started."""
        return self._children.live

    def __repr__(self) -> str:
        return f"<corral.Runner {self._name!r} with {len(self._children)} running>"

    # -- scope ------------------------------------------------------------------------

    async def __aenter__(self) -> Runner:
        if self._entered:
            raise RuntimeError("a Runner can be entered only once; call open_runner() again")
        self._entered = True
        await self._scope.enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if exc_type is None:
            self._children.end_services()
        return await self._scope.exit(exc_type, exc, tb)

    def cancel(self) -> None:
        """Cancel the runner's scope: stop every child and end the ``async with`` block.

        Like cancelling a nursery's cancel scope, this also cancels the body
        of the block; the block then exits without an error.
        """
        self.token.check("Runner.cancel")
        self._scope.cancel()

    def _lifeline_error(self, message: str) -> None:
        self._hub.log(logging.ERROR, message)

    # -- starting ---------------------------------------------------------------------

    @with_keywords(ProcessOptions)
    async def start(self, argv: Sequence[StrOrPath], **options: Unpack[StartOptions]) -> Process:
        """Spawn ``argv`` as a managed child and return its :class:`Process` once it runs.

        The keywords that :mod:`subprocess` and :func:`anyio.open_process`
        have mean what they mean there; see :doc:`howto/subprocess` for a
        table.

        Args:
            argv: the program and its arguments, as a list (no shell is
                involved; a ``str`` is refused with :class:`TypeError`).
            name: the child's name, unique among the runner's running
                children (at most 100 characters, no spaces or slashes);
                defaults to the program's base name, made unique with a
                suffix.  Its log source is ``<runner>.<name>``.
            env: the child's whole environment, replacing the launcher's (as
                in :mod:`subprocess`).
            extra_env: variables to set on top of the environment (the
                launcher's, or ``env``); a ``None`` value removes one.
                Unless either names ``PYTHONUNBUFFERED``, corral's start-up
                hook goes first on ``PYTHONPATH``, so that a Python child's
                prints arrive within 20 ms, block-buffered (see "Every log
                line in one place").  corral adds its own ``CORRAL_*``
                variables in every case.
            cwd: the child's working directory.
            check: whether a non-zero exit (or death by a signal nobody asked
                for) is a failure that stops the runner and raises
                :class:`ProcessFailed` out of its ``async with``.
            service: a child that runs as long as the block, such as a server:
                when the block's code ends normally, the runner waits for
                its other children as usual, then stops this one (stop
                signal, grace, SIGKILL) instead of waiting for it; that exit
                is not a failure.  By default (``False``) the end of the
                block waits for the child, as a nursery waits for its tasks.
            grace: seconds between the stop signal and SIGKILL when this child
                is stopped; defaults to the runner's.
            stop_signal: the signal that asks this child to stop; defaults to
                the runner's (SIGTERM).
            stdin: ``subprocess.DEVNULL`` (the default), ``PIPE`` (a writable
                stream, :attr:`Process.stdin`), ``None`` (inherit), a file or
                a descriptor.
            stdout, stderr: :data:`LOG` (the default: each line becomes a log
                record of the child's source, stdout at INFO and stderr at
                WARNING), ``PIPE`` (a readable stream on the process),
                ``LOG | PIPE`` (both), ``DEVNULL``, ``None`` (inherit), a file
                or a descriptor; ``subprocess.STDOUT`` for stderr.
            pass_fds, start_new_session, user, group, extra_groups, umask: as
                in :class:`subprocess.Popen`.  A child in a new session still
                leads its own process group, which is stopped as any other.
            wait_started: return only once the child has reported that it
                started (see :func:`corral.child.started` and the
                ``CORRAL_STARTED_FD`` protocol); its value is then in
                :attr:`Process.started_value`.
            start_timeout: with ``wait_started``, seconds to wait for the
                report before stopping the child and raising
                :class:`TimeoutError`; ``None`` waits as long as it runs.
            restart: ``"never"`` (the default), ``"on-failure"`` (start it
                again after a non-zero exit) or ``"always"`` (after any exit
                that was not asked for), with exponential backoff and jitter;
                each restart is logged.  The :class:`Process` stays the same
                object.  Once ``max_restarts`` restarts in a row are spent, a
                failure counts as one (:class:`ProcessFailed`, with the count).
                A run that lasted a minute resets the count.
            max_restarts: restarts in a row allowed by ``restart``.
            backoff: seconds before the first restart; doubled each time,
                up to 30 s.

        Raises:
            TypeError, ValueError: an option is not acceptable; nothing was
                spawned.
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

        A start whose task is cancelled before it returns (its scope
        cancelled, or its deadline passed, even during the spawn itself)
        stops the child (stop signal, grace, SIGKILL) and reaps it before the
        cancellation goes on, as :func:`anyio.run_process` does; a start in a
        scope that is cancelled already spawns nothing.
        """
        opts = ProcessOptions.of(options, "Runner.start")
        self.token.check("Runner.start")
        self._check_open()
        return await self._children.start(opts.checked(argv))

    @with_keywords(ProcessOptions)
    async def run(
        self,
        argv: Sequence[StrOrPath],
        *,
        input: bytes | None = None,
        **options: Unpack[StartOptions],
    ) -> CompletedProcess:
        """Run ``argv`` to completion and return a :class:`CompletedProcess`.

        Takes the options of :meth:`start`, with these differences, as
        :func:`subprocess.run`: ``input`` (bytes) is written to the child's
        stdin, which is then closed (a child that stops reading early is not
        an error); ``stdout=PIPE`` / ``stderr=PIPE`` (or ``LOG | PIPE``)
        collect the exact bytes into the result's ``stdout`` / ``stderr``;
        and with ``check=True`` (the default) a non-zero exit raises
        :class:`ProcessFailed` here, directly, not out of the runner;
        ``service=True`` is refused, since ``run()`` waits for its child.  If the
        calling task is cancelled, the child is stopped (stop signal, grace,
        SIGKILL) before the cancellation propagates.
        """
        opts = ProcessOptions.of(options, "Runner.run")
        if opts.service:
            raise ValueError("service=True is for start(): run() waits for its child itself")
        stdin = opts.stdin
        if input is not None:
            if not isinstance(input, (bytes, bytearray, memoryview)):
                raise TypeError(f"input must be bytes, not {type(input).__name__}")
            if stdin is not DEVNULL and stdin != DEVNULL:
                raise ValueError("stdin and input cannot both be given")
            stdin = PIPE
        self.token.check("Runner.run")
        self._check_open()
        from .._core._run import drain, feed  # (loaded with the runner's children)

        # Built on start() as anyio.run_process is on open_process: feed, drain, wait.
        proc = await self._children.start(opts.replace(check=False, stdin=stdin).checked(argv))
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            async with anyio.create_task_group() as tg:
                if proc.stdout is not None:
                    tg.start_soon(drain, proc.stdout, out)
                if proc.stderr is not None:
                    tg.start_soon(drain, proc.stderr, err)
                if proc.stdin is not None:
                    tg.start_soon(feed, proc.stdin, bytes(input or b""))
                code = await proc.wait()
        except BaseException:
            await proc.aclose()  # stop signal, grace, SIGKILL, reap: shielded
            raise
        result = CompletedProcess(
            proc.args,
            code,
            b"".join(out) if proc.stdout is not None else None,
            b"".join(err) if proc.stderr is not None else None,
            name=proc.name,
            pid=proc.pid,
            duration=proc.duration or 0.0,
            started_value=proc.started_value,
            stderr_tail=proc.stderr_tail,
        )
        if opts.check and result.returncode != 0 and not proc.stop_requested:
            result.check_returncode()
        return result

    # -- launching --------------------------------------------------------------------

    @with_keywords(LaunchSpec)
    async def launch(
        self, func: Callable[..., T], /, *args: Any, **options: Unpack[LaunchOptions]
    ) -> LaunchResult[T]:
        """Run ``func(*args)`` once per worker, on this machine or across hosts.

        Returns a :class:`LaunchResult`: the return values in global rank
        order (``results[0]`` is rank 0's), with ``results.by_host[host]``
        listing each host's in local-rank order.  Each worker is a fresh
        Python process with the environment torchrun gives (``RANK``,
        ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
        ``MASTER_ADDR``, ``MASTER_PORT``...: :doc:`howto/switching`), so
        ``torch.distributed.init_process_group("gloo")`` needs no arguments.
        Its stdout, stderr and :mod:`logging` records reach this runner under
        the source ``<runner>.agent-<i>.worker-<j>``, with no set-up code in
        the function.  See :doc:`howto/launch`.

        Args:
            func: any importable function, or any callable cloudpickle can
                carry (a closure, a lambda, a function of ``__main__``).
                Keyword arguments go in with :func:`functools.partial`, so
                launch's own options never collide with the function's.
            args: positional arguments for ``func``.
            hosts: ``None`` (this machine, no ssh), a list of hosts (one agent
                per host, started with ssh), or ``"slurm"`` (the current
                allocation, agents started with one ``srun`` step).
            workers_per_host: workers on each host: one int, or one per host.
                With ``hosts="slurm"`` it defaults to ``SLURM_NTASKS_PER_NODE``
                or ``SLURM_GPUS_ON_NODE``; otherwise to 1.  At most 4096 on a
                host and 65536 in all (``MAX_WORKERS_PER_HOST``,
                ``MAX_WORKERS``).
            extra_env: variables for every worker (``None`` removes one).
            forward_env: ``"all"`` (but :data:`corral.HOST_ENV_NAMES`) or globs.
            copy_env: globs forwarded on top, host-specific names included.
            ssh: how to reach remote hosts (an :class:`SSH`); user, port,
                identity file, extra options, the remote Python and directory.
            launcher_address: the address agents dial back to; by default each
                agent dials this machine's address on the route to its host.
            start_timeout: seconds, counted from this call, that every agent
                gets to start (ssh's connection and login, the remote Python's
                start-up), connect back, authenticate and report ready;
                past it, :class:`LaunchError` names the hosts that are not
                ready.  An agent that cannot dial back within it gives up.
            link_timeout: seconds the link to an agent may stay silent
                before it counts as cut (both ends send a heartbeat every
                quarter of it): the agent then stops its workers, and the
                launch fails with :class:`LaunchError` naming the host.
            grace: seconds between the stop signal and SIGKILL when workers
                are stopped; defaults to the runner's.
            log_level: on remote hosts, records below this level stay on
                their host (in ``host_log_dir`` there), for launches too large
                to bring every line home.  Workers on this machine
                (``hosts=None``) send every record to the runner, whose own
                handlers and routes choose what to keep.
            host_log_dir: a folder on each remote host for its agent's log
                files (every record, whatever ``log_level``).
            backend: the process group each worker initialises before the
                function runs and destroys after (torchrunx's ``backend=``):
                ``"gloo"``, ``"nccl"``, ``"mpi"``, ``"ucc"``, ``"xccl"`` or
                ``"auto"`` (NCCL where CUDA is, else Gloo); ``None``: none.
            process_group_timeout: its ``timeout``, in seconds.
            master_addr, master_port: the ``MASTER_ADDR`` and ``MASTER_PORT``
                every worker sees, instead of corral's choice.
            name: the launch's name: its sources are then
                ``<runner>.<name>.agent-<i>.worker-<j>`` (the console's
                prefixes, the log files, the monitor's rows), so that launches
                under way at once are told apart.  Without it, a launch has no
                name of its own unless another is under way in this runner:
                it is then numbered, ``launch-2``, ``launch-3``...  Two
                launches under way may not share a name.

        Raises:
            TypeError, ValueError: bad arguments (an empty host list, a wrong
                number of ``workers_per_host`` or more than the maximum, a
                function that cannot be pickled, an unreadable identity
                file); nothing was started.
            LaunchError: an agent did not come up (ssh's own message
                included, or the hosts not ready within ``start_timeout``),
                or the link to an agent was lost (closed, or silent for
                ``link_timeout``); it names the host.
            WorkerFailed: a worker died, or raised an exception that cannot be
                rebuilt here; every other worker was stopped first.
            Exception: the exception a worker raised, rebuilt here, with the
                remote traceback as its ``__cause__``.
        """
        spec = LaunchSpec.of(options, "Runner.launch")
        self.token.check("Runner.launch")
        self._check_open()
        from .._launch import _launcher  # on first use: no cloudpickle, no agent code before

        self._scope.protect()
        spec = self._named(spec)
        try:
            return await _launcher.launch(self._launch_context(), spec, func, args)
        finally:
            self._launches.discard(spec.name or "")

    @with_keywords(LaunchSpec)
    async def launch_command(
        self, argv: Sequence[StrOrPath], **options: Unpack[LaunchOptions]
    ) -> LaunchResult[CompletedProcess]:
        """Run the command ``argv`` once per worker, as :meth:`launch` runs a function.

        What ``torchrun`` does for a script: each worker is ``argv`` itself,
        started with the same torchrun-compatible environment, and its output
        is logged under ``<runner>.agent-<i>.worker-<j>``.  Returns how each
        ran, in rank order: a :class:`CompletedProcess` per worker (its
        ``args``, ``returncode`` 0, the worker's ``name``
        ``agent-<i>.worker-<j>``, its ``pid`` on its host, its ``duration``;
        the output went to the logs, so ``stdout`` and ``stderr`` are
        ``None``).  The first worker that exits with
        another code, or is killed, makes every other one stop and raises
        :class:`WorkerFailed` with its rank, host, exit code and stderr tail.
        The options are :meth:`launch`'s.
        """
        spec = LaunchSpec.of(options, "Runner.launch_command")
        self.token.check("Runner.launch_command")
        self._check_open()
        from .._launch import _launcher

        self._scope.protect()
        spec = self._named(spec)
        try:
            return await _launcher.launch(
                self._launch_context(),
                spec,
                None,
                (),
                argv=[os.fspath(a) for a in argv] if not isinstance(argv, (str, bytes)) else argv,
            )
        finally:
            self._launches.discard(spec.name or "")

    def _named(self, spec: LaunchSpec) -> LaunchSpec:
        """``spec`` with the launch's name in this runner (see :meth:`launch`), now taken."""
        if spec.name is None:
            name, number = "", 1
            while name in self._launches:
                number += 1
                name = f"launch-{number}"
        else:
            name = check_launch_name(spec.name)
            if name in self._launches:
                raise ValueError(
                    f"a launch named {name!r} is under way in this runner: give another name"
                )
        self._launches.add(name)
        return dataclasses.replace(spec, name=name or None)

    def _launch_context(self) -> LaunchContext:
        return self._scope.launch_context(self.start, self._hub.forwarder(), self._grace)

    # -- observing ----------------------------------------------------------------------

    def add_observer(self, callback: Callable[[Process, str], None]) -> Callable[[], None]:
        """Call ``callback(process, state)`` at each change of a child's state; returns its remover.

        ``state`` is ``"running"`` (started, or restarted), ``"restarting"``
        (a restart follows, after its backoff) or ``"exited"``.  Observers
        are called on the runner's loop, in the order they were added, at
        the moment the state changes: an observer must not block, and what it
        raises is raised there (out of :meth:`start`, or by the child's
        supervisor, which fails the runner).  Call the returned function to
        remove it again.
        """
        return self._children.add_observer(callback)

    def log(self, level: int, message: str) -> None:
        """Log a record of the runner's own, as its lifecycle records are (``started web``...).

        Its source is the runner's name; it reaches the console, the log files
        and the handlers as every record does.  Call it on the runner's loop,
        once entered; it never waits.
        """
        self.token.check("Runner.log")
        self._hub.log(level, message)

    async def to_log_thread(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` in the thread that calls the log handlers, between two batches.

        For work of a handler's own that must not run at the same time as its
        records (the ``corral`` command redraws its status table under the
        lines with :meth:`ConsoleHandler.set_footer` this way).
        """
        self.token.check("Runner.to_log_thread")
        return await self._hub.to_worker_thread(fn, *args)

    # -- helpers ----------------------------------------------------------------------

    def _check_open(self) -> None:
        self._children.check_open()


@with_keywords(RunnerSpec)
def open_runner(**options: Unpack[RunnerOptions]) -> Runner:
    """Create a :class:`Runner`; use it as ``async with corral.open_runner() as r:``.

    Args:
        name: the runner's name, the first part of every log source.
        grace: default seconds a child gets between the stop signal and
            SIGKILL when it is stopped (a finite number >= 0).
        stop_signal: the default signal that asks a child to stop.
        console: print every child's output lines to the launcher's stderr
            with a ``HH:MM:SS source |`` prefix (coloured on a terminal), at
            INFO and above.
        handlers: extra :class:`logging.Handler` objects (or :class:`Route`
            objects limiting a handler to some sources and levels) that
            receive the records; they are called from a worker thread, never
            on the loop.  A handler gets the records at its own level (every
            record if it has none): the root logger's level does not apply.
        log_dir: write logs under this folder: each run gets a timestamped
            subfolder (:attr:`Runner.log_path`) with one file per source and
            a ``combined.log`` holding everything, lifecycle records included.
        propagate: also hand every record to the standard logging tree, to the
            logger named after its source (``<runner>.<process>``), from where
            it propagates to the application's root logger (whose level and
            handlers then apply).
        handle_signals: what to do with SIGINT, SIGTERM and SIGHUP while the
            runner is open (see :doc:`howto/signals`).  ``None``, the default,
            takes SIGINT and SIGTERM only if nobody holds them (their handler
            is still Python's default) and the runner is entered on the main
            thread: then the signal is forwarded to every child at once and
            the block raises :class:`KeyboardInterrupt` (SIGINT, under
            Python's own handler), or, for a signal whose handler was
            ``SIG_DFL``, the signal ends the process once every child is
            stopped, as it would have without corral.  Signals that the
            application, its framework, ``asyncio.run`` or ``trio.run``
            installed a handler for are left to it: the cancellation it
            delivers stops every child just as well.
            ``True`` takes all three whoever holds them and raises
            :class:`KeyboardInterrupt` or :class:`Signalled` (for a
            command-line launcher); ``False`` never touches a handler.
        monitor: ``"HOST:PORT"`` starts a live monitor there: a page for a
            browser and a WebSocket feed of the processes and their logs, at
            :attr:`Runner.monitor_url` (see :doc:`howto/monitor`).  ``True``
            or a port alone (``"8765"``) listens on loopback; port 0 is any
            free port.  An address that cannot be had (a port in use, an
            address this machine does not have) makes entering raise an
            :exc:`OSError` that names it and the reason, within 10 seconds.
        monitor_origins: the origins (``"https://HOST[:PORT]"``) of pages
            that may connect to the monitor besides its own: a reverse
            proxy's, which serves the page at its own address (see
            :ref:`monitor-proxy`).  Nothing else widens who may connect.
        contain: start the children in a cgroup of the runner's own where one
            can be made, so that what leaves their process groups (a ``setsid``
            daemon) is stopped with them (see :doc:`howto/containment`).
        subreaper: make the process a child subreaper while open (orphans are stopped too).
        usage: sample each child's CPU and memory about once a second (for
            :attr:`Process.usage`, the monitor, ``corral``'s table); ``False``: never.

    Entering the runner raises :exc:`CorralError` if the system cannot give
    it what it waits for its children with: pidfds (``pidfd_open``, Linux 5.3
    and later, not forbidden by a seccomp filter).
    """
    RunnerSpec.of(options, "open_runner")
    return Runner(**options)
