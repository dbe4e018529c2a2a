"""``Runner.launch``: run a function on N workers across hosts, torchrun-style.

::

    results = await r.launch(train, cfg, hosts=["node1", "node2"], workers_per_host=4)

runs ``train(cfg)`` once per worker — eight here — and returns their return
values in global rank order.  Each worker is a fresh Python process (``python
-m corral._worker``) with the environment ``torch.distributed`` expects from
torchrun: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (a free port on the first
host), so ``init_process_group("gloo")`` works with no arguments.

The parts:

* **This machine** (``hosts=None``): the launcher's own runner starts the
  workers (:class:`corral._agent.HostWorkers`); no ssh, no agent process.
* **Other hosts**: one agent per host (:mod:`corral._agent`), started with ssh
  or one ``srun`` step, dials back to a TCP listener of the launcher and
  authenticates with a secret made for this launch (:mod:`corral._link`).
  The agent processes are children of the runner like any other, so they are
  stopped and reaped with it.
* The function and its arguments travel pickled with cloudpickle (so
  closures, lambdas and functions of ``__main__`` work), over the
  authenticated link only.

**Failures.**  The first worker that raises makes ``launch`` stop every
other worker on every host (stop signal, grace, SIGKILL), then raise: the
original exception if it can be rebuilt here (with the remote traceback as
its cause and the rank and host in a note), else :class:`WorkerFailed`.  A
worker that dies without an exception (``os._exit(3)``, a signal) raises
:class:`WorkerFailed` naming its rank, host and exit, with its stderr tail.
An agent that cannot start raises :class:`LaunchError` naming its host:
with ssh's own message if ssh exited, at ``start_timeout`` (counted from the
call) if it hangs — a host that accepts the connection and never speaks, a
cut link, an agent stuck in its hello.  A host whose link is lost later
(closed, or silent past ``link_timeout``: see :mod:`corral._link`) raises
:class:`LaunchError` naming it, once the other hosts stopped their workers;
its own agent stops its workers when it notices the same silence.

**Stops.**  Cancelling ``launch`` (Ctrl-C, a timeout, the runner's scope)
tells every agent to stop its workers (stop signal, grace, SIGKILL), and
returns once each confirmed them reaped or its link was lost — never later
than ``grace`` + :data:`STOP_SLACK` seconds after the stop began.  The link
itself is what carries the stop: the ssh clients may be gone already (the
signal fan-out reaches them too), and a client hung on a cut link is
stopped, not waited for.
"""

from __future__ import annotations

import hmac
import logging
import math
import os
import pickle
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import anyio
import anyio.abc

from . import _link
from ._agent import CONFIG_ENV, HostWorkers, encode_config
from ._errors import CorralError, _signal_name
from ._hosts import (
    MAX_WORKERS,
    MAX_WORKERS_PER_HOST,
    SSH,
    dial_back_addresses,
    environment_for_hosts,
    slurm_hosts,
    slurm_workers_per_host,
)
from ._routing import FRAMES, LINES, Chunk, StreamState
from ._spawn import check_grace

if TYPE_CHECKING:
    from ._process import Process
    from ._runner import Runner

__all__ = ["LaunchError", "LaunchResult", "RemoteTraceback", "WorkerFailed", "launch"]

T = TypeVar("T")

#: Seconds agents get to start and dial back, unless ``start_timeout`` says otherwise.
DEFAULT_START_TIMEOUT = 60.0
#: Seconds a link may stay silent before it counts as cut, unless ``link_timeout`` says otherwise.
DEFAULT_LINK_TIMEOUT = _link.DEFAULT_LINK_TIMEOUT


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


class LaunchResult(Sequence[T], Generic[T]):
    """The return values of a launch, in global rank order; ``by_host`` groups them.

    ``results[0]`` is rank 0's value; ``results.by_host["node2"]`` is the list
    of that host's values in local-rank order; ``results.hosts`` the hosts in
    order.
    """

    def __init__(self, values: list[T], hosts: list[str], counts: list[int]) -> None:
        self._values = values
        self.hosts = hosts
        self.by_host: dict[str, list[T]] = {}
        start = 0
        for host, count in zip(hosts, counts, strict=True):
            self.by_host[host] = values[start : start + count]
            start += count

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self._values[index]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[T]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LaunchResult):
            return self._values == other._values
        if isinstance(other, list):
            return self._values == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"LaunchResult({self._values!r})"


# -- planning ---------------------------------------------------------------------------------


@dataclass
class _Plan:
    hosts: list[str]  # names as given ("localhost" for this machine)
    counts: list[int]
    remote: bool
    slurm: bool
    ssh: SSH
    env: dict[str, str | None]
    grace: float
    start_timeout: float
    link_timeout: float
    log_level: int
    host_log_dir: str | None
    argv: list[str] = field(default_factory=list)  # a command, not a function
    firsts: list[int] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return sum(self.counts)


def _plan(
    runner: Runner,
    *,
    hosts: Sequence[str] | str | None,
    workers_per_host: int | Sequence[int] | None,
    extra_env: Mapping[str, str | None] | None,
    copy_env: Sequence[str],
    ssh: SSH | None,
    start_timeout: float,
    link_timeout: float,
    grace: float | None,
    log_level: int,
    host_log_dir: str | None,
) -> _Plan:
    slurm = hosts == "slurm"
    if hosts is None:
        names = ["localhost"]
        remote = False
    elif slurm:
        names = slurm_hosts()
        remote = True
        if workers_per_host is None:
            workers_per_host = slurm_workers_per_host()
    elif isinstance(hosts, str):
        raise TypeError(
            f'hosts must be None, "slurm" or a list of host names, not the string {hosts!r}'
        )
    else:
        names = [str(host) for host in hosts]
        if not names:
            raise ValueError("hosts is empty: give at least one host, or None for this machine")
        for name in names:
            if not name or not name.isprintable() or not _is_utf8(name):
                raise ValueError(f"hosts: {name!r} is not a host name (printable UTF-8 text)")
        if len(set(names)) != len(names):
            raise ValueError(
                f"hosts lists a host twice ({names}); use workers_per_host for more workers"
            )
        remote = True
    if workers_per_host is None:
        workers_per_host = 1
    if isinstance(workers_per_host, int) and not isinstance(workers_per_host, bool):
        counts = [workers_per_host] * len(names)
    elif isinstance(workers_per_host, Sequence) and not isinstance(workers_per_host, str):
        counts = [int(n) for n in workers_per_host]
        if len(counts) != len(names):
            raise ValueError(f"workers_per_host has {len(counts)} entries for {len(names)} hosts")
    else:
        raise TypeError("workers_per_host must be an int or one int per host")
    if any(n < 1 for n in counts):
        raise ValueError(f"workers_per_host must be at least 1 everywhere, not {counts}")
    if max(counts) > MAX_WORKERS_PER_HOST:
        raise ValueError(
            f"workers_per_host may be at most {MAX_WORKERS_PER_HOST} on a host, not {max(counts)}"
        )
    if sum(counts) > MAX_WORKERS:
        raise ValueError(
            f"a launch may have at most {MAX_WORKERS} workers in all, not {sum(counts)} "
            f"({len(names)} hosts)"
        )
    if isinstance(copy_env, str):
        raise TypeError("copy_env is a sequence of globs, not one string")
    ssh = ssh if ssh is not None else SSH()
    if remote and not slurm:
        ssh.check()
    if not (math.isfinite(start_timeout) and start_timeout > 0):
        raise ValueError(f"start_timeout must be a positive number of seconds, not {start_timeout}")
    link_timeout = _link.check_link_timeout(link_timeout)
    # Workers here inherit the launcher's environment: only extra_env (with
    # its removals) goes on top.  Remote ones get the variables by rule.
    env = environment_for_hosts(copy_env, extra_env) if remote else dict(extra_env or {})
    plan = _Plan(
        hosts=names,
        counts=counts,
        remote=remote,
        slurm=slurm,
        ssh=ssh,
        env=env,
        grace=runner.grace if grace is None else check_grace(grace),
        start_timeout=start_timeout,
        link_timeout=link_timeout,
        log_level=log_level,
        host_log_dir=host_log_dir,
    )
    first = 0
    for count in counts:
        plan.firsts.append(first)
        first += count
    return plan


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates: bytes of an argument that were not UTF-8
        return False
    return True


def _pickle_job(func: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    if not callable(func):
        raise TypeError(f"launch needs a callable, not {type(func).__name__}")
    import cloudpickle

    try:
        return cast(bytes, cloudpickle.dumps((func, args)))
    except Exception as exc:
        raise TypeError(
            f"cannot send {func!r} and its arguments to the workers: {exc} "
            "(they travel pickled with cloudpickle)"
        ) from exc


# -- the coordinator ---------------------------------------------------------------------------


@dataclass
class _Failure:
    rank: int
    host: str
    local_rank: int
    error: _link.WorkerError | None = None
    returncode: int | None = None
    stderr: bytes = b""
    lost: str | None = None  # the agent was lost: why


class _Coordinator:
    """Collects the outcomes of every worker; decides when the launch is over."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.values: dict[int, Any] = {}
        self.failure: _Failure | None = None
        self.settled = anyio.Event()  # every result in, or a failure
        self._answered: set[int] = set()

    def rank(self, host: int, local_rank: int) -> int:
        return self.plan.firsts[host] + local_rank

    async def result(self, host: int, message: _link.WorkerResult) -> None:
        rank = self.rank(host, message.local_rank)
        self._answered.add(rank)
        try:
            self.values[rank] = pickle.loads(message.payload)
        except Exception as exc:
            self._fail(
                _Failure(
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
        self._fail(_Failure(rank, self.plan.hosts[host], message.local_rank, message))

    async def exited(self, host: int, message: _link.WorkerExit) -> None:
        rank = self.rank(host, message.local_rank)
        if rank in self._answered:
            return
        if self.plan.argv and message.returncode == 0:
            # A command's exit code is its answer.
            self._answered.add(rank)
            self.values[rank] = 0
            if len(self.values) == self.plan.world_size:
                self.settled.set()
            return
        self._fail(
            _Failure(
                rank,
                self.plan.hosts[host],
                message.local_rank,
                returncode=message.returncode,
                stderr=message.stderr,
            )
        )

    def agent_lost(self, host: int, why: str) -> None:
        """The agent of ``host`` is gone, or stops its workers on its own: the launch fails."""
        if self.settled.is_set():
            return
        self._fail(_Failure(self.plan.firsts[host], self.plan.hosts[host], 0, lost=why))

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

    def _fail(self, failure: _Failure) -> None:
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
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            tail = failure.stderr.decode("utf-8", "replace").rstrip()
            message = f"worker {where} {how}" + ("" if self.plan.argv else " without an exception")
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


# -- launching -----------------------------------------------------------------------------------


async def launch(
    runner: Runner,
    func: Callable[..., T] | None,
    args: tuple[Any, ...],
    *,
    argv: Sequence[str] | None = None,
    hosts: Sequence[str] | str | None = None,
    workers_per_host: int | Sequence[int] | None = None,
    extra_env: Mapping[str, str | None] | None = None,
    copy_env: Sequence[str] = (),
    ssh: SSH | None = None,
    launcher_address: str | None = None,
    start_timeout: float = DEFAULT_START_TIMEOUT,
    link_timeout: float = DEFAULT_LINK_TIMEOUT,
    grace: float | None = None,
    log_level: int = logging.NOTSET,
    host_log_dir: str | None = None,
) -> LaunchResult[T]:
    plan = _plan(
        runner,
        hosts=hosts,
        workers_per_host=workers_per_host,
        extra_env=extra_env,
        copy_env=copy_env,
        ssh=ssh,
        start_timeout=start_timeout,
        link_timeout=link_timeout,
        grace=grace,
        log_level=log_level,
        host_log_dir=host_log_dir,
    )
    if argv is not None:
        from ._spawn import check_argv

        plan.argv = check_argv(argv)
        payload = b""
    else:
        assert func is not None
        payload = _pickle_job(func, args)
    coordinator = _Coordinator(plan)
    if plan.remote:
        try:
            await _launch_remote(runner, plan, payload, coordinator, launcher_address)
        except BaseExceptionGroup as group:
            # An agent that could not start is one error, however many task
            # groups it crossed (and however many agents failed alike).
            errors, rest = group.split(LaunchError)
            if errors is None or rest is not None:
                raise
            first: BaseException = errors
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
    else:
        await _launch_here(runner, plan, payload, coordinator)
    if coordinator.failure is not None:
        raise coordinator.exception()
    return cast(LaunchResult[T], coordinator.outcome())


def _job(plan: _Plan, host: int, payload: bytes, master_addr: str, master_port: int) -> _link.Job:
    return _link.Job(
        payload=payload,
        world_size=plan.world_size,
        first_rank=plan.firsts[host],
        workers=plan.counts[host],
        group_rank=host,
        groups=len(plan.hosts),
        master_addr=master_addr,
        master_port=master_port,
        env=plan.env,
        grace=plan.grace,
        log_level=plan.log_level,
        argv=plan.argv,
    )


async def _launch_here(
    runner: Runner, plan: _Plan, payload: bytes, coordinator: _Coordinator
) -> None:
    """This machine: the runner's own children are the workers."""
    workers = HostWorkers(runner, host=0, prefix="agent-0.", python=sys.executable)
    job = _job(plan, 0, payload, "127.0.0.1", _free_port())
    try:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await workers.run(job, coordinator)

            tg.start_soon(run)
            await coordinator.settled.wait()
            if coordinator.failure is not None:
                with anyio.CancelScope(shield=True):
                    await workers.stop(plan.grace)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await workers.stop(plan.grace)
        raise


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# -- other hosts -------------------------------------------------------------------------------

#: Told to stop, the agents get their grace period and this many seconds more to confirm that
#: every worker is reaped, before the launcher stops waiting for them.
STOP_SLACK = 0.5
#: At the end of a launch, how long an agent's command (ssh, srun) gets to exit by itself once
#: the agent confirmed its workers reaped, before it is stopped; after a cancellation or a signal.
COMMAND_EXIT_WAIT = 2.0
COMMAND_EXIT_WAIT_STOPPED = 0.25


class _AgentConnection:
    """The launcher's side of one agent's link."""

    def __init__(self, index: int, link: _link.Link, hello: _link.AgentHello) -> None:
        self.index = index
        self.link = link
        self.hello = hello
        self.ready = anyio.Event()
        self.master_port = 0
        self.done = anyio.Event()  # AgentDone came: every worker of the host is reaped
        self.ended = anyio.Event()  # done, or the link is lost
        self.finished = anyio.Event()  # nothing more will be read from the link
        # The conversation is shielded from the launch's cancellation, so that a
        # stop still hears the agents confirm; the launch ends it with this scope.
        self.scope = anyio.CancelScope(shield=True)


class _Remote:
    """Agents on other hosts, their links, and what they say."""

    def __init__(self, runner: Runner, plan: _Plan, coordinator: _Coordinator, secret: str) -> None:
        self.runner = runner
        self.plan = plan
        self.coordinator = coordinator
        self.secret = secret
        self.agents: dict[int, _AgentConnection] = {}
        self.all_connected = anyio.Event()
        #: Each agent's command (an ssh client; or one srun for them all) and its agents.
        self.commands: list[tuple[Process, list[int]]] = []
        self.closing = False  # the launch is ending: no more agents are heard
        self._states: dict[tuple[int, str, str], StreamState] = {}
        #: Connections waiting for their hello, oldest first (see _link.MAX_PENDING_HELLOS).
        self._hellos: dict[anyio.CancelScope, None] = {}

    def _warn(self, message: str) -> None:
        self.runner._hub.warn(message)

    def where(self, index: int) -> str:
        return f"agent-{index} on {self.plan.hosts[index]}"

    async def serve(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup
    ) -> None:
        async def handle(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                await self._converse(stream)

        await listener.serve(handle, task_group=tg)

    async def _converse(self, stream: anyio.abc.SocketStream) -> None:
        # Before the secret is checked: one small hello, quickly, and only so
        # many connections waiting for theirs (see corral._link).
        hello = None
        with anyio.CancelScope() as waiting:
            self._hellos[waiting] = None
            while len(self._hellos) > _link.MAX_PENDING_HELLOS:
                oldest = next(iter(self._hellos))
                del self._hellos[oldest]
                oldest.cancel()
            try:
                hello = await _link.read_hello(stream)
            finally:
                self._hellos.pop(waiting, None)
        if hello is None:
            return
        if (
            hello.v != _link.LINK_VERSION
            or not hmac.compare_digest(hello.secret.encode(), self.secret.encode())
            or not 0 <= hello.index < len(self.plan.hosts)
            or hello.index in self.agents
        ):
            peer = stream.extra(anyio.abc.SocketAttribute.remote_address)
            self._warn(
                f"refused a connection to the launch link from {peer!r}: not one of our agents"
            )
            return
        if self.closing:
            return
        link = _link.Link(stream, self.plan.link_timeout)
        agent = _AgentConnection(hello.index, link, hello)
        self.agents[hello.index] = agent
        if len(self.agents) == len(self.plan.hosts):
            self.all_connected.set()
        why = "was cut off by the end of the launch"
        with agent.scope:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(link.beat)
                    try:
                        while True:
                            for message in await link.receive():
                                await self._dispatch(agent, message)
                    except _link.LinkLost as lost:
                        why = lost.reason
                    tg.cancel_scope.cancel()
            finally:
                link.lose(why)
                agent.ended.set()
                agent.finished.set()
                if not agent.done.is_set():
                    self.coordinator.agent_lost(agent.index, why)

    async def _dispatch(self, agent: _AgentConnection, message: Any) -> None:
        index = agent.index
        if isinstance(message, _link.Lines):
            state = self._state(index, message.source, message.stream, LINES, message.level)
            await self.runner._hub.collector.put(Chunk(state, message.text, message.created))
        elif isinstance(message, _link.Records):
            state = self._state(index, message.source, "logging", FRAMES, 0)
            await self.runner._hub.collector.put(Chunk(state, wire=message.records))
        elif isinstance(message, _link.Ready):
            agent.master_port = message.master_port
            agent.ready.set()
        elif isinstance(message, _link.WorkerResult):
            await self.coordinator.result(index, message)
        elif isinstance(message, _link.WorkerError):
            await self.coordinator.error(index, message)
        elif isinstance(message, _link.WorkerExit):
            await self.coordinator.exited(index, message)
        elif isinstance(message, _link.Stopping):
            self.coordinator.agent_lost(index, f"stopped its workers: {message.reason}")
        elif isinstance(message, _link.AgentDone):
            agent.done.set()
            agent.ended.set()
            self.coordinator.agent_done(index)

    def _state(self, agent: int, source: str, stream: str, kind: str, level: int) -> StreamState:
        key = (agent, source, stream)
        state = self._states.get(key)
        if state is None:
            relative = f"agent-{agent}" + (f".{source}" if source else "")
            src = self.runner._hub.source(relative)
            state = StreamState(src, kind, stream, level, 0, peer=f"agent-{agent}")
            self._states[key] = state
        return state

    async def start_agents(self, addresses: list[tuple[str, int]]) -> None:
        plan = self.plan
        python = plan.ssh.remote_python
        command = [python, "-m", "corral._agent"]
        timeouts = {"start_timeout": plan.start_timeout, "link_timeout": plan.link_timeout}
        if plan.slurm:
            address, port = addresses[0]
            config = encode_config(
                secret=self.secret,
                address=address,
                port=port,
                index=-1,
                python=python,
                watch_stdin=False,
                log_level=plan.log_level,
                log_dir=plan.host_log_dir,
                **timeouts,
            )
            nodes = len(plan.hosts)
            proc = await self.runner.start(
                [
                    "srun",
                    f"--nodes={nodes}",
                    f"--ntasks={nodes}",
                    "--ntasks-per-node=1",
                    "--kill-on-bad-exit=0",
                    "--input=none",
                    *command,
                ],
                name="agents",
                extra_env={CONFIG_ENV: config},
                check=False,
                grace=plan.grace + 5,
            )
            self.commands.append((proc, list(range(nodes))))
            return
        for index, host in enumerate(plan.hosts):
            address, port = addresses[index]
            config = encode_config(
                secret=self.secret,
                address=address,
                port=port,
                index=index,
                host=host,
                python=python,
                watch_stdin=True,
                log_level=plan.log_level,
                log_dir=plan.host_log_dir,
                **timeouts,
            )
            proc = await self.runner.start(
                plan.ssh.argv(host, command),
                name=f"agent-{index}.ssh",
                stdin=subprocess.PIPE,
                check=False,
                grace=plan.grace + 5,
            )
            self.commands.append((proc, [index]))
            assert proc.stdin is not None
            try:
                # stdin stays open afterwards: the agent's lifeline.
                await proc.stdin.send(config.encode() + b"\n")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # ssh has exited already: wait_started reports why

    def _is_ready(self, index: int) -> bool:
        agent = self.agents.get(index)
        return agent is not None and agent.ready.is_set()

    async def wait_started(self, deadline: float) -> None:
        """Until every agent is connected and ready; else LaunchError naming the hosts.

        Fails as soon as an agent's command exits before its agent is ready
        (with what the command wrote on stderr), or an agent's link is lost,
        and at ``deadline`` (``start_timeout`` after the launch began).
        """
        failure: LaunchError | None = None
        with anyio.CancelScope(deadline=deadline) as timer:
            async with anyio.create_task_group() as tg:

                async def watch(proc: Process, indices: list[int]) -> None:
                    nonlocal failure
                    await proc.wait()
                    if failure is None and not all(self._is_ready(i) for i in indices):
                        failure = self._exited_early(proc, indices)
                    tg.cancel_scope.cancel()

                async def ready() -> None:
                    await self.all_connected.wait()
                    for agent in self.agents.values():
                        await agent.ready.wait()
                    tg.cancel_scope.cancel()

                async def failed() -> None:
                    await self.coordinator.settled.wait()
                    tg.cancel_scope.cancel()

                for proc, indices in self.commands:
                    tg.start_soon(watch, proc, indices)
                tg.start_soon(ready)
                tg.start_soon(failed)
        if failure is not None:
            raise failure
        if self.coordinator.failure is not None:
            raise self.coordinator.exception()
        if timer.cancelled_caught:
            raise LaunchError(self._not_started())

    def _exited_early(self, proc: Process, indices: list[int]) -> LaunchError:
        which = proc.name.removesuffix(".ssh")
        where = f" on {self.plan.hosts[indices[0]]}" if len(indices) == 1 else ""
        tail = proc.stderr_tail.decode("utf-8", "replace").strip()
        return LaunchError(
            f"{which}{where} ({' '.join(proc.argv[:1])}) exited with code {proc.returncode} "
            f"before it connected back" + (f": {tail}" if tail else "")
        )

    def _not_started(self) -> str:
        missing = []
        for proc, indices in self.commands:
            tail = proc.stderr_tail.decode("utf-8", "replace").strip()
            program = os.path.basename(proc.argv[0])
            said = f" ({program} said: {tail})" if tail else f" ({program} said nothing)"
            for index in indices:
                if index not in self.agents:
                    missing.append(f"{self.where(index)} did not connect back{said}")
                elif not self.agents[index].ready.is_set():
                    missing.append(f"{self.where(index)} connected back but did not get ready")
        return (
            f"the launch did not start within {self.plan.start_timeout:g} s (start_timeout): "
            + "; ".join(missing)
        )

    async def stop_all(self, grace: float) -> None:
        """Tell every agent to stop its workers; wait until each confirmed them reaped.

        Waits for each agent until it confirmed (``AgentDone``), or its link
        is lost (closed, or silent past ``link_timeout``), and at most
        ``grace`` + :data:`STOP_SLACK` seconds in all: an agent kills its
        workers at the grace deadline, and says so at once.
        """
        waiting = [agent for agent in self.agents.values() if not agent.ended.is_set()]

        async def stop(agent: _AgentConnection) -> None:
            try:
                await agent.link.send(_link.Stop(grace))
            except _link.LinkLost:
                return
            await agent.ended.wait()

        with anyio.move_on_after(grace + STOP_SLACK):
            async with anyio.create_task_group() as tg:
                for agent in waiting:
                    tg.start_soon(stop, agent)
        late = [self.where(agent.index) for agent in waiting if not agent.ended.is_set()]
        if late:
            self._warn(
                f"{', '.join(late)} did not confirm that its workers stopped within "
                f"{grace + STOP_SLACK:g} s (grace + {STOP_SLACK:g} s); its link is closed now, "
                "and an agent that loses its link stops its workers"
            )

    async def end(self, patience: float) -> None:
        """The launch is over: let the agents go, close their links, stop their commands.

        The agents that confirmed get ``patience`` seconds to close their
        links (their last log lines are read meanwhile) and their commands to
        exit; every other command (an ssh client hung on a cut link, say) is
        stopped at once.
        """
        for proc, _ in self.commands:
            if proc.stdin is not None:
                await proc.stdin.aclose()
        confirmed = [
            (proc, indices)
            for proc, indices in self.commands
            if all(i in self.agents and self.agents[i].done.is_set() for i in indices)
        ]
        with anyio.move_on_after(patience):
            for proc, indices in confirmed:
                for index in indices:
                    await self.agents[index].finished.wait()
                await proc.wait()
        self.closing = True
        for agent in self.agents.values():
            agent.scope.cancel()
        async with anyio.create_task_group() as tg:
            for proc, _ in self.commands:
                if proc.returncode is None:
                    tg.start_soon(proc.stop, 0.5)


async def _launch_remote(
    runner: Runner,
    plan: _Plan,
    payload: bytes,
    coordinator: _Coordinator,
    launcher_address: str | None,
) -> None:
    deadline = anyio.current_time() + plan.start_timeout
    secret = secrets.token_hex(16)
    remote = _Remote(runner, plan, coordinator, secret)
    # Each agent dials back to this machine's address on the route to its own
    # host (hosts on different networks reach us by different addresses).
    if launcher_address is not None:
        wanted = [launcher_address] * len(plan.hosts)
    else:
        wanted = await anyio.to_thread.run_sync(dial_back_addresses, plan.hosts, plan.ssh)
    listeners: dict[str, anyio.abc.Listener[anyio.abc.SocketStream]] = {}
    ports: dict[str, int] = {}
    try:
        for address in dict.fromkeys(wanted):
            made = await anyio.create_tcp_listener(local_host=address, local_port=0)
            listeners[address] = made
            ports[address] = made.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:
            for each in listeners.values():
                tg.start_soon(remote.serve, each, tg)
            patience = COMMAND_EXIT_WAIT
            try:
                await remote.start_agents([(a, ports[a]) for a in wanted])
                await remote.wait_started(deadline)
                master_addr = plan.hosts[0]
                master_port = remote.agents[0].master_port
                for index, agent in sorted(remote.agents.items()):
                    try:
                        await agent.link.send(_job(plan, index, payload, master_addr, master_port))
                    except _link.LinkLost:
                        pass  # its reader reports the loss
                await coordinator.settled.wait()
                if coordinator.failure is not None:
                    with anyio.CancelScope(shield=True):
                        await remote.stop_all(plan.grace)
                else:
                    for agent in remote.agents.values():
                        await agent.ended.wait()
            except BaseException:
                patience = COMMAND_EXIT_WAIT_STOPPED
                with anyio.CancelScope(shield=True):
                    await remote.stop_all(plan.grace)
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await remote.end(patience)
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for each in listeners.values():
                await each.aclose()
