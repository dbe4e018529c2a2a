"""Serve a monitor with the WebSocket library of the running loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._sys._backend import LoopHandle
    from ._server import Monitor

__all__ = ["server_for"]


def server_for(monitor: Monitor, loop: LoopHandle) -> Callable[[Monitor], Awaitable[None]]:
    """What serves ``monitor`` on ``loop`` until its runner ends (a task of the runner).

    trio-websocket on Trio, the ``websockets`` package's server on asyncio;
    each is imported only when it is the one that serves (here, so that the
    runner can protect its code as its own before it runs).
    """
    monitor.bind_loop(loop)
    if loop.backend == "trio":
        from ._trio import serve_trio

        return serve_trio
    from ._asyncio import serve_asyncio

    return serve_asyncio
