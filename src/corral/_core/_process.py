"""A managed child process: the :class:`Process` handle a user holds.

A :class:`Process` is created by :meth:`Runner.start` right after the child
was spawned, with its supervisor (:mod:`corral._core._supervisor`): one
supervising task in the runner's task group, which looks after the child
until it is gone (and, with a restart policy, across its restarts: the
:class:`Process` stays the same object, its pid changes).  The handle reads
its state and asks for stops; the supervisor does the rest.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import anyio.abc

from .._checks import check_signal
from .._sys import _platform

if sys.version_info >= (3, 13):
    from warnings import deprecated
else:
    from typing_extensions import deprecated

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream

    from .._logs._sources import LogTail
    from .._sys._proc import ResourceUsage
    from ._supervisor import Supervisor

__all__ = ["Process"]


class Process(anyio.abc.Process):
    """A child process managed by a :class:`Runner`.

    Every child is the leader of its own process group, and everything this
    class does to it (stop, kill, signal) reaches the whole group, so the
    child's own children are never left behind.  It is an
    :class:`anyio.abc.Process`, and reads like :mod:`subprocess`'s process
    objects too: :meth:`terminate`, :meth:`kill` and
    :meth:`send_signal` send at once, :attr:`returncode` and :meth:`poll`
    reflect an exit as soon as it happened, and :meth:`stop` is the graceful
    stop (the stop signal, a grace period, SIGKILL).

    A process belongs to its runner's event loop: call its methods from
    there, or through :attr:`Runner.token` from another thread.
    """

    def __init__(self, supervisor: Supervisor) -> None:
        self._sup = supervisor
        self._token = supervisor.token

    # -- what a user reads ----------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's process id (also the id of its process group); new at each restart."""
        return self._sup.run.pid

    @property
    def name(self) -> str:
        """The child's name within its runner, unique while it runs."""
        return self._sup.name

    @property
    def source(self) -> str:
        """The dotted log source of this child, ``<runner name>.<process name>``."""
        return self._sup.source.name

    @property
    def args(self) -> list[str]:
        """The argument vector the child was started with (as :attr:`subprocess.Popen.args`)."""
        return list(self._sup.spec.argv)

    @property
    @deprecated("Process.argv is deprecated; use Process.args, as in subprocess")
    def argv(self) -> tuple[str, ...]:
        """Deprecated: the same as :attr:`args`, as a tuple (type checkers flag its use)."""
        return tuple(self._sup.spec.argv)

    @property
    def returncode(self) -> int | None:
        """``None`` while running; then the exit code, or ``-signum`` if a signal killed it.

        Reflects the exit as soon as it happened (the child is not reaped for
        it: that is the supervisor's job), like :meth:`poll`.
        """
        return self._sup.peek_returncode()

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was asked for, by :meth:`stop`, :meth:`terminate` or :meth:`kill`,
        a signal the runner passed on, or the runner's own stop.

        An exit after it is not a failure, even with ``check=True``, and is not
        restarted.
        """
        return self._sup.stop_requested

    def poll(self) -> int | None:
        """The exit code if the child has exited, else ``None`` (never waits)."""
        return self.returncode

    @property
    def stdin(self) -> ByteSendStream | None:
        """A writable AnyIO byte stream to the child's stdin (``stdin=PIPE``), else ``None``."""
        return self._sup.stdin

    @property
    def stdout(self) -> ByteReceiveStream | None:
        """A readable AnyIO byte stream of the child's stdout (``PIPE`` or ``LOG | PIPE``)."""
        return self._sup.stdout

    @property
    def stderr(self) -> ByteReceiveStream | None:
        """A readable AnyIO byte stream of the child's stderr (``PIPE`` or ``LOG | PIPE``)."""
        return self._sup.stderr

    @property
    def stderr_tail(self) -> bytes:
        """The last bytes the child wrote to stderr (empty when stderr was not read)."""
        return self._sup.stderr_tail()

    @property
    def started_value(self) -> object:
        """The value the child reported with :func:`corral.child.started` (or ``None``)."""
        return self._sup.run.started_value

    @property
    def duration(self) -> float | None:
        """Seconds from spawn to exit, once the child has exited."""
        return self._sup.run.duration

    @property
    def started_at(self) -> float:
        """When the current run was spawned, in :func:`time.monotonic` seconds."""
        return self._sup.run.spawned.started_at

    @property
    def restarts(self) -> int:
        """How many times the child was restarted (see ``restart=`` of :meth:`Runner.start`)."""
        return self._sup.restarts

    @property
    def usage(self) -> ResourceUsage | None:
        """What the child and its descendants cost at the last sample, while it runs.

        CPU in percent of one core, resident memory in bytes and, where NVML
        is there, GPU memory: a :class:`ResourceUsage`, sampled from ``/proc``
        about once a second (see ``usage=`` of :func:`open_runner`).
        ``None`` before the first sample, once the child has exited, and
        with ``usage=False``.
        """
        return self._sup.usage()

    @property
    def previous_exit(self) -> int | None:
        """The exit code of the run before the current one (after a restart), else ``None``."""
        previous = self._sup.previous
        return previous[0] if previous is not None else None

    def __repr__(self) -> str:
        code = self.returncode
        state = "running" if code is None else _platform.describe_status(code)
        return f"<corral.Process {self.name!r} pid={self.pid} {state}>"

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
        return self._sup.source.open_tail(buffer)

    async def wait(self) -> int:
        """Wait until the child has exited and its output was delivered; return its code.

        With a restart policy, waits for the last run.  Waiting never raises
        :class:`ProcessFailed`: failure reporting is the runner's (for
        ``check=True``) or :meth:`Runner.run`'s job.
        """
        self._token.check("Process.wait")
        await self._sup.final.wait()
        code = self._sup.final_code
        assert code is not None
        return code

    def terminate(self) -> None:
        """Send SIGTERM to the child's whole process group, at once.

        An exit caused by this call is not a failure, even with ``check=True``,
        and the child is not restarted.  What the child started in its group
        gets the child's grace to end after it (see :meth:`stop`).
        """
        self._token.check("Process.terminate")
        self._sup.terminate()

    def kill(self) -> None:
        """Send SIGKILL to the child's whole process group, at once.

        An exit caused by this call is not a failure, even with ``check=True``,
        and the child is not restarted.  A :meth:`stop` under way ends at once.
        """
        self._token.check("Process.kill")
        self._sup.kill()

    def send_signal(self, signal: int) -> None:
        """Send ``signal`` to the child's whole process group, at once (0 checks it exists).

        Unlike :meth:`terminate` and :meth:`kill`, an exit that this signal
        causes counts as a failure for a ``check=True`` child.
        """
        self._token.check("Process.send_signal")
        self._sup.signal_group(check_signal(signal, "signal") if signal != 0 else 0)

    async def stop(self, grace: float | None = None, *, signal: int | None = None) -> int:
        """Stop the child: ``signal`` to its group, up to ``grace`` seconds, then SIGKILL.

        The graceful stop, the one every stop of corral is (a failure
        elsewhere, the end of the runner's scope, a Ctrl-C passed on):

        1. ``signal`` — by default the child's stop signal (``stop_signal=``
           of :meth:`Runner.start` or the runner, SIGTERM unless told
           otherwise) — goes to the child's whole process group;
        2. the group gets ``grace`` seconds (by default the child's grace) to
           end.  The grace belongs to the whole group, not to the child alone:
           a shell that runs its program without ``exec`` (``sh -c 'python
           app.py; echo done'``, a Procfile line) dies at once on SIGTERM while
           the program goes on cleaning up in the group, and the program keeps
           the rest of the grace;
        3. whatever of the group is left then gets SIGKILL;
        4. once the child is reaped and its output delivered, the call returns
           its exit code.

        A second ``stop()`` while one is under way sends no second signal
        (which would cut short the clean-up the first one started); a shorter
        ``grace`` brings the SIGKILL forward for both, and :meth:`kill` ends
        the grace at once.  An exit caused by a stop is not a failure, even
        with ``check=True``, and the child is not restarted.  If the calling
        task is cancelled meanwhile, the stop itself (signal, grace, SIGKILL,
        reap) still completes.
        """
        self._token.check("Process.stop")
        return await self._sup.stop(grace, signal)

    async def aclose(self) -> None:
        """:meth:`stop` the child, then close the streams of its pipes."""
        try:
            await self.stop()
        finally:
            for stream in self._sup.user_streams:
                stream.close()

    async def __aenter__(self) -> Process:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
