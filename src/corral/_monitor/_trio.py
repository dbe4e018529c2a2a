"""The monitor on Trio: trio-websocket, with h11 in front for the page."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._server import HANDSHAKE_TIMEOUT, MAX_CLIENT_MESSAGE, MAX_REQUEST, bound_send_buffer

if TYPE_CHECKING:
    from ._server import Monitor

__all__ = ["serve_trio"]


async def serve_trio(monitor: Monitor) -> None:
    """Serve ``monitor`` until its runner ends, with trio-websocket (and h11 for the page)."""
    trio = sys.modules["trio"]
    import h11
    import trio_websocket

    async def connection(stream: Any) -> None:
        try:
            await talk(stream)
        except (
            h11.ProtocolError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio_websocket.HandshakeError,
            trio_websocket.ConnectionClosed,
            OSError,
        ):
            pass  # a client that broke the protocol or went away: its own loss
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def read_request(stream: Any, conn: Any, received: bytearray) -> Any:
        """The request, read within the bounds; ``None`` if it broke them."""
        key = object()
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as scope:
            monitor.handshake_begins(key, scope.cancel)
            try:
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(4096)
                        received += data
                        if not data or len(received) > MAX_REQUEST:
                            return None
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        return event
                    else:
                        return None
            finally:
                monitor.handshake_ends(key)
        return None

    async def talk(stream: Any) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
        received = bytearray()
        request = await read_request(stream, conn, received)
        if request is None:
            return
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        target = request.target.decode()
        websocket = headers.get("upgrade", "").lower() == "websocket"
        reply, source, level = monitor.answer(target, headers.get("origin"), websocket)
        if reply is not None:
            status, body, kind = reply
            response = h11.Response(
                status_code=status,
                headers=[
                    ("Content-Type", kind),
                    ("Content-Length", str(len(body))),
                    ("Cache-Control", "no-store"),
                    ("Connection", "close"),
                ],
            )
            data = conn.send(response) or b""
            data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
            await stream.send_all(data)
            await stream.aclose()
            return
        joined = await monitor.join(source, level)
        try:
            bound_send_buffer(stream.socket)
            replay = _replay_stream(trio, stream, bytes(received))
            del received
            ws_request = await trio_websocket.wrap_server_stream(
                nursery, replay, message_queue_size=1, max_message_size=MAX_CLIENT_MESSAGE
            )
            ws = await ws_request.accept()

            async def send(message: bytes) -> None:
                await ws.send_message(message.decode())

            try:
                await monitor.talk(
                    joined, send, ws.get_message, ws.ping, trio_websocket.ConnectionClosed
                )
            finally:
                with trio.move_on_after(2):
                    await ws.aclose()
        finally:
            monitor.leave(joined.client)

    listeners = await monitor.listen(
        trio.open_tcp_listeners(monitor.port, host=monitor.host or None)
    )
    if listeners is None:
        return
    async with trio.open_nursery() as nursery:
        monitor.port = listeners[0].socket.getsockname()[1]
        monitor.ready.set()
        nursery.start_soon(trio.serve_listeners, connection, listeners)
        await monitor.ended.wait()
        with trio.move_on_after(2):
            await monitor.idle.wait()
        nursery.cancel_scope.cancel()


def _replay_stream(trio: Any, stream: Any, head: bytes) -> Any:
    """``stream``, giving back ``head`` (bytes already read) before the rest."""

    class Replay(trio.abc.Stream):  # type: ignore[misc]
        def __init__(self) -> None:
            self._head = head

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            if self._head:
                data, self._head = self._head, b""
                return data
            return await stream.receive_some(max_bytes)  # type: ignore[no-any-return]

        async def send_all(self, data: bytes) -> None:
            await stream.send_all(data)

        async def wait_send_all_might_not_block(self) -> None:
            await stream.wait_send_all_might_not_block()

        async def aclose(self) -> None:
            await stream.aclose()

    return Replay()
