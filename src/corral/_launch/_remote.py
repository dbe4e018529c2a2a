"""A launch on other hosts: one agent per host, started with ssh or srun, and its link."""

from __future__ import annotations

import hmac
import os
import secrets
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._errors import LaunchError
from .._sys._proc import ResourceUsage
from . import _link
from ._coordinator import Coordinator
from ._hosts import dial_back_addresses
from ._link import CONFIG_ENV
from ._plan import Plan

if TYPE_CHECKING:
    from .._core._process import Process
    from ._context import LaunchContext

__all__ = ["COMMAND_EXIT_WAIT", "COMMAND_EXIT_WAIT_STOPPED", "STOP_SLACK", "launch_remote"]

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

    def __init__(
        self, ctx: LaunchContext, plan: Plan, coordinator: Coordinator, secret: str
    ) -> None:
        self.ctx = ctx
        self.plan = plan
        self.coordinator = coordinator
        self.secret = secret
        self.agents: dict[int, _AgentConnection] = {}
        self.all_connected = anyio.Event()
        #: Each agent's command (an ssh client; or one srun for them all) and its agents.
        self.commands: list[tuple[Process, list[int]]] = []
        self.closing = False  # the launch is ending: no more agents are heard
        #: Connections waiting for their hello, oldest first (see _link.MAX_PENDING_HELLOS).
        self._hellos: dict[anyio.CancelScope, None] = {}

    def _warn(self, message: str) -> None:
        self.ctx.logs.warn(message)

    def where(self, index: int) -> str:
        return f"{self.plan.agent(index)} on {self.plan.hosts[index]}"

    async def serve(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup
    ) -> None:
        async def handle(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                await self._converse(stream)

        await listener.serve(handle, task_group=tg)

    async def _converse(self, stream: anyio.abc.SocketStream) -> None:
        # Before the secret is checked: one small hello, quickly, and only so
        # many connections waiting for theirs (see corral._launch._link).
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
        link = _link.Link(stream, self.plan.options.link_timeout)
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
                self._usage(agent.index, [])
                agent.ended.set()
                agent.finished.set()
                if not agent.done.is_set():
                    if self.coordinator.settled.is_set() and self.coordinator.failure is None:
                        # The outcome stands; what the host logged last may not.
                        self._warn(
                            f"the link to {self.where(agent.index)} {why} before the agent "
                            "confirmed that its workers were reaped: every worker's outcome "
                            "had come, but lines they wrote last may be missing"
                        )
                    self.coordinator.agent_lost(agent.index, why)

    async def _dispatch(self, agent: _AgentConnection, message: Any) -> None:
        index = agent.index
        if isinstance(message, _link.Lines):
            await self.ctx.logs.lines(
                self._relative(index, message.source),
                message.stream,
                message.level,
                message.created,
                message.text,
                peer=self.plan.agent(index),
            )
        elif isinstance(message, _link.Records):
            await self.ctx.logs.records(
                self._relative(index, message.source),
                message.records,
                peer=self.plan.agent(index),
            )
        elif isinstance(message, _link.Ready):
            agent.master_port = message.master_port
            agent.ready.set()
        elif isinstance(message, _link.ResultPart):
            await self.coordinator.result_part(index, message)
        elif isinstance(message, _link.WorkerResult):
            await self.coordinator.result(index, message)
        elif isinstance(message, _link.WorkerError):
            await self.coordinator.error(index, message)
        elif isinstance(message, _link.WorkerExit):
            await self.coordinator.exited(index, message)
        elif isinstance(message, _link.Usage):
            self._usage(index, message.workers)
        elif isinstance(message, _link.Stopping):
            self.coordinator.agent_lost(index, f"stopped its workers: {message.reason}")
        elif isinstance(message, _link.AgentDone):
            agent.done.set()
            agent.ended.set()
            self.coordinator.agent_done(index)

    def _usage(self, index: int, workers: list[_link.WorkerUsage]) -> None:
        """What agent ``index`` says its workers cost (none: it has no more)."""
        if self.ctx.usage is None:
            return
        host = self.plan.hosts[index]
        figures = {
            self._relative(index, w.source): ResourceUsage(
                w.pid, w.cpu_percent, w.rss, w.gpu_memory, w.processes, host
            )
            for w in workers
        }
        self.ctx.usage.remote(self.plan.agent(index), figures)

    def _relative(self, agent: int, source: str) -> str:
        """The source within the runner of what agent ``agent`` says ``source`` wrote."""
        return self.plan.agent(agent) + (f".{source}" if source else "")

    async def start_agents(self, addresses: list[tuple[str, int]]) -> None:
        plan = self.plan
        python = plan.ssh.remote_python
        command = [python, "-m", "corral._agent"]
        if plan.slurm:
            address, port = addresses[0]
            config = plan.agent_config(
                secret=self.secret,
                address=address,
                port=port,
                index=-1,
                python=python,
                watch_stdin=False,
                usage=self.ctx.usage is not None,  # the agent samples its workers
            )
            nodes = len(plan.hosts)
            proc = await self.ctx.start(
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
            config = plan.agent_config(
                secret=self.secret,
                address=address,
                port=port,
                index=index,
                host=host,
                python=python,
                watch_stdin=True,
                usage=self.ctx.usage is not None,  # the agent samples its workers
            )
            proc = await self.ctx.start(
                # ssh ignores SIGINT if it starts with SIGINT ignored: a Ctrl-C that
                # the runner passes on to its children must not end the session
                # before the stop (with that SIGINT) has gone over the link.
                ["/bin/sh", "-c", 'trap "" INT && exec "$0" "$@"', *plan.ssh.argv(host, command)],
                name=f"{plan.agent(index)}.ssh",
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
            f"{which}{where} ({_program(proc)}) exited with code {proc.returncode} "
            f"before it connected back" + (f": {tail}" if tail else "")
        )

    def _not_started(self) -> str:
        missing = []
        for proc, indices in self.commands:
            tail = proc.stderr_tail.decode("utf-8", "replace").strip()
            program = os.path.basename(_program(proc))
            said = f" ({program} said: {tail})" if tail else f" ({program} said nothing)"
            for index in indices:
                if index not in self.agents:
                    missing.append(f"{self.where(index)} did not connect back{said}")
                elif not self.agents[index].ready.is_set():
                    missing.append(f"{self.where(index)} connected back but did not get ready")
        timeout = self.plan.options.start_timeout
        return f"the launch did not start within {timeout:g} s (start_timeout): " + "; ".join(
            missing
        )

    async def stop_all(self, grace: float) -> None:
        """Tell every agent to stop its workers; wait until each confirmed them reaped.

        The workers get the signal that stops the runner, if one does (a
        Ctrl-C's SIGINT, as the runner's own children got it), else their stop
        signal.  Waits for each agent until it confirmed (``AgentDone``), or its
        link is lost (closed, or silent past ``link_timeout``), and at most
        ``grace`` + :data:`STOP_SLACK` seconds in all: an agent kills its
        workers at the grace deadline, and says so at once.  A second signal
        meanwhile ends every grace at once: each agent is told to kill now.
        """
        waiting = [agent for agent in self.agents.values() if not agent.ended.is_set()]
        signum = self.ctx.stop_signal() or 0

        async def stop(agent: _AgentConnection) -> None:
            try:
                await agent.link.send(_link.Stop(grace, signum))
            except _link.LinkLost:
                return
            await agent.ended.wait()

        async def hasten(aborted: Callable[[], Awaitable[None]]) -> None:
            await aborted()
            for agent in waiting:
                if not agent.ended.is_set():
                    try:
                        await agent.link.send(_link.Stop(0.0, signal.SIGKILL))
                    except _link.LinkLost:
                        pass

        with anyio.move_on_after(grace + STOP_SLACK):
            async with anyio.create_task_group() as tg:
                if self.ctx.aborted is not None:
                    tg.start_soon(hasten, self.ctx.aborted)
                async with anyio.create_task_group() as stops:
                    for agent in waiting:
                        stops.start_soon(stop, agent)
                tg.cancel_scope.cancel()
        late = [self.where(agent.index) for agent in waiting if not agent.ended.is_set()]
        if late:
            self._warn(
                f"{', '.join(late)} did not confirm that its workers stopped within "
                f"{grace + STOP_SLACK:g} s (grace + {STOP_SLACK:g} s); its link is closed now, "
                "and an agent that loses its link stops its workers"
            )

    async def end(self, *, stopped: bool) -> None:
        """The launch is over: let the agents go, close their links, stop their commands.

        The agents that confirmed get :data:`COMMAND_EXIT_WAIT` seconds (after
        a cancellation or a signal, ``stopped``: :data:`COMMAND_EXIT_WAIT_STOPPED`)
        to close their links (their last log lines are read meanwhile) and
        their commands to exit; every other command (an ssh client hung on a
        cut link, say) is stopped at once.  At the end of a launch that was not
        ``stopped`` an agent's wait counts only while the launcher waits on its
        link with nothing coming: a host that is still forwarding its workers'
        last records (a burst that a busy machine sends slowly, or that a slow
        log handler here takes slowly) is read to the end, not cut off.
        """
        for proc, _ in self.commands:
            if proc.stdin is not None:
                await proc.stdin.aclose()
        confirmed = [
            (proc, indices)
            for proc, indices in self.commands
            if all(i in self.agents and self.agents[i].done.is_set() for i in indices)
        ]
        if stopped:
            with anyio.move_on_after(COMMAND_EXIT_WAIT_STOPPED):
                for proc, indices in confirmed:
                    for index in indices:
                        await self.agents[index].finished.wait()
                    await proc.wait()
        else:
            for proc, indices in confirmed:
                for index in indices:
                    if not await _until_finished(self.agents[index], COMMAND_EXIT_WAIT):
                        self._warn(
                            f"{self.where(index)} confirmed that its workers were reaped, then "
                            f"sent nothing for {COMMAND_EXIT_WAIT:g} s without closing its link; "
                            "the link is closed now, and what the agent had not sent is lost"
                        )
                with anyio.move_on_after(COMMAND_EXIT_WAIT):
                    await proc.wait()
        self.closing = True
        for agent in self.agents.values():
            agent.scope.cancel()
        async with anyio.create_task_group() as tg:
            for proc, indices in self.commands:
                if proc.returncode is None:
                    # An ssh client whose agent did not confirm may hang on a cut
                    # link (it ignores a Ctrl-C's SIGINT, and SIGTERM makes it try
                    # to say goodbye over that link): it is killed at once.  srun
                    # gets its time to end the step's tasks.
                    hung = (proc, indices) not in confirmed and not self.plan.slurm
                    tg.start_soon(proc.stop, 0.0 if hung else 0.5)


async def _until_finished(agent: _AgentConnection, patience: float) -> bool:
    """Wait until nothing more will be read from ``agent``'s link, or until it has been
    waited on for ``patience`` seconds with nothing coming.

    Only the time spent waiting on the link counts: while the launcher hands what
    came to a slow log handler, the agent is not silent, it is held back.  Whether
    the link was read to its end.
    """
    link = agent.link
    while not agent.finished.is_set():
        since = link.waiting_since
        left = patience if since is None else since + patience - anyio.current_time()
        if left <= 0:
            return False
        with anyio.move_on_after(left):
            await agent.finished.wait()
    return True


def _program(proc: Process) -> str:
    """The agent command's program (ssh, srun), past the shell that starts ssh."""
    args = proc.args
    return args[3] if args[:2] == ["/bin/sh", "-c"] and len(args) > 3 else args[0]


async def launch_remote(
    ctx: LaunchContext,
    plan: Plan,
    payload: bytes,
    coordinator: Coordinator,
) -> None:
    options = plan.options
    deadline = anyio.current_time() + options.start_timeout
    secret = secrets.token_hex(16)
    remote = _Remote(ctx, plan, coordinator, secret)
    # Each agent dials back to this machine's address on the route to its own
    # host (hosts on different networks reach us by different addresses).
    if options.launcher_address is not None:
        wanted = [options.launcher_address] * len(plan.hosts)
    else:
        wanted = await dial_back_addresses(plan.hosts, plan.ssh)
    listeners: dict[str, anyio.abc.Listener[anyio.abc.SocketStream]] = {}
    ports: dict[str, int] = {}
    try:
        for address in dict.fromkeys(wanted):
            made = await anyio.create_tcp_listener(local_host=address, local_port=0)
            listeners[address] = made
            ports[address] = made.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:
            coordinator.serve(tg)
            for each in listeners.values():
                tg.start_soon(remote.serve, each, tg)
            stopped = False  # by a cancellation or a signal
            try:
                await remote.start_agents([(a, ports[a]) for a in wanted])
                await remote.wait_started(deadline)
                master_addr = plan.hosts[0]
                master_port = remote.agents[0].master_port
                for index, agent in sorted(remote.agents.items()):
                    try:
                        await agent.link.send(plan.job(index, payload, master_addr, master_port))
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
                stopped = True
                with anyio.CancelScope(shield=True):
                    await remote.stop_all(plan.grace)
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await remote.end(stopped=stopped)
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for each in listeners.values():
                await each.aclose()
