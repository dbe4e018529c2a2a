"""A managed child process and the task that supervises it.

A :class:`Process` is created by :meth:`Runner.start` right after the
child was spawned, and one supervising task in the runner's task group
looks after it until it is gone.  The supervisor has two parts:

* the **core** runs shielded from cancellation.  It reads the child's
  captured streams, waits on the child's pidfd until the leader has exited,
  reads the exit status *without* reaping, kills whatever the child left
  behind in its process group (the zombie leader keeps the group id from
  being reused meanwhile), reads the pipes dry, and only then reaps the
  leader and records the result.  Because it is shielded, a cancellation
  can never leave a child unreaped or its last lines unread.
* the **watch** around it is cancellable.  When the runner's scope is
  cancelled (by :meth:`Runner.cancel`, a failure elsewhere, or an enclosing
  cancel scope), the watch stops the child — the stop signal to the whole
  group, up to ``grace`` seconds, then SIGKILL — and waits for the core.

A child's exit that nobody asked for, with ``check=True``, raises
:class:`ProcessFailed` from the supervisor, which makes the runner's task
group cancel every sibling: failures always propagate.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from . import _platform
from ._errors import HandshakeError, ProcessFailed, StartupFailed
from ._handshake import HandshakeReader
from ._streams import TAIL_BACKLOG, PipeReader, Tails, make_record

if TYPE_CHECKING:
    from ._runner import Runner

__all__ = ["Process"]


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class Process:
    """A child process managed by a :class:`Runner`.

    Every child is the leader of its own process group, and everything this
    class does to it (stop, kill, signal) reaches the whole group, so the
    child's own children are never left behind.

    A process belongs to its runner's event loop: call its methods from
    there, or through :attr:`Runner.token` from another thread.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        pid: int,
        pidfd: int,
        name: str,
        argv: Sequence[str],
        check: bool,
        grace: float,
        stop_signal: int,
        readers: list[PipeReader],
        stderr_reader: PipeReader | None,
        handshake: HandshakeReader | None = None,
        started_at: float | None = None,
    ) -> None:
        self._runner = runner
        self._token = runner.token
        self._pid = pid
        self._pgid = pid
        self._pidfd = pidfd
        self._name = name
        self._argv = tuple(argv)
        self._check = check
        self._grace = grace
        self._stop_signal = stop_signal
        self._readers = readers
        self._stderr_reader = stderr_reader
        self._returncode: int | None = None
        self._leader_exited = anyio.Event()
        self._done = anyio.Event()
        self._stop_requested = False
        self._reaped = False
        self._tails = Tails(TAIL_BACKLOG)
        for reader in readers:
            reader.tails = self._tails
        self._started_at = time.monotonic() if started_at is None else started_at
        self._duration: float | None = None
        self._handshake = handshake
        self._handshake_scope: anyio.CancelScope | None = None
        self._started = anyio.Event()
        self._started_value: object = None
        self._startup_error: Exception | None = None
        if handshake is None:
            self._started.set()

    # -- what a user reads ----------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's process id (also the id of its process group)."""
        return self._pid

    @property
    def name(self) -> str:
        """The child's name within its runner, unique while it runs."""
        return self._name

    @property
    def source(self) -> str:
        """The dotted log source of this child, ``<runner name>.<process name>``."""
        return f"{self._runner.name}.{self._name}"

    @property
    def argv(self) -> tuple[str, ...]:
        """The argument vector the child was started with."""
        return self._argv

    @property
    def returncode(self) -> int | None:
        """``None`` while running; then the exit code, or ``-signum`` if a signal killed it."""
        return self._returncode

    @property
    def stderr_tail(self) -> bytes:
        """The last bytes the child wrote to stderr (empty when stderr is not captured)."""
        reader = self._stderr_reader
        return bytes(reader.tail) if reader is not None else b""

    @property
    def started_value(self) -> object:
        """The value the child reported with :func:`corral.child.started` (or ``None``)."""
        return self._started_value

    @property
    def duration(self) -> float | None:
        """Seconds from spawn to exit, once the child has exited."""
        return self._duration

    def __repr__(self) -> str:
        state = "running" if self._returncode is None else _describe_status(self._returncode)
        return f"<corral.Process {self._name!r} pid={self._pid} {state}>"

    # -- what a user does -------------------------------------------------------------

    def logs(self, *, buffer: int = 1024) -> MemoryObjectReceiveStream[logging.LogRecord]:
        """Tail this child's log records live: ``async for record in proc.logs(): ...``.

        Yields the records of this source — stdout and stderr lines and, for
        children connected with :func:`corral.child.connect`, their
        :mod:`logging` records — starting with the last 256 already written
        (so a tail opened right after :meth:`Runner.start` misses nothing),
        then live as they arrive, and ends after the last one once the child
        has exited.  Records go to the runner's handlers as well; a tail sees
        them independently.

        A tail that falls more than ``buffer`` records behind slows the child
        down (backpressure) rather than dropping records: keep reading, or
        close it (``async with proc.logs() as records:`` does) when done.
        """
        self._token.check("Process.logs")
        return self._tails.open(buffer)

    async def wait(self) -> int:
        """Wait until the child has exited and all its output was delivered; return its code.

        Waiting never raises :class:`ProcessFailed`: failure reporting is the
        runner's (for ``check=True``) or :meth:`Runner.run`'s job.
        """
        self._token.check("Process.wait")
        await self._done.wait()
        assert self._returncode is not None
        return self._returncode

    async def terminate(self, grace: float | None = None) -> int:
        """Stop the child: the stop signal to its group, up to ``grace`` seconds, then SIGKILL.

        ``grace`` defaults to the one given to :meth:`Runner.start` or the
        runner.  An exit caused by this call is not a failure, even with
        ``check=True``.  Returns the exit code once the child is gone.  If
        the calling task is cancelled meanwhile, the stop still completes.
        """
        self._token.check("Process.terminate")
        with anyio.CancelScope(shield=True):
            await self._stop(self._grace if grace is None else grace)
            await self._done.wait()
        assert self._returncode is not None
        return self._returncode

    def kill(self) -> None:
        """Send SIGKILL to the child's whole process group at once.

        An exit caused by this call is not a failure, even with ``check=True``.
        """
        self._token.check("Process.kill")
        self._stop_requested = True
        self._signal_group(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group.

        Unlike :meth:`terminate` and :meth:`kill`, an exit that this signal
        causes counts as a failure for a ``check=True`` child.
        """
        self._token.check("Process.send_signal")
        self._signal_group(sig)

    # -- the machinery --------------------------------------------------------------

    def _signal_group(self, sig: int) -> bool:
        # After the leader has been reaped, its id may belong to someone else:
        # never signal it then.
        if self._reaped:
            return False
        return _platform.signal_group(self._pgid, sig)

    def _forward_stop(self, sig: int) -> None:
        """Pass a stop signal the launcher received on to the group (signal fan-out).

        The exit that follows is not a failure, and the stop that follows
        when the scope is cancelled sends no signal of its own on top of
        this one (it would cut short the clean-up this one started); its
        grace period and SIGKILL still apply.
        """
        self._stop_requested = True
        self._stop_signal = 0  # signal 0 only checks that the group exists
        self._signal_group(sig)

    async def _stop(self, grace: float) -> None:
        """Stop signal to the group, up to ``grace`` seconds, then SIGKILL; wait for the exit."""
        self._stop_requested = True
        if self._leader_exited.is_set():
            return
        self._signal_group(self._stop_signal)
        with anyio.move_on_after(grace):
            await self._leader_exited.wait()
        if not self._leader_exited.is_set():
            self._runner._log(
                logging.WARNING,
                f"{self._name} (pid {self._pid}) did not stop within {grace:g} s; killing it",
            )
            self._signal_group(signal.SIGKILL)
            await self._leader_exited.wait()

    async def _supervise(self) -> None:
        """The task that looks after this child; runs in the runner's task group."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._core)
            try:
                await self._done.wait()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await self._stop(self._grace)
                    await self._done.wait()
                raise
        assert self._returncode is not None
        if isinstance(self._startup_error, StartupFailed):
            return  # Runner.start reports this one
        if self._check and self._returncode != 0 and not self._stop_requested:
            raise ProcessFailed(
                self._returncode,
                self._argv,
                name=self._name,
                pid=self._pid,
                stderr=self.stderr_tail,
            )

    async def _core(self) -> None:
        status: int | None = None
        with anyio.CancelScope(shield=True):
            try:
                async with anyio.create_task_group() as tg:
                    for reader in self._readers:
                        tg.start_soon(reader.run)
                    if self._handshake is not None:
                        tg.start_soon(self._read_handshake)
                    await anyio.wait_readable(self._pidfd)
                    status = _platform.exit_status(self._pid)
                    assert status is not None, "pidfd readable but the child has not exited"
                    self._duration = time.monotonic() - self._started_at
                    # The leader is a zombie now: its group id is still ours.
                    # Anything it left behind in the group goes with it.
                    _platform.signal_group(self._pgid, signal.SIGKILL)
                    self._leader_exited.set()
                    for reader in self._readers:
                        reader.finish()
                    # Its logging connections end with it: read them to the end.
                    await self._runner._drain_logs(self)
                    if self._handshake_scope is not None:
                        self._handshake_scope.cancel()
            finally:
                if status is None:
                    # Only a bug gets here; never leave the child unmanaged.
                    _platform.signal_group(self._pgid, signal.SIGKILL)
                    status = _platform.wait_blocking(self._pid)
                _platform.reap(self._pid)
                self._reaped = True
                self._runner._lifeline.remove(self._pgid)
                os.close(self._pidfd)
                for reader in self._readers:
                    os.close(reader.fd)
                if self._handshake is not None:
                    self._resolve_handshake(exited=True)
                    self._handshake.close()
                self._leader_exited.set()
            self._returncode = status
            self._runner._process_exited(self)
            self._tails.close()
            # Every line the child wrote is queued; wait until the handlers
            # have it too, so that wait() returning means "all written".
            collector = self._runner._collector
            await collector.wait_handled(collector.mark())
            self._done.set()

    async def _read_handshake(self) -> None:
        assert self._handshake is not None
        with anyio.CancelScope() as self._handshake_scope:
            await self._handshake.read()
        self._handshake_scope = None
        if not self._leader_exited.is_set():
            self._resolve_handshake(exited=False)
            if self._started.is_set():
                # The report is in: give the descriptor back now rather than
                # holding it for the child's whole life.
                self._handshake.close()

    def _resolve_handshake(self, *, exited: bool) -> None:
        """Decide the start-up outcome from what the handshake pipe delivered."""
        handshake = self._handshake
        if handshake is None or self._started.is_set():
            return
        if exited:
            handshake.drain()
        if handshake.reported:
            try:
                self._started_value = handshake.value()
            except ValueError as exc:
                quoted = bytes(handshake.data[:200]).decode("utf-8", "replace")
                self._startup_error = HandshakeError(
                    f"process {self._name!r} (pid {self._pid}) reported its start with "
                    f"malformed JSON ({exc}); it wrote: {quoted!r}"
                    + ("..." if len(handshake.data) > 200 else "")
                )
        elif handshake.eof and not exited and not _platform.is_exiting(self._pid):
            self._started_value = None  # closing the descriptor reports null
        else:
            self._startup_error = StartupFailed(
                0, self._argv, name=self._name, pid=self._pid
            )  # placeholder; Runner.start raises one with the real status
        self._started.set()

    def _exit_record(self) -> logging.LogRecord:
        assert self._returncode is not None
        duration = self._duration if self._duration is not None else 0.0
        level = logging.DEBUG
        if self._returncode != 0 and not self._stop_requested:
            # A failure that stops the runner (check=True) is an error; a
            # non-zero exit the caller said it tolerates is worth a warning.
            level = logging.ERROR if self._check else logging.WARNING
        return make_record(
            self._runner.name,
            level,
            f"{self._name} (pid {self._pid}) {_describe_status(self._returncode)} "
            f"after {duration:.3f} s",
        )
