"""The supervisor of a managed child: the machinery behind its :class:`Process` handle.

:meth:`Runner.start` creates a :class:`Supervisor` right after the child was
spawned, with the :class:`~corral._core._process.Process` its caller gets; its
task in the runner's task group looks after the child until it is gone (and,
with a restart policy, across its restarts: each is a new run, the
:class:`Process` stays the same object).  Each run of the child has two parts:

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
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._checks import check_grace, check_signal
from .._errors import HandshakeError, ProcessFailed, StartupFailed
from .._sys import _platform
from .._sys._backend import SureTask, outlast_native_cancel, start_surely
from ._handshake import MAX_REPORT
from ._run import Run, UserStream, close_status, open_run
from ._spawn import Spawned, Spawner, describe_argv
from ._stop import Census, Grace, group_gone, stop

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream

    from .._logs._hub import LogHub
    from .._logs._sources import Source
    from .._sys._proc import ResourceUsage
    from ._options import StartSpec
    from ._signals import Subscription
    from ._token import LoopToken
    from ._usage import UsageSampler

__all__ = ["STABLE_AFTER", "ProcessServices", "Supervisor"]

#: A child that ran this long counts as stable: its restart count starts over.
STABLE_AFTER = 60.0


@dataclass
class ProcessServices:
    """What a process needs from its runner, and nothing more."""

    token: LoopToken
    runner_name: str
    hub: LogHub
    spawner: Spawner
    lifeline_remove: Callable[[int], None]
    signals: Subscription | None
    #: The pipes the runner handed to users as streams; those still open are
    #: closed when the runner exits.
    open_streams: set[UserStream]
    #: Who finds the members of the children's groups (one per runner).
    census: Census
    #: What samples each child's CPU and memory (``None``: ``usage=False``).
    usage: UsageSampler | None = None


class Supervisor:
    """One managed child's machinery: its runs, its stop, its restarts (see the module's docs).

    ``on_exit`` is called once the child is not running any more (no
    restart can follow); ``on_event`` with each change of state:
    ``"running"``, ``"restarting"``, ``"exited"``.  It is also the target the
    signal sweep forwards a signal to (:meth:`forward_signal`).
    """

    def __init__(
        self,
        services: ProcessServices,
        spec: StartSpec,
        spawned: Spawned,
        *,
        name: str,
        source: Source,
        grace: float,
        stop_signal: int,
        on_exit: Callable[[], None],
        on_event: Callable[[str], None],
    ) -> None:
        self._services = services
        self._on_exit = on_exit
        self._on_event = on_event
        self.token = services.token
        self.spec = spec
        self.name = name
        self.source = source
        self._check = spec.check
        self._grace = grace
        self._stop_signal = stop_signal
        self._policy = spec.policy
        self._start_timeout = spec.start_timeout
        self.stop_requested = False
        self._forwarded = False
        self.restarts = 0
        self.previous: tuple[int, float] | None = None  # (returncode, duration) of the last run
        self._stop_event = anyio.Event()
        self.final = anyio.Event()
        self.final_code: int | None = None
        self.stdin: ByteSendStream | None = None
        self.stdout: ByteReceiveStream | None = None
        self.stderr: ByteReceiveStream | None = None
        self.user_streams: list[UserStream] = []
        self._restarts_in_a_row = 0
        self._left = False
        #: The run whose SIGKILL at the end of its grace was announced: a stop
        #: the runner's scope makes and one a caller asks for may overlap, and
        #: the kill is announced once.
        self._kill_said: Run | None = None
        self.run = self._make_run(spawned)

    # -- what its process reads -------------------------------------------------------

    def usage(self) -> ResourceUsage | None:
        """The current run's figures at the last sample, while it runs (and is sampled)."""
        sampler = self._services.usage
        if sampler is None or self.peek_returncode() is not None:
            return None
        return sampler.by_pid.get(self.run.pid)

    def peek_returncode(self) -> int | None:
        """``None`` while running; then the exit code, or ``-signum`` if a signal killed it.

        Reflects the exit as soon as it happened (the child is not reaped for
        it: that is the supervisor's job), like :meth:`poll`.
        """
        if self.final_code is not None:
            return self.final_code
        run = self.run
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

    def stderr_tail(self) -> bytes:
        """The last bytes the child wrote to stderr (empty when stderr was not read)."""
        reader = self.run.stderr_reader
        return bytes(reader.tail) if reader is not None else b""

    # -- what its process does ----------------------------------------------------------

    async def stop(self, grace: float | None = None, signum: int | None = None) -> int:
        """Stop the child: ``signum`` to the group, up to ``grace`` seconds, then SIGKILL.

        See :meth:`Process.stop`.
        """
        grace = self._grace if grace is None else check_grace(grace)
        signum = self._stop_signal if signum is None else check_signal(signum, "signal")
        self.request_stop()
        run = self.run
        with anyio.CancelScope(shield=True):
            await self._stop_run(run, grace, signum)
            await outlast_native_cancel(run.reaped.wait)
        await self.final.wait()
        assert self.final_code is not None
        return self.final_code

    # -- the machinery --------------------------------------------------------------

    def _leave_runner(self) -> None:
        if not self._left:
            self._left = True
            self._on_exit()

    def request_stop(self) -> None:
        self.stop_requested = True
        self._stop_event.set()

    def terminate(self) -> None:
        """SIGTERM to the group at once, which then has its grace (:meth:`Process.terminate`)."""
        self.request_stop()
        self._stopping(self.run, self._grace)
        self.signal_group(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the group at once; a stop under way ends its grace now."""
        self.request_stop()
        self._stopping(self.run, 0.0)
        self.signal_group(signal.SIGKILL)

    def _stopping(self, run: Run, grace: float) -> Grace:
        """The stop under way of ``run`` (one per run): made with ``grace``, or shortened to it."""
        if run.stopping is None:
            run.stopping = Grace(grace)
        else:
            run.stopping.shorten(grace)
        return run.stopping

    def signal_group(self, sig: int) -> bool:
        # After the leader has been reaped, its id may belong to someone else:
        # never signal it then.
        run = self.run
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
        self.stop_requested = True
        self._forwarded = True
        run = self.run
        if run.reaped.is_set():
            return
        try:
            _platform.signal_group(run.pgid, signum)
        except OSError:
            pass  # nothing to do about it in a signal handler; the stop follows

    async def _stop_run(self, run: Run, grace: float, signum: int | None = None) -> None:
        """The one stop of the run's group: ``signum`` (or the stop signal), ``grace``, SIGKILL.

        Returns once the whole group is gone (see :mod:`corral._core._stop`):
        the grace runs until then, not until the leader exits.  The first stop
        of a run sends its signal (unless the launcher passed one on); a later
        one only shortens the grace under way.  If the stop signal cannot be
        sent, SIGKILL follows at once.
        """
        if run.reaped.is_set():
            return
        for reader in run.readers:
            reader.stopping()  # a child that is stopping is read whatever its tails hold
        first = run.stopping is None
        stopping = self._stopping(run, grace)
        send = signum if signum is not None else self._stop_signal
        await stop(
            _Group(self, run),
            stopping,
            send if first and not self._forwarded else None,
            on_kill=partial(self._say_kill, run, grace),
            on_signal_error=partial(self._say_cannot_signal, run),
        )

    def _say_kill(self, run: Run, grace: float) -> None:
        if grace > 0 and self._kill_said is not run:
            self._kill_said = run
            self._services.hub.log(
                logging.WARNING,
                f"{self.name} (pid {run.pid}) did not stop within {grace:g} s; killing it",
            )

    def _say_cannot_signal(self, run: Run, exc: OSError | ValueError) -> None:
        self._services.hub.log(
            logging.WARNING,
            f"{self.name} (pid {run.pid}): cannot send its stop signal ({exc}); killing it",
        )

    def _make_run(self, spawned: Spawned) -> Run:
        """Open the run of a freshly spawned child; take the streams it hands its user."""
        run = open_run(
            spawned,
            self.spec,
            hub=self._services.hub,
            source=self.source,
            open_streams=self._services.open_streams,
        )
        if run.stdin is not None:
            self.stdin = run.stdin
        if run.stdout is not None:
            self.stdout = run.stdout
        if run.stderr is not None:
            self.stderr = run.stderr
        self.user_streams.extend(run.user_streams)
        return run

    async def supervise(self) -> None:
        """The task that looks after this child; runs in the runner's task group."""
        failure: ProcessFailed | None = None
        try:
            while True:
                run = self.run
                await self._watch(run)
                assert run.returncode is not None
                code = run.returncode
                failed = code != 0 and not self.stop_requested
                if isinstance(run.startup_error, StartupFailed) and not self.restarts:
                    break  # Runner.start reports this one
                if not self._should_restart(failed):
                    if failed and self._check:
                        failure = self._failure(run, code)
                    break
                if not await self._restart(run):
                    if failed and self._check and not self.stop_requested:
                        failure = self._failure(run, code)
                    break
        finally:
            run = self.run
            self.final_code = run.returncode if run.returncode is not None else -signal.SIGKILL
            self.source.end()
            self._leave_runner()
            self.final.set()
        if failure is not None:
            raise failure

    def _failure(self, run: Run, code: int) -> ProcessFailed:
        return ProcessFailed(
            code,
            self.spec.argv,
            name=self.name,
            pid=run.pid,
            stderr=self.stderr_tail(),
            restarts=self.restarts,
        )

    def _should_restart(self, failed: bool) -> bool:
        follows = self._restart_follows(failed)
        run = self.run
        if run.duration is not None and run.duration >= STABLE_AFTER:
            self._restarts_in_a_row = 0
        return follows

    def _restart_follows(self, failed: bool) -> bool:
        """Whether the policy starts the child again after this exit (no side effects)."""
        policy = self._policy
        if self.stop_requested or policy.restart == "never":
            return False
        if policy.restart == "on-failure" and not failed:
            return False
        run = self.run
        stable = run.duration is not None and run.duration >= STABLE_AFTER
        return (0 if stable else self._restarts_in_a_row) < policy.max_restarts

    async def _restart(self, run: Run) -> bool:
        """Wait the backoff, then spawn the next run; ``False`` if stopped meanwhile."""
        self._restarts_in_a_row += 1
        delay = self._policy.delay(self._restarts_in_a_row)
        assert run.returncode is not None
        self._services.hub.log(
            logging.WARNING,
            f"restarting {self.name} in {delay:.2f} s (restart {self.restarts + 1}, "
            f"{self._restarts_in_a_row} of {self._policy.max_restarts} in a row); it "
            f"{_platform.describe_status(run.returncode)}",
        )
        self._on_event("restarting")
        with anyio.move_on_after(delay):
            await self._stop_event.wait()
        if self.stop_requested:
            return False
        await anyio.lowlevel.checkpoint()
        try:
            spawned = self._services.spawner.spawn(
                self.spec, self._services.hub.child_env(self.source)
            )
        except OSError as exc:
            # Out of descriptors (ResourceLimitError), or the program is gone:
            # this exit stays the last one, a failure as any other (nothing
            # was spawned, nothing else is affected).
            self._services.hub.log(
                logging.ERROR, f"cannot restart {self.name}: {exc}; it stays stopped"
            )
            return False
        self.previous = (run.returncode, run.duration or 0.0)
        self.restarts += 1
        self.source.restart()
        self.run = self._make_run(spawned)
        if self._services.signals is not None:
            self._services.signals.add(self)
        self._services.hub.log(
            logging.INFO,
            f"restarted {self.name} (pid {spawned.pid}): {describe_argv(self.spec.argv)}",
        )
        self._on_event("running")
        return True

    async def _watch(self, run: Run) -> None:
        async with anyio.create_task_group() as tg:
            try:
                # The core reaps the child: it must run, whatever cancels us.
                await start_surely(tg, (self._core, (run,), f"corral core {self.name}"))
                await run.done.wait()
            except anyio.get_cancelled_exc_class():
                self.stop_requested = True
                with anyio.CancelScope(shield=True):
                    await self._stop_run(run, self._grace)
                    await outlast_native_cancel(run.reaped.wait)
                raise

    async def _core(self, run: Run) -> None:
        status: int | None = None
        spawned = run.spawned
        hub = self._services.hub
        with anyio.CancelScope(shield=True):
            try:
                async with anyio.create_task_group() as tg:
                    tasks: list[SureTask] = [
                        (reader.run, (), f"corral reader {self.name}") for reader in run.readers
                    ]
                    if run.handshake is not None:
                        decide = partial(self._decide_start, run, False)
                        tasks.append(
                            (run.handshake.read, (decide,), f"corral start-up {self.name}")
                        )
                    await start_surely(tg, *tasks)
                    await anyio.wait_readable(spawned.pidfd)
                    status = self._exit_status(run)
                    run.duration = time.monotonic() - spawned.started_at
                    run.exit_seen = status
                    run.leader_exited.set()
                    # The leader is a zombie now: its group id is still ours.
                    await self._end_group(run)
                    for reader in run.readers:
                        reader.finish()
                    for stream in run.receive_streams:
                        stream.child_exited()
                    if run.handshake is not None:
                        run.handshake.finish()
                    # Its logging connections end with it: read them to the end.
                    await hub.drain(self.source, run.pgid)
            finally:
                if status is None or not run.group_gone.is_set():
                    # Only a cancellation that no shield holds back gets here
                    # (asyncio.run cancelling every task at its end): kill the
                    # group and reap, never leave the child unmanaged.
                    _platform.signal_group(run.pgid, signal.SIGKILL)
                    run.group_gone.set()
                if status is None:
                    try:
                        status = _platform.wait_blocking(run.pid)
                    except _platform.StatusLost:
                        status = 0
                if self._services.signals is not None:
                    self._services.signals.discard(self)
                _platform.reap(run.pid)
                run.reaped.set()
                if self.stop_requested or self._policy.restart == "never":
                    self._leave_runner()  # no restart can follow: not running any more
                self._services.lifeline_remove(run.pgid)
                os.close(spawned.pidfd)
                for reader in run.readers:
                    os.close(reader.fd)
                if run.handshake is not None:
                    self._decide_start(run, True)
                    run.handshake.close()
                close_status(run)
                run.leader_exited.set()
            run.returncode = status
            hub.log(*self._exit_record(run))
            self._on_event("exited")
            mark = hub.collector.mark()
        # Every line the child wrote is queued; wait until the handlers have it
        # too, so that wait() returning means "all written" (bounded: the
        # collector gives up on a stuck handler).
        await hub.delivered(mark)
        run.done.set()

    async def _end_group(self, run: Run) -> None:
        """Once the leader has exited: what it left in its group ends too.

        Stopped (a stop signal went to the group: a stop, ``terminate()``, a
        signal passed on), the group keeps what is left of its grace: a
        program that a shell ran without ``exec`` may still be cleaning up.
        Otherwise, or once the grace is over, whatever is left gets SIGKILL.
        """
        stopping = run.stopping
        if stopping is None and self._forwarded:
            stopping = run.stopping = Grace(self._grace)
        if stopping is not None and not stopping.over:
            census = self._services.census
            await stopping.within(partial(group_gone, census, run.pgid, run.pid))
        _platform.signal_group(run.pgid, signal.SIGKILL)
        run.group_gone.set()

    def _exit_status(self, run: Run) -> int:
        try:
            status = _platform.exit_status(run.pid)
        except _platform.StatusLost:
            # SIGCHLD ignored, or the application reaps children itself:
            # the status is gone.  Report what subprocess and Trio report.
            self._services.hub.log(
                logging.WARNING,
                f"{self.name} (pid {run.pid}) exited, but its exit status was collected "
                "elsewhere (SIGCHLD ignored, or another waitpid); reporting 0",
            )
            return 0
        assert status is not None, "pidfd readable but the child has not exited"
        return status

    def _decide_start(self, run: Run, exited: bool) -> None:
        """Decide the start-up outcome from what the handshake pipe delivered."""
        handshake = run.handshake
        if handshake is None or run.started.is_set():
            return
        quoted = bytes(handshake.data[:200]).decode("utf-8", "replace")
        if handshake.too_long:
            run.startup_error = HandshakeError(
                f"process {self.name!r} (pid {run.pid}) wrote more than {MAX_REPORT} bytes "
                f"to its start-up descriptor without a newline; it began: {quoted!r}..."
            )
        elif handshake.reported:
            try:
                run.started_value = handshake.value()
            except ValueError as exc:
                run.startup_error = HandshakeError(
                    f"process {self.name!r} (pid {run.pid}) reported its start with "
                    f"malformed JSON ({exc}); it wrote: {quoted!r}"
                    + ("..." if len(handshake.data) > 200 else "")
                )
        elif handshake.eof and not exited and not self._exiting(run):
            run.started_value = None  # closing the descriptor reports null
        else:
            run.startup_error = StartupFailed(0, self.spec.argv, name=self.name, pid=run.pid)
        run.started.set()
        close_status(run)

    def _exiting(self, run: Run) -> bool:
        status = run.spawned.status
        return status is None or _platform.is_exiting(status)

    async def abandon(self) -> None:
        """Stop the child and wait until it is reaped, whatever cancels the caller meanwhile.

        For a :meth:`Runner.start` or :meth:`Runner.run` that was cancelled (or
        failed) before its caller got hold of the child: like
        :func:`anyio.run_process`, the child is gone before the cancellation
        goes on.  Shielded, and bounded as every stop is: stop signal, grace,
        SIGKILL, reap.
        """
        run = self.run
        if self.peek_returncode() is None or self._policy.restart != "never":
            self.request_stop()  # no restart either
        with anyio.CancelScope(shield=True):
            await self._stop_run(run, self._grace)
            await outlast_native_cancel(run.reaped.wait)

    async def wait_started(self) -> None:
        """Wait for the first run's start-up report (for :meth:`Runner.start`)."""
        run = self.run
        limit = self._start_timeout
        try:
            with anyio.fail_after(limit):
                await run.started.wait()
        except TimeoutError:
            await self.stop()
            raise TimeoutError(
                f"process {self.name!r} (pid {run.pid}) did not report that it started "
                f"within {limit:g} s; it was stopped"
            ) from None
        except BaseException:
            await self.abandon()
            raise
        error = run.startup_error
        if error is None:
            return
        if isinstance(error, StartupFailed):
            # Wait for the exit to be complete so that the stderr tail is too.
            try:
                await run.done.wait()
            except BaseException:
                await self.abandon()
                raise
            assert run.returncode is not None
            raise StartupFailed(
                run.returncode,
                self.spec.argv,
                name=self.name,
                pid=run.pid,
                stderr=self.stderr_tail(),
            )
        await self.stop()
        raise error

    def _exit_record(self, run: Run) -> tuple[int, str]:
        assert run.returncode is not None
        duration = run.duration if run.duration is not None else 0.0
        level = logging.DEBUG
        if run.returncode != 0 and not self.stop_requested:
            # A failure that stops the runner (check=True, no restart left) is
            # an error; one that is restarted, or a non-zero exit the caller
            # said it tolerates, is worth a warning.
            level = (
                logging.ERROR
                if self._check and not self._restart_follows(failed=True)
                else logging.WARNING
            )
        return level, (
            f"{self.name} (pid {run.pid}) {_platform.describe_status(run.returncode)} "
            f"after {duration:.3f} s"
        )


class _Group:
    """A run's process group, as a stop sees it (a :class:`corral._core._stop.Target`)."""

    def __init__(self, supervisor: Supervisor, run: Run) -> None:
        self._supervisor = supervisor
        self._run = run

    def signal(self, signum: int) -> None:
        self._supervisor.signal_group(signum)

    async def gone(self) -> None:
        await self._run.group_gone.wait()

    async def kill(self) -> None:
        self._supervisor.signal_group(signal.SIGKILL)
