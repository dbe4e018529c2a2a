"""The workers of one host: started in a runner, fed their job, their outcomes reported.

:class:`HostWorkers` starts one host's workers (``python -m corral._worker``,
or the command of :meth:`Runner.launch_command`), feeds each its pickled job,
and reports every outcome — a return value, an exception, an exit — to a
:class:`Reporter`: the launch's coordinator on the launcher's own host
(``hosts=None``), the link to the launcher in an agent on another host.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
import anyio.to_thread

from .._core._pipes import PipeReceiveStream
from .._logs._wire import FrameDecoder, WireError
from . import _link
from ._torchenv import ErrorFiles, worker_variables

if TYPE_CHECKING:
    from .._core._process import Process
    from ._context import StartFn

__all__ = ["HostWorkers", "Reporter"]


class Reporter(Protocol):
    """Where a host's workers' outcomes go (the launch coordinator, or the link)."""

    async def result_part(self, host: int, message: _link.ResultPart) -> None: ...

    async def result(self, host: int, message: _link.WorkerResult) -> None: ...

    async def error(self, host: int, message: _link.WorkerError) -> None: ...

    async def exited(self, host: int, message: _link.WorkerExit) -> None: ...


class HostWorkers:
    """The workers of one host, in a runner (the launcher's, or an agent's).

    Each worker leads a session of its own, as torchrun's do
    (``start_new_session=True``): with the kernel's autogroup scheduling, a
    session is a group that shares the CPU fairly with every other session,
    so workers in the launcher's own session would share one session's CPU
    time on a busy machine (the ``import torch`` of four workers took twice
    as long on a loaded host).  Their process groups are stopped as any
    child's.  Their error files (``TORCHELASTIC_ERROR_FILE``) are in a folder
    made in ``scratch``, the runner's temporary folder, if it is given: its
    lifeline removes that if the launcher is killed.
    """

    def __init__(
        self,
        start: StartFn,
        *,
        host: int,
        prefix: str,
        python: str,
        cwd: str | None = None,
        scratch: str | None = None,
    ) -> None:
        self._start_child = start
        self._host = host
        self._prefix = prefix
        self._python = python
        self._cwd = cwd
        self._procs: list[Process] = []
        self._stopping: float | None = None  # the grace of a stop under way
        self._stop_signal = 0  # and what it sends first (0: each worker's stop signal)
        self._errors = ErrorFiles(scratch)

    @property
    def processes(self) -> list[Process]:
        return list(self._procs)

    async def run(self, job: _link.Job, reporter: Reporter) -> None:
        """Start every worker of ``job`` on this host; return when all have exited.

        Once :meth:`stop` was called, no further worker starts, and one whose
        start was under way is stopped as soon as it is up.
        """
        await anyio.to_thread.run_sync(self._errors.make, job.workers)
        try:
            await self._run(job, reporter)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._errors.remove)

    async def _run(self, job: _link.Job, reporter: Reporter) -> None:
        async with anyio.create_task_group() as tg:
            for local_rank in range(job.workers):
                if self._stopping is not None:
                    break
                if job.argv:
                    proc = await self._start_command(job, local_rank)
                    self._procs.append(proc)
                    tg.start_soon(self._report_exit, proc, local_rank, reporter)
                else:
                    proc, results = await self._start(job, local_rank)
                    self._procs.append(proc)
                    tg.start_soon(self._supervise, proc, results, local_rank, job.payload, reporter)
                if self._stopping is not None:
                    tg.start_soon(self._stop_one, proc, self._stopping, self._stop_signal)

    async def stop(self, grace: float, signum: int = 0) -> None:
        """Stop every worker that still runs (stop signal, grace, SIGKILL), all at once.

        ``signum``, if given, is sent instead of each worker's stop signal (the
        SIGINT of a Ctrl-C, as the launcher's own children got it).  Also keeps
        :meth:`run` from starting any more.  Called again while a stop is under
        way (the link was lost meanwhile, a second Ctrl-C), it sends no second
        signal: the shorter grace brings SIGKILL forward.
        """
        first = self._stopping is None
        self._stopping = grace if self._stopping is None else min(grace, self._stopping)
        if first:
            self._stop_signal = signum
        async with anyio.create_task_group() as tg:
            for proc in self._procs:
                if proc.returncode is None:
                    if first:
                        tg.start_soon(self._stop_one, proc, grace, signum)
                    else:
                        tg.start_soon(self._hasten, proc, grace)

    @staticmethod
    async def _stop_one(proc: Process, grace: float, signum: int) -> None:
        await proc.stop(grace, signal=signum or None)

    @staticmethod
    async def _hasten(proc: Process, grace: float) -> None:
        """A stop of ``proc`` is under way: ``grace`` from now at most, then SIGKILL."""
        await proc.stop(grace)

    def _environment(self, job: _link.Job, local_rank: int) -> dict[str, str | None]:
        """The worker's environment: the job's, and torchrun's variables for its rank."""
        env: dict[str, str | None] = dict(job.env)
        env.update(worker_variables(job, local_rank, self._errors.path(local_rank)))
        return env

    async def _start_command(self, job: _link.Job, local_rank: int) -> Process:
        proc: Process = await self._start_child(
            job.argv,
            name=f"{self._prefix}worker-{local_rank}",
            extra_env=self._environment(job, local_rank),
            cwd=self._cwd,
            check=False,
            grace=job.grace,
            start_new_session=True,
        )
        return proc

    async def _report_exit(self, proc: Process, local_rank: int, reporter: Reporter) -> None:
        code = await proc.wait()
        error, traceback = "", ""
        if code != 0:
            # What torch's @record wrote there, as torchrun reads it.
            error, traceback = await anyio.to_thread.run_sync(self._errors.read, local_rank)
        await reporter.exited(
            self._host,
            _link.WorkerExit(
                local_rank, proc.pid, code, proc.stderr_tail, error, traceback, proc.duration or 0.0
            ),
        )

    async def _start(self, job: _link.Job, local_rank: int) -> tuple[Process, PipeReceiveStream]:
        read_end, write_end = os.pipe()
        try:
            env = self._environment(job, local_rank)
            env["CORRAL_RESULT_FD"] = str(write_end)
            proc = await self._start_child(
                [self._python, "-m", "corral._worker"],
                name=f"{self._prefix}worker-{local_rank}",
                extra_env=env,
                cwd=self._cwd,
                stdin=subprocess.PIPE,
                pass_fds=(write_end,),
                check=False,
                grace=job.grace,
                start_new_session=True,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        return proc, PipeReceiveStream(read_end, set())

    async def _supervise(
        self,
        proc: Process,
        results: PipeReceiveStream,
        local_rank: int,
        payload: bytes,
        reporter: Reporter,
    ) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._feed, proc, payload)
            tg.start_soon(self._read_outcome, proc, results, reporter)
        await self._report_exit(proc, local_rank, reporter)

    async def _feed(self, proc: Process, payload: bytes) -> None:
        stdin = proc.stdin
        assert stdin is not None
        try:
            await stdin.send(payload)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the worker died before it read its job: its exit says why
        finally:
            await stdin.aclose()

    async def _read_outcome(
        self, proc: Process, results: PipeReceiveStream, reporter: Reporter
    ) -> None:
        decoder = FrameDecoder(_link.MAX_LINK_FRAME, _link.decoder())

        async def child_exited() -> None:
            await proc.wait()
            results.child_exited()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child_exited)
                while True:
                    try:
                        data = await results.receive()
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                    try:
                        messages = cast(list[Any], decoder.feed(data))
                    except WireError:
                        break  # garbage from a dying worker: its exit says the rest
                    for message in messages:
                        if isinstance(message, _link.ResultPart):
                            await reporter.result_part(self._host, message)
                        elif isinstance(message, _link.WorkerResult):
                            await reporter.result(self._host, message)
                        elif isinstance(message, _link.WorkerError):
                            await reporter.error(self._host, message)
                tg.cancel_scope.cancel()
        finally:
            results.close()
