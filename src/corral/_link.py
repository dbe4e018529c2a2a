"""The link between a launcher and its agents: one authenticated connection per host.

:meth:`Runner.launch` runs a function on workers spread over hosts.  On each
remote host one *agent* (``python -m corral._agent``, itself a corral runner)
starts and supervises that host's workers, and talks to the launcher over one
TCP connection that the agent dials back to.  This module defines what goes
over it.  Frames are those of the log wire format (:mod:`corral._wire`): a
4-byte big-endian length and one MessagePack array whose first element names
the message.  The connection is versioned (:data:`LINK_VERSION`, in the
agent's hello) and authenticated (the hello carries a secret made for this
launch, compared in constant time).

Only these messages ever carry pickles — the function and its arguments, a
worker's return value, a worker's exception — and only after the hello was
accepted; log records travel as the log wire format's own records, never
pickled.

Agent to launcher:

``AgentHello``
    first frame: protocol version, secret, agent index, host name, pid.
``Ready``
    the agent is set up; agent 0 adds a free TCP port on its host for
    ``MASTER_PORT``.
``Lines``
    complete lines one worker (or the agent itself) wrote to stdout or stderr.
``Records``
    :mod:`logging` records of one worker, as the log wire format's records.
``WorkerResult`` / ``WorkerError``
    a worker's return value (pickled), or its exception (pickled if it
    survives a round trip, else boxed: type name, message, traceback text).
``WorkerExit``
    a worker's process has exited (return code, stderr tail).
``AgentDone``
    every worker of the agent has been reaped.

Launcher to agent:

``Job``
    what to run — a pickled function and its arguments, or a command line —
    and how: ranks, world, master address and port, environment, grace
    period.
``Stop``
    stop every worker now (stop signal, grace, SIGKILL) and report
    ``AgentDone``.
"""

from __future__ import annotations

from typing import Final, TypeAlias

import msgspec

from ._wire import Record

__all__ = [
    "LINK_VERSION",
    "AgentDone",
    "AgentHello",
    "Job",
    "Lines",
    "LinkMessage",
    "Ready",
    "Records",
    "Stop",
    "WorkerError",
    "WorkerExit",
    "WorkerResult",
    "decoder",
    "encode",
]

LINK_VERSION: Final = 1
"""The version of this protocol; an agent speaking another is refused."""

#: A frame on the link may be this big: pickled arguments and results can be large.
MAX_LINK_FRAME: Final = 1 << 30


class AgentHello(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    v: int
    secret: str
    index: int
    host: str
    pid: int


class Ready(msgspec.Struct, tag="ready", array_like=True, frozen=True):
    master_port: int = 0


class Lines(msgspec.Struct, tag="lines", array_like=True, frozen=True):
    source: str  # "worker-<j>", or "" for the agent itself
    stream: str
    level: int
    created: float
    text: bytes  # complete lines, each ending with a newline


class Records(msgspec.Struct, tag="records", array_like=True, frozen=True):
    source: str
    records: list[Record]


class WorkerResult(msgspec.Struct, tag="result", array_like=True, frozen=True):
    local_rank: int
    payload: bytes


class WorkerError(msgspec.Struct, tag="error", array_like=True, frozen=True):
    local_rank: int
    type_name: str
    message: str
    traceback: str
    payload: bytes | None = None  # the exception, pickled, if it survives a round trip


class WorkerExit(msgspec.Struct, tag="exit", array_like=True, frozen=True):
    local_rank: int
    pid: int
    returncode: int
    stderr: bytes


class AgentDone(msgspec.Struct, tag="done", array_like=True, frozen=True):
    pass


class Job(msgspec.Struct, tag="job", array_like=True, frozen=True):
    payload: bytes
    world_size: int
    first_rank: int
    workers: int
    group_rank: int
    groups: int
    master_addr: str
    master_port: int
    env: dict[str, str | None]  # None: remove the variable
    grace: float
    log_level: int = 0
    argv: list[str] = msgspec.field(default_factory=list)  # a command instead of a function


class Stop(msgspec.Struct, tag="stop", array_like=True, frozen=True):
    grace: float


LinkMessage: TypeAlias = (
    AgentHello
    | Ready
    | Lines
    | Records
    | WorkerResult
    | WorkerError
    | WorkerExit
    | AgentDone
    | Job
    | Stop
)

_encoder: Final = msgspec.msgpack.Encoder()


def decoder() -> msgspec.msgpack.Decoder[LinkMessage]:
    """A decoder of link messages (for :class:`corral._wire.FrameDecoder`)."""
    return msgspec.msgpack.Decoder(LinkMessage)


def encode(message: LinkMessage) -> bytes:
    """The whole frame of ``message``, ready to send."""
    payload = _encoder.encode(message)
    return len(payload).to_bytes(4, "big") + payload
