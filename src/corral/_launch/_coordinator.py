"""The coordinator of a launch: every worker's outcome, and when the launch is over."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from .._errors import LaunchError, RemoteTraceback, WorkerFailed, signal_name
from .._results import CompletedProcess, LaunchResult
from . import _link
from ._plan import Plan

__all__ = ["Coordinator", "Failure"]

#: A result pickle at least this big is unpickled in a worker thread.
LARGE_RESULT = 1 << 20

#: How much of a large pickle the worker thread copies at a time.  Each copy
#: holds the GIL; between two, the loop's thread may take it back.
_CHUNK = 1 << 20


class _ChunkedReader:
    """A file over a pickle, for :class:`pickle.Unpickler`, that copies in small pieces.

    ``pickle.loads`` copies a large ``bytes`` object in the pickle with one C
    call, holding the GIL (and so the event loop) for as long as that takes.
    The unpickler reads such objects through ``readinto`` when its file has
    one: here it copies :data:`_CHUNK` bytes at a time, in Python.
    """

    def __init__(self, data: memoryview) -> None:
        self._data = data.cast("B") if data.format != "B" else data
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        out = bytes(self._data[self._pos : end])
        self._pos += len(out)
        return out

    def readinto(self, target: memoryview) -> int:
        view = memoryview(target).cast("B")
        wanted = min(len(view), len(self._data) - self._pos)
        done = 0
        while done < wanted:
            step = min(_CHUNK, wanted - done)
            view[done : done + step] = self._data[self._pos : self._pos + step]
            self._pos += step
            done += step
        return done

    def readline(self) -> bytes:
        data = self._data
        pos = self._pos
        end = pos
        while end < len(data) and data[end] != 0x0A:
            end += 1
        end = min(end + 1, len(data))
        self._pos = end
        return bytes(data[pos:end])


def _unpickle_large(payload: memoryview) -> Any:
    return pickle.Unpickler(_ChunkedReader(payload)).load()


@dataclass
class Failure:
    rank: int
    host: str
    local_rank: int
    error: _link.WorkerError | None = None
    returncode: int | None = None
    stderr: bytes = b""
    lost: str | None = None  # the agent was lost: why
    error_file: tuple[str, str] = ("", "")  # what its TORCHELASTIC_ERROR_FILE said


class Coordinator:
    """Collects the outcomes of every worker; decides when the launch is over."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.values: dict[int, Any] = {}
        self.failure: Failure | None = None
        self.settled = anyio.Event()  # every result in, or a failure
        self._answered: set[int] = set()
        #: One large result unpickled at a time, off the loop (see :meth:`result`).
        self._unpickling: anyio.CapacityLimiter | None = None

    def rank(self, host: int, local_rank: int) -> int:
        return self.plan.firsts[host] + local_rank

    async def result(self, host: int, message: _link.WorkerResult) -> None:
        rank = self.rank(host, message.local_rank)
        self._answered.add(rank)
        payload = message.payload
        try:
            if len(payload) < LARGE_RESULT:
                self.values[rank] = pickle.loads(payload)
            else:
                # Hundreds of megabytes take a good part of a second to unpickle:
                # off the loop, which goes on meanwhile.  (A cancellation waits
                # for the thread to finish, then goes on as usual.)
                if self._unpickling is None:
                    self._unpickling = anyio.CapacityLimiter(1)
                self.values[rank] = await anyio.to_thread.run_sync(
                    _unpickle_large, payload, limiter=self._unpickling
                )
        except Exception as exc:
            self._fail(
                Failure(
                    rank,
                    self.plan.hosts[host],
                    message.local_rank,
                    _link.WorkerError(
                        message.local_rank,
                        type(exc).__qualname__,
                        f"the return value of rank {rank} cannot be unpickled here: {exc}",
                        "",
                    ),
                )
            )
            return
        if len(self.values) == self.plan.world_size:
            self.settled.set()

    async def error(self, host: int, message: _link.WorkerError) -> None:
        rank = self.rank(host, message.local_rank)
        self._answered.add(rank)
        self._fail(Failure(rank, self.plan.hosts[host], message.local_rank, message))

    async def exited(self, host: int, message: _link.WorkerExit) -> None:
        rank = self.rank(host, message.local_rank)
        if rank in self._answered:
            return
        if self.plan.argv and message.returncode == 0:
            # A command's answer is how it ran: its exit code, pid and duration.
            self._answered.add(rank)
            self.values[rank] = CompletedProcess(
                list(self.plan.argv),
                0,
                name=f"agent-{host}.worker-{message.local_rank}",
                pid=message.pid,
                duration=message.duration,
                stderr_tail=message.stderr,
            )
            if len(self.values) == self.plan.world_size:
                self.settled.set()
            return
        self._fail(
            Failure(
                rank,
                self.plan.hosts[host],
                message.local_rank,
                returncode=message.returncode,
                stderr=message.stderr,
                error_file=(message.error, message.traceback),
            )
        )

    def agent_lost(self, host: int, why: str) -> None:
        """The agent of ``host`` is gone, or stops its workers on its own: the launch fails."""
        if self.settled.is_set():
            return
        self._fail(Failure(self.plan.firsts[host], self.plan.hosts[host], 0, lost=why))

    def agent_done(self, host: int) -> None:
        """The agent of ``host`` reported its workers reaped: had each of them answered?"""
        first = self.plan.firsts[host]
        silent = [
            r for r in range(first, first + self.plan.counts[host]) if r not in self._answered
        ]
        if silent and not self.settled.is_set():
            self.agent_lost(
                host, f"reported its workers done, but ranks {silent} never reported an outcome"
            )

    def _fail(self, failure: Failure) -> None:
        if self.failure is None:
            self.failure = failure
        self.settled.set()

    def exception(self) -> BaseException:
        failure = self.failure
        assert failure is not None
        if failure.lost is not None:
            index = self.plan.hosts.index(failure.host)
            return LaunchError(f"the agent on host {failure.host} (agent-{index}) {failure.lost}")
        where = f"rank {failure.rank} on host {failure.host} (local rank {failure.local_rank})"
        error = failure.error
        if error is None:
            code = failure.returncode
            assert code is not None
            how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
            tail = failure.stderr.decode("utf-8", "replace").rstrip()
            message = f"worker {where} {how}" + ("" if self.plan.argv else " without an exception")
            said, traceback = failure.error_file
            if said:  # torch's @record wrote its exception to TORCHELASTIC_ERROR_FILE
                message += f": {said}"
            if tail:
                message += "; last stderr lines:\n" + "\n".join(
                    "  " + line for line in tail.splitlines()[-10:]
                )
            return WorkerFailed(
                message,
                rank=failure.rank,
                host=failure.host,
                local_rank=failure.local_rank,
                returncode=code,
                stderr=failure.stderr,
                exc_type=said.partition(":")[0] if said and traceback else None,
                remote_traceback=traceback,
            )
        if error.payload is not None:
            try:
                exc = pickle.loads(error.payload)
            except Exception:
                exc = None
            if isinstance(exc, BaseException):
                exc.__cause__ = RemoteTraceback(error.traceback)
                exc.add_note(f"raised by worker {where}")
                for name, value in (("rank", failure.rank), ("host", failure.host)):
                    try:
                        setattr(exc, name, value)
                    except (AttributeError, TypeError):
                        pass
                return exc
        name = error.type_name or "an error"
        failed = WorkerFailed(
            f"worker {where} raised {name}: {error.message}",
            rank=failure.rank,
            host=failure.host,
            local_rank=failure.local_rank,
            exc_type=error.type_name or None,
            remote_traceback=error.traceback,
        )
        if error.traceback:
            failed.__cause__ = RemoteTraceback(error.traceback)
        return failed

    def outcome(self) -> LaunchResult[Any]:
        values = [self.values[rank] for rank in range(self.plan.world_size)]
        return LaunchResult(values, self.plan.hosts, self.plan.counts)
