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
An agent that cannot start raises :class:`LaunchError` with ssh's own
message.  Cancelling ``launch`` stops every worker and returns once each
host reported its workers reaped.
"""

from __future__ import annotations

import hmac
import logging
import math
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
    SSH,
    dial_back_addresses,
    environment_for_hosts,
    slurm_hosts,
    slurm_workers_per_host,
)
from ._routing import FRAMES, LINES, Chunk, StreamState
from ._spawn import check_grace
from ._wire import FrameDecoder, WireError

if TYPE_CHECKING:
    from ._process import Process
    from ._runner import Runner

__all__ = ["LaunchError", "LaunchResult", "RemoteTraceback", "WorkerFailed", "launch"]

T = TypeVar("T")

#: Seconds agents get to start and dial back, unless ``start_timeout`` says otherwise.
DEFAULT_START_TIMEOUT = 60.0


class LaunchError(CorralError):
    """A launch could not start: an agent did not come up (ssh refused, no such host...).

    The message carries what the agent's command (ssh, srun) wrote on stderr.
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
    if isinstance(copy_env, str):
        raise TypeError("copy_env is a sequence of globs, not one string")
    ssh = ssh if ssh is not None else SSH()
    if remote and not slurm:
        ssh.check()
    if not (math.isfinite(start_timeout) and start_timeout > 0):
        raise ValueError(f"start_timeout must be a positive number of seconds, not {start_timeout}")
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
        log_level=log_level,
        host_log_dir=host_log_dir,
    )
    first = 0
    for count in counts:
        plan.firsts.append(first)
        first += count
    return plan


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
        if self.settled.is_set():
            return
        self._fail(
            _Failure(
                self.plan.firsts[host],
                self.plan.hosts[host],
                0,
                _link.WorkerError(0, "", f"the agent on {self.plan.hosts[host]} {why}", ""),
            )
        )

    def _fail(self, failure: _Failure) -> None:
        if self.failure is None:
            self.failure = failure
        self.settled.set()

    def exception(self) -> BaseException:
        failure = self.failure
        assert failure is not None
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


class _AgentConnection:
    """The launcher's side of one agent's link."""

    def __init__(self, index: int, stream: anyio.abc.SocketStream, hello: _link.AgentHello) -> None:
        self.index = index
        self.stream = stream
        self.hello = hello
        self.ready = anyio.Event()
        self.master_port = 0
        self.done = anyio.Event()
        self.lost = anyio.Event()
        self._lock = anyio.Lock()

    async def send(self, message: _link.LinkMessage) -> None:
        async with self._lock:
            await self.stream.send(_link.encode(message))


class _Remote:
    """Agents on other hosts, their links, and what they say."""

    def __init__(self, runner: Runner, plan: _Plan, coordinator: _Coordinator, secret: str) -> None:
        self.runner = runner
        self.plan = plan
        self.coordinator = coordinator
        self.secret = secret
        self.agents: dict[int, _AgentConnection] = {}
        self.all_connected = anyio.Event()
        self.processes: list[Process] = []
        self._states: dict[tuple[int, str, str], StreamState] = {}

    async def serve(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup
    ) -> None:
        async def handle(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                await self._converse(stream)

        await listener.serve(handle, task_group=tg)

    async def _converse(self, stream: anyio.abc.SocketStream) -> None:
        decoder = FrameDecoder(_link.MAX_LINK_FRAME, _link.decoder())
        pending: list[Any] = []
        with anyio.move_on_after(self.plan.start_timeout):
            while not pending:
                try:
                    pending = cast(list[Any], decoder.feed(await stream.receive()))
                except (anyio.EndOfStream, anyio.BrokenResourceError, WireError):
                    return
        if not pending:
            return
        hello = pending.pop(0)
        if (
            not isinstance(hello, _link.AgentHello)
            or hello.v != _link.LINK_VERSION
            or not hmac.compare_digest(hello.secret.encode(), self.secret.encode())
            or not 0 <= hello.index < len(self.plan.hosts)
            or hello.index in self.agents
        ):
            peer = stream.extra(anyio.abc.SocketAttribute.remote_address)
            self.runner._hub.warn(
                f"refused a connection to the launch link from {peer!r}: not one of our agents"
            )
            return
        agent = _AgentConnection(hello.index, stream, hello)
        self.agents[hello.index] = agent
        if len(self.agents) == len(self.plan.hosts):
            self.all_connected.set()
        try:
            while True:
                for message in pending:
                    await self._dispatch(agent, message)
                try:
                    data = await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
                try:
                    pending = cast(list[Any], decoder.feed(data))
                except WireError as exc:
                    self.runner._hub.warn(
                        f"agent-{agent.index}: bad frame on the launch link: {exc}"
                    )
                    break
        finally:
            agent.lost.set()
            if not agent.done.is_set():
                self.coordinator.agent_lost(agent.index, "lost its link to the launcher")

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
        elif isinstance(message, _link.AgentDone):
            agent.done.set()

    def _state(self, agent: int, source: str, stream: str, kind: str, level: int) -> StreamState:
        key = (agent, source, stream)
        state = self._states.get(key)
        if state is None:
            relative = f"agent-{agent}" + (f".{source}" if source else "")
            src = self.runner._hub.source(relative)
            state = StreamState(src, kind, stream, level, 0, peer=f"agent-{agent}")
            self._states[key] = state
        return state

    async def wait_agents_gone(self) -> None:
        """The agents' commands end once their work is done; stop those that do not."""
        with anyio.move_on_after(self.plan.grace + 10):
            for proc in self.processes:
                if proc.stdin is not None:
                    await proc.stdin.aclose()
                await proc.wait()
        for proc in self.processes:
            if proc.returncode is None:
                await proc.stop(1.0)

    async def start_agents(self, addresses: list[tuple[str, int]]) -> None:
        plan = self.plan
        python = plan.ssh.remote_python
        command = [python, "-m", "corral._agent"]
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
            self.processes.append(proc)
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
            )
            proc = await self.runner.start(
                plan.ssh.argv(host, command),
                name=f"agent-{index}.ssh",
                stdin=subprocess.PIPE,
                check=False,
                grace=plan.grace + 5,
            )
            self.processes.append(proc)
            assert proc.stdin is not None
            try:
                # stdin stays open afterwards: the agent's lifeline.
                await proc.stdin.send(config.encode() + b"\n")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # ssh has exited already: wait_connected reports why

    async def wait_connected(self) -> None:
        """Until every agent dialed back; raise LaunchError if an agent's command exits first."""
        plan = self.plan
        async with anyio.create_task_group() as tg:

            async def watch(proc: Process) -> None:
                await proc.wait()
                if not self.all_connected.is_set():
                    which = proc.name.removesuffix(".ssh")
                    tail = proc.stderr_tail.decode("utf-8", "replace").strip()
                    raise LaunchError(
                        f"{which} ({' '.join(proc.argv[:1])}) exited with code {proc.returncode} "
                        f"before it connected back" + (f": {tail}" if tail else "")
                    )

            for proc in self.processes:
                tg.start_soon(watch, proc)
            with anyio.fail_after(plan.start_timeout):
                try:
                    await self.all_connected.wait()
                    for agent in self.agents.values():
                        await agent.ready.wait()
                except TimeoutError:
                    missing = [
                        plan.hosts[i] for i in range(len(plan.hosts)) if i not in self.agents
                    ]
                    raise LaunchError(
                        f"agents on {missing} did not connect back to the launcher within "
                        f"{plan.start_timeout:g} s"
                    ) from None
            tg.cancel_scope.cancel()

    async def stop_all(self, grace: float) -> None:
        """Tell every agent to stop its workers; wait until each reported them reaped."""
        async with anyio.create_task_group() as tg:

            async def stop(agent: _AgentConnection) -> None:
                try:
                    await agent.send(_link.Stop(grace))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return
                with anyio.move_on_after(grace + 10):
                    async with anyio.create_task_group() as inner:

                        async def done() -> None:
                            await agent.done.wait()
                            inner.cancel_scope.cancel()

                        async def lost() -> None:
                            await agent.lost.wait()
                            inner.cancel_scope.cancel()

                        inner.start_soon(done)
                        inner.start_soon(lost)

            for agent in list(self.agents.values()):
                tg.start_soon(stop, agent)


async def _launch_remote(
    runner: Runner,
    plan: _Plan,
    payload: bytes,
    coordinator: _Coordinator,
    launcher_address: str | None,
) -> None:
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
            try:
                await remote.start_agents([(a, ports[a]) for a in wanted])
                await remote.wait_connected()
                master_addr = plan.hosts[0]
                master_port = remote.agents[0].master_port
                for index, agent in sorted(remote.agents.items()):
                    await agent.send(_job(plan, index, payload, master_addr, master_port))
                await coordinator.settled.wait()
                if coordinator.failure is not None:
                    with anyio.CancelScope(shield=True):
                        await remote.stop_all(plan.grace)
                else:
                    for agent in remote.agents.values():
                        await agent.done.wait()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await remote.stop_all(plan.grace)
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await remote.wait_agents_gone()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for each in listeners.values():
                await each.aclose()
