"""The agent: the part of a launch that runs on each remote host, ``python -m corral._agent``.

Started over ssh or srun, it runs its host's workers
(:class:`~corral._launch._workers.HostWorkers`) and:

* is a corral runner itself, so every promise of the core holds there too
  (process groups, stops with grace, a lifeline of its own);
* dials back to the launcher and authenticates (:mod:`corral._launch._link`), then
  does what the launcher asks (a :class:`~corral._launch._link.Job`, a
  :class:`~corral._launch._link.Stop`);
* forwards its workers' lines and records to the launcher as they come
  (:class:`ForwardSink`, a destination of its runner's log service), with
  backpressure: a slow link slows the workers, nothing is dropped; records
  below the launch's ``log_level`` stay on the host, in per-worker files;
* watches its link (:class:`corral._launch._link.Link`): heartbeats both ways, and
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

import logging
import os
import socket
import sys
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel

from .._logs._records import format_message, source_of
from .._logs._sinks import BlockSink
from .._logs._sources import Source
from .._logs._wire import Record
from .._sys._proc import INTERVAL, TreeSampler
from . import _link
from ._context import StartFn
from ._hosts import free_port
from ._workers import HostWorkers

__all__ = ["ForwardSink", "main"]


# -- forwarding the agent's logs over the link ------------------------------------------------


class ForwardSink(BlockSink):
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
            msg=record.getMessage() if own else format_message(record),
            pid=record.process or os.getpid(),
        )
        self._forward(_link.Records(self._relative(source_of(record)), [wire]))


# -- the agent process ------------------------------------------------------------------------


class _Link(_link.Link):
    """The agent's side of the link, as the reporter of its workers.

    A report that cannot be sent is dropped: the link is gone, and the agent
    is stopping its workers anyway.
    """

    ME = "agent"
    PEER = "launcher"

    async def _report(self, message: _link.LinkMessage) -> None:
        try:
            await self.send(message)
        except _link.LinkLost:
            pass

    async def result_part(self, host: int, message: _link.ResultPart) -> None:
        await self._report(message)  # as it came: one part per send, heartbeats between

    async def result(self, host: int, message: _link.WorkerResult) -> None:
        await self._report(message)

    async def error(self, host: int, message: _link.WorkerError) -> None:
        await self._report(message)

    async def exited(self, host: int, message: _link.WorkerExit) -> None:
        await self._report(message)


class AgentRunner(Protocol):
    """What an agent needs of its runner (a :class:`~corral.Runner` is one)."""

    @property
    def start(self) -> StartFn: ...

    def cancel(self) -> None: ...


#: Opens the agent's runner: :func:`corral.open_runner`.
OpenRunner = Callable[..., AbstractAsyncContextManager[AgentRunner]]


class _AgentExit(Exception):
    """The agent cannot go on; the message says why (for its stderr)."""


#: Why an agent under ssh gives up before it dials back.
CLIENT_GONE = "its ssh client is gone (standard input closed) before the agent could dial back"


async def _serve(config: _link.AgentConfig, open_runner: OpenRunner) -> None:
    index = config.index if config.index >= 0 else int(os.environ.get("SLURM_NODEID", "0"))
    host = config.host or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    name = f"agent-{index}"
    if config.watch_stdin and _link.stdin_closed():
        # The launcher killed the ssh client (a Ctrl-C during the start) while
        # this agent was starting: nobody is there to serve.
        raise _AgentExit(CLIENT_GONE)
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
    async with stream:
        link = _Link(stream, config.link_timeout)
        # The hello first, at once: the launcher gives a connection only a
        # few seconds to say who it is.
        try:
            await link.send(
                _link.AgentHello(_link.LINK_VERSION, config.secret, index, host, os.getpid())
            )
        except _link.LinkLost as exc:
            raise _AgentExit(f"the launcher {exc.reason}") from None
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.beat)
            forward = ForwardSink(name, link.send)
            forward.setLevel(config.log_level)
            routes: list[Any] = [forward]
            async with open_runner(
                name=name,
                console=False,
                handlers=routes,
                log_dir=config.host_log_dir,
                handle_signals=True,
                # The agent owns its process: what its workers orphan is its own.
                subreaper=True,
                usage=False,  # the agent samples its workers itself (_report_usage)
            ) as runner:
                port = free_port("") if index == 0 else 0
                try:
                    await link.send(_link.Ready(port))
                except _link.LinkLost as exc:
                    raise _AgentExit(f"the launcher {exc.reason}") from None
                workers = HostWorkers(
                    runner.start, host=index, prefix="", python=config.python or sys.executable
                )
                lost = await _obey(link, workers, config)
                if lost is not None:
                    runner.cancel()
            tg.cancel_scope.cancel()
        # Every message is sent: end the link without losing one (see _link).
        await link.close()
    if lost is not None:
        raise _AgentExit(f"the launcher {lost}; stopped the workers")


async def _obey(link: _Link, workers: HostWorkers, config: _link.AgentConfig) -> str | None:
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

    async def stop(grace: float, signum: int = 0) -> None:
        await workers.stop(grace, signum)
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
                    tg.start_soon(stop, message.grace, message.signal)

    async with anyio.create_task_group() as tg:
        if config.watch_stdin:
            tg.start_soon(watch_stdin)
        if config.usage:
            tg.start_soon(_report_usage, link, workers)
        tg.start_soon(receive)
        await done.wait()
        tg.cancel_scope.cancel()
    return lost


async def _report_usage(link: _Link, workers: HostWorkers) -> None:
    """Send what each running worker costs, every :data:`INTERVAL` seconds, until cancelled."""
    sampler = TreeSampler()
    limiter = anyio.CapacityLimiter(1)
    said = False
    while True:
        began = anyio.current_time()
        names = {p.pid: p.name for p in workers.processes if p.returncode is None}
        if names or said:
            figures = await anyio.to_thread.run_sync(sampler.sample, list(names), limiter=limiter)
            message = _link.Usage(
                [
                    _link.WorkerUsage(
                        names[pid], pid, u.cpu_percent, u.rss, u.gpu_memory, u.processes
                    )
                    for pid, u in figures.items()
                ]
            )
            try:
                await link.send(message)
            except _link.LinkLost:
                return
            said = bool(figures)
        # Until the next tick, which may be due already: the send may have waited
        # (behind a large frame, on a slow link) for longer than the interval.
        await anyio.sleep_until(began + INTERVAL)


def main(open_runner: OpenRunner, config: _link.AgentConfig) -> int:
    """The agent's process: serve the launcher with ``config``; the exit code.

    ``open_runner`` is :func:`corral.open_runner`, and ``config`` what
    :func:`corral._launch._link.read_config` read (the entry point, ``python
    -m corral._agent``, passes both).
    """
    try:
        anyio.run(_serve, config, open_runner)
    except BaseException as exc:  # the link gone, a signal...: say so, exit non-zero
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # out of the task groups it crossed
        if isinstance(exc, _AgentExit):
            print(f"corral agent: {exc}", file=sys.stderr)
            return 1
        print(f"corral agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0
