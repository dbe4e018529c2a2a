"""A managed child process and the task that supervises it.

A :class:`Process` is created by :meth:`Runner.start` right after the child
was spawned, and one supervising task in the runner's task group looks after
it until it is gone (and, with a restart policy, across its restarts: the
:class:`Process` stays the same object, its pid changes).  Each run of the
child has two parts:

* the **core** runs shielded from cancellation.  It reads the child's
  pipes, waits on the child's pidfd until the leader has exited, reads the
  exit status *without* reaping, kills whatever the child left behind in its
  process group (the zombie leader keeps the group id from being reused
  meanwhile), reads the pipes dry, gives the child's log connections a
  bounded drain, and only then reaps the leader.  Its only open-ended wait is
  the child's exit, which SIGKILL bounds.
* the **watch** around it is cancellable.  When the runner's scope is
  cancelled (by :meth:`Runner.cancel`, a failure elsewhere, or an enclosing
  cancel scope), the watch stops the child — the stop signal to the whole
  group, up to ``grace`` seconds, then SIGKILL — and waits for the core.

A child's exit that nobody asked for, with ``check=True``, raises
:class:`ProcessFailed` from the supervisor (once any restarts are spent),
which makes the runner's task group cancel every sibling: failures always
propagate.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.lowlevel

from .._checks import check_grace, check_signal
from .._errors import STDERR_TAIL_BYTES, HandshakeError, ProcessFailed, StartupFailed
from .._logs._pipes import (
    BufferedReceiveStream,
    PipeReader,
    PipeReceiveStream,
    PipeSendStream,
)
from .._logs._sources import LogTail, Source
from .._results import CompletedProcess
from .._sys import _platform
from .._sys._backend import SureTask, outlast_native_cancel, start_surely
from ._handshake import MAX_REPORT, HandshakeReader
from ._spawn import Spawned, Spawner, SpawnSpec, describe_argv

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream

    from .._logs._hub import LogHub
    from ._signals import Subscription
    from ._token import LoopToken

__all__ = ["CompletedProcess", "Process", "ProcessServices", "RestartPolicy"]

Restart = Literal["never", "on-failure", "always"]

#: A restart policy's delay never grows beyond this many seconds.
MAX_BACKOFF = 30.0
#: A child that ran this long counts as stable: its restart count starts over.
STABLE_AFTER = 60.0


@dataclass(frozen=True)
class RestartPolicy:
    """When a child is started again after it exited (``restart=`` of :meth:`Runner.start`)."""

    restart: Restart = "never"
    max_restarts: int = 3
    backoff: float = 1.0

    @classmethod
    def make(cls, restart: object, max_restarts: object, backoff: object) -> RestartPolicy:
        if restart not in ("never", "on-failure", "always"):
            raise ValueError(f"restart={restart!r}: expected 'never', 'on-failure' or 'always'")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, not {max_restarts!r}")
        policy: Restart = restart
        return cls(policy, max_restarts, check_grace(backoff, "backoff"))

    def delay(self, attempt: int) -> float:
        """Seconds before restart number ``attempt`` (1-based): exponential, with jitter."""
        base = self.backoff * 2.0 ** (attempt - 1)
        return min(base * random.uniform(0.8, 1.2), MAX_BACKOFF)


@dataclass
class ProcessServices:
    """What a process needs from its runner, and nothing more."""

    token: LoopToken
    runner_name: str
    hub: LogHub
    spawner: Spawner
    lifeline_remove: Callable[[int], None]
    signals: Subscription | None
    on_exit: Callable[[Process], None]
    #: Told of every change of state: "running", "exited", "restarting".
    on_event: Callable[[Process, str], None]
    #: The pipes the runner handed to users as streams; those still open are
    #: closed when the runner exits.
    open_streams: set[PipeSendStream | PipeReceiveStream | BufferedReceiveStream]


class _Run:
    """One run of the child: one pid, its pipes and what became of it."""

    def __init__(self, spawned: Spawned) -> None:
        self.spawned = spawned
        self.pid = spawned.pid
        self.pgid = spawned.pid
        self.readers: list[PipeReader] = []
        self.stderr_reader: PipeReader | None = None
        self.collected: dict[str, bytearray] = {}
        self.receive_streams: list[PipeReceiveStream] = []
        self.handshake: HandshakeReader | None = None
        self.started = anyio.Event()
        self.started_value: object = None
        self.startup_error: Exception | None = None
        self.returncode: int | None = None
        self.exit_seen: int | None = None
        self.duration: float | None = None
        self.leader_exited = anyio.Event()
        self.reaped = anyio.Event()
        self.done = anyio.Event()


class Process:
    """A child process managed by a :class:`Runner`.

    Every child is the leader of its own process group, and everything this
    class does to it (stop, kill, signal) reaches the whole group, so the
    child's own children are never left behind.  It reads like AnyIO's and
    :mod:`subprocess`'s process objects: :meth:`terminate`, :meth:`kill` and
    :meth:`send_signal` send at once, :attr:`returncode` and :meth:`poll`
    reflect an exit as soon as it happened, and :meth:`stop` is the graceful
    stop (the stop signal, a grace period, SIGKILL).

    A process belongs to its runner's event loop: call its methods from
    there, or through :attr:`Runner.token` from another thread.
    """

    def __init__(
        self,
        services: ProcessServices,
        spec: SpawnSpec,
        spawned: Spawned,
        *,
        name: str,
        source: Source,
        check: bool,
        grace: float,
        stop_signal: int,
        policy: RestartPolicy,
        start_timeout: float | None,
        collect: bool = False,
    ) -> None:
        self._services = services
        self._token = services.token
        self._spec = spec
        self._name = name
        self._source = source
        self._check = check
        self._grace = grace
        self._stop_signal = stop_signal
        self._policy = policy
        self._start_timeout = start_timeout
        self._stop_requested = False
        self._forwarded = False
        self._restarts = 0
        self._previous: tuple[int, float] | None = None  # (returncode, duration) of the last run
        self._stop_event = anyio.Event()
        self._final = anyio.Event()
        self._final_code: int | None = None
        self._stdin: ByteSendStream | None = None
        self._stdout: ByteReceiveStream | None = None
        self._stderr: ByteReceiveStream | None = None
        self._user_streams: list[PipeSendStream | PipeReceiveStream | BufferedReceiveStream] = []
        self._collects = collect
        self._restarts_in_a_row = 0
        self._left = False
        self._run = self._make_run(spawned)

    # -- what a user reads ----------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's process id (also the id of its process group); new at each restart."""
        return self._run.pid

    @property
    def name(self) -> str:
        """The child's name within its runner, unique while it runs."""
        return self._name

    @property
    def source(self) -> str:
        """The dotted log source of this child, ``<runner name>.<process name>``."""
        return self._source.name

    @property
    def argv(self) -> tuple[str, ...]:
        """The argument vector the child was started with."""
        return tuple(self._spec.argv)

    @property
    def args(self) -> list[str]:
        """The argument vector, as :mod:`subprocess` calls it."""
        return list(self._spec.argv)

    @property
    def returncode(self) -> int | None:
        """``None`` while running; then the exit code, or ``-signum`` if a signal killed it.

        Reflects the exit as soon as it happened (the child is not reaped for
        it: that is the supervisor's job), like :meth:`poll`.
        """
        if self._final_code is not None:
            return self._final_code
        run = self._run
        if run.returncode is not None:
            return run.returncode
        if run.exit_seen is None and not run.reaped.is_set():
            try:
                run.exit_seen = _platform.exit_status(run.pid)
            except _platform.StatusLost:
                # Reaped by someone else (SIGCHLD ignored, a waitpid(-1)): it is
                # gone, and its status with it.  The supervisor reports 0 then,
                # as subprocess and Trio do; so does this, at once.
                run.exit_seen = 0
        return run.exit_seen

    def poll(self) -> int | None:
        """The exit code if the child has exited, else ``None`` (never waits)."""
        return self.returncode

    @property
    def stdin(self) -> ByteSendStream | None:
        """A writable AnyIO byte stream to the child's stdin (``stdin=PIPE``), else ``None``."""
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream | None:
        """A readable AnyIO byte stream of the child's stdout (``PIPE`` or ``LOG | PIPE``)."""
        return self._stdout

    @property
    def stderr(self) -> ByteReceiveStream | None:
        """A readable AnyIO byte stream of the child's stderr (``PIPE`` or ``LOG | PIPE``)."""
        return self._stderr

    @property
    def stderr_tail(self) -> bytes:
        """The last bytes the child wrote to stderr (empty when stderr was not read)."""
        run = self._run
        if "stderr" in run.collected:
            return bytes(run.collected["stderr"][-STDERR_TAIL_BYTES:])
        reader = run.stderr_reader
        return bytes(reader.tail) if reader is not None else b""

    @property
    def started_value(self) -> object:
        """The value the child reported with :func:`corral.child.started` (or ``None``)."""
        return self._run.started_value

    @property
    def duration(self) -> float | None:
        """Seconds from spawn to exit, once the child has exited."""
        return self._run.duration

    @property
    def started_at(self) -> float:
        """When the current run was spawned, in :func:`time.monotonic` seconds."""
        return self._run.spawned.started_at

    @property
    def restarts(self) -> int:
        """How many times the child was restarted (see ``restart=`` of :meth:`Runner.start`)."""
        return self._restarts

    @property
    def previous_exit(self) -> int | None:
        """The exit code of the run before the current one (after a restart), else ``None``."""
        return self._previous[0] if self._previous is not None else None

    def __repr__(self) -> str:
        code = self.returncode
        state = "running" if code is None else _platform.describe_status(code)
        return f"<corral.Process {self._name!r} pid={self.pid} {state}>"

    # -- what a user does -------------------------------------------------------------

    def logs(self, *, buffer: int = 1024) -> LogTail:
        """Tail this child's log records live: ``async for record in proc.logs(): ...``.

        Yields the records of this source — stdout and stderr lines and, for
        children connected with :func:`corral.child.connect`, their
        :mod:`logging` records — starting with the last few hundred already
        written (so a tail opened right after :meth:`Runner.start` misses
        nothing), then live as they arrive, and ends after the last one once
        the child has exited for good.  Records go to the runner's handlers as
        well; a tail sees them independently.

        A tail that falls ``buffer`` records behind slows the child down
        (backpressure) rather than dropping records — but never holds up a
        stop.  Close it (``async with proc.logs() as records:`` does) when
        done.
        """
        self._token.check("Process.logs")
        return self._source.open_tail(buffer)

    async def wait(self) -> int:
        """Wait until the child has exited and its output was delivered; return its code.

        With a restart policy, waits for the last run.  Waiting never raises
        :class:`ProcessFailed`: failure reporting is the runner's (for
        ``check=True``) or :meth:`Runner.run`'s job.
        """
        self._token.check("Process.wait")
        await self._final.wait()
        assert self._final_code is not None
        return self._final_code

    def terminate(self) -> None:
        """Send SIGTERM to the child's whole process group, at once.

        An exit caused by this call is not a failure, even with ``check=True``,
        and the child is not restarted.
        """
        self._token.check("Process.terminate")
        self._request_stop()
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL to the child's whole process group, at once.

        An exit caused by this call is not a failure, even with ``check=True``,
        and the child is not restarted.
        """
        self._token.check("Process.kill")
        self._request_stop()
        self._signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group, at once.

        Unlike :meth:`terminate` and :meth:`kill`, an exit that this signal
        causes counts as a failure for a ``check=True`` child.
        """
        self._token.check("Process.send_signal")
        self._signal(check_signal(sig, "sig") if sig != 0 else 0)

    async def stop(self, grace: float | None = None) -> int:
        """Stop the child: its stop signal to the group, up to ``grace`` seconds, then SIGKILL.

        ``grace`` defaults to the one given to :meth:`Runner.start` or the
        runner.  An exit caused by this call is not a failure, even with
        ``check=True``, and the child is not restarted.  Returns the exit code
        once the child is gone and its output delivered.  If the calling task
        is cancelled meanwhile, the stop itself (signal, grace, SIGKILL, reap)
        still completes.
        """
        self._token.check("Process.stop")
        grace = self._grace if grace is None else check_grace(grace)
        self._request_stop()
        run = self._run
        with anyio.CancelScope(shield=True):
            await self._stop_run(run, grace)
            await outlast_native_cancel(run.reaped.wait)
        await self._final.wait()
        assert self._final_code is not None
        return self._final_code

    async def aclose(self) -> None:
        """:meth:`stop` the child, then close the streams of its pipes."""
        try:
            await self.stop()
        finally:
            for stream in self._user_streams:
                stream.close()

    async def __aenter__(self) -> Process:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the machinery --------------------------------------------------------------

    def _leave_runner(self) -> None:
        if not self._left:
            self._left = True
            self._services.on_exit(self)

    def _request_stop(self) -> None:
        self._stop_requested = True
        self._stop_event.set()

    def _signal(self, sig: int) -> bool:
        # After the leader has been reaped, its id may belong to someone else:
        # never signal it then.
        run = self._run
        if run.reaped.is_set():
            return False
        return _platform.signal_group(run.pgid, sig)

    def forward_signal(self, signum: int) -> None:
        """Pass a stop signal the launcher received on to the group (signal fan-out).

        Called from the signal handler.  The exit that follows is not a
        failure, and the stop that follows when the scope is cancelled sends no
        signal of its own on top of this one (it would cut short the clean-up
        this one started); its grace period and SIGKILL still apply.
        """
        self._stop_requested = True
        self._forwarded = True
        run = self._run
        if run.reaped.is_set() or run.leader_exited.is_set():
            return
        try:
            _platform.signal_group(run.pgid, signum)
        except OSError:
            pass  # nothing to do about it in a signal handler; the stop follows

    async def _stop_run(self, run: _Run, grace: float) -> None:
        """Stop signal to the group, up to ``grace`` seconds, then SIGKILL; wait for the exit.

        Always ends with the leader exited: if the stop signal cannot be sent,
        SIGKILL follows at once.
        """
        if run.leader_exited.is_set() or run.reaped.is_set():
            return
        for reader in run.readers:
            reader.stopping()  # a child that is stopping is read whatever its tails hold
        if not self._forwarded:
            try:
                self._signal(self._stop_signal)
            except (OSError, ValueError) as exc:
                self._services.hub.log(
                    logging.WARNING,
                    f"{self._name} (pid {run.pid}): cannot send its stop signal ({exc}); "
                    "killing it",
                )
                grace = 0.0
        with anyio.move_on_after(grace) as grace_period:
            await outlast_native_cancel(run.leader_exited.wait, grace_period)
        if not run.leader_exited.is_set():
            if grace > 0:
                self._services.hub.log(
                    logging.WARNING,
                    f"{self._name} (pid {run.pid}) did not stop within {grace:g} s; killing it",
                )
            self._signal(signal.SIGKILL)
            await outlast_native_cancel(run.leader_exited.wait)

    def _make_run(self, spawned: Spawned) -> _Run:
        """Set up the readers and streams of a freshly spawned child."""
        run = _Run(spawned)
        hub = self._services.hub
        spec = self._spec
        for stream, plan, fd in (
            ("stdout", spec.stdout, spawned.stdout),
            ("stderr", spec.stderr, spawned.stderr),
        ):
            if fd is None:
                continue
            if plan.pipe and not plan.log and not self._collects:
                # start(): the pipe itself is the user's stream.
                receive = PipeReceiveStream(fd, self._services.open_streams)
                run.receive_streams.append(receive)
                self._set_stream(stream, receive)
                continue
            collect: bytearray | None = None
            buffered: BufferedReceiveStream | None = None
            if plan.pipe:
                if self._collects:
                    collect = run.collected[stream] = bytearray()
                else:
                    buffered = BufferedReceiveStream(self._services.open_streams)
                    self._set_stream(stream, buffered)
            reader = PipeReader(
                fd,
                collector=hub.collector,
                state=hub.lines(self._source, stream, spawned.pid) if plan.log else None,
                collect=collect,
                stream=buffered,
                tail_bytes=STDERR_TAIL_BYTES if stream == "stderr" and plan.log else 0,
            )
            run.readers.append(reader)
            if stream == "stderr":
                run.stderr_reader = reader
        if spawned.stdin is not None:
            send = PipeSendStream(spawned.stdin, self._services.open_streams)
            self._stdin = send
            self._user_streams.append(send)
        if spawned.handshake is not None:
            run.handshake = HandshakeReader(spawned.handshake)
        else:
            run.started.set()
        return run

    def _set_stream(self, stream: str, value: PipeReceiveStream | BufferedReceiveStream) -> None:
        self._user_streams.append(value)
        if stream == "stdout":
            self._stdout = value
        else:
            self._stderr = value

    async def _supervise(self) -> None:
        """The task that looks after this child; runs in the runner's task group."""
        failure: ProcessFailed | None = None
        try:
            while True:
                run = self._run
                await self._watch(run)
                assert run.returncode is not None
                code = run.returncode
                failed = code != 0 and not self._stop_requested
                if isinstance(run.startup_error, StartupFailed) and not self._restarts:
                    break  # Runner.start reports this one
                if not self._should_restart(failed):
                    if failed and self._check:
                        failure = self._failure(run, code)
                    break
                if not await self._restart(run):
                    if failed and self._check and not self._stop_requested:
                        failure = self._failure(run, code)
                    break
        finally:
            run = self._run
            self._final_code = run.returncode if run.returncode is not None else -signal.SIGKILL
            self._source.end()
            self._leave_runner()
            self._final.set()
        if failure is not None:
            raise failure

    def _failure(self, run: _Run, code: int) -> ProcessFailed:
        return ProcessFailed(
            code,
            self._spec.argv,
            name=self._name,
            pid=run.pid,
            stdout=_collected(run, "stdout"),
            stderr=_collected(run, "stderr", self.stderr_tail),
            restarts=self._restarts,
        )

    def _should_restart(self, failed: bool) -> bool:
        follows = self._restart_follows(failed)
        run = self._run
        if run.duration is not None and run.duration >= STABLE_AFTER:
            self._restarts_in_a_row = 0
        return follows

    def _restart_follows(self, failed: bool) -> bool:
        """Whether the policy starts the child again after this exit (no side effects)."""
        policy = self._policy
        if self._stop_requested or policy.restart == "never":
            return False
        if policy.restart == "on-failure" and not failed:
            return False
        run = self._run
        stable = run.duration is not None and run.duration >= STABLE_AFTER
        return (0 if stable else self._restarts_in_a_row) < policy.max_restarts

    async def _restart(self, run: _Run) -> bool:
        """Wait the backoff, then spawn the next run; ``False`` if stopped meanwhile."""
        self._restarts_in_a_row += 1
        delay = self._policy.delay(self._restarts_in_a_row)
        assert run.returncode is not None
        self._services.hub.log(
            logging.WARNING,
            f"restarting {self._name} in {delay:.2f} s (restart {self._restarts + 1}, "
            f"{self._restarts_in_a_row} of {self._policy.max_restarts} in a row); it "
            f"{_platform.describe_status(run.returncode)}",
        )
        self._services.on_event(self, "restarting")
        with anyio.move_on_after(delay):
            await self._stop_event.wait()
        if self._stop_requested:
            return False
        await anyio.lowlevel.checkpoint()
        try:
            spawned = self._services.spawner.spawn(
                self._spec, self._services.hub.child_env(self._source)
            )
        except OSError as exc:
            # Out of descriptors (ResourceLimitError), or the program is gone:
            # this exit stays the last one, a failure as any other (nothing
            # was spawned, nothing else is affected).
            self._services.hub.log(
                logging.ERROR, f"cannot restart {self._name}: {exc}; it stays stopped"
            )
            return False
        self._previous = (run.returncode, run.duration or 0.0)
        self._restarts += 1
        self._source.restart()
        self._run = self._make_run(spawned)
        if self._services.signals is not None:
            self._services.signals.add(self)
        self._services.hub.log(
            logging.INFO,
            f"restarted {self._name} (pid {spawned.pid}): {describe_argv(self._spec.argv)}",
        )
        self._services.on_event(self, "running")
        return True

    async def _watch(self, run: _Run) -> None:
        async with anyio.create_task_group() as tg:
            try:
                # The core reaps the child: it must run, whatever cancels us.
                await start_surely(tg, (self._core, (run,), f"corral core {self._name}"))
                await run.done.wait()
            except anyio.get_cancelled_exc_class():
                self._stop_requested = True
                with anyio.CancelScope(shield=True):
                    await self._stop_run(run, self._grace)
                    await outlast_native_cancel(run.reaped.wait)
                raise

    async def _core(self, run: _Run) -> None:
        status: int | None = None
        spawned = run.spawned
        hub = self._services.hub
        with anyio.CancelScope(shield=True):
            try:
                async with anyio.create_task_group() as tg:
                    tasks: list[SureTask] = [
                        (reader.run, (), f"corral reader {self._name}") for reader in run.readers
                    ]
                    if run.handshake is not None:
                        decide = partial(self._decide_start, run, False)
                        tasks.append(
                            (run.handshake.read, (decide,), f"corral start-up {self._name}")
                        )
                    await start_surely(tg, *tasks)
                    await anyio.wait_readable(spawned.pidfd)
                    status = self._exit_status(run)
                    run.duration = time.monotonic() - spawned.started_at
                    # The leader is a zombie now: its group id is still ours.
                    # Anything it left behind in the group goes with it.
                    _platform.signal_group(run.pgid, signal.SIGKILL)
                    run.exit_seen = status
                    run.leader_exited.set()
                    for reader in run.readers:
                        reader.finish()
                    for stream in run.receive_streams:
                        stream.child_exited()
                    if run.handshake is not None:
                        run.handshake.finish()
                    # Its logging connections end with it: read them to the end.
                    await hub.drain(self._source, run.pgid)
            finally:
                if status is None:
                    # Only a cancellation that no shield holds back gets here
                    # (asyncio.run cancelling every task at its end): kill the
                    # group and reap, never leave the child unmanaged.
                    _platform.signal_group(run.pgid, signal.SIGKILL)
                    try:
                        status = _platform.wait_blocking(run.pid)
                    except _platform.StatusLost:
                        status = 0
                if self._services.signals is not None:
                    self._services.signals.discard(self)
                _platform.reap(run.pid)
                run.reaped.set()
                if self._stop_requested or self._policy.restart == "never":
                    self._leave_runner()  # no restart can follow: not running any more
                self._services.lifeline_remove(run.pgid)
                os.close(spawned.pidfd)
                for reader in run.readers:
                    os.close(reader.fd)
                if run.handshake is not None:
                    self._decide_start(run, True)
                    run.handshake.close()
                _close_status(run)
                run.leader_exited.set()
            run.returncode = status
            hub.log(*self._exit_record(run))
            self._services.on_event(self, "exited")
            mark = hub.collector.mark()
        # Every line the child wrote is queued; wait until the handlers have it
        # too, so that wait() returning means "all written" (bounded: the
        # collector gives up on a stuck handler).
        await hub.delivered(mark)
        run.done.set()

    def _exit_status(self, run: _Run) -> int:
        try:
            status = _platform.exit_status(run.pid)
        except _platform.StatusLost:
            # SIGCHLD ignored, or the application reaps children itself:
            # the status is gone.  Report what subprocess and Trio report.
            self._services.hub.log(
                logging.WARNING,
                f"{self._name} (pid {run.pid}) exited, but its exit status was collected "
                "elsewhere (SIGCHLD ignored, or another waitpid); reporting 0",
            )
            return 0
        assert status is not None, "pidfd readable but the child has not exited"
        return status

    def _decide_start(self, run: _Run, exited: bool) -> None:
        """Decide the start-up outcome from what the handshake pipe delivered."""
        handshake = run.handshake
        if handshake is None or run.started.is_set():
            return
        quoted = bytes(handshake.data[:200]).decode("utf-8", "replace")
        if handshake.too_long:
            run.startup_error = HandshakeError(
                f"process {self._name!r} (pid {run.pid}) wrote more than {MAX_REPORT} bytes "
                f"to its start-up descriptor without a newline; it began: {quoted!r}..."
            )
        elif handshake.reported:
            try:
                run.started_value = handshake.value()
            except ValueError as exc:
                run.startup_error = HandshakeError(
                    f"process {self._name!r} (pid {run.pid}) reported its start with "
                    f"malformed JSON ({exc}); it wrote: {quoted!r}"
                    + ("..." if len(handshake.data) > 200 else "")
                )
        elif handshake.eof and not exited and not self._exiting(run):
            run.started_value = None  # closing the descriptor reports null
        else:
            run.startup_error = StartupFailed(0, self._spec.argv, name=self._name, pid=run.pid)
        run.started.set()
        _close_status(run)

    def _exiting(self, run: _Run) -> bool:
        status = run.spawned.status
        return status is None or _platform.is_exiting(status)

    async def _abandon(self) -> None:
        """Stop the child and wait until it is reaped, whatever cancels the caller meanwhile.

        For a :meth:`Runner.start` or :meth:`Runner.run` that was cancelled (or
        failed) before its caller got hold of the child: like
        :func:`anyio.run_process`, the child is gone before the cancellation
        goes on.  Shielded, and bounded as every stop is: stop signal, grace,
        SIGKILL, reap.
        """
        run = self._run
        if self.returncode is None or self._policy.restart != "never":
            self._request_stop()  # no restart either
        with anyio.CancelScope(shield=True):
            await self._stop_run(run, self._grace)
            await outlast_native_cancel(run.reaped.wait)

    async def _wait_started(self) -> None:
        """Wait for the first run's start-up report (for :meth:`Runner.start`)."""
        run = self._run
        limit = self._start_timeout
        try:
            with anyio.fail_after(limit):
                await run.started.wait()
        except TimeoutError:
            await self.stop()
            raise TimeoutError(
                f"process {self._name!r} (pid {run.pid}) did not report that it started "
                f"within {limit:g} s; it was stopped"
            ) from None
        except BaseException:
            await self._abandon()
            raise
        error = run.startup_error
        if error is None:
            return
        if isinstance(error, StartupFailed):
            # Wait for the exit to be complete so that the stderr tail is too.
            try:
                await run.done.wait()
            except BaseException:
                await self._abandon()
                raise
            assert run.returncode is not None
            raise StartupFailed(
                run.returncode,
                self._spec.argv,
                name=self._name,
                pid=run.pid,
                stderr=self.stderr_tail,
            )
        await self.stop()
        raise error

    def _exit_record(self, run: _Run) -> tuple[int, str]:
        assert run.returncode is not None
        duration = run.duration if run.duration is not None else 0.0
        level = logging.DEBUG
        if run.returncode != 0 and not self._stop_requested:
            # A failure that stops the runner (check=True, no restart left) is
            # an error; one that is restarted, or a non-zero exit the caller
            # said it tolerates, is worth a warning.
            level = (
                logging.ERROR
                if self._check and not self._restart_follows(failed=True)
                else logging.WARNING
            )
        return level, (
            f"{self._name} (pid {run.pid}) {_platform.describe_status(run.returncode)} "
            f"after {duration:.3f} s"
        )

    def _completed(self) -> CompletedProcess:
        run = self._run
        assert self._final_code is not None
        return CompletedProcess(
            list(self._spec.argv),
            self._final_code,
            _collected(run, "stdout"),
            _collected(run, "stderr"),
            name=self._name,
            pid=run.pid,
            duration=run.duration or 0.0,
            started_value=run.started_value,
            stderr_tail=self.stderr_tail,
        )


def _close_status(run: _Run) -> None:
    spawned = run.spawned
    if spawned.status is not None:
        os.close(spawned.status)
        spawned.status = None


def _collected(run: _Run, stream: str, default: bytes | None = None) -> bytes | None:
    data = run.collected.get(stream)
    return bytes(data) if data is not None else default
