"""The exceptions corral raises.

Every error a user may want to catch is defined here, so that one import
answers "what can go wrong?".  The most important one is
:class:`ProcessFailed`: it is how a failing child makes itself heard.  It
subclasses :class:`subprocess.CalledProcessError`, so code that already
handles failures of :func:`subprocess.run` keeps working, and it carries
what you need to understand the failure without digging through logs: the
process's name, its exit code or the signal that killed it, and the last few
kilobytes of what it wrote to stderr.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

__all__ = [
    "CorralError",
    "HandshakeError",
    "LaunchError",
    "StartupFailed",
    "ProcessFailed",
    "RemoteTraceback",
    "ResourceLimitError",
    "Signalled",
    "WorkerFailed",
    "WrongLoopError",
    "signal_name",
]

#: How much of a failed child's stderr a :class:`ProcessFailed` keeps.
STDERR_TAIL_BYTES = 4096


class CorralError(Exception):
    """Base class of the errors that are corral's own."""


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15; ``"signal 99"`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class ProcessFailed(subprocess.CalledProcessError, CorralError):
    """A managed child exited with a non-zero code or was killed by a signal.

    Raised out of the runner's ``async with`` block (inside an
    :class:`ExceptionGroup`, as task groups do, so catch it with
    ``except* corral.ProcessFailed``) when a child started with
    ``check=True`` fails, and directly by :meth:`Runner.run` when the child it
    waited for fails.

    Attributes:
        name: the process's name within its runner.
        pid: its process id (of its last run, if it was restarted).
        returncode: the exit code; negative (``-signum``) if a signal killed it,
            as in :mod:`subprocess`.
        signal: the :class:`signal.Signals` that killed it, or ``None``.
        cmd: the argument vector it was started with.
        stdout: what it wrote to stdout, when :meth:`Runner.run` collected it
            (``stdout=PIPE``), else ``None``.  ``output`` is the same.
        stderr: what it wrote to stderr when collected (``stderr=PIPE``);
            otherwise the last :data:`STDERR_TAIL_BYTES` bytes of it when it
            went to the log (``b""`` when stderr went elsewhere).
        restarts: how many times it had been restarted before this failure
            (see the ``restart=`` option of :meth:`Runner.start`).
    """

    def __init__(
        self,
        returncode: int,
        cmd: Sequence[str],
        *,
        name: str,
        pid: int,
        stdout: bytes | None = None,
        stderr: bytes | None = b"",
        restarts: int = 0,
    ) -> None:
        super().__init__(returncode, list(cmd), output=stdout, stderr=stderr)
        self.name = name
        self.pid = pid
        self.restarts = restarts
        self.signal: signal.Signals | None = None
        if returncode < 0:
            try:
                self.signal = signal.Signals(-returncode)
            except ValueError:
                self.signal = None

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions pickle through ``self.args``; ours take keyword-only
        # arguments, so spell the round trip out.
        return (
            _rebuild,
            (
                type(self),
                self.returncode,
                self.cmd,
                self.name,
                self.pid,
                self.output,
                self.stderr,
                self.restarts,
            ),
        )

    @property
    def reason(self) -> str:
        """``"exited with code 3"`` or ``"was killed by SIGKILL"``."""
        if self.returncode < 0:
            return f"was killed by {signal_name(-self.returncode)}"
        return f"exited with code {self.returncode}"

    def __str__(self) -> str:
        text = f"process {self.name!r} (pid {self.pid}) {self.reason}"
        if self.restarts:
            text += f" after {self.restarts} restart{'s' if self.restarts != 1 else ''}"
        tail = self.stderr_text[-STDERR_TAIL_BYTES:].rstrip()
        if tail:
            lines = tail.splitlines()[-10:]
            text += "; last stderr lines:\n" + "\n".join("  " + line for line in lines)
        return text

    @property
    def stderr_text(self) -> str:
        """The stderr bytes decoded as UTF-8 (undecodable bytes replaced)."""
        data = self.stderr or b""
        if isinstance(data, str):
            return data
        return bytes(data).decode("utf-8", "replace")


def _rebuild(
    cls: type[ProcessFailed],
    returncode: int,
    cmd: Sequence[str],
    name: str,
    pid: int,
    stdout: bytes | None,
    stderr: bytes | None,
    restarts: int,
) -> ProcessFailed:
    return cls(returncode, cmd, name=name, pid=pid, stdout=stdout, stderr=stderr, restarts=restarts)


class StartupFailed(ProcessFailed):
    """A child started with ``wait_started=True`` exited before reporting that it started.

    Raised by :meth:`Runner.start`.  Like every :class:`ProcessFailed` it
    carries the exit status and the tail of the child's stderr; the exit
    code may even be 0 — what failed is the start.
    """

    @property
    def reason(self) -> str:
        return super().reason + " before reporting that it started"


class HandshakeError(CorralError, ValueError):
    """A child's start-up report was not one line of valid JSON.

    The message names the process and quotes the start of what it wrote.
    The child has been stopped when this is raised.
    """


class WrongLoopError(CorralError, RuntimeError):
    """A runner or process was touched from a thread or event loop it does not belong to.

    Runners and processes belong to the event loop that opened the runner.
    From another thread, go through the runner's token instead::

        r.token.run_sync(r.cancel)
        r.token.run(proc.terminate)
    """


class ResourceLimitError(CorralError, OSError):
    """A child could not be started because a system resource limit is exhausted.

    Raised by :meth:`Runner.start` before anything was spawned, so no
    half-started child is ever left behind.
    """


class Signalled(BaseException):
    """The launcher received SIGTERM or SIGHUP while a runner was handling signals.

    Raised out of the runner's ``async with`` (for SIGINT the runner raises
    :class:`KeyboardInterrupt` instead) after the signal was forwarded to
    every child and every child has exited, by a runner opened with
    ``handle_signals=True``.  A runner that only borrowed a signal nobody
    held (the default) lets it end the process instead, as it would have
    without corral.  Like :class:`KeyboardInterrupt`
    it derives from :class:`BaseException`, not :class:`Exception`: it is a
    request to stop, and an ``except Exception`` meant for errors must not
    swallow it.  It may come wrapped in a :class:`BaseExceptionGroup` (when
    the runner ran inside a task group, or a child failed as well); catch it
    with ``except* corral.Signalled``, which handles both forms.

    Attributes:
        signal: the :class:`signal.Signals` that was received.
    """

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"received {self.signal.name}; every child was stopped")

    def __reduce__(self) -> tuple[object, ...]:
        return (Signalled, (int(self.signal),))


class LaunchError(CorralError):
    """A launch could not start, or lost a host: the message names the host and says why.

    Raised when an agent does not come up — its command (ssh, srun) exited
    first (the message carries what it wrote on stderr), or it was not
    connected back and ready within ``start_timeout`` — and when the link to
    a running agent is lost: closed, broken, or silent for ``link_timeout``
    seconds (a cut cable, a host that died).  Every other host's workers were
    stopped first.
    """


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, as text (its ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text.rstrip()


class WorkerFailed(CorralError):
    """A worker of a launch failed and its exception could not be rebuilt here, or it died.

    Attributes:
        rank: the worker's global rank.
        host: the host it ran on.
        local_rank: its rank on that host.
        exc_type: the dotted name of the exception it raised (``None`` if it died
            without one).
        returncode: its exit code, or ``-signum`` (``None`` if it raised).
        signal: the signal that killed it, if one did.
        stderr: the last bytes it wrote to stderr.
        remote_traceback: the traceback of its exception, as text.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        host: str,
        local_rank: int,
        exc_type: str | None = None,
        returncode: int | None = None,
        stderr: bytes = b"",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.local_rank = local_rank
        self.exc_type = exc_type
        self.returncode = returncode
        self.stderr = stderr
        self.remote_traceback = remote_traceback
        self.signal = None
        if returncode is not None and returncode < 0:
            import signal

            try:
                self.signal = signal.Signals(-returncode)
            except ValueError:
                pass

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_worker_failed,
            (
                self.args[0],
                self.rank,
                self.host,
                self.local_rank,
                self.exc_type,
                self.returncode,
                self.stderr,
                self.remote_traceback,
            ),
        )


def _rebuild_worker_failed(
    message: str,
    rank: int,
    host: str,
    local_rank: int,
    exc_type: str | None,
    returncode: int | None,
    stderr: bytes,
    remote_traceback: str,
) -> WorkerFailed:
    return WorkerFailed(
        message,
        rank=rank,
        host=host,
        local_rank=local_rank,
        exc_type=exc_type,
        returncode=returncode,
        stderr=stderr,
        remote_traceback=remote_traceback,
    )
