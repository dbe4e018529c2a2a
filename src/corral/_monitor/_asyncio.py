"""The monitor on asyncio: the ``websockets`` package's server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

from ._server import HANDSHAKE_TIMEOUT, MAX_CLIENT_MESSAGE, MAX_REQUEST, Joined, bound_send_buffer

if TYPE_CHECKING:
    import asyncio

    from ._server import Monitor

__all__ = ["serve_asyncio"]

#: What websockets' asyncio server buffers for a connection beyond the message
#: being sent (its high-water mark): the kernel's buffer is the one that counts.
WRITE_LIMIT: Final = 4096


async def serve_asyncio(monitor: Monitor) -> None:
    """Serve ``monitor`` until its runner ends, with the ``websockets`` package."""
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.datastructures import Headers
    from websockets.exceptions import ConnectionClosed
    from websockets.http11 import Request, Response

    class Connection(ServerConnection):
        """Bounds what a connection may send before its request is checked."""

        received = 0
        joined: Joined | None = None  # accepted, not served yet
        lost = False  # the connection has gone (maybe while it joined)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            monitor.handshake_begins(self, transport.abort)  # type: ignore[attr-defined]

        def data_received(self, data: bytes) -> None:
            if self.request is None:
                self.received += len(data)
                if self.received > MAX_REQUEST:
                    monitor.handshake_ends(self)
                    self.transport.abort()
                    return
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.lost = True
            monitor.handshake_ends(self)
            joined, self.joined = self.joined, None
            if joined is not None:  # gone before it was served
                monitor.leave(joined.client)
            super().connection_lost(exc)

    async def process_request(connection: ServerConnection, request: Request) -> Response | None:
        monitor.handshake_ends(connection)
        headers = request.headers
        websocket = headers.get("Upgrade", "").lower() == "websocket"
        reply, source, level = monitor.answer(request.path, headers.get("Origin"), websocket)
        if reply is not None:
            return _response(*reply)
        assert isinstance(connection, Connection)
        joined = await monitor.join(source, level)
        if connection.lost:
            # Gone while it joined (connection_lost found nothing to free): no
            # handler will run for it, so its place is given back here.
            monitor.leave(joined.client)
            return _response(503, b"gone\n", "text/plain")
        connection.joined = joined
        return None

    def _response(status: int, body: bytes, kind: str) -> Response:
        reason = {200: "OK", 403: "Forbidden", 503: "Service Unavailable"}[status]
        headers = Headers(
            [
                ("Content-Type", kind),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                ("Connection", "close"),
            ]
        )
        return Response(status, reason, headers, body)

    async def handler(connection: ServerConnection) -> None:
        assert isinstance(connection, Connection)
        joined, connection.joined = connection.joined, None
        assert joined is not None
        bound_send_buffer(connection.transport.get_extra_info("socket"))

        async def send(message: bytes) -> None:
            await connection.send(message, text=True)  # UTF-8 already

        async def ping() -> None:
            await (await connection.ping())  # sent, then its pong

        await monitor.talk(joined, send, connection.recv, ping, ConnectionClosed)

    server = await monitor.listen(
        serve(
            handler,
            monitor.host or None,
            monitor.port,
            create_connection=Connection,
            process_request=process_request,
            compression=None,
            server_header=None,
            close_timeout=1,
            ping_interval=None,  # the monitor pings its clients itself (Monitor.talk)
            open_timeout=HANDSHAKE_TIMEOUT,
            max_size=MAX_CLIENT_MESSAGE,
            max_queue=4,
            # Its own buffer, beyond the message being sent: the kernel's is the buffer.
            write_limit=WRITE_LIMIT,
        )
    )
    if server is None:
        return
    try:
        sockets = list(server.sockets)
        monitor.port = sockets[0].getsockname()[1]
        monitor.ready.set()
        await monitor.ended.wait()
        # The handlers send "end" and close; give them a moment.
        with anyio.move_on_after(2):
            await monitor.idle.wait()
    finally:
        server.close()
        # A connection that says nothing (a browser's speculative one, half
        # a request) or a client that reads nothing would hold the close
        # up for the library's timeouts: give them one second, then cut.
        with anyio.move_on_after(1):
            await server.wait_closed()
        for connection in list(server.all_connections):
            transport = connection.transport
            if transport is not None:
                transport.abort()
        with anyio.move_on_after(1):
            await server.wait_closed()
