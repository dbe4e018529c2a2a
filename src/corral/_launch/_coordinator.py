"""The coordinator of a launch: every worker's outcome, and when the launch is over."""

from __future__ import annotations

import pickle
import socket
import threading
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread

from .._errors import LaunchError, RemoteTraceback, WorkerFailed, signal_name
from .._results import CompletedProcess, LaunchResult
from . import _link
from ._plan import Plan

__all__ = ["Coordinator", "Failure"]

#: How many bytes of a large result may wait between the loop and the
#: unpickling thread (each side's socket buffer): the most a result costs
#: beyond its own value.
_IN_FLIGHT = 1 << 20

#: What ``socket.send`` needs not to raise SIGPIPE when the thread has gone.
_SEND_FLAGS: Final = getattr(socket, "MSG_NOSIGNAL", 0)


class _SocketReader:
    """A file over a blocking socket, for :class:`pickle.Unpickler` in a thread.

    The unpickler reads a large ``bytes`` or ``bytearray`` object of the
    pickle through ``readinto`` once it has allocated it: the kernel copies
    the bytes straight into the value, so that a result is never held twice.
    Everything else is read through a small buffer.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def _fill(self, wanted: int) -> None:
        while len(self._buffer) < wanted:
            data = self._sock.recv(max(wanted - len(self._buffer), 64 * 1024))
            if not data:
                return  # the end, early: the unpickler says the pickle is truncated
            self._buffer += data

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            raise ValueError("the unpickler reads counted bytes only")
        self._fill(n)
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def readinto(self, target: memoryview) -> int:
        view = memoryview(target).cast("B")
        done = min(len(self._buffer), len(view))
        view[:done] = self._buffer[:done]
        self._buffer = self._buffer[done:]
        while done < len(view):
            got = self._sock.recv_into(view[done:])
            if not got:
                break
            done += got
        return done

    def readline(self) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                out, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return out
            size = len(self._buffer)
            self._fill(size + 1)
            if len(self._buffer) == size:
                out, self._buffer = self._buffer, b""
                return out


def _unpickle_from(assembly: _Assembly) -> Any:
    """Unpickle what comes on the thread's end of ``assembly`` (in a worker thread)."""
    with assembly.lock:
        if assembly.given_up:
            return None
        assembly.started = True
    with assembly.thread_end:
        return pickle.Unpickler(_SocketReader(assembly.thread_end)).load()


class _Assembly:
    """A large result on its way: its parts go, as they come, to an unpickler in a thread.

    The loop writes each part to one end of a socket pair, waiting while the
    thread is behind (at most :data:`_IN_FLIGHT` bytes wait); the thread reads
    the other end.  :meth:`abort` (the worker died, its host was lost, the
    launch ends) closes the loop's end: the thread then meets the end of its
    pickle and stops.
    """

    def __init__(self, host: int, local_rank: int) -> None:
        self.host = host
        self.local_rank = local_rank
        self._sock, self.thread_end = socket.socketpair()
        for sock, option in ((self._sock, socket.SO_SNDBUF), (self.thread_end, socket.SO_RCVBUF)):
            sock.setsockopt(socket.SOL_SOCKET, option, _IN_FLIGHT // 2)
        self._sock.setblocking(False)
        self.aborted = False
        self.complete = False
        #: Whether the thread has taken its end (it closes it), or never will.
        self.lock = threading.Lock()
        self.started = False
        self.given_up = False

    async def feed(self, data: bytes) -> None:
        import anyio

        view = memoryview(data)
        while view and not self.aborted:
            try:
                view = view[self._sock.send(view, _SEND_FLAGS) :]
            except BlockingIOError:
                try:
                    await anyio.wait_writable(self._sock)
                except anyio.ClosedResourceError:
                    return  # aborted meanwhile
            except OSError:
                return  # the thread has stopped reading: its own error says why

    def finish(self) -> None:
        """The last part was fed: the thread reads to the end, then finds the end."""
        self.complete = True
        self._close()

    def give_up(self) -> None:
        """No thread will read: close its end (unless one has taken it)."""
        with self.lock:
            self.given_up = True
            if not self.started:
                self.thread_end.close()

    def abort(self) -> None:
        if not self.complete and not self.aborted:
            self.aborted = True
            self._close()

    def _close(self) -> None:
        import anyio

        if self._sock.fileno() >= 0:
            anyio.notify_closing(self._sock)
            self._sock.close()


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
        #: Large results on their way, by rank (see :meth:`result_part`).
        self._assemblies: dict[int, _Assembly] = {}
        #: Where the threads that unpickle large results are waited for (see :meth:`serve`).
        self._tasks: anyio.abc.TaskGroup | None = None

    def rank(self, host: int, local_rank: int) -> int:
        return self.plan.firsts[host] + local_rank

    def serve(self, tasks: anyio.abc.TaskGroup) -> None:
        """Unpickle large results in ``tasks`` (the launch's): cancelled, they are given up."""
        self._tasks = tasks

    async def result_part(self, host: int, message: _link.ResultPart) -> None:
        """A piece of a large result: to its unpickler in a thread, which starts at the first.

        Waits while that thread is behind (backpressure: the link or the
        worker's pipe is read no faster than the value is built).
        """
        rank = self.rank(host, message.local_rank)
        assembly = self._assemblies.get(rank)
        if assembly is None:
            if self._tasks is None or rank in self._answered:
                return
            assembly = self._assemblies[rank] = _Assembly(host, message.local_rank)
            self._tasks.start_soon(self._assemble, rank, assembly)
        await assembly.feed(message.data)

    async def _assemble(self, rank: int, assembly: _Assembly) -> None:
        try:
            # A cancellation (the launch ends) gives the thread up; abort() below
            # then ends its pickle, and so the thread, at once.
            value = await anyio.to_thread.run_sync(_unpickle_from, assembly, abandon_on_cancel=True)
        except Exception as exc:
            if not assembly.aborted:
                self._unpicklable(rank, assembly.host, assembly.local_rank, exc)
            return
        finally:
            assembly.abort()
            assembly.give_up()
        if not assembly.aborted:
            self._value(rank, value)

    async def result(self, host: int, message: _link.WorkerResult) -> None:
        rank = self.rank(host, message.local_rank)
        self._answered.add(rank)
        assembly = self._assemblies.get(rank)
        if assembly is not None:
            await assembly.feed(message.payload)  # its last piece
            assembly.finish()
            return  # _assemble takes it from here
        try:
            value = pickle.loads(message.payload)  # small: at most PART_SIZE
        except Exception as exc:
            self._unpicklable(rank, host, message.local_rank, exc)
            return
        self._value(rank, value)

    def _value(self, rank: int, value: Any) -> None:
        self.values[rank] = value
        if len(self.values) == self.plan.world_size:
            self.settled.set()

    def _unpicklable(self, rank: int, host: int, local_rank: int, exc: Exception) -> None:
        self._fail(
            Failure(
                rank,
                self.plan.hosts[host],
                local_rank,
                _link.WorkerError(
                    local_rank,
                    type(exc).__qualname__,
                    f"the return value of rank {rank} cannot be unpickled here: {exc}",
                    "",
                ),
            )
        )

    def _abort(self, rank: int) -> None:
        assembly = self._assemblies.get(rank)
        if assembly is not None:
            assembly.abort()

    async def error(self, host: int, message: _link.WorkerError) -> None:
        rank = self.rank(host, message.local_rank)
        self._answered.add(rank)
        self._fail(Failure(rank, self.plan.hosts[host], message.local_rank, message))

    async def exited(self, host: int, message: _link.WorkerExit) -> None:
        rank = self.rank(host, message.local_rank)
        if rank in self._answered:
            return
        self._abort(rank)  # died in the middle of its result
        if self.plan.argv and message.returncode == 0:
            # A command's answer is how it ran: its exit code, pid and duration.
            self._answered.add(rank)
            self.values[rank] = CompletedProcess(
                list(self.plan.argv),
                0,
                name=f"{self.plan.agent(host)}.worker-{message.local_rank}",
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
        for assembly in self._assemblies.values():
            if assembly.host == host:
                assembly.abort()  # what is left of its results will not come
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
            agent = self.plan.agent(index)
            return LaunchError(f"the agent on host {failure.host} ({agent}) {failure.lost}")
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
