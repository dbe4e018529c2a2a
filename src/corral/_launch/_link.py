"""The link between a launcher and its agents: one authenticated connection per host.

:meth:`Runner.launch` runs a function on workers spread over hosts.  On each
remote host one *agent* (``python -m corral._agent``, itself a corral runner)
starts and supervises that host's workers, and talks to the launcher over one
TCP connection that the agent dials back to.  This module defines what goes
over it, and the rules both ends keep.  Frames are those of the log wire
format (:mod:`corral._logs._wire`): a 4-byte big-endian length and one MessagePack
array whose first element names the message.  The connection is versioned
(:data:`LINK_VERSION`, in the agent's hello) and authenticated (the hello
carries a secret made for this launch, compared in constant time).

**Before the secret is checked** (:func:`read_hello`), a connection may send
one frame, the hello, of at most :data:`MAX_HELLO` bytes (4 KiB), and must
send it whole within :data:`HELLO_TIMEOUT` seconds (5 s) of being accepted;
the listener reads exactly that frame and nothing after it.  A longer length
prefix, anything that is not a hello, or a hello that is late is closed at
once, and of :data:`MAX_PENDING_HELLOS` (64) connections still waiting for
their hello the one that has waited longest is closed when another comes, so
that strangers cost the launcher at most a few KiB and a few descriptors
each, for a few seconds: the 1 GiB frames of an authenticated link (:data:`MAX_LINK_FRAME`)
are allowed only once the hello was accepted.

**The link has a deadline** (:class:`Link`).  A TCP connection with no
traffic does not notice a pulled cable, so once the hello is accepted each
side sends a :class:`Heartbeat` every ``link_timeout / 4`` seconds
(:func:`heartbeat_interval`), and each side counts the link as cut when it
has been waiting for ``link_timeout`` seconds (5 s by default,
:data:`~corral._scaleout.DEFAULT_LINK_TIMEOUT`; ``link_timeout=`` of
:meth:`Runner.launch`)
without a single byte arriving.  (Bytes, not frames: a large frame that is
still arriving keeps the link alive.  Time spent handling what arrived does
not count: a side that is busy is not silent.)  A link that is cut, closed or
broken ends the same way on both sides: the agent stops its workers at once
(its grace, at most 1 s) and exits, and the launcher counts that host as
lost, which fails the launch (:class:`corral.LaunchError` naming the host)
and stops every other host's workers.

**The link ends without a reset** (:meth:`Link.close`).  The agent is the side
that ends a link that served its purpose: it says end-of-stream after its last
message and reads on, dropping what comes (heartbeats), until the launcher has
read everything and closed its side too.  Closing a TCP connection that still
holds unread bytes (a heartbeat that came meanwhile) makes the kernel reset it
instead, and a reset throws away what the other side had not read yet: the
agent's last log lines and its ``AgentDone``.

Only these messages ever carry pickles — the function and its arguments, a
worker's return value, a worker's exception — and only after the hello was
accepted; log records travel as the log wire format's own records, never
pickled.

Both ways:

``Heartbeat``
    nothing but a sign of life.

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
``ResultPart`` / ``WorkerResult``
    a worker's return value, pickled.  A pickle of more than
    :data:`PART_SIZE` bytes goes as ``ResultPart`` frames of that size,
    then its last piece as the ``WorkerResult``: no frame of the link is
    ever much bigger than that, so nothing else (a heartbeat, a log line)
    waits behind a large result for longer than one part takes, and the
    receiver unpickles the value as its parts come (see
    :mod:`corral._launch._coordinator`) instead of holding the whole
    pickle and the value at once.
``WorkerError``
    a worker's exception (pickled if it survives a round trip, else boxed:
    type name, message, traceback text).
``WorkerExit``
    a worker's process has exited (return code, stderr tail, and what its
    error file says, if it wrote one).
``Usage``
    what each running worker costs (CPU, memory, GPU memory of its tree),
    about once a second, when the launcher's runner samples its own children.
``Stopping``
    the agent stops its workers on its own, and says why (under ssh: its
    standard input, the ssh client's pipe, was closed).
``AgentDone``
    every worker of the agent has been reaped: after its job, or in answer
    to ``Stop``.

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

import base64
import contextlib
import functools
import os
import select
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import msgspec

from .._logs._wire import FrameDecoder, Record, WireError

# Workers import this module for its messages alone, and a worker must stay
# light (standard library and msgspec): anyio is imported only where the
# link's I/O needs it.
if TYPE_CHECKING:
    import anyio
    import anyio.abc

__all__ = [
    "CONFIG_ENV",
    "HELLO_TIMEOUT",
    "LINK_VERSION",
    "MAX_HELLO",
    "MAX_LINK_FRAME",
    "MAX_PENDING_HELLOS",
    "PART_SIZE",
    "AgentConfig",
    "AgentDone",
    "AgentHello",
    "Heartbeat",
    "Job",
    "Lines",
    "Link",
    "LinkLost",
    "LinkMessage",
    "Ready",
    "Records",
    "ResultPart",
    "Stop",
    "Stopping",
    "Usage",
    "WorkerError",
    "WorkerExit",
    "WorkerResult",
    "WorkerUsage",
    "decode_config",
    "decoder",
    "encode_config",
    "encode",
    "heartbeat_interval",
    "read_hello",
]

LINK_VERSION: Final = 2
"""The version of this protocol; an agent speaking another is refused."""

#: A frame on an authenticated link may be this big: pickled arguments and results can be large.
MAX_LINK_FRAME: Final = 1 << 30

#: A worker's pickled return value goes in parts of at most this many bytes (see ``ResultPart``).
PART_SIZE: Final = 256 * 1024

#: The largest hello (the one frame allowed before the secret is checked), in bytes.
MAX_HELLO: Final = 4096

#: Seconds a connection has, from being accepted, to send its hello whole.
HELLO_TIMEOUT: Final = 5.0

#: Connections of a launch listener that may wait for their hello at once; to
#: accept another, the one that has waited longest is closed.
MAX_PENDING_HELLOS: Final = 64

#: Heartbeats each side sends per ``link_timeout``.
BEATS_PER_TIMEOUT: Final = 4


def heartbeat_interval(link_timeout: float) -> float:
    """Seconds between two heartbeats of a link whose deadline is ``link_timeout``."""
    return link_timeout / BEATS_PER_TIMEOUT


class AgentHello(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    v: int
    secret: str
    index: int
    host: str
    pid: int


class Heartbeat(msgspec.Struct, tag="beat", array_like=True, frozen=True):
    pass


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


class ResultPart(msgspec.Struct, tag="part", array_like=True, frozen=True):
    local_rank: int
    data: bytes


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
    error: str = ""  # what its TORCHELASTIC_ERROR_FILE says: "Type: message"
    traceback: str = ""  # and the traceback there
    duration: float = 0.0  # seconds from spawn to exit


class WorkerUsage(msgspec.Struct, array_like=True, frozen=True):
    source: str  # "worker-<j>"
    pid: int
    cpu_percent: float
    rss: int
    gpu_memory: int | None
    processes: int


class Usage(msgspec.Struct, tag="usage", array_like=True, frozen=True):
    workers: list[WorkerUsage]


class Stopping(msgspec.Struct, tag="stopping", array_like=True, frozen=True):
    reason: str


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
    signal: int = 0  # what to send each worker first; 0: its stop signal


LinkMessage: TypeAlias = (
    AgentHello
    | Heartbeat
    | Ready
    | Lines
    | Records
    | ResultPart
    | WorkerResult
    | WorkerError
    | WorkerExit
    | Usage
    | Stopping
    | AgentDone
    | Job
    | Stop
)

_encoder: Final = msgspec.msgpack.Encoder()
_hello_decoder: Final = msgspec.msgpack.Decoder(AgentHello)


def decoder() -> msgspec.msgpack.Decoder[LinkMessage]:
    """A decoder of link messages (for :class:`corral._logs._wire.FrameDecoder`)."""
    return msgspec.msgpack.Decoder(LinkMessage)


def encode(message: LinkMessage) -> bytes:
    """The whole frame of ``message``, ready to send."""
    payload = _encoder.encode(message)
    return len(payload).to_bytes(4, "big") + payload


# -- before the secret is checked ---------------------------------------------------------------


async def read_hello(stream: anyio.abc.ByteReceiveStream) -> AgentHello | None:
    """The hello of a connection just accepted, read under the pre-authentication rule.

    Reads the length prefix, then exactly the frame it announces if that is at
    most :data:`MAX_HELLO` bytes, all within :data:`HELLO_TIMEOUT` seconds;
    nothing after it is read.  Returns ``None`` when the peer breaks the rule
    (too long, too late, not a hello, or gone); the caller then closes the
    connection.  The secret and the version are the caller's to check.
    """
    import anyio

    with anyio.move_on_after(HELLO_TIMEOUT):
        try:
            size = int.from_bytes(await _receive_exactly(stream, 4), "big")
            if not 0 < size <= MAX_HELLO:
                return None
            payload = await _receive_exactly(stream, size)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return None
        try:
            return _hello_decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            return None
    return None


async def _receive_exactly(stream: anyio.abc.ByteReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        data += await stream.receive(size - len(data))
    return bytes(data)


# -- an authenticated link ----------------------------------------------------------------------


class LinkLost(Exception):
    """The link is gone: closed by the other side, broken, or silent past its deadline.

    ``reason`` says which, as a phrase ("nothing came over the link for 5 s ...").
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Link:
    """One side of an authenticated link: framed sends, heartbeats, a deadline on silence.

    Sends are serialised by a lock (frames never interleave).  :meth:`receive`
    returns the next messages, heartbeats left out, and raises
    :class:`LinkLost` once the link is gone, by whatever cause; from then on
    every :meth:`send` raises it too, and :meth:`lose` makes any send or
    receive in progress raise it at once (a send to a cut link would
    otherwise wait forever for a full send buffer to drain).  Run
    :meth:`beat` in a task for as long as the link should be kept alive.

    A side that was itself not running (SIGSTOP or Ctrl-Z, a suspended
    machine, a loop blocked for seconds) is silent to the other side, which
    counts the link as cut: the heartbeat notices that it woke up late, and
    the reason of a loss that follows says so instead of blaming the other
    side.  :attr:`ME` and :attr:`PEER` name the two sides in that reason.
    """

    ME = "launcher"
    PEER = "agent"

    def __init__(self, stream: anyio.abc.ByteStream, timeout: float) -> None:
        import anyio

        self._stream = stream
        self.timeout = timeout
        self._decoder = FrameDecoder(MAX_LINK_FRAME, decoder())
        self._lock = anyio.Lock()
        self._lost: str | None = None
        self._scopes: set[anyio.CancelScope] = set()
        #: When the heartbeat is due to wake next (``None`` until it beats).
        self._due: float | None = None
        #: The last time this side was found not running: (seconds, when it ended).
        self._stalled: tuple[float, float] | None = None
        #: Since when :meth:`receive` has waited for a message (heartbeats aside);
        #: ``None`` while its caller handles the last ones it returned.
        self.waiting_since: float | None = None

    @property
    def lost(self) -> str | None:
        """Why the link is gone, or ``None`` while it holds."""
        return self._lost

    def lose(self, reason: str) -> None:
        """Declare the link gone (the first reason stays); what waits on it fails now."""
        if self._lost is None:
            self._lost = reason
        for scope in self._scopes:
            scope.cancel()

    def _own_stall(self) -> float:
        """Seconds this side itself was just not running (its heartbeat woke that late); or 0."""
        import anyio

        now = anyio.current_time()
        stall = 0.0 if self._due is None else now - self._due  # overdue, not woken yet
        if self._stalled is not None and now - self._stalled[1] < self.timeout:
            stall = max(stall, self._stalled[0])
        return stall if stall > heartbeat_interval(self.timeout) else 0.0

    def _lose_here(self, reason: str) -> None:
        """:meth:`lose`, for what this side saw, saying if it was itself not running."""
        stall = self._own_stall()
        if stall >= self.timeout - heartbeat_interval(self.timeout):
            reason = (
                f"lost the link because this {self.ME} was not running for at least "
                f"{stall:.1f} s (stopped by SIGSTOP or Ctrl-Z, a suspended machine, a blocked "
                f"loop), about as long as link_timeout ({self.timeout:g} s) or more: the "
                f"{self.PEER}, hearing nothing, counted the link as cut (then, here, it {reason})"
            )
        elif stall:
            reason += (
                f" (this {self.ME} itself was not running for {stall:.1f} s or more just before)"
            )
        self.lose(reason)

    @contextlib.contextmanager
    def _until_lost(self) -> Iterator[anyio.CancelScope]:
        import anyio

        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    async def send(self, message: LinkMessage | bytes) -> None:
        """Send one message (or an encoded frame); :class:`LinkLost` if the link is gone."""
        frame = message if isinstance(message, bytes) else encode(message)
        if self._lost is not None:
            raise LinkLost(self._lost)
        await self._write(functools.partial(self._stream.send, frame))
        if self._lost is not None:
            raise LinkLost(self._lost)

    async def _write(self, write: Callable[[], Awaitable[None]]) -> None:
        """``write()`` on the stream, alone there, unless the link is gone; an error loses it."""
        import anyio

        with self._until_lost():
            try:
                async with self._lock:
                    if self._lost is None:
                        await write()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._lose_here(f"broke the link ({exc!r})")

    async def receive(self) -> list[LinkMessage]:
        """The next messages that came (never an empty list); :class:`LinkLost` when gone."""
        import anyio

        if self.waiting_since is None:
            self.waiting_since = anyio.current_time()
        while True:
            data = b""
            with self._until_lost(), anyio.move_on_after(self.timeout) as quiet:
                try:
                    data = await self._stream.receive()
                except anyio.EndOfStream:
                    self._lose_here("closed the link")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self._lose_here(f"broke the link ({exc!r})")
            if quiet.cancelled_caught:
                self._lose_here(
                    f"went silent: nothing came over the link for {self.timeout:g} s "
                    "(link_timeout), so the link counts as cut"
                )
            if self._lost is not None:
                raise LinkLost(self._lost)
            try:
                messages = self._decoder.feed(data)
            except WireError as exc:
                self.lose(f"sent a bad frame ({exc})")
                raise LinkLost(str(self._lost)) from None
            kept = [m for m in messages if not isinstance(m, Heartbeat)]
            if kept:
                self.waiting_since = None
                return kept  # type: ignore[return-value]

    async def close(self) -> None:
        """End the link from this side once the other side has read all of it.

        Says end-of-stream (after any frame being sent), then reads and drops
        what still comes until the other side closes too, or the link is lost
        by its usual rules (silence past the deadline, a reset): see the
        module's docs for why a plain close can lose this side's last
        messages.  Stop :meth:`beat` first: nothing may be sent after this.
        """
        if self._lost is not None:
            return
        await self._write(self._stream.send_eof)
        while True:
            try:
                await self.receive()
            except LinkLost:
                return

    async def beat(self) -> None:
        """Send a heartbeat every :func:`heartbeat_interval` seconds until the link is gone.

        The beat is also this side's clock (see :meth:`_own_stall`): it keeps a
        schedule and never waits on a send itself (a heartbeat still on its way
        when the next is due is not doubled), so that whenever this process is
        stopped, the beat's next wake-up is already overdue when it runs again.
        """
        import anyio

        frame = encode(Heartbeat())
        interval = heartbeat_interval(self.timeout)
        sending = False

        async def send() -> None:
            nonlocal sending
            try:
                await self.send(frame)
            except LinkLost:
                pass
            finally:
                sending = False

        async with anyio.create_task_group() as tg:
            due = anyio.current_time() + interval
            while self._lost is None:
                self._due = due
                await anyio.sleep_until(due)
                now = anyio.current_time()
                late = now - due
                if late > interval:  # this side was not running meanwhile
                    self._stalled = (late, now)
                # On schedule: a stop that comes before the next sleep makes it overdue too.
                due = now + interval if late > interval else due + interval
                if not sending:
                    sending = True
                    tg.start_soon(send)


# -- the agent's configuration -------------------------------------------------------------

#: The variable that carries an agent's configuration (with srun; ssh sends it on stdin).
CONFIG_ENV: Final = "CORRAL_AGENT_CONFIG"


class AgentConfig(msgspec.Struct, frozen=True):
    """What an agent is told when it starts (base64 JSON in :data:`CONFIG_ENV` or on stdin)."""

    secret: str
    address: str
    port: int
    # The launch's options the agent keeps, as the launcher checked them: each named as
    # its option, which gives it its value (corral._launch._plan.Plan.agent_config).
    start_timeout: float  # to dial back
    link_timeout: float
    log_level: int
    host_log_dir: str | None
    index: int = -1  # -1: from SLURM_NODEID
    host: str = ""
    python: str = ""
    watch_stdin: bool = True
    usage: bool = False  # sample the workers, send Usage


def encode_config(**fields: Any) -> str:
    """The agent's configuration, for its stdin or environment (base64 JSON)."""
    return base64.b64encode(msgspec.json.encode(AgentConfig(**fields))).decode()


def decode_config(raw: str) -> AgentConfig:
    """The configuration :func:`encode_config` made."""
    return msgspec.json.decode(base64.b64decode(raw), type=AgentConfig)


def read_config() -> AgentConfig | None:
    """The agent's configuration: from :data:`CONFIG_ENV`, else the first line of stdin."""
    raw = os.environ.pop(CONFIG_ENV, None)
    if raw is None:
        raw = sys.stdin.buffer.readline().decode().strip()
    return decode_config(raw) if raw else None


def stdin_closed() -> bool:
    """Whether the agent's standard input is at end-of-file already (never waits).

    Under ssh it is the launcher's pipe to the ssh client: closed, the client is
    gone.  (A byte that is there is dropped: nothing comes after the configuration.)
    """
    try:
        readable, _, _ = select.select([0], [], [], 0)
        return bool(readable) and os.read(0, 1) == b""
    except (OSError, ValueError):
        return True  # no standard input at all
