"""Serve a monitor with the WebSocket library of the running loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._sys._backend import LoopHandle
    from ._server import Monitor

__all__ = ["serve"]


async def serve(monitor: Monitor, loop: LoopHandle) -> None:
    """Serve ``monitor`` until its runner ends (a task of the runner).

    trio-websocket on Trio, the ``websockets`` package's server on asyncio;
    each is imported only when it is the one that serves.
    """
    monitor.bind_loop(loop)
    if loop.backend == "trio":
        from ._trio import serve_trio

        await serve_trio(monitor)
    else:
        from ._asyncio import serve_asyncio

        await serve_asyncio(monitor)
