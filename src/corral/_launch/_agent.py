"""The agent's side of a launch on a remote host (``python -m corral._agent``).

The agent process (:mod:`corral._runner._agent`) is a corral runner of its
own, so every promise of a runner holds there too (process groups, stops
with grace, a lifeline of its own); it runs its host's workers
(:class:`~corral._launch._workers.HostWorkers`) in it.  What it does for the
launcher is here; it:

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
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from .._core._options import DEFAULT_GRACE
from .._logs._records import format_message, source_of
from .._logs._sinks import BlockSink
from .._logs._sources import Source
from .._logs._wire import Record
from .._sys._proc import INTERVAL, TreeSampler
from . import _link
from ._workers import HostWorkers

__all__ = ["CLIENT_GONE", "AgentExit", "AgentLink", "ForwardSink", "obey"]


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


class AgentLink(_link.Link):
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


class AgentExit(Exception):
    """The agent cannot go on; the message says why (for its stderr)."""


#: Why an agent under ssh gives up before it dials back.
CLIENT_GONE = "its ssh client is gone (standard input closed) before the agent could dial back"


async def obey(link: AgentLink, workers: HostWorkers, config: _link.AgentConfig) -> str | None:
    """Do what the launcher says until the work is done; why the link was lost, if it was."""
    done = anyio.Event()
    grace = DEFAULT_GRACE  # until a job says otherwise
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


async def _report_usage(link: AgentLink, workers: HostWorkers) -> None:
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
