"""The blocking handles of a blocking runner: :class:`SyncProcess` and :class:`SyncLogTail`."""

from __future__ import annotations

import logging
import subprocess
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from .._core._process import Process
    from .._logs._sources import LogTail
    from .._runner._runner import Runner
    from .._sys._proc import ResourceUsage
    from ._portal import Portal

__all__ = ["SyncLogTail", "SyncProcess"]


class SyncProcess:
    """A child started by :meth:`SyncRunner.start`: a blocking :class:`Process`.

    Reads like :class:`subprocess.Popen`: :meth:`wait` (with ``timeout``),
    :meth:`poll`, :attr:`returncode`, :meth:`terminate`, :meth:`kill`,
    :meth:`send_signal`, plus the graceful :meth:`stop` and a blocking
    iterator over its log records, :meth:`logs`.  Like its runner, it belongs
    to the thread that opened the runner.
    """

    def __init__(self, portal: Portal, process: Process) -> None:
        self._portal = portal
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
        return self._portal.peek("Process.returncode", lambda: process.returncode)

    def poll(self) -> int | None:
        """The exit code if the child has exited, else ``None`` (never waits)."""
        process = self._process
        return self._portal.peek("Process.poll", process.poll)

    @property
    def usage(self) -> ResourceUsage | None:
        """What the child costs at the last sample, as :attr:`Process.usage`."""
        process = self._process
        return self._portal.peek("Process.usage", lambda: process.usage)

    @property
    def stderr_tail(self) -> bytes:
        """The last bytes the child wrote to stderr."""
        process = self._process
        return self._portal.peek("Process.stderr_tail", lambda: process.stderr_tail)

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

        code = self._portal.call("Process.wait", wait)
        if code is None:
            assert timeout is not None
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def stop(self, grace: float | None = None, *, signal: int | None = None) -> int:
        """Stop the child as :meth:`Process.stop` does (``signal``, grace, SIGKILL); its code."""
        self._portal.note_grace(grace)
        process = self._process
        return self._portal.call("Process.stop", lambda r: process.stop(grace, signal=signal))

    def terminate(self) -> None:
        """Send SIGTERM to the child's process group, at once (not a failure)."""
        process = self._process
        self._portal.call_sync("Process.terminate", lambda r: process.terminate())

    def kill(self) -> None:
        """Send SIGKILL to the child's process group, at once (not a failure)."""
        process = self._process
        self._portal.call_sync("Process.kill", lambda r: process.kill())

    def send_signal(self, signal: int) -> None:
        """Send ``signal`` to the child's process group, as :meth:`Process.send_signal`."""
        process = self._process
        self._portal.call_sync("Process.send_signal", lambda r: process.send_signal(signal))

    def logs(self, *, buffer: int = 1024) -> SyncLogTail:
        """Follow the child's log records: ``for record in proc.logs(): ...``.

        A blocking :class:`LogTail` (see :meth:`Process.logs`): it yields the
        child's :class:`logging.LogRecord` objects, its stdout and stderr lines
        among them (``record.getMessage()`` is the line), and ends once the
        child has exited for good.
        """
        process = self._process
        tail = self._portal.call_sync("Process.logs", lambda r: process.logs(buffer=buffer))
        return SyncLogTail(self._portal, tail)


class SyncLogTail:
    """A blocking iterator over one source's log records; see :meth:`SyncProcess.logs`.

    Close it (``with proc.logs() as records:`` does) when you stop reading
    before it ends: an open tail that is not read holds the child back once
    its buffer is full.
    """

    def __init__(self, portal: Portal, tail: LogTail) -> None:
        self._portal = portal
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
            return self._portal.call("LogTail.receive", lambda r: tail.receive())
        except anyio.EndOfStream:
            self._closed = True
            raise StopIteration from None

    def close(self) -> None:
        """Stop following the source (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if not self._portal.closed:
            tail = self._tail
            self._portal.call_sync("LogTail.close", lambda r: tail.close())

    def __enter__(self) -> SyncLogTail:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
