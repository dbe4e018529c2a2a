"""The link's clock, on a fake one: heartbeats, deadlines and stalls to the exact second.

Each test runs on Trio with ``MockClock(autojump_threshold=0)`` (pytest-trio's
``autojump_clock``): whenever every task waits, time jumps to the next deadline, so an hour
of link time takes no time at all and every figure is exact, whatever the machine's load.
The links are real: :class:`Link` over the two ends of a Unix socket pair, the frames those
of the wire.  What only real time shows (a kernel that drops a host's packets, a process
stopped by SIGSTOP, ssh) keeps one real-time case per fault in ``test_link_faults.py``.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
import trio
import trio.testing

from corral._launch._link import (
    MAX_LINK_FRAME,
    Heartbeat,
    Lines,
    Link,
    LinkLost,
    decoder,
    encode,
    heartbeat_interval,
)
from corral._logs._wire import FrameDecoder

pytestmark = [pytest.mark.trio, pytest.mark.timeout(30)]

TIMEOUT = 30.0  # a link_timeout in link seconds: any value, the clock is fake
INTERVAL = heartbeat_interval(TIMEOUT)


@asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[anyio.abc.SocketStream, anyio.abc.SocketStream]]:
    """Two connected ends of a real Unix socket pair, as AnyIO streams."""
    a, b = socket.socketpair()
    async with (
        await anyio.abc.SocketStream.from_socket(a) as ours,
        await anyio.abc.SocketStream.from_socket(b) as theirs,
    ):
        yield ours, theirs


async def read_frames(stream: anyio.abc.SocketStream, times: list[float], count: int) -> None:
    """Read frames off ``stream``, noting the link time of each heartbeat, ``count`` of them."""
    frames = FrameDecoder(MAX_LINK_FRAME, decoder())
    while len(times) < count:
        for message in frames.feed(await stream.receive()):
            if isinstance(message, Heartbeat):
                times.append(trio.current_time())


async def test_heartbeats_come_on_schedule(autojump_clock: trio.testing.MockClock) -> None:
    """A heartbeat every heartbeat_interval(link_timeout) seconds, exactly, for an hour."""
    count = int(3600 / INTERVAL)
    times: list[float] = []
    async with socket_pair() as (ours, theirs), anyio.create_task_group() as tg:
        link = Link(ours, TIMEOUT)
        started = trio.current_time()
        tg.start_soon(link.beat)
        await read_frames(theirs, times, count)
        tg.cancel_scope.cancel()
    gaps = [b - a for a, b in zip([started, *times], times, strict=False)]
    assert gaps == pytest.approx([INTERVAL] * count)
    assert INTERVAL < TIMEOUT / 2  # several beats fit in a deadline: one lost beat is no loss


async def test_a_silent_link_is_lost_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Nothing comes: receive() raises LinkLost after link_timeout, not before, not later."""
    async with socket_pair() as (ours, _theirs):
        link = Link(ours, TIMEOUT)
        started = trio.current_time()
        with (
            anyio.fail_after(10 * TIMEOUT),
            pytest.raises(LinkLost, match=r"went silent: nothing came over the link for 30 s"),
        ):
            await link.receive()
        assert trio.current_time() - started == pytest.approx(TIMEOUT)
    assert link.lost is not None


async def test_heartbeats_keep_a_quiet_link_alive(autojump_clock: trio.testing.MockClock) -> None:
    """With the other side beating, a receive that gets no message waits for as long as it
    takes (here 100 deadlines), then returns the message that came."""
    async with socket_pair() as (ours, theirs), anyio.create_task_group() as tg:
        link, peer = Link(ours, TIMEOUT), Link(theirs, TIMEOUT)
        tg.start_soon(peer.beat)
        message = Lines("worker-0", "stdout", 20, 0.0, b"at last\n")

        async def late() -> None:
            await anyio.sleep(100 * TIMEOUT)
            await peer.send(message)

        tg.start_soon(late)
        started = trio.current_time()
        assert await link.receive() == [message]
        assert trio.current_time() - started == pytest.approx(100 * TIMEOUT)
        tg.cancel_scope.cancel()
    assert link.lost is None


@pytest.mark.parametrize("factor", [1.01, 3.0])
async def test_heartbeats_slower_than_the_deadline_lose_the_link(
    autojump_clock: trio.testing.MockClock, factor: float
) -> None:
    """A peer that beats less often than link_timeout (a deadline too short for its link) is
    lost at the first gap longer than the deadline."""
    async with socket_pair() as (ours, theirs):
        link = Link(ours, TIMEOUT)
        raw = encode(Heartbeat())

        async def slow_beats() -> None:
            while True:
                await theirs.send(raw)
                await anyio.sleep(factor * TIMEOUT)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_beats)
            started = trio.current_time()
            with anyio.fail_after(10 * TIMEOUT), pytest.raises(LinkLost, match="went silent"):
                await link.receive()
            # The first beat came at once; the deadline ran from the wait's last data.
            assert trio.current_time() - started == pytest.approx(TIMEOUT)
            tg.cancel_scope.cancel()


async def test_a_stall_of_this_side_is_named_in_the_loss(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """This side was not running (its loop blocked, SIGSTOP) for about link_timeout: its
    heartbeat wakes that late, and the loss that follows blames this side, not the peer."""
    async with socket_pair() as (ours, theirs):
        link = Link(ours, TIMEOUT)
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.beat)
            await anyio.sleep(2.5 * INTERVAL)  # the beat sleeps, due at 3 intervals
            autojump_clock.jump(TIMEOUT)  # nothing of this side runs meanwhile: a stall
            await anyio.sleep(0)  # the beat wakes, TIMEOUT - INTERVAL / 2 late
            tg.cancel_scope.cancel()  # (no more beats: the loss is the peer's close)
        await theirs.aclose()  # the peer, hearing nothing, gave up
        with pytest.raises(LinkLost) as lost:
            await link.receive()
    # Woken TIMEOUT - INTERVAL / 2 late: 26.25 s, more than the deadline less one beat.
    assert str(lost.value).startswith(
        "lost the link because this launcher was not running for at least 26.2 s"
    ), lost.value
    # (A close with heartbeats unread on the peer's side is a reset here: broken, not closed.)
    assert re.search(r"\(then, here, it (closed|broke) the link", str(lost.value)), lost.value


async def test_a_short_stall_is_a_note_and_an_old_one_is_forgotten(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stall shorter than the deadline is noted in a loss that follows; one that ended more
    than link_timeout ago is not."""
    for wait_after, noted in ((0.0, True), (TIMEOUT + INTERVAL, False)):
        async with socket_pair() as (ours, theirs):
            link = Link(ours, TIMEOUT)
            async with anyio.create_task_group() as tg:
                tg.start_soon(link.beat)
                await anyio.sleep(0.5 * INTERVAL)
                autojump_clock.jump(2 * INTERVAL)  # beyond one interval: a stall
                await anyio.sleep(0)
                await anyio.sleep(wait_after)
                tg.cancel_scope.cancel()
            await theirs.aclose()
            with pytest.raises(LinkLost) as lost:
                await link.receive()
        said = str(lost.value)
        assert said.startswith(("closed the link", "broke the link")), said
        assert ("this launcher itself was not running" in said) is noted, said


async def test_a_heartbeat_behind_a_blocked_send_keeps_the_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While a send waits (a peer that reads nothing), the heartbeat's clock goes on: no beat
    is queued behind it, and the first beat after the peer reads comes on schedule."""
    async with socket_pair() as (ours, theirs):
        ours.extra(anyio.abc.SocketAttribute.raw_socket).setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
        )
        link = Link(ours, TIMEOUT)
        big = Lines("worker-0", "stdout", 20, 0.0, b"x" * (4 << 20))
        got: list[tuple[float, object]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.beat)
            tg.start_soon(link.send, big)
            await anyio.sleep(10.5 * INTERVAL)  # ten beats came due behind the big send
            frames = FrameDecoder(MAX_LINK_FRAME, decoder())
            read_from = trio.current_time()
            while sum(isinstance(m, Heartbeat) for _, m in got) < 2:
                data = await theirs.receive()
                got += [(trio.current_time(), m) for m in frames.feed(data)]
            tg.cancel_scope.cancel()
    assert [m for _, m in got[:2]] == [big, Heartbeat()], got[:3]
    first, second = [t for t, m in got if isinstance(m, Heartbeat)][:2]
    assert first == pytest.approx(read_from), "no beat waited behind the send but one"
    # The next one comes on the schedule kept meanwhile: within an interval of the read.
    assert read_from < second <= read_from + INTERVAL + 1e-6
    assert link.lost is None
