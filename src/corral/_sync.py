"""corral from synchronous code: :func:`launch` and :func:`open_runner_sync`.

A script, a notebook cell or a synchronous library function cannot ``async
with`` a runner, and must not call :func:`anyio.run` where an event loop runs
already (a Jupyter kernel runs one in its main thread; so does a synchronous
function called from inside ``asyncio.run``).  So a blocking runner runs its
own event loop on a helper thread, always, whatever the calling thread is
doing; it is built on the public runner alone:

* The helper thread runs ``anyio.run`` of one *host* task, which enters an
  ordinary :class:`~corral.Runner` and, inside it, a task group for the
  calls: the portal between the two threads.  Each blocking call becomes a
  task of that group, handed over with :meth:`LoopToken.run_sync_soon` and
  answered through a :class:`concurrent.futures.Future`, so it runs *inside
  the runner's scope*: when a child fails, or the runner is cancelled, the
  call is cancelled with everything else, as the body of ``async with``
  would be, and the runner's error comes out of the call once every child
  is stopped.  (AnyIO's own ``BlockingPortal`` cannot be used: its calls go
  through ``trio.from_thread``, which refuses to run in a thread where a
  Trio loop runs, as in a synchronous function called from ``trio.run``.)
* The thread comes from a one-thread :class:`~concurrent.futures.ThreadPoolExecutor`:
  it is not a daemon, so an interpreter that exits while a runner is
  still stopping waits for that (bounded) stop instead of cutting it short.
  It is joined when the runner closes.
* Python delivers signals to the main thread only, and a runner entered on
  another thread takes no signal handler.  Ctrl-C therefore surfaces as
  :class:`KeyboardInterrupt` in the blocked calling thread (the kernel's
  interrupt in Jupyter is the same SIGINT).  The runner then cancels its
  scope (the stop signal to every child's group, its grace period,
  SIGKILL, reaping), waits for that at most the longest grace period in use
  plus one second, and re-raises.  A second Ctrl-C during that wait kills
  every child at once.
* A blocking runner belongs to the thread that opened it, as a runner
  belongs to its loop: from any other thread (its own loop's included) its
  methods raise :class:`~corral.WrongLoopError` at once; after it closed
  they raise :class:`~corral.CorralError`.  Nothing ever waits on a loop
  that is gone.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import anyio

from . import (
    CompletedProcess,
    CorralError,
    LaunchResult,
    LogTail,
    LoopToken,
    Process,
    Runner,
    WrongLoopError,
    open_runner,
)

__all__ = ["SyncLogTail", "SyncProcess", "SyncRunner", "launch", "open_runner_sync"]

T = TypeVar("T")

#: Seconds an interrupted runner gets on top of its longest grace period to
#: stop every child, before :class:`KeyboardInterrupt` is raised regardless.
INTERRUPT_SLACK = 1.0

_BACKENDS = ("asyncio", "trio")


class SyncRunner:
    """A :class:`Runner` for synchronous code; create it with :func:`open_runner_sync`.

    ``with corral.open_runner_sync() as r:`` opens the runner on an event
    loop of its own, in a helper thread; its methods block the calling
    thread until the runner's loop has done the work.  Leaving the block
    waits for the children that still run, as ``async with`` does; leaving
    it by an exception (:class:`KeyboardInterrupt` included) stops them
    first.  A child started with ``check=True`` that fails stops the others,
    and its :class:`ProcessFailed` (in an :class:`ExceptionGroup`, as out of
    ``async with``) is raised by the call that was waiting, or by the next
    one, or at the end of the block.

    The runner belongs to the thread that opened it.
    """

    def __init__(self, backend: str, options: dict[str, Any]) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f'backend must be "asyncio" or "trio", not {backend!r}')
        if options.get("handle_signals"):
            raise ValueError(
                "a blocking runner's loop runs on a helper thread, where Python delivers no "
                "signal: it cannot take signal handlers (handle_signals=True).  Ctrl-C "
                "reaches the calling thread as KeyboardInterrupt and stops every child"
            )
        self._backend = backend
        self._options = options
        self._name = str(options.get("name", "corral"))
        try:
            self._longest_grace = max(0.0, float(options.get("grace", 5.0)))
        except (TypeError, ValueError):
            self._longest_grace = 5.0  # the runner refuses it on entry
        self._entered = False
        self._closed = False
        self._owner: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: concurrent.futures.Future[None] | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._runner: Runner | None = None
        # Touched on the loop only: the calls handed over and not started yet.
        self._pending: deque[_Call] = deque()
        self._wake: anyio.Event | None = None
        self._accepting = False
        self._close_requested = False
        self._stopping = False
        self._delivered = False  # the runner's own error was raised to the caller

    # -- properties -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The runner's name, the first part of every log source it produces."""
        return self._name

    @property
    def backend(self) -> str:
        """``"asyncio"`` or ``"trio"``: the event loop the runner runs on."""
        return self._backend

    @property
    def runner(self) -> Runner:
        """The :class:`Runner` itself, running on the helper thread's loop.

        Its methods belong to that loop: reach them through :attr:`token`.
        """
        if self._runner is None:
            raise CorralError("the runner is not open (use 'with corral.open_runner_sync() as r:')")
        return self._runner

    @property
    def token(self) -> LoopToken:
        """The :class:`LoopToken` of the runner's loop, to call into it from any other thread."""
        return self.runner.token

    @property
    def grace(self) -> float:
        """Default seconds between the stop signal and SIGKILL."""
        return self.runner.grace

    @property
    def log_path(self) -> str | None:
        """The folder of this run's log files (with ``log_dir=``)."""
        return self.runner.log_path

    @property
    def monitor_url(self) -> str | None:
        """The monitor's address (with ``monitor=``), as :attr:`Runner.monitor_url`."""
        return self.runner.monitor_url

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._runner is not None else "new"
        return f"<corral.SyncRunner {self._name!r} on {self._backend}, {state}>"

    # -- scope ------------------------------------------------------------------------

    def __enter__(self) -> SyncRunner:
        if self._entered:
            raise RuntimeError(
                "a SyncRunner can be entered only once; call open_runner_sync() again"
            )
        self._entered = True
        self._owner = threading.current_thread()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"corral-{self._name}-loop"
        )
        self._loop = self._executor.submit(self._run_loop)
        try:
            self._started.result()
        except KeyboardInterrupt:
            self._interrupted()
            raise
        except BaseException:
            # The runner could not be entered (an option it refused, say):
            # the loop ends with the same error.
            self._close(wait=True)
            raise
        assert self._runner is not None
        self._longest_grace = max(self._longest_grace, self._runner.grace)
        return self

    def _run_loop(self) -> None:
        anyio.run(self._host, backend=self._backend)

    async def _host(self) -> None:
        """The helper thread's main task: the runner, and the calls' task group inside it."""
        try:
            runner = open_runner(**self._options)
            async with runner, anyio.create_task_group() as calls:
                try:
                    self._wake = anyio.Event()
                    self._accepting = True
                    self._runner = runner
                    self._started.set_result(None)
                    if self._stopping:  # interrupted while we were entering
                        runner.cancel()
                    while not self._close_requested:
                        await self._wake.wait()
                        self._wake = anyio.Event()
                        while self._pending:
                            call = self._pending.popleft()
                            calls.start_soon(call.run, runner, name=f"corral call {call.what}")
                finally:
                    self._accepting = False
                    while self._pending:
                        self._pending.popleft().future.cancel()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._closed:
            return
        if exc is not None:
            # As in ``async with``: an error in the body stops every child.
            self._interrupted()
            error = self._loop_error()
            if error is not None and not self._delivered and error is not exc:
                exc.add_note(f"runner {self._name!r} also failed: {error!r}")
            return
        assert self._loop is not None
        try:
            self._on_loop(self._request_close)
            # Like a nursery, the end of the block waits for the children.
            concurrent.futures.wait([self._loop])
        except KeyboardInterrupt:
            self._interrupted()
            raise
        self._close(wait=True)
        error = self._loop_error()
        if error is not None and not self._delivered:
            self._delivered = True
            raise error

    def cancel(self) -> None:
        """Cancel the runner's scope: stop every child; the block then ends.

        Returns at once; leaving the ``with`` block waits for the stop.  Any
        later call on the runner raises :class:`CorralError`.
        """
        self._call_sync("Runner.cancel", lambda r: r.cancel())
        self._stopping = True

    # -- what the runner does -----------------------------------------------------------

    def start(self, argv: Sequence[str | os.PathLike[str]], **options: Any) -> SyncProcess:
        """Start ``argv`` as :meth:`Runner.start` does (same options); return its handle.

        ``stdin``, ``stdout`` and ``stderr`` cannot be ``PIPE`` here (the
        streams are asynchronous): use :meth:`run` to collect output, or
        :meth:`SyncProcess.logs` to follow it.
        """
        for stream in ("stdin", "stdout", "stderr"):
            value = options.get(stream)
            if value == subprocess.PIPE or getattr(value, "pipe", False):
                raise ValueError(
                    f"{stream}=PIPE gives an asynchronous stream, which a blocking runner "
                    "cannot hand out; use run() to collect output, or logs() to follow it"
                )
        self._note_grace(options.get("grace"))
        proc = self._call("Runner.start", lambda r: r.start(argv, **options))
        return SyncProcess(self, proc)

    def run(self, argv: Sequence[str | os.PathLike[str]], **options: Any) -> CompletedProcess:
        """Run ``argv`` to completion as :meth:`Runner.run` does; return its result.

        Returns a :class:`CompletedProcess`.  With ``check=True`` (the default) a failure raises
        :class:`ProcessFailed` here.  Interrupted (Ctrl-C), it stops the
        child and every other one before :class:`KeyboardInterrupt` comes out.
        """
        self._note_grace(options.get("grace"))
        return self._call("Runner.run", lambda r: r.run(argv, **options))

    def launch(self, func: Callable[..., T], /, *args: Any, **options: Any) -> LaunchResult[T]:
        """Run ``func(*args)`` on every worker as :meth:`Runner.launch` does (same options)."""
        self._note_grace(options.get("grace"))
        return self._call("Runner.launch", lambda r: r.launch(func, *args, **options))

    def launch_command(
        self, argv: Sequence[str | os.PathLike[str]], **options: Any
    ) -> LaunchResult[int]:
        """Run the command on every worker as :meth:`Runner.launch_command` does."""
        self._note_grace(options.get("grace"))
        return self._call("Runner.launch_command", lambda r: r.launch_command(argv, **options))

    # -- the machinery ------------------------------------------------------------------

    def _check(self, what: str) -> Runner:
        owner = self._owner
        if owner is None or self._runner is None:
            if self._closed:
                raise CorralError(
                    f"runner {self._name!r} is closed; {what} cannot be used any more"
                )
            raise CorralError(
                f"{what}: the runner is not open (use 'with corral.open_runner_sync() as r:')"
            )
        if threading.current_thread() is not owner:
            raise WrongLoopError(
                f"{what} belongs to the blocking runner {self._name!r} of thread "
                f"{owner.name!r} and was used from thread {threading.current_thread().name!r}; "
                "use it from that thread, or reach the runner's loop through r.token.run / "
                "r.token.run_sync"
            )
        if self._closed:
            raise CorralError(f"runner {self._name!r} is closed; {what} cannot be used any more")
        return self._runner

    def _call(self, what: str, func: Callable[[Runner], Awaitable[T]]) -> T:
        """Run ``await func(runner)`` on the loop, in the runner's scope; block for its result."""
        return cast(T, self._submit(what, func))

    def _call_sync(self, what: str, func: Callable[[Runner], T]) -> T:
        """Run ``func(runner)`` on the loop, in the runner's scope; block for its result."""
        return cast(T, self._submit(what, func))

    def _submit(self, what: str, func: Callable[[Runner], Any]) -> Any:
        runner = self._check(what)
        call = _Call(what, func)
        future = call.future
        try:
            try:
                runner.token.run_sync_soon(self._hand_over, call)
            except anyio.RunFinishedError:
                raise self._ended(what) from None
            try:
                return future.result()
            except concurrent.futures.CancelledError:
                # The runner's scope was cancelled under the call (a child
                # failed, or the runner was cancelled), or it was closing.
                raise self._ended(what) from None
        except KeyboardInterrupt:
            self._interrupted()
            raise

    def _hand_over(self, call: _Call) -> None:
        """On the loop: queue one call for the host task, which starts it in the runner's scope."""
        if not self._accepting or self._wake is None:
            call.future.cancel()
            return
        self._pending.append(call)
        self._wake.set()

    def _request_close(self, runner: Runner) -> None:
        """On the loop: let the host task leave the runner (which waits for the children)."""
        self._close_requested = True
        if self._wake is not None:
            self._wake.set()

    def _peek(self, what: str, read: Callable[[], T]) -> T:
        """``read()`` on the loop while the runner is open; directly once it has closed."""
        if self._closed:
            return read()
        return self._call_sync(what, lambda r: read())

    def _ended(self, what: str) -> BaseException:
        """Wait for a runner that is ending by itself; return what the call should raise."""
        assert self._loop is not None
        concurrent.futures.wait([self._loop])  # the runner's exit is bounded
        self._close(wait=True)
        error = self._loop_error()
        if error is not None and not self._delivered:
            self._delivered = True
            return error
        return CorralError(f"runner {self._name!r} was cancelled; {what} did not complete")

    def _loop_error(self) -> BaseException | None:
        loop = self._loop
        if loop is None or not loop.done():
            return None
        return loop.exception()

    def _note_grace(self, grace: object) -> None:
        if isinstance(grace, (int, float)) and not isinstance(grace, bool) and grace >= 0:
            self._longest_grace = max(self._longest_grace, float(grace))

    def _interrupted(self) -> None:
        """Stop every child and close, within the longest grace period plus a second."""
        if self._closed:
            return
        deadline = time.monotonic() + self._longest_grace + INTERRUPT_SLACK
        self._stopping = True
        self._on_loop(lambda r: r.cancel())
        assert self._loop is not None
        ended = False
        killed = False
        while True:
            try:
                left = max(0.0, deadline - time.monotonic())
                ended = bool(concurrent.futures.wait([self._loop], timeout=left).done)
                break
            except KeyboardInterrupt:
                # Ctrl-C again: no more grace.
                if not killed:
                    killed = True
                    self._on_loop(_kill_all)
        self._close(wait=ended)

    def _on_loop(self, func: Callable[[Runner], None]) -> None:
        """Call ``func(runner)`` on the loop if the runner is there; never raises."""
        runner = self._runner
        if runner is None or not self._started.done():
            return  # the host cancels the runner itself once it is entered
        try:
            runner.token.run_sync_soon(func, runner)
        except anyio.RunFinishedError:
            pass  # the loop has finished already: nothing left to stop

    def _close(self, *, wait: bool) -> None:
        self._closed = True
        if self._executor is not None:
            # Without ``wait`` the thread finishes the runner's bounded exit on
            # its own (and the interpreter waits for it at exit).
            self._executor.shutdown(wait=wait)


class _Call:
    """One blocking call: what it runs on the loop, and the future its caller waits on."""

    def __init__(self, what: str, func: Callable[[Runner], Any]) -> None:
        self.what = what
        self.func = func
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    async def run(self, runner: Runner) -> None:
        future = self.future
        try:
            value = self.func(runner)
            if inspect.isawaitable(value):
                value = await value
        except anyio.get_cancelled_exc_class():
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit...: the runner's too
        else:
            future.set_result(value)


def _kill_all(runner: Runner) -> None:
    for proc in runner.processes:
        proc.kill()


class SyncProcess:
    """A child started by :meth:`SyncRunner.start`: a blocking :class:`Process`.

    Reads like :class:`subprocess.Popen`: :meth:`wait` (with ``timeout``),
    :meth:`poll`, :attr:`returncode`, :meth:`terminate`, :meth:`kill`,
    :meth:`send_signal`, plus the graceful :meth:`stop` and a blocking
    iterator over its log records, :meth:`logs`.  Like its runner, it belongs
    to the thread that opened the runner.
    """

    def __init__(self, runner: SyncRunner, process: Process) -> None:
        self._runner = runner
        self._process = process

    @property
    def process(self) -> Process:
        """The :class:`Process` itself (it belongs to the runner's loop)."""
        return self._process

    @property
    def pid(self) -> int:
        """The child's process id (also its process group's)."""
        return self._process.pid

    @property
    def name(self) -> str:
        """The child's name within its runner."""
        return self._process.name

    @property
    def source(self) -> str:
        """Its log source, ``<runner>.<name>``."""
        return self._process.source

    @property
    def args(self) -> list[str]:
        """The argument vector, as :mod:`subprocess` calls it."""
        return self._process.args

    @property
    def started_value(self) -> object:
        """What the child reported with :func:`corral.child.started` (or ``None``)."""
        return self._process.started_value

    @property
    def returncode(self) -> int | None:
        """``None`` while the child runs; then its exit code (``-signum`` if killed)."""
        process = self._process
        return self._runner._peek("Process.returncode", lambda: process.returncode)

    def poll(self) -> int | None:
        """The exit code if the child has exited, else ``None`` (never waits)."""
        process = self._process
        return self._runner._peek("Process.poll", process.poll)

    @property
    def stderr_tail(self) -> bytes:
        """The last bytes the child wrote to stderr."""
        process = self._process
        return self._runner._peek("Process.stderr_tail", lambda: process.stderr_tail)

    def __repr__(self) -> str:
        return f"<corral.SyncProcess {self.name!r} pid={self.pid}>"

    def wait(self, timeout: float | None = None) -> int:
        """Block until the child has exited and its output was delivered; return its code.

        Raises :class:`subprocess.TimeoutExpired` if it still runs after
        ``timeout`` seconds (it keeps running), as :meth:`subprocess.Popen.wait`.
        """
        process = self._process

        async def wait(runner: Runner) -> int | None:
            if timeout is None:
                return await process.wait()
            with anyio.move_on_after(timeout):
                return await process.wait()
            return None

        code = self._runner._call("Process.wait", wait)
        if code is None:
            assert timeout is not None
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def stop(self, grace: float | None = None) -> int:
        """Stop the child as :meth:`Process.stop` does (stop signal, grace, SIGKILL); its code."""
        self._runner._note_grace(grace)
        process = self._process
        return self._runner._call("Process.stop", lambda r: process.stop(grace))

    def terminate(self) -> None:
        """Send SIGTERM to the child's process group, at once (not a failure)."""
        process = self._process
        self._runner._call_sync("Process.terminate", lambda r: process.terminate())

    def kill(self) -> None:
        """Send SIGKILL to the child's process group, at once (not a failure)."""
        process = self._process
        self._runner._call_sync("Process.kill", lambda r: process.kill())

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child's process group, as :meth:`Process.send_signal`."""
        process = self._process
        self._runner._call_sync("Process.send_signal", lambda r: process.send_signal(sig))

    def logs(self, *, buffer: int = 1024) -> SyncLogTail:
        """Follow the child's log records: ``for record in proc.logs(): ...``.

        A blocking :class:`LogTail` (see :meth:`Process.logs`): it yields the
        child's :class:`logging.LogRecord` objects, its stdout and stderr lines
        among them (``record.getMessage()`` is the line), and ends once the
        child has exited for good.
        """
        process = self._process
        tail = self._runner._call_sync("Process.logs", lambda r: process.logs(buffer=buffer))
        return SyncLogTail(self._runner, tail)


class SyncLogTail:
    """A blocking iterator over one source's log records; see :meth:`SyncProcess.logs`.

    Close it (``with proc.logs() as records:`` does) when you stop reading
    before it ends: an open tail that is not read holds the child back once
    its buffer is full.
    """

    def __init__(self, runner: SyncRunner, tail: LogTail) -> None:
        self._runner = runner
        self._tail = tail
        self._closed = False

    @property
    def source(self) -> str:
        """The dotted source this tail follows."""
        return self._tail.source

    def __iter__(self) -> SyncLogTail:
        return self

    def __next__(self) -> logging.LogRecord:
        if self._closed:
            raise StopIteration
        tail = self._tail
        try:
            return self._runner._call("LogTail.receive", lambda r: tail.receive())
        except anyio.EndOfStream:
            self._closed = True
            raise StopIteration from None

    def close(self) -> None:
        """Stop following the source (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if not self._runner._closed:
            tail = self._tail
            self._runner._call_sync("LogTail.close", lambda r: tail.close())

    def __enter__(self) -> SyncLogTail:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_runner_sync(*, backend: str = "asyncio", **options: Any) -> SyncRunner:
    """Create a blocking runner: ``with corral.open_runner_sync() as r:``.

    For scripts, notebooks and synchronous code: the runner runs on an event
    loop of its own in a helper thread, so it works where a loop already
    runs in the calling thread (a Jupyter cell, a function called from
    ``asyncio.run``) and from any thread.  See :class:`SyncRunner` and
    :doc:`howto/sync`.

    Args:
        backend: ``"asyncio"`` (the default) or ``"trio"``, the helper
            thread's event loop.
        options: the keywords of :func:`open_runner` (``name``, ``grace``,
            ``console``, ``handlers``, ``log_dir``...), except
            ``handle_signals=True``: Ctrl-C reaches the calling thread as
            :class:`KeyboardInterrupt`, and stops every child.
    """
    return SyncRunner(backend, options)


def launch(
    func: Callable[..., T],
    /,
    *args: Any,
    hosts: Sequence[str] | str | None = None,
    workers_per_host: int | Sequence[int] | None = None,
    hostnames: Sequence[str] | str | None = None,
    backend: str = "asyncio",
    **options: Any,
) -> LaunchResult[T]:
    """Run ``func(*args)`` on every worker and return their results: one blocking call.

    Opens a runner, calls :meth:`Runner.launch`, and closes the runner
    again, with every guarantee of :meth:`Runner.launch`: the first failure
    stops every other worker and raises here (the worker's own exception,
    with its remote traceback), every line the workers write reaches the
    console (and ``log_dir=``), and nothing outlives the call.  It works
    from a plain script, from any thread, and where an event loop already
    runs in the calling thread (a Jupyter cell; a synchronous function called
    from async code), without calling :func:`anyio.run` on that loop.
    Ctrl-C, or a kernel interrupt in Jupyter, stops every worker and raises
    :class:`KeyboardInterrupt` within the grace period plus one second.

    Args:
        func: the function (see :meth:`Runner.launch`).
        args: its positional arguments; keyword arguments go in with
            :func:`functools.partial`.
        hosts: ``None`` (this machine), a list of hosts (over ssh), or
            ``"slurm"``, as in :meth:`Runner.launch`.
        workers_per_host: workers on each host, as in :meth:`Runner.launch`.
        hostnames: torchrunx's spelling of ``hosts``, with torchrunx's
            meanings: ``"auto"`` is the Slurm allocation inside one
            (``SLURM_JOB_ID`` set) and this machine elsewhere, and
            ``["localhost"]`` is this machine (no ssh).  Give one of
            ``hosts`` and ``hostnames``.
        backend: ``"asyncio"`` or ``"trio"``, the event loop to run on.
        options: the keywords of :func:`open_runner` (``name``, ``grace``,
            ``console``, ``log_dir``...) and of :meth:`Runner.launch`
            (``extra_env``, ``copy_env``, ``ssh``, ``start_timeout``...).
    """
    if hostnames is not None:
        if hosts is not None:
            raise TypeError("give hosts or hostnames (its torchrunx spelling), not both")
        hosts = _from_hostnames(hostnames)
    runner_options = {
        name: options.pop(name) for name in list(options) if name in _runner_keywords()
    }
    with open_runner_sync(backend=backend, **runner_options) as r:
        return r.launch(func, *args, hosts=hosts, workers_per_host=workers_per_host, **options)


def _from_hostnames(hostnames: Sequence[str] | str) -> Sequence[str] | str | None:
    if hostnames == "auto":
        return "slurm" if os.environ.get("SLURM_JOB_ID") else None
    if isinstance(hostnames, str):
        return hostnames  # "slurm", or a mistake Runner.launch explains
    if list(hostnames) == ["localhost"]:
        return None
    return hostnames


@functools.cache
def _runner_keywords() -> frozenset[str]:
    """The keywords :func:`open_runner` takes (``grace`` among them: launch inherits it)."""
    return frozenset(inspect.signature(open_runner).parameters)
