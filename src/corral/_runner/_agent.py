"""The agent process of a launch on another host: a runner of its own, serving the launcher.

``python -m corral._agent`` (started over ssh or srun on each remote host)
comes here: it dials back to the launcher and authenticates over the link
(:mod:`corral._launch._link`), opens a :class:`Runner` of its own (so every
promise of a runner holds on that host too: process groups, stops with grace,
a lifeline, the orphans of its workers stopped, as the process is the
agent's own), starts its host's workers in it, and does what the launcher
asks until the work is done or the link is lost
(:func:`corral._launch._agent.obey`, which says how).
"""

from __future__ import annotations

import logging
import os
import socket
import sys

import anyio

from .._launch import _link
from .._launch._agent import CLIENT_GONE, AgentExit, AgentLink, ForwardSink, obey
from .._launch._hosts import free_port
from .._launch._workers import HostWorkers
from ._runner import open_runner

__all__ = ["main"]


async def _serve(config: _link.AgentConfig) -> None:
    index = config.index if config.index >= 0 else int(os.environ.get("SLURM_NODEID", "0"))
    host = config.host or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    name = f"agent-{index}"
    if config.watch_stdin and _link.stdin_closed():
        # The launcher killed the ssh client (a Ctrl-C during the start) while
        # this agent was starting: nobody is there to serve.
        raise AgentExit(CLIENT_GONE)
    with anyio.move_on_after(config.start_timeout) as dialing:
        try:
            stream = await anyio.connect_tcp(config.address, config.port)
        except OSError as exc:
            raise AgentExit(
                f"cannot dial back to the launcher at {config.address}:{config.port}: {exc}"
            ) from None
    if dialing.cancelled_caught:
        raise AgentExit(
            f"cannot dial back to the launcher at {config.address}:{config.port}: "
            f"no answer within {config.start_timeout:g} s (start_timeout)"
        )
    lost: str | None = None
    async with stream:
        link = AgentLink(stream, config.link_timeout)
        # The hello first, at once: the launcher gives a connection only a
        # few seconds to say who it is.
        try:
            await link.send(
                _link.AgentHello(_link.LINK_VERSION, config.secret, index, host, os.getpid())
            )
        except _link.LinkLost as exc:
            raise AgentExit(f"the launcher {exc.reason}") from None
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.beat)
            forward = ForwardSink(name, link.send)
            forward.setLevel(config.log_level)
            routes: list[logging.Handler] = [forward]
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
                    raise AgentExit(f"the launcher {exc.reason}") from None
                workers = HostWorkers(
                    runner.start, host=index, prefix="", python=config.python or sys.executable
                )
                lost = await obey(link, workers, config)
                if lost is not None:
                    runner.cancel()
            tg.cancel_scope.cancel()
        # Every message is sent: end the link without losing one (see _link).
        await link.close()
    if lost is not None:
        raise AgentExit(f"the launcher {lost}; stopped the workers")


def main(config: _link.AgentConfig) -> int:
    """The agent's process: serve the launcher with ``config``; the exit code.

    ``config`` is what :func:`corral._launch._link.read_config` read (the entry
    point, ``python -m corral._agent``, passes it).
    """
    try:
        anyio.run(_serve, config)
    except BaseException as exc:  # the link gone, a signal...: say so, exit non-zero
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # out of the task groups it crossed
        if isinstance(exc, AgentExit):
            print(f"corral agent: {exc}", file=sys.stderr)
            return 1
        print(f"corral agent: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0
