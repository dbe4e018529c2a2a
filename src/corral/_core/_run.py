"""One run of a child: its pid, its pipes and what became of it.

A child that is restarted has one run after another (see
:mod:`corral._core._supervisor`); each is opened here, right after its spawn,
with the readers of its pipes and the streams its user gets; :func:`feed` and
:func:`drain` are how :meth:`Runner.run` writes and reads those streams.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import anyio

from .._errors import STDERR_TAIL_BYTES
from ._handshake import HandshakeReader
from ._pipes import BufferedReceiveStream, PipeReader, PipeReceiveStream, PipeSendStream
from ._stop import Grace

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream

    from .._logs._hub import LogHub
    from .._logs._sources import Source
    from ._options import StartSpec
    from ._spawn import Spawned

__all__ = ["Run", "UserStream", "close_status", "drain", "feed", "open_run"]

#: A stream of a child's pipe handed to its user.
UserStream = PipeSendStream | PipeReceiveStream | BufferedReceiveStream


class Run:
    """One run of the child: one pid, its pipes and what became of it."""

    def __init__(self, spawned: Spawned) -> None:
        self.spawned = spawned
        self.pid = spawned.pid
        self.pgid = spawned.pid
        self.readers: list[PipeReader] = []
        self.stderr_reader: PipeReader | None = None
        self.receive_streams: list[PipeReceiveStream] = []
        self.handshake: HandshakeReader | None = None
        self.started = anyio.Event()
        self.started_value: object = None
        self.startup_error: Exception | None = None
        self.returncode: int | None = None
        self.exit_seen: int | None = None
        self.duration: float | None = None
        self.leader_exited = anyio.Event()
        #: Set once nothing of its process group runs any more (then it is reaped).
        self.group_gone = anyio.Event()
        #: The stop under way (signal sent, grace running), if one is.
        self.stopping: Grace | None = None
        self.reaped = anyio.Event()
        self.done = anyio.Event()
        #: The streams this run hands its user (``PIPE``), in the order they were made.
        self.stdin: PipeSendStream | None = None
        self.stdout: PipeReceiveStream | BufferedReceiveStream | None = None
        self.stderr: PipeReceiveStream | BufferedReceiveStream | None = None
        self.user_streams: list[UserStream] = []


def open_run(
    spawned: Spawned,
    spec: StartSpec,
    *,
    hub: LogHub,
    source: Source,
    open_streams: set[UserStream],
) -> Run:
    """Set up the readers and streams of a freshly spawned child."""
    run = Run(spawned)
    for stream, plan, fd in (
        ("stdout", spec.stdout, spawned.stdout),
        ("stderr", spec.stderr, spawned.stderr),
    ):
        if fd is None:
            continue
        if plan.pipe and not plan.log:
            # The pipe itself is the user's stream.
            receive = PipeReceiveStream(fd, open_streams)
            run.receive_streams.append(receive)
            _set_stream(run, stream, receive)
            continue
        buffered: BufferedReceiveStream | None = None
        if plan.pipe:
            buffered = BufferedReceiveStream(open_streams)
            _set_stream(run, stream, buffered)
        reader = PipeReader(
            fd,
            collector=hub.collector,
            state=hub.lines(source, stream, spawned.pid) if plan.log else None,
            stream=buffered,
            tail_bytes=STDERR_TAIL_BYTES if stream == "stderr" and plan.log else 0,
        )
        run.readers.append(reader)
        if stream == "stderr":
            run.stderr_reader = reader
    if spawned.stdin is not None:
        send = PipeSendStream(spawned.stdin, open_streams)
        run.stdin = send
        run.user_streams.append(send)
    if spawned.handshake is not None:
        run.handshake = HandshakeReader(spawned.handshake)
    else:
        run.started.set()
    return run


def _set_stream(run: Run, stream: str, value: PipeReceiveStream | BufferedReceiveStream) -> None:
    run.user_streams.append(value)
    if stream == "stdout":
        run.stdout = value
    else:
        run.stderr = value


def close_status(run: Run) -> None:
    spawned = run.spawned
    if spawned.status is not None:
        os.close(spawned.status)
        spawned.status = None


async def feed(stdin: ByteSendStream, data: bytes) -> None:
    """Write ``data`` to the child's stdin and close it; a child that stopped reading is fine."""
    try:
        if data:
            await stdin.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        await stdin.aclose()


async def drain(stream: ByteReceiveStream, into: list[bytes]) -> None:
    """Read ``stream`` to its end, each read appended to ``into``, then close it."""
    async with stream:
        async for data in stream:
            into.append(data)
