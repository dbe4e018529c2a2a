"""The agent: the part of a launch that runs on each host.

:class:`HostWorkers` starts one host's workers (``python -m corral._worker``)
in a corral runner, feeds each its pickled job, and reports every outcome —
a return value, an exception, an exit — to a :class:`Reporter`.  On the
launcher's own host (``hosts=None``) the launcher uses it directly, in its own
runner.  On a remote host it runs inside an *agent*, ``python -m
corral._agent``, started over ssh or srun, which:

* is a corral runner itself, so every promise of the core holds there too
  (process groups, stops with grace, a lifeline of its own);
* dials back to the launcher and authenticates (:mod:`corral._link`), then
  does what the launcher asks (a :class:`~corral._link.Job`, a
  :class:`~corral._link.Stop`);
* forwards its workers' lines and records to the launcher as they come
  (:class:`ForwardSink`, a destination of its runner's log service), with
  backpressure: a slow link slows the workers, nothing is dropped; records
  below the launch's ``log_level`` stay on the host, in per-worker files;
* watches its link (:class:`corral._link.Link`): heartbeats both ways, and
  a deadline.  If the connection to the launcher closes, breaks, or stays
  silent past ``link_timeout``, nobody is left to report to: it stops its
  workers at once (their grace, at most 1 s) and exits.  A killed ssh client
  does not stop the remote command, and a pulled cable does not even close
  the connection; the agent has to notice by itself.
* under ssh, watches its standard input too: end-of-file there means the ssh
  client is gone.  The launcher may still be there (its link says so), so
  the agent tells it (``Stopping``), stops its workers with the job's grace,
  and confirms (``AgentDone``).

It gives up dialing back after the launch's ``start_timeout``.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import msgspec

from . import _link
from ._process import Process
from ._routing import _BlockSink, _format_message, source_of
from ._sources import Source
from ._streams import PipeReceiveStream
from ._wire import FrameDecoder, Record, WireError

__all__ = ["HostWorkers", "Reporter", "main"]

CONFIG_ENV = "CORRAL_AGENT_CONFIG"


class Reporter(Protocol):
    """Where a host's workers' outcomes go (the launch coordinator, or the link)."""

    async def result(self, host: int, message: _link.WorkerResult) -> None: ...

    async def error(self, host: int, message: _link.WorkerError) -> None: ...

    async def exited(self, host: int, message: _link.WorkerExit) -> None: ...


class HostWorkers:
    """The workers of one host, in a runner (the launcher's, or an agent's)."""

    def __init__(
        self,
        runner: Any,
        *,
        host: int,
        prefix: str,
        python: str,
        cwd: str | None = None,
    ) -> None:
        self._runner = runner
        self._host = host
        self._prefix = prefix
        self._python = python
        self._cwd = cwd
        self._procs: list[Process] = []
        self._stopping: float | None = None  # the grace of a stop under way

    @property
    def processes(self) -> list[Process]:
        return list(self._procs)

    async def run(self, job: _link.Job, reporter: Reporter) -> None:
        """Start every worker of ``job`` on this host; return when all have exited.

        Once :meth:`stop` was called, no further worker starts, and one whose
        start was under way is stopped as soon as it is up.
        """
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
                    tg.start_soon(proc.stop, self._stopping)

    async def stop(self, grace: float) -> None:
        """Stop every worker that still runs (stop signal, grace, SIGKILL), all at once.

        Also keeps :meth:`run` from starting any more.  Called again while a
        stop is under way (the link was lost meanwhile, say), it sends no
        second stop signal: the shorter grace brings SIGKILL forward.
        """
        first = self._stopping is None
        self._stopping = grace if self._stopping is None else min(grace, self._stopping)
        async with anyio.create_task_group() as tg:
            for proc in self._procs:
                if proc.returncode is None:
                    tg.start_soon(self._stop_one if first else self._hasten, proc, grace)

    @staticmethod
    async def _stop_one(proc: Process, grace: float) -> None:
        await proc.stop(grace)

    @staticmethod
    async def _hasten(proc: Process, grace: float) -> None:
        """A stop of ``proc`` is under way: SIGKILL it if it still runs ``grace`` s from now."""
        with anyio.move_on_after(grace):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()

    @staticmethod
    def _environment(job: _link.Job, local_rank: int) -> dict[str, str | None]:
        """The worker's environment: the job's, and torchrun's variables for its rank."""
        env: dict[str, str | None] = dict(job.env)
        env.update(
            RANK=str(job.first_rank + local_rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(job.world_size),
            LOCAL_WORLD_SIZE=str(job.workers),
            GROUP_RANK=str(job.group_rank),
            GROUP_WORLD_SIZE=str(job.groups),
            ROLE_RANK=str(job.first_rank + local_rank),
            MASTER_ADDR=job.master_addr,
            MASTER_PORT=str(job.master_port),
        )
        return env

    async def _start_command(self, job: _link.Job, local_rank: int) -> Process:
        proc: Process = await self._runner.start(
            job.argv,
            name=f"{self._prefix}worker-{local_rank}",
            extra_env=self._environment(job, local_rank),
            cwd=self._cwd,
            check=False,
            grace=job.grace,
        )
        return proc

    async def _report_exit(self, proc: Process, local_rank: int, reporter: Reporter) -> None:
        code = await proc.wait()
        await reporter.exited(
            self._host, _link.WorkerExit(local_rank, proc.pid, code, proc.stderr_tail)
        )

    async def _start(self, job: _link.Job, local_rank: int) -> tuple[Process, PipeReceiveStream]:
        read_end, write_end = os.pipe()
        try:
            env = self._environment(job, local_rank)
            env["CORRAL_RESULT_FD"] = str(write_end)
            proc = await self._runner.start(
                [self._python, "-m", "corral._worker"],
                name=f"{self._prefix}worker-{local_rank}",
                extra_env=env,
                cwd=self._cwd,
                stdin=subprocess.PIPE,
                pass_fds=(write_end,),
                check=False,
                grace=job.grace,
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
                        if isinstance(message, _link.WorkerResult):
                            await reporter.result(self._host, message)
                        elif isinstance(message, _link.WorkerError):
                            await reporter.error(self._host, message)
                tg.cancel_scope.cancel()
        finally:
            results.close()


# -- forwarding the agent's logs over the link ------------------------------------------------


class ForwardSink(_BlockSink):
    """A destination of the agent's runner: lines and records go to the launcher.

    Called on the agent's log worker thread; each write hands a frame to the
    event loop and waits until it is sent, so a slow link slows the workers
    down instead of piling up (backpressure, not loss).
    """

    def __init__(self, agent_name: str, send: Callable[[bytes], Coroutine[Any, Any, None]]) -> None:
        super().__init__(logging.NOTSET)
        self._prefix = agent_name + "."
        self._agent_name = agent_name
        self._send = send

    def _relative(self, name: str) -> str:
        if name.startswith(self._prefix):
            return name[len(self._prefix) :]
        return "" if name == self._agent_name else name

    def _forward(self, message: _link.LinkMessage) -> None:
        try:
            anyio.from_thread.run(self._send, _link.encode(message))
        except (_link.LinkLost, anyio.RunFinishedError):
            pass  # the link is gone: the agent is stopping its workers

    def write_lines(
        self, source: Source, stream: str, level: int, created: float, text: bytes
    ) -> None:
        self._forward(
            _link.Lines(self._relative(source.name), stream, level, created, text + b"\n")
        )

    def write_wire(self, source: Source, records: list[Record]) -> None:
        self._forward(_link.Records(self._relative(source.name), records))

    def emit(self, record: logging.LogRecord) -> None:
        own = record.name == self._agent_name
        wire = Record(
            created=record.created,
            level=record.levelno,
            levelname=record.levelname,
            # The agent's own runner speaks under its source alone, as the
            # launcher's runner does: no logger name in front of the message.
            name="" if own else record.name,
            msg=record.getMessage() if own else _format_message(record),
            pid=record.process or os.getpid(),
        )
        self._forward(_link.Records(self._relative(source_of(record)), [wire]))


# -- the agent process ------------------------------------------------------------------------


class _Config(msgspec.Struct, frozen=True):
    secret: str
    address: str
    port: int
    index: int = -1  # -1: from SLURM_NODEID
    host: str = ""
    python: str = ""
    watch_stdin: bool = True
    log_level: int = 0
    log_dir: str | None = None
    start_timeout: float = 60.0  # to dial back
    link_timeout: float = _link.DEFAULT_LINK_TIMEOUT


class _Link(_link.Link):
    """The agent's side of the link, as the reporter of its workers.

    A report that cannot be sent is dropped: the link is gone, and the agent
    is stopping its workers anyway.
    """

    async def _report(self, message: _link.LinkMessage) -> None:
        try:
            await self.send(message)
        except _link.LinkLost:
            pass

    async def result(self, host: int, message: _link.WorkerResult) -> None:
        await self._report(message)

    async def error(self, host: int, message: _link.WorkerError) -> None:
        await self._report(message)

    async def exited(self, host: int, message: _link.WorkerExit) -> None:
        await self._report(message)


class _AgentExit(Exception):
    """The agent cannot go on; the message says why (for its stderr)."""


async def _serve(config: _Config) -> None:
    import corral

    index = config.index if config.index >= 0 else int(os.environ.get("SLURM_NODEID", "0"))
    host = config.host or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    name = f"agent-{index}"
    with anyio.move_on_after(config.start_timeout) as dialing:
        try:
            stream = await anyio.connect_tcp(config.address, config.port)
        except OSError as exc:
            raise _AgentExit(
                f"cannot dial back to the launcher at {config.address}:{config.port}: {exc}"
            ) from None
    if dialing.cancelled_caught:
        raise _AgentExit(
            f"cannot dial back to the launcher at {config.address}:{config.port}: "
            f"no answer within {config.start_timeout:g} s (start_timeout)"
        )
    lost: str | None = None
    async with stream, anyio.create_task_group() as tg:
        link = _Link(stream, config.link_timeout)
        # The hello first, at once: the launcher gives a connection only a
        # few seconds to say who it is.
        try:
            await link.send(
                _link.AgentHello(_link.LINK_VERSION, config.secret, index, host, os.getpid())
            )
        except _link.LinkLost as exc:
            raise _AgentExit(f"the launcher {exc.reason}") from None
        tg.start_soon(link.beat)
        forward = ForwardSink(name, link.send)
        forward.setLevel(config.log_level)
        routes: list[Any] = [forward]
        async with corral.open_runner(
            name=name,
            console=False,
            handlers=routes,
            log_dir=config.log_dir,
            handle_signals=True,
        ) as runner:
            port = _free_port() if index == 0 else 0
            try:
                await link.send(_link.Ready(port))
            except _link.LinkLost as exc:
                raise _AgentExit(f"the launcher {exc.reason}") from None
            workers = HostWorkers(
                runner, host=index, prefix="", python=config.python or sys.executable
            )
            lost = await _obey(link, workers, config)
            if lost is not None:
                runner.cancel()
        tg.cancel_scope.cancel()
    if lost is not None:
        raise _AgentExit(f"the launcher {lost}; stopped the workers")


async def _obey(link: _Link, workers: HostWorkers, config: _Config) -> str | None:
    """Do what the launcher says until the work is done; why the link was lost, if it was."""
    done = anyio.Event()
    grace = 5.0  # until a job says otherwise
    job_started = False
    lost: str | None = None

    async def confirm() -> None:
        try:
            await link.send(_link.AgentDone())
        except _link.LinkLost:
            pass
        done.set()

    async def run_job(job: _link.Job) -> None:
        await workers.run(job, link)
        await confirm()  # every worker's exit is reported by now

    async def stop(grace: float) -> None:
        await workers.stop(grace)
        if not job_started:
            await confirm()  # no job, nothing to report: say so at once
        # With a job, run_job confirms once every worker's exit is reported.

    async def watch_stdin() -> None:
        # Under ssh, stdin is the launcher's pipe to the ssh client:
        # end-of-file means the ssh client is gone.
        os.set_blocking(0, False)
        while True:
            await anyio.wait_readable(0)
            try:
                if not os.read(0, 65536):
                    break
            except BlockingIOError:
                continue
        try:
            await link.send(_link.Stopping("its ssh client exited (its standard input closed)"))
        except _link.LinkLost:
            pass
        tg.start_soon(stop, grace)

    async def receive() -> None:
        nonlocal job_started, grace, lost
        while True:
            try:
                messages = await link.receive()
            except _link.LinkLost as exc:
                # Nobody to report to: stop everything now, quickly.
                lost = exc.reason
                await workers.stop(min(grace, 1.0))
                done.set()
                return
            for message in messages:
                if isinstance(message, _link.Job):
                    job_started = True
                    grace = message.grace
                    tg.start_soon(run_job, message)
                elif isinstance(message, _link.Stop):
                    tg.start_soon(stop, message.grace)

    async with anyio.create_task_group() as tg:
        if config.watch_stdin:
            tg.start_soon(watch_stdin)
        tg.start_soon(receive)
        await done.wait()
        tg.cancel_scope.cancel()
    return lost


def _free_port() -> int:
    """A TCP port free on this host now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
    return port


def main() -> int:
    raw = os.environ.pop(CONFIG_ENV, None)
    if raw is None:
        raw = sys.stdin.buffer.readline().decode().strip()
    if not raw:
        print("corral agent: no configuration on stdin", file=sys.stderr)
        return 2
    config = msgspec.json.decode(base64.b64decode(raw), type=_Config)
    try:
        anyio.run(_serve, config)
    except BaseException as exc:  # the link gone, a signal...: say so, exit non-zero
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # out of the task groups it crossed
        if isinstance(exc, _AgentExit):
            print(f"corral agent: {exc}", file=sys.stderr)
            return 1
        print(f"corral agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def encode_config(**fields: Any) -> str:
    """The agent's configuration, for its stdin or environment (base64 JSON)."""
    return base64.b64encode(msgspec.json.encode(_Config(**fields))).decode()


if __name__ == "__main__":
    sys.exit(main())
