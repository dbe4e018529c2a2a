"""Every buffer has a bound in bytes: the launcher's memory under floods and abuse.

Each test runs a launcher in another process (``tests/programs/launcher.py``, a runner that
obeys JSON commands on its stdin) and reads its resident size from ``/proc``: the growth
of its peak (``VmHWM``, reset through ``/proc/PID/clear_refs`` before the scenario)
over what it held before.  docs/howto/limits.rst lists every bound these tests check.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from tests.helpers.commands import Child, launched, stuck_client, websocket_request
from tests.helpers.loops import BOTH_LOOPS, one_loop
from tests.helpers.processes import ListHandler
from tests.monitor.test_monitor import LOOPBACK, MonitorClient, monitored
from tests.programs import program

import corral
from corral._core._pipes import CHUNK, STREAM_BUFFER
from corral._logs._collector import DEFAULT_MAX_BYTES
from corral._logs._router import MAX_LINE
from corral._logs._server import MAX_REFUSALS_REPORTED
from corral._logs._sources import (
    BACKLOG_BYTES,
    BACKLOG_RECORDS,
    BACKLOG_TOTAL_BYTES,
    TAIL_BYTES,
    Source,
)
from corral._logs._wire import MAX_HELLO
from corral._monitor import _asyncio as _monitor_asyncio
from corral._monitor import _trio as _monitor_trio
from corral._monitor._clients import (
    MESSAGE_BYTES,
    MIN_MESSAGE,
    QUEUE_BYTES,
    RECENT_BYTES,
    RECENT_MESSAGE,
    RECENT_RECORDS,
    SEND_BUDGET,
    STATE_QUEUE,
    Client,
    MonitorSink,
)
from corral._monitor._rows import ROW_BYTES, ROW_TEXT
from corral._monitor._server import (
    HANDSHAKE_TIMEOUT,
    MAX_CLIENT_MESSAGE,
    MAX_CLIENTS,
    USAGE_HISTORY,
    USAGE_HISTORY_BYTES,
    Monitor,
)

# One loop (tests/helpers/loops.py): the log path's buffers are the same whatever the loop.
# The monitor's two servers differ by loop (trio-websocket, websockets' asyncio server): what
# they hold for their clients, and the peers they refuse, is measured on both.
anyio_backend = one_loop()

PY = sys.executable
PIPE = subprocess.PIPE
LOG = corral.LOG


def lines_argv(count: int, length: int) -> list[str]:
    """A child that prints ``count`` lines of ``length`` bytes (newline included) as
    ``tests/programs/lines.py`` does, made of small C programs: a hundred of them cost far
    less than as many interpreters."""
    line = f"head -c {length - 1} /dev/zero | tr '\\0' x; echo"
    return ["sh", "-c", f"i=0; while [ $i -lt {count} ]; do {line}; i=$((i + 1)); done"]


class Launcher(Child):
    """``tests/programs/launcher.py``: ``url``, ``command()``, ``memory()``, ``run()``."""

    def command(self, *command: Any, timeout: float = 60) -> str:
        """Send a command; return its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()
        return self.wait_line(lambda line: line.startswith(f"ok {command[0]}"), timeout)

    def memory(self) -> tuple[int, int]:
        """Its resident size now and at its peak since the last reset, in KiB."""
        _, _, rss, hwm = self.command("memory").split()
        return int(rss), int(hwm)

    def reset(self) -> int:
        """Reset its peak resident size; its resident size now (KiB)."""
        return int(self.command("reset").split()[2])

    def run(self, children: int, name: str, *argv: object, timeout: float = 60) -> float:
        """Run ``children`` copies of the program ``name`` at once; seconds until their lines
        were in."""
        return self.run_costs(children, name, *argv, timeout=timeout)[0]

    def run_costs(
        self, children: int, name: str, *argv: object, timeout: float = 60
    ) -> tuple[float, float]:
        """:meth:`run`'s seconds, and the CPU seconds the launcher spent meanwhile.

        ``argv[0]``, if there is one, is how many lines each child prints (as for
        ``lines.py``); the launcher counts them if told to (``counting``).
        """
        each = int(str(argv[0])) if argv and str(argv[0]).isdigit() else 0
        return self.run_argv(children, each, program(name, *argv), timeout=timeout)

    def run_argv(
        self, children: int, each: int, argv: list[str], timeout: float = 60
    ) -> tuple[float, float]:
        """Run ``children`` copies of ``argv`` at once, ``each`` printing so many lines."""
        answer = self.command("run", children, each, argv, timeout=timeout)
        words = answer.split()
        return float(words[2]), float(words[4])


@contextmanager
def launcher(
    tmp_path: Path, backend: str, *, counting: bool = False, **options: Any
) -> Iterator[Launcher]:
    """``launcher.py`` with the runner's ``options``; it must end well once its input is
    closed."""
    config = json.dumps({"runner": options, "counting": counting})
    with launched(Launcher, program("launcher", backend, config), tmp_path / "launcher") as child:
        yield child
        child.end_input()
        assert child.finish(timeout=30) == 0, child.text()


def grown_mib(runner: Launcher, before: int) -> float:
    """How far the launcher's peak rose above ``before`` (KiB), in MiB."""
    _, peak = runner.memory()
    return (peak - before) / 1024


# -- the monitor -------------------------------------------------------------------------------


@contextmanager
def stuck_clients(runner: Launcher, count: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stuck_client(runner.url)
            stack.callback(sock.close)
            socks.append(sock)
        runner.command("clients", count)
        yield socks
    runner.command("clients", 0)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_monitor_without_clients_keeps_megabyte_lines_bounded(
    tmp_path: Path, anyio_backend: str
) -> None:
    """300 lines of 1 MiB with nobody watching: the monitor keeps a bounded recent part."""
    with launcher(tmp_path, anyio_backend, monitor=True) as runner:
        runner.run(1, "lines", 10, 1 << 20)  # warm up
        before = runner.reset()
        runner.run(1, "lines", 300, 1 << 20)
        grown = grown_mib(runner, before)
    # Without a monitor the same flood costs the launcher 8 to 14 MiB (the collector's
    # queue, a read being split); the monitor may add its recent-output buffer.
    assert grown < 40, f"the launcher grew by {grown:.0f} MiB"


@pytest.mark.slow
@BOTH_LOOPS
@pytest.mark.timeout(60)
@pytest.mark.parametrize("clients", [1, 200])
def test_stuck_monitor_clients_cost_bounded_memory(
    tmp_path: Path, anyio_backend: str, clients: int
) -> None:
    """Clients that never read, 16 KiB lines: bounded per client and in total."""
    with launcher(tmp_path, anyio_backend, monitor=True) as runner:
        runner.run(1, "lines", 2000, 16384)  # warm up
        with stuck_clients(runner, clients):
            before = runner.reset()
            runner.run(1, "lines", 20_000, 16384)  # 320 MiB
            grown = grown_mib(runner, before)
    assert grown < 48, f"{clients} stuck clients: the launcher grew by {grown:.0f} MiB"


@pytest.mark.slow
@BOTH_LOOPS
@pytest.mark.timeout(120)
def test_two_hundred_stuck_clients_barely_slow_a_flood(tmp_path: Path, anyio_backend: str) -> None:
    """The launcher's CPU for a flood, with 200 clients that never read and without any.

    CPU seconds, the launcher's own (all its threads): what a client costs is work, and a busy
    machine that stretches the wall time of a run leaves its CPU time about as it was.
    """
    lines = 20_000
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    with launcher(tmp_path, anyio_backend, monitor=True, counting=True) as runner:
        runner.run(1, "lines", lines, 200)  # warm up
        for _ in range(2):
            cpu["without"].append(runner.run_costs(1, "lines", lines, 200)[1])
        with stuck_clients(runner, 200):
            runner.run(1, "lines", lines, 200)  # every client is stuck by now
            for _ in range(3):
                cpu["with"].append(runner.run_costs(1, "lines", lines, 200)[1])
        for _ in range(2):  # before and after: a drift of the machine's load weighs on neither
            cpu["without"].append(runner.run_costs(1, "lines", lines, 200)[1])
    without, with_stuck = statistics.median(cpu["without"]), statistics.median(cpu["with"])
    # The target is 10% (bench/monitor.py measures it); what this catches is work per client
    # and read (that made it 9-12x slower).  At this small a flood a loaded machine was seen
    # at 1.6x (the 200 clients' fixed costs weigh more), so the bound is 3x, far under the bug.
    assert with_stuck <= 3 * without, cpu


# -- nothing unauthenticated costs memory --------------------------------------------------------


def _peer_address(runner: Launcher, where: str) -> tuple[int, Any]:
    """The family and address of the monitor (``where="monitor"``) or of the log socket."""
    if where == "monitor":
        parts = urllib.parse.urlsplit(runner.url)
        return socket.AF_INET, (parts.hostname, parts.port)
    return socket.AF_UNIX, runner.command("socket").split(maxsplit=2)[2]


def _connect(family: int, address: Any) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(address)
    sock.setblocking(False)
    return sock


def _send(peers: list[socket.socket], data: bytes) -> None:
    for sock in peers:
        try:
            sock.send(data)
        except OSError:
            pass  # full, or closed on us already: that is the point


def _hostile_peers(runner: Launcher, where: str, abuse: str) -> list[socket.socket]:
    """Connections that abuse the listener before it checked them; still open.

    ``"huge"``: 100 peers that announce a frame of a gigabyte, or send a megabyte
    of request headers; ``"many"``: 400 peers that each send a hello or a request
    head as long as the listener has ever accepted, all but its last byte.
    """
    family, address = _peer_address(runner, where)
    peers = [_connect(family, address) for _ in range(100 if abuse == "huge" else 400)]
    if where == "monitor":
        head = b"GET /?token=wrong HTTP/1.1\r\nHost: x\r\n"
        if abuse == "huge":
            line = b"X-" + b"a" * 8000 + b": b\r\n"  # as long as a header line may be
            for _ in range(4):
                _send(peers, head + line * 128)  # megabytes of headers, never ending
        else:
            _send(peers, head + (b"X-" + b"a" * 1000 + b": b\r\n") * 15)
    elif abuse == "huge":
        for _ in range(4):
            _send(peers, struct.pack(">I", 1 << 30) + b"x" * (1 << 20))
    else:
        _send(peers, struct.pack(">I", MAX_HELLO) + b"x" * (MAX_HELLO - 1))
    return peers


def _honest_monitor_client(url: str) -> dict[str, Any]:
    from websockets.sync.client import connect

    with connect(url.replace("http://", "ws://"), open_timeout=10) as ws:
        message = json.loads(ws.recv(timeout=10))
        assert isinstance(message, dict)
        return message


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("anyio_backend", "where"),
    [("asyncio", "monitor"), ("trio", "monitor"), ("asyncio", "log socket")],
)
@pytest.mark.parametrize("abuse", ["huge", "many"])
def test_unauthenticated_peers_cost_a_few_mib_and_honest_ones_still_work(
    tmp_path: Path, anyio_backend: str, where: str, abuse: str
) -> None:
    """Peers that announce huge frames or send endless request headers, or many that
    hold what they may before the listener checked them: the launcher barely grows."""
    with launcher(tmp_path, anyio_backend, monitor=True, counting=True) as runner:
        runner.run(1, "honest_logger", 0)  # warm up
        _honest_monitor_client(runner.url)
        before = runner.reset()
        peers = _hostile_peers(runner, where, abuse)
        try:
            grown = grown_mib(runner, before)
            # Meanwhile, the honest still get through.
            assert _honest_monitor_client(runner.url)["type"] == "hello"
            answer = runner.command("run", 1, 1, program("honest_logger", 1)).split()
            assert answer[3] == "1", answer
            grown = max(grown, grown_mib(runner, before))
        finally:
            for sock in peers:
                sock.close()
    # What may be held: 64 pending connections of at most 16 KiB each, their transports and
    # parsers, and what the allocator keeps after a burst of 400 accepts.  Measured: 1.6-2.2 MiB
    # on Trio, 2.9-4.4 MiB on asyncio (websockets' connections); without the bounds, 800 MiB.
    assert grown < 6, f"{abuse} peers on the {where}: the launcher grew by {grown:.1f} MiB"


# -- tail backlogs and live tails ----------------------------------------------------------------


def _text(records: list[logging.LogRecord]) -> int:
    return sum(len(record.getMessage()) for record in records)


@pytest.mark.anyio
async def test_a_backlog_keeps_to_its_bound_in_bytes() -> None:
    """Four lines of 1 MiB, then a tail: it gets the end of the last one, 256 KiB."""
    async with corral.open_runner(console=False) as r:
        p = await r.start(program("lines", 4, 1 << 20), name="big")
        await p.wait()
        records = [record async for record in p.logs()]
        q = await r.start(program("lines", 5000, 100), name="many")
        await q.wait()
        many = [record async for record in q.logs()]
    assert _text(records) <= BACKLOG_BYTES
    [record] = records
    message = record.getMessage()
    assert message.startswith("[...] ") and message.endswith("x" * 1000), message[:20]
    assert len(message) == BACKLOG_BYTES
    # Short lines: the newest BACKLOG_RECORDS of them, whole.
    assert [len(record.getMessage()) for record in many] == [99] * BACKLOG_RECORDS


@pytest.mark.anyio
async def test_the_backlogs_of_all_sources_keep_to_their_total() -> None:
    """40 children of 1 MiB of output each: the newest output is kept, 8 MiB of it."""
    kept: list[int] = []
    async with corral.open_runner(console=False) as r:
        procs = []
        for i in range(40):
            p = await r.start(lines_argv(2, 1 << 19), name=f"c{i}")
            await p.wait()
            procs.append(p)
        for p in procs:
            kept.append(_text([record async for record in p.logs()]))
    assert sum(kept) <= BACKLOG_TOTAL_BYTES
    assert all(size <= BACKLOG_BYTES for size in kept)
    # The newest sources keep theirs whole (256 KiB each), the oldest lost theirs.
    assert kept[-8:] == [BACKLOG_BYTES] * 8, kept
    assert kept[0] == 0, kept
    assert sum(kept) > BACKLOG_TOTAL_BYTES - 2 * BACKLOG_BYTES, kept


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_backlogs_of_many_children_cost_a_bounded_total(tmp_path: Path, anyio_backend: str) -> None:
    """100 children with two lines of 1 MiB each, no handler, no tail: bounded in total.

    (Each stream held its unfinished line of up to 1 MiB, and each source a backlog of
    1 MiB: the launcher grew by 100 to 220 MiB.)"""
    with launcher(tmp_path, anyio_backend) as runner:
        runner.run_argv(4, 2, lines_argv(2, 1 << 20))  # warm up
        before = runner.reset()
        runner.run_argv(100, 2, lines_argv(2, 1 << 20))
        grown = grown_mib(runner, before)
    # The backlogs, the unfinished lines and the collector's queue, 8 MiB at most each
    # (31 to 38 MiB measured, 48 once on a loaded machine), and slack for the allocator;
    # unbounded, it grew by 100 to 220 MiB.
    assert grown < 64, f"the launcher grew by {grown:.0f} MiB"


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["stdout", "logging"])
async def test_a_tail_that_is_not_read_holds_a_bounded_amount(kind: str) -> None:
    """A tail opened and never read: its buffer of 1,024 records is bounded in bytes too,
    and the child is held back (over its pipe and over its log connection alike)."""
    async with corral.open_runner(console=False) as r:
        p = await r.start(program("held_back", kind, 400), name="held", check=False)
        tail = p.logs()
        code = await p.wait()
        held = _text(list(tail._records))
        tail.close()
    assert code == 3, "the child was never held back"
    # TAIL_BYTES, and what the collector had then: the batch being routed and the
    # queue behind it (each at most its bound and one read), and what the pipe held.
    bound = TAIL_BYTES + 2 * (DEFAULT_MAX_BYTES + CHUNK) + 64 * 1024
    assert held < bound, f"the tail held {held / 2**20:.1f} MiB"


# -- the monitor's other bounds --------------------------------------------------------------------


@pytest.mark.slow
@BOTH_LOOPS
@pytest.mark.timeout(90)
def test_the_monitor_refuses_clients_beyond_its_bound(tmp_path: Path, anyio_backend: str) -> None:
    with launcher(tmp_path, anyio_backend, monitor=True) as runner:
        with stuck_clients(runner, MAX_CLIENTS) as clients:
            parts = urllib.parse.urlsplit(runner.url)
            with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
                sock.sendall(websocket_request(runner.url))
                answer = b""
                while data := sock.recv(65536):
                    answer += data
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert answer.endswith(b"too many clients\n"), answer
            clients.pop().close()
            runner.command("clients", MAX_CLIENTS - 1)
            stuck_client(runner.url).close()  # one left: there is room for another
        runner.command("clients", 0)


@pytest.mark.anyio
async def test_a_long_record_reaches_clients_cut_in_the_middle() -> None:
    logs = ListHandler()
    line = "a" * 50_000 + "b" * 50_000
    async with monitored(handlers=[logs]) as (r, readers):
        assert r.monitor_url is not None
        client = await MonitorClient.connect(r.monitor_url)
        await r.run([PY, "-c", f"print({line!r})"], name="long")
        row = await client.wait_row(lambda row: row[0] == "demo.long")
        readers.append(client)
    half = ROW_TEXT // 2
    assert row[5] == "a" * half + "\n[... 83616 characters cut ...]\n" + "b" * half
    assert logs.lines("demo.long") == [line]  # the handlers have it whole


@BOTH_LOOPS
@pytest.mark.anyio
async def test_a_client_message_over_the_bound_closes_only_that_client() -> None:
    async with monitored() as (r, readers):
        assert r.monitor_url is not None
        big = await MonitorClient.connect(r.monitor_url)
        other = await MonitorClient.connect(r.monitor_url)
        await big.send({"type": "filter", "source": "x" * MAX_CLIENT_MESSAGE})
        await big.rest()  # closed on it
        assert big._protocol.close_code == 1009  # message too big
        await r.run([PY, "-c", "print('still here')"], name="after")
        await other.wait_row(lambda row: row[5] == "still here")
        readers.append(other)


@BOTH_LOOPS
@pytest.mark.anyio
@pytest.mark.timeout(20)
async def test_a_request_that_never_ends_is_closed_at_the_handshake_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The deadline is HANDSHAKE_TIMEOUT (5 s); each server reads it when it needs it, and here
    # it is 1 s, so that the test waits out less.  The lower bound shows the deadline is kept.
    deadline = 1.0
    assert HANDSHAKE_TIMEOUT == 5.0  # what docs/howto/monitor.rst and limits.rst say
    monkeypatch.setattr(_monitor_trio, "HANDSHAKE_TIMEOUT", deadline)
    monkeypatch.setattr(_monitor_asyncio, "HANDSHAKE_TIMEOUT", deadline)
    async with corral.open_runner(name="demo", monitor=LOOPBACK, console=False) as r:
        assert r.monitor_url is not None
        port = urllib.parse.urlsplit(r.monitor_url).port
        assert port is not None
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            start = time.monotonic()
            await stream.send(b"GET /?token=")
            with anyio.fail_after(deadline + 10):
                try:
                    while True:
                        await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    pass
            took = time.monotonic() - start
    assert deadline - 0.1 < took < deadline + 5, took  # room above: a loaded machine


# -- the monitor's queue, on its own --------------------------------------------------------------


def _take_all(sink: MonitorSink, client: Client) -> tuple[list[Any], int, list[int]]:
    """Everything waiting for ``client``: its rows, the drops it was told of, message sizes."""
    rows: list[Any] = []
    dropped = 0
    sizes = []
    more = True
    while more:
        messages, size, more = sink.take(client)
        sink.sent(size)
        sizes.append(size)
        for message in messages:
            decoded = json.loads(message)
            if decoded["type"] == "logs":
                rows += decoded["records"]
            elif decoded["type"] == "dropped":
                dropped += decoded["count"]
    return rows, dropped, sizes


def _joined(sink: MonitorSink, source: str = "*", level: int = 0) -> Client:
    client = Client(source, level)
    client.state = sink.state_position()
    _, size, _ = sink.join(client)
    sink.sent(size)
    return client


def test_the_monitor_queue_keeps_to_its_bounds_and_counts_what_a_client_lost() -> None:
    sink = MonitorSink(Monitor(True, "demo"))
    a, b = Source("demo.a", "a"), Source("demo.b", "b")
    read = b"\n".join([b"x" * 1023] * 64)  # a read of 64 lines, 64 KiB
    # No client: only the recent part is kept.
    for _ in range(100):
        sink.write_lines(a, "stdout", 20, 0.0, read)
    records, nbytes = sink.held
    assert nbytes <= RECENT_BYTES + len(read) + 200
    assert RECENT_RECORDS <= records <= RECENT_RECORDS + 64
    # Two clients that do not read, one of them for demo.a only; 19 MiB of output.
    everything, only_a = _joined(sink), _joined(sink, "demo.a")
    _take_all(sink, everything)
    _take_all(sink, only_a)
    for i in range(300):
        sink.write_lines(a if i % 3 else b, "stdout", 20, 0.0, read)
        assert sink.held[1] <= QUEUE_BYTES + len(read) + 200
    # Each is told exactly how much it lost, and gets the rest.
    rows, dropped, sizes = _take_all(sink, everything)
    assert dropped > 0 and len(rows) + dropped == 300 * 64
    assert max(sizes) <= MESSAGE_BYTES + ROW_BYTES
    rows, dropped, _ = _take_all(sink, only_a)
    assert {row[0] for row in rows} == {"demo.a"}
    assert dropped > 0 and len(rows) + dropped == 200 * 64
    # The last client gone, the queue shrinks to the recent part again.
    sink.detach(everything)
    sink.detach(only_a)
    assert sink.held[1] <= RECENT_BYTES + len(read) + 200


def test_the_monitor_keeps_a_bounded_share_of_messages_on_their_way() -> None:
    sink = MonitorSink(Monitor(True, "demo"))
    a = Source("demo.a", "a")
    clients = [_joined(sink) for _ in range(MAX_CLIENTS)]
    for _ in range(64):
        sink.write_lines(a, "stdout", 20, 0.0, b"\n".join([b"x" * 1023] * 64))
    # Every client is made a message it does not take off (a client that does not read).
    on_their_way = [sink.take(client)[1] for client in clients]
    assert sum(on_their_way) <= SEND_BUDGET + MAX_CLIENTS * MIN_MESSAGE
    assert min(on_their_way) >= ROW_BYTES // 2  # and each one gets something
    for size in on_their_way:
        sink.sent(size)


def test_a_client_far_behind_on_states_gets_the_newest_of_each_process() -> None:
    sink = MonitorSink(Monitor(True, "demo"))
    client = _joined(sink)
    for i in range(STATE_QUEUE + 500):
        sink.push_state(f"p{i % 3}", json.dumps({"type": "process", "n": i}).encode())
    messages, size, more = sink.take(client)
    sink.sent(size)
    assert not more
    assert sorted(json.loads(m)["n"] for m in messages) == [
        STATE_QUEUE + 497,
        STATE_QUEUE + 498,
        STATE_QUEUE + 499,
    ]


def test_the_monitor_keeps_a_bounded_history_of_what_processes_cost() -> None:
    monitor = Monitor(True, "demo")
    sink = MonitorSink(monitor)
    client = _joined(sink)
    figures = {f"worker-{i}": corral.ResourceUsage(1000 + i, 99.5, 1 << 30) for i in range(8)}
    for second in range(USAGE_HISTORY + 100):
        monitor.usage_event(1_700_000_000.0 + second, figures)
    count, nbytes = monitor.usage_history
    assert count == USAGE_HISTORY and nbytes <= USAGE_HISTORY_BYTES
    hello = json.loads(monitor._snapshot())  # what a client that comes now gets first
    assert [s["time"] for s in hello["usage"]] == [
        1_700_000_000.0 + second for second in range(100, USAGE_HISTORY + 100)
    ]
    # A client behind gets the newest sample only.
    messages, size, _ = sink.take(client)
    sink.sent(size)
    [usage] = [json.loads(m) for m in messages]
    assert usage["type"] == "usage" and usage["time"] == 1_700_000_000.0 + USAGE_HISTORY + 99
    # Many processes: the bound in bytes holds (the newest sample always stays).
    many = {f"agent-{i}.worker-{i}": corral.ResourceUsage(i, 1.0, 1 << 20) for i in range(2000)}
    for second in range(10):
        monitor.usage_event(1_800_000_000.0 + second, many)
        count, nbytes = monitor.usage_history
        assert nbytes <= USAGE_HISTORY_BYTES or count == 1
    assert count < 10


# -- the other bounds of the log path ------------------------------------------------------------


@pytest.mark.anyio
async def test_refused_log_connections_are_reported_a_bounded_number_of_times() -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        code = "import os; print(os.environ['CORRAL_LOG_SOCKET'])"
        path = (await r.run([PY, "-c", code], stdout=PIPE)).stdout.decode().strip()
        for _ in range(MAX_REFUSALS_REPORTED + 10):
            async with await anyio.connect_unix(path) as peer:
                await peer.send(struct.pack(">I", 1 << 30))  # no hello
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await peer.receive()
    refused = [m for m in logs.messages("corral") if "is no hello" in m]
    assert len(refused) == MAX_REFUSALS_REPORTED, refused
    assert refused[-1].endswith("(further connections refused before their hello go unreported)")


@pytest.mark.anyio
async def test_pipes_are_read_a_bounded_block_at_a_time() -> None:
    """A child that writes 4 MiB at once: each read of its pipe is at most CHUNK bytes."""
    async with corral.open_runner(console=False) as r:
        code = "import os\nos.write(1, b'x' * (4 << 20))"
        p = await r.start([PY, "-c", code], stdout=LOG | PIPE)
        assert p.stdout is not None
        reads = []
        with anyio.fail_after(20):
            try:
                while True:
                    reads.append(len(await p.stdout.receive(1 << 30)))
            except anyio.EndOfStream:
                pass
        await p.wait()
    assert sum(reads) == 4 << 20
    assert max(reads) <= CHUNK


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_an_unread_log_and_pipe_stream_holds_a_bounded_amount() -> None:
    async with corral.open_runner(console=False) as r:
        argv = program("held_back", "stdout", 400)  # 25 MiB
        p = await r.start(argv, name="held", stdout=LOG | PIPE, check=False)
        assert p.stdout is not None
        code = await p.wait()
        held = 0
        with anyio.fail_after(10):
            try:
                while True:
                    held += len(await p.stdout.receive(1 << 30))
            except anyio.EndOfStream:
                pass
    assert code == 3, "the child was never held back"
    # STREAM_BUFFER, the read that crossed it, and what the pipe held at the exit.
    assert held <= STREAM_BUFFER + 2 * CHUNK, held


@pytest.mark.anyio
async def test_a_line_longer_than_the_bound_is_delivered_in_pieces() -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        code = "import os\nos.write(1, b'x' * (MAX_LINE * 2 + 100) + b'\\nend\\n')"
        await r.run([PY, "-c", code.replace("MAX_LINE", str(MAX_LINE))], name="long")
    assert [len(line) for line in logs.lines("corral.long")] == [MAX_LINE, MAX_LINE, 100, 3]


# -- the table -------------------------------------------------------------------------------------


def test_every_row_of_the_table_of_buffers_names_tests_that_exist() -> None:
    """docs/howto/limits.rst: each buffer's row names the tests that hold its bound."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "howto" / "limits.rst").read_text()
    table = text[text.index(".. _buffers:") :]
    rows = re.split(r"\n   \* - ", table)[2:]  # after the header row
    assert len(rows) >= 24, len(rows)
    for row in rows:
        cells = re.split(r"\n     - ", row)
        assert len(cells) == 4, row
        named = re.findall(r"``(test_\w+)::(test_\w+)``", cells[3])
        if cells[3].strip() == "—":
            assert "none" in cells[1], row  # only a buffer with no bound has no test
            continue
        assert named, row
        for module, test in named:
            found = sorted((root / "tests").rglob(f"{module}.py"))
            assert found, (module, "no such test module")
            source = found[0].read_text()
            assert re.search(rf"^(async )?def {test}\(", source, re.MULTILINE), (module, test)


@pytest.mark.anyio
@pytest.mark.parametrize("length", [10, 1000])
async def test_a_client_gets_the_newest_records_from_before_it_in_one_message(
    length: int,
) -> None:
    async with monitored() as (r, readers):
        assert r.monitor_url is not None
        # One write of everything (up to the pipe's size), so that the record
        # count does not depend on how the reads happened to split the lines.
        code = (
            "import sys; sys.stdout.write(''.join("
            f"f'{{i:06d}}' + 'x' * {length - 6} + '\\n' for i in range(600)))"
        )
        await r.run([PY, "-c", code], name="before")
        client = await MonitorClient.connect(
            r.monitor_url,
        )
        hello, first = await client.recv(), await client.recv()
        readers.append(client)
    assert hello is not None and hello["type"] == "hello"
    assert first is not None and first["type"] == "logs"
    numbers = [int(row[5][:6]) for row in first["records"] if row[0] == "demo.before"]
    assert numbers == list(range(600 - len(numbers), 600))  # the newest, in order
    if length == 10:
        assert len(first["records"]) == RECENT_RECORDS
    else:
        assert 20 < len(numbers) < RECENT_RECORDS
        assert len(json.dumps(first)) <= RECENT_MESSAGE + 4096
