"""The log server and the child handler, end to end: real sockets, real processes."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Generic, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from corral._logserver import _RECORDS_PER_CHECKPOINT, LogServer
from corral._wire import ENV_SECRET, ENV_SOCKET, ENV_SOURCE, PROTOCOL_VERSION, Hello, Record, encode

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SRC = str(Path(__file__).resolve().parents[1] / "src")
PRELUDE = "import logging, os, sys, threading, time\nfrom corral._child_logging import connect\n"

T = TypeVar("T")


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Collected(Generic[T]):
    """A list that a test can wait on, filled from the event loop's thread."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._changed: anyio.Event | None = None

    def add(self, item: T) -> None:
        self.items.append(item)
        if self._changed is not None:
            self._changed.set()

    async def until(self, predicate: Callable[[list[T]], bool]) -> None:
        while not predicate(self.items):
            self._changed = anyio.Event()
            await self._changed.wait()

    async def count(self, n: int) -> None:
        await self.until(lambda items: len(items) >= n)


class Sink(Collected[logging.LogRecord]):
    async def deliver(self, record: logging.LogRecord) -> None:
        self.add(record)

    def messages(self, source: str | None = None) -> list[str]:
        return [
            r.getMessage()
            for r in self.items
            if source is None or getattr(r, "corral_source", None) == source
        ]


class WarningCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: Collected[logging.LogRecord] = Collected()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.add(record)

    async def wait(self, reason: str, pid: int | None = None) -> logging.LogRecord:
        def match(r: logging.LogRecord) -> bool:
            return reason in getattr(r, "corral_reason", "") and (
                pid is None or getattr(r, "corral_peer_pid", None) == pid
            )

        await self.seen.until(lambda items: any(map(match, items)))
        return next(r for r in self.seen.items if match(r))


@pytest.fixture
def warnings_seen() -> Iterator[WarningCatcher]:
    catcher = WarningCatcher()
    logger = logging.getLogger("corral.logserver")
    logger.addHandler(catcher)
    try:
        yield catcher
    finally:
        logger.removeHandler(catcher)


def child_env(server: LogServer | None, source: str, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = SRC
    if server is not None:
        env.update(server.env(source))
    env.update(overrides)
    return env


@asynccontextmanager
async def open_child(
    code: str, env: dict[str, str], *, start_new_session: bool = False
) -> AsyncIterator[anyio.abc.Process]:
    """A child with pipes on all three streams, killed if still running at the end."""
    process = await anyio.open_process(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=start_new_session,
    )
    try:
        async with process:
            try:
                yield process
            finally:
                if process.returncode is None:
                    process.kill()
    finally:
        with anyio.CancelScope(shield=True):
            await process.wait()


async def run_child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, check=False
    )


class Lines:
    def __init__(self, proc: anyio.abc.Process) -> None:
        assert proc.stdout is not None
        self._buffered = BufferedByteReceiveStream(proc.stdout)

    async def next(self) -> str:
        return (await self._buffered.receive_until(b"\n", 1 << 16)).decode()


async def read_all(stream: anyio.abc.ByteReceiveStream | None) -> str:
    assert stream is not None
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
    return b"".join(chunks).decode()


def check(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


# -- what arrives ---------------------------------------------------------------------


async def test_records_keep_their_fields() -> None:
    sink = Sink()
    before = time.time()
    async with LogServer(sink.deliver) as server:
        result = await run_child(
            """
            handler = connect(logging.DEBUG)
            assert handler is not None
            log = logging.getLogger("app.db")
            log.info("hello %s %d", "world", 42)
            log.handle(logging.makeLogRecord({
                "name": "app.fixed", "levelno": 35, "levelname": "NOTICE",
                "msg": "100%% fixed at %s", "args": ("noon",), "created": 1234567890.25,
            }))
            try:
                1 / 0
            except ZeroDivisionError:
                log.exception("it broke")
            def work():
                logging.getLogger("app.worker").warning("from a thread")
            t = threading.Thread(target=work, name="worker-7")
            t.start()
            t.join()
            log.debug("where am I", stack_info=True)
            log.info("%s", "percent %d stays")
            print(os.getpid())
            """,
            child_env(server, "web"),
        )
    after = time.time()
    pid = int(check(result))
    assert result.stderr == b""
    records = sink.items
    assert [r.getMessage() for r in records] == [
        "hello world 42",
        "100% fixed at noon",
        "it broke",
        "from a thread",
        "where am I",
        "percent %d stays",
    ]
    hello, fixed, broke, threaded, stack, percent = records
    for r in records:
        assert r.corral_source == "web"  # type: ignore[attr-defined]
        assert r.corral_stream == "logging"  # type: ignore[attr-defined]
        assert r.process == pid
        assert r.args is None
    assert (hello.levelno, hello.levelname, hello.name) == (logging.INFO, "INFO", "app.db")
    assert before <= hello.created <= after
    assert hello.threadName == "MainThread"
    assert hello.processName == "MainProcess"
    assert hello.pathname == "<string>" and hello.funcName == "<module>"
    assert hello.lineno > 3  # the line of the call in the child's "-c" script
    assert (fixed.levelno, fixed.levelname, fixed.name) == (35, "NOTICE", "app.fixed")
    assert fixed.created == 1234567890.25
    assert fixed.msecs == 250
    assert broke.levelno == logging.ERROR
    assert broke.exc_text is not None
    assert broke.exc_text.startswith("Traceback (most recent call last):")
    assert broke.exc_text.endswith("ZeroDivisionError: division by zero")
    assert broke.exc_info is None
    assert threaded.threadName == "worker-7" and threaded.funcName == "work"
    assert threaded.name == "app.worker" and threaded.levelname == "WARNING"
    assert stack.levelno == logging.DEBUG
    assert stack.stack_info is not None and stack.stack_info.startswith("Stack (most recent")
    # The records work with ordinary formatters.
    text = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s").format(broke)
    assert "ERROR app.db it broke\nTraceback" in text
    assert percent.getMessage() == "percent %d stays"


FLOOD_THEN_EXIT = """
    connect(logging.INFO)
    log = logging.getLogger("flood")
    print("connected", flush=True)
    sys.stdin.readline()
    for i in range({n}):
        log.info("record %d", i)
    os._exit(0)
    """


async def test_flood_then_os_exit_loses_nothing() -> None:
    n = 5000
    sink = Sink()
    async with AsyncExitStack() as processes:  # the child outlives the server block
        async with LogServer(sink.deliver) as server:
            child = await processes.enter_async_context(
                open_child(FLOOD_THEN_EXIT.format(n=n), child_env(server, "flood"))
            )
            assert await Lines(child).next() == "connected"
            assert child.stdin is not None
            await child.stdin.send(b"go\n")
            # Leave at once: the child has yet to log (nearly) everything.  Leaving waits
            # for its connection to reach end-of-file, which comes after its last record,
            # even though it ends with os._exit.
        assert await child.wait() == 0
    assert sink.messages() == [f"record {i}" for i in range(n)]
    assert server.records_received == server.records_delivered == n


async def test_records_in_flight_survive_an_error_exit() -> None:
    sink = Sink()
    n = 2000
    async with AsyncExitStack() as processes:
        with pytest.raises(RuntimeError, match="body failed"):
            async with LogServer(sink.deliver) as server:
                child = await processes.enter_async_context(
                    open_child(FLOOD_THEN_EXIT.format(n=n), child_env(server, "late"))
                )
                assert await Lines(child).next() == "connected"
                assert child.stdin is not None
                await child.stdin.send(b"go\n")
                raise RuntimeError("body failed")
        # The error came out unwrapped, after the server had read what the child sent
        # within `linger` seconds: here, everything.
        assert await child.wait() == 0
    assert sink.messages() == [f"record {i}" for i in range(n)]


async def test_fork_reconnects_with_the_new_pid() -> None:
    sink = Sink()
    async with LogServer(sink.deliver) as server:
        result = await run_child(
            """
            handler = connect(logging.INFO)
            logging.info("parent before")
            inherited = os.fstat(handler._sock.fileno()).st_ino
            pid = os.fork()
            if pid == 0:
                logging.info("child %d", os.getpid())
                # Its own connection, not the parent's socket.
                assert os.fstat(handler._sock.fileno()).st_ino != inherited
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert status == 0
            logging.info("parent after")
            print(os.getpid(), pid)
            """,
            child_env(server, "forker"),
        )
    parent, child = map(int, check(result).split())
    by_message = {r.getMessage(): r for r in sink.items}
    assert set(by_message) == {"parent before", f"child {child}", "parent after"}
    assert by_message["parent before"].process == parent
    assert by_message[f"child {child}"].process == child
    assert by_message["parent after"].process == parent
    assert {getattr(r, "corral_source", None) for r in sink.items} == {"forker"}


async def test_threads_big_and_odd_records() -> None:
    sink = Sink()
    async with LogServer(sink.deliver) as server:
        result = await run_child(
            """
            connect(logging.INFO)
            def work(t):
                log = logging.getLogger(f"thread{t}")
                for i in range(300):
                    # Some frames far bigger than the socket's buffer: each must still
                    # go out whole, never interleaved with another thread's.
                    size = 300_000 if i % 100 == 7 else 50
                    log.info("%d %d %s", t, i, str(t) * size)
            threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            logging.info("huge " + "y" * 3_000_000)
            logging.info("bad \\udcff surrogate")  # e.g. a file name from surrogateescape
            """,
            child_env(server, "threads"),
        )
        check(result)
    *threaded, huge, odd = sink.items
    for t in range(6):
        mine = [r.getMessage().split() for r in threaded if r.name == f"thread{t}"]
        assert [int(i) for _, i, _ in mine] == list(range(300))
        assert all(body == str(t) * len(body) for _, _, body in mine)
        assert [len(body) for _, _, body in mine] == [
            300_000 if i % 100 == 7 else 50 for i in range(300)
        ]
    message = huge.getMessage()
    assert message.startswith("huge yyy") and message.endswith("yyy")
    assert "[corral: " in message and " bytes cut]" in message
    assert len(message.encode()) < (1 << 20)
    assert odd.getMessage() == "bad \\udcff surrogate"  # backslash, u, d, c, f, f


async def test_interrupted_send_recovers(warnings_seen: WarningCatcher) -> None:
    gate = anyio.Event()
    sink = Sink()

    async def gated(record: logging.LogRecord) -> None:
        await gate.wait()
        await sink.deliver(record)

    code = """
        handler = connect(logging.INFO)

        class Announcing:  # says when the big frame's send begins
            def __init__(self, sock):
                self.sock = sock
            def send(self, data, flags=0):
                if len(data) > 500_000:
                    print("blocking", n, flush=True)
                return self.sock.send(data, flags)
            def __getattr__(self, name):
                return getattr(self.sock, name)

        handler._sock = Announcing(handler._sock)
        n = 10
        for i in range(n):
            logging.info("pre %d", i)
        try:
            # More than the socket's buffers hold, and the launcher is not reading: the
            # kernel takes part of the frame, then the send blocks.
            logging.info("big " + "z" * 900_000)
        except KeyboardInterrupt:
            pass
        print("interrupted", flush=True)
        logging.info("after")
        """
    async with (
        LogServer(gated) as server,
        open_child(code, child_env(server, "intr")) as child,
    ):
        lines = Lines(child)
        word, count = (await lines.next()).split()
        assert word == "blocking"
        child.send_signal(signal.SIGINT)
        assert await lines.next() == "interrupted"
        gate.set()
        assert await child.wait() == 0
    messages = sink.messages()
    n = int(count)
    # Two connections now, the abandoned one and the new one: each in order, but the
    # two may interleave.
    assert [m for m in messages if m.startswith("pre")] == [f"pre {i}" for i in range(n)]
    assert messages.count("after") == 1
    # The big record came whole or not at all: never as garbage, never cut.
    big = [m for m in messages if m.startswith("big")]
    assert big in ([], ["big " + "z" * 900_000])
    assert len(messages) == n + 1 + len(big)
    cut_off = [
        r
        for r in warnings_seen.seen.items
        if "middle of a frame" in getattr(r, "corral_reason", "")
    ]
    if cut_off:
        # Interrupted halfway through its send (the usual case): the launcher noted the
        # cut-off frame on the abandoned connection; the child went on over a new one.
        assert big == []
        assert [getattr(r, "corral_peer_source", None) for r in cut_off] == ["intr"]


# -- connect() --------------------------------------------------------------------------


async def test_connect_without_environment_is_a_no_op() -> None:
    result = await run_child(
        """
        assert connect() is None
        assert connect(logging.INFO) is None
        assert logging.getLogger().handlers == []
        assert logging.getLogger().level == logging.WARNING
        print("ok")
        """,
        child_env(None, "none"),
    )
    assert check(result) == "ok\n"


async def test_connect_is_idempotent() -> None:
    sink = Sink()
    async with LogServer(sink.deliver) as server:
        result = await run_child(
            """
            from corral._child_logging import CorralLogHandler
            first = connect(logging.INFO)
            second = connect(logging.INFO)
            assert first is second
            assert sum(isinstance(h, CorralLogHandler) for h in logging.getLogger().handlers) == 1
            own = logging.getLogger("own")
            third = connect(logger=own)
            assert third is not None and third is not first
            logging.info("once")
            own.warning("twice")  # own handler, then propagated to the root's
            """,
            child_env(server, "idem"),
        )
        check(result)
    # Two connections (one per handler): ordered within each, not across them.
    assert sorted(sink.messages()) == ["once", "twice", "twice"]


async def test_connect_warns_when_the_launcher_is_unreachable(tmp_path: Path) -> None:
    env = child_env(
        None,
        "x",
        **{
            ENV_SOCKET: str(tmp_path / "nothing-here"),
            ENV_SECRET: "s",
            ENV_SOURCE: "x",
        },
    )
    result = await run_child(
        """
        assert connect() is None
        logging.warning("still fine")
        """,
        env,
    )
    assert result.returncode == 0
    stderr = result.stderr.decode()
    assert "RuntimeWarning: corral: cannot send log records" in stderr
    assert "still fine" in stderr  # logging's last resort handler


# -- who may connect --------------------------------------------------------------------


async def test_wrong_secret_is_rejected_and_others_carry_on(
    warnings_seen: WarningCatcher,
) -> None:
    sink = Sink()
    good_code = """
        connect(logging.INFO)
        print("connected", flush=True)
        sys.stdin.readline()
        for i in range(200):
            logging.info("good %d", i)
        """
    bad_code = """
        connect(logging.INFO)
        print("connected", flush=True)
        sys.stdin.readline()
        for i in range(100):
            logging.info("bad %d", i)
        print("alive", flush=True)
        """
    async with (
        LogServer(sink.deliver) as server,
        open_child(good_code, child_env(server, "good")) as good,
        open_child(bad_code, child_env(server, "bad", **{ENV_SECRET: "0" * 32})) as bad,
    ):
        assert await Lines(good).next() == "connected"
        bad_lines = Lines(bad)
        assert await bad_lines.next() == "connected"
        warning = await warnings_seen.wait("wrong secret", pid=bad.pid)
        assert f"pid {bad.pid}" in warning.getMessage()
        # The connection is closed: the bad child's logging fails once, quietly
        # enough, and the child carries on.
        assert bad.stdin is not None and good.stdin is not None
        await bad.stdin.send(b"go\n")
        assert await bad_lines.next() == "alive"
        assert await bad.wait() == 0
        await good.stdin.send(b"go\n")
        assert await good.wait() == 0
        bad_stderr = await read_all(bad.stderr)
        assert bad_stderr.count("--- Logging error ---") == 1
        assert "BrokenPipeError" in bad_stderr or "ConnectionResetError" in bad_stderr
    assert sink.messages("good") == [f"good {i}" for i in range(200)]
    assert sink.messages("bad") == []


def frame(value: object) -> bytes:
    payload = msgspec.msgpack.encode(value)
    return len(payload).to_bytes(4, "big") + payload


def good_prefix(server: LogServer) -> bytes:
    return encode(Hello(PROTOCOL_VERSION, server.secret, "raw", os.getpid())) + encode(
        Record(time.time(), logging.INFO, "INFO", "raw.logger", "the good one")
    )


BAD_STREAMS: dict[str, tuple[Callable[[LogServer], bytes], bool, str]] = {
    # name: (bytes to send, whether to close our end afterwards, expected reason)
    "garbage": (
        lambda s: good_prefix(s) + b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1",
        False,
        "undecodable payload",
    ),
    "oversized": (lambda s: good_prefix(s) + b"\xff\xff\xff\xff", False, "exceeds the limit"),
    "truncated": (
        lambda s: good_prefix(s) + encode(Record(1.0, 20, "INFO", "x", "cut"))[:9],
        True,
        "middle of a frame",
    ),
    "wrong schema": (
        lambda s: good_prefix(s) + frame(["record", "noon", 20, "INFO", "n", "m"]),
        False,
        "does not match the schema",
    ),
    "second hello": (
        lambda s: good_prefix(s) + encode(Hello(1, "a", "b", 1)),
        False,
        "second hello",
    ),
    "no hello first": (
        lambda s: encode(Record(1.0, 20, "INFO", "x", "sneaky")),
        False,
        "not a hello",
    ),
    "wrong version": (
        lambda s: encode(Hello(1, s.secret, "raw", 1)).replace(b"\xa5hello\x01", b"\xa5hello\x02"),
        False,
        "unsupported protocol version 2",
    ),
}


@pytest.mark.parametrize("kind", list(BAD_STREAMS))
async def test_bad_bytes_close_only_that_connection(
    kind: str, warnings_seen: WarningCatcher
) -> None:
    make, close_after, reason = BAD_STREAMS[kind]
    sink = Sink()
    good_code = """
        connect(logging.INFO)
        print("connected", flush=True)
        sys.stdin.readline()
        for i in range(300):
            logging.info("good %d", i)
        """
    async with (
        LogServer(sink.deliver) as server,
        open_child(good_code, child_env(server, "good")) as good,
    ):
        assert await Lines(good).next() == "connected"
        async with await anyio.connect_unix(server.path) as raw:
            await raw.send(make(server))
            if close_after:
                await raw.send_eof()
            warning = await warnings_seen.wait(reason, pid=os.getpid())
            # The server hung up on us, without waiting for any more bytes.
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await raw.receive()
        message = warning.getMessage()
        assert f"pid {os.getpid()}" in message and reason in message
        if kind not in ("no hello first", "wrong version"):
            assert getattr(warning, "corral_peer_source", None) == "raw"
            assert "source 'raw'" in message
        # Meanwhile the good child, connected all along, is served as usual.
        assert good.stdin is not None
        await good.stdin.send(b"go\n")
        assert await good.wait() == 0
    assert sink.messages("good") == [f"good {i}" for i in range(300)]
    expected_raw = [] if kind in ("no hello first", "wrong version") else ["the good one"]
    assert sink.messages("raw") == expected_raw


async def test_no_hello_in_time(warnings_seen: WarningCatcher) -> None:
    sink = Sink()
    async with (
        LogServer(sink.deliver, hello_timeout=0.2) as server,
        await anyio.connect_unix(server.path) as raw,
    ):
        await raw.send(b"\x00\x00")  # not even a whole prefix
        await warnings_seen.wait("no hello within 0.2 s", pid=os.getpid())
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await raw.receive()


async def test_closed_before_hello(warnings_seen: WarningCatcher) -> None:
    async with (
        LogServer(Sink().deliver) as server,
        await anyio.connect_unix(server.path) as raw,
    ):
        await raw.send(encode(Hello(1, server.secret, "x", 1))[:7])
        await raw.send_eof()
        await warnings_seen.wait("middle of a frame", pid=os.getpid())


# -- backpressure -----------------------------------------------------------------------


async def test_slow_delivery_blocks_the_child_not_the_server_memory() -> None:
    gate = anyio.Event()
    first_call = anyio.Event()
    delivered: Collected[str] = Collected()
    backlog: list[int] = []
    server: LogServer

    async def slow_deliver(record: logging.LogRecord) -> None:
        backlog.append(server.records_received - server.records_delivered)
        first_call.set()
        await gate.wait()
        delivered.add(record.getMessage())

    receive_size = 65536
    payload = "x" * 200
    # Each frame is longer than the payload, so one read holds fewer records than this:
    bound = receive_size // len(payload) + 1
    extra = 5000  # about 1.2 MB more: far beyond what the kernel's buffers hold
    code = f"""
        import select
        handler = connect(logging.INFO)
        log = logging.getLogger("flood")
        n = 0
        while select.select([], [handler._sock], [], 0)[1]:
            # Writable: the launcher is keeping up (or has not stopped reading yet).
            if n == 100_000:
                print("never full", flush=True)
                os._exit(1)
            log.info("%d {payload}", n)
            n += 1
        # Unread records fill the socket's buffer: the launcher has stopped reading.
        print("full", n, flush=True)
        for i in range(n, n + {extra}):
            log.info("%d {payload}", i)  # these block until the launcher catches up
        print("done", flush=True)
        """
    async with (
        LogServer(slow_deliver, receive_size=receive_size) as server,
        open_child(code, child_env(server, "flood")) as child,
    ):
        lines = Lines(child)
        word, sent = (await lines.next()).split()
        assert word == "full"
        await first_call.wait()
        # Delivery is stuck on the first record.  The server has read at most one
        # chunk and stopped; the child, still logging, is blocked in its send.
        assert server.records_delivered == 0
        assert 0 < server.records_received <= bound
        gate.set()
        assert await lines.next() == "done"
        assert await child.wait() == 0
    total = int(sent) + extra
    assert delivered.items == [f"{i} {payload}" for i in range(total)]
    assert server.records_received == server.records_delivered == total
    # However far ahead the child was, the server never held more than one read's worth.
    assert max(backlog) <= bound


async def test_a_flood_does_not_starve_the_loop() -> None:
    # While records pour in, another task gets to run at least every few dozen records.
    ticks = 0
    ticks_at_delivery: list[int] = []
    n = 20000

    async def deliver(record: logging.LogRecord) -> None:
        ticks_at_delivery.append(ticks)  # never yields: the server must

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with LogServer(deliver) as server:
            result = await run_child(
                f"""
                connect(logging.INFO)
                for i in range({n}):
                    logging.info("r %d", i)
                """,
                child_env(server, "flood"),
            )
            check(result)
        tg.cancel_scope.cancel()
    assert len(ticks_at_delivery) == n
    longest = run = 0
    for before, after in itertools.pairwise(ticks_at_delivery):
        run = run + 1 if after == before else 0
        longest = max(longest, run)
    # The server checkpoints every _RECORDS_PER_CHECKPOINT records; Trio may run the
    # server twice in a row across two scheduling batches, hence the factor of two.
    assert longest < 2 * _RECORDS_PER_CHECKPOINT


# -- the server's own life --------------------------------------------------------------


async def test_directory_socket_and_environment() -> None:
    async with LogServer(Sink().deliver) as server:
        directory = os.path.dirname(server.path)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(server.path).st_mode)
        assert len(server.secret) == 32 and int(server.secret, 16) >= 0
        assert server.env("train.worker-3") == {
            "CORRAL_LOG_SOCKET": server.path,
            "CORRAL_LOG_SECRET": server.secret,
            "CORRAL_SOURCE": "train.worker-3",
        }
    assert not os.path.exists(directory)


async def test_connections_queued_at_exit_are_still_served() -> None:
    sink = Sink()
    async with LogServer(sink.deliver) as server:
        # Connect, write and hang up without ever yielding to the event loop: the
        # connection is still in the listener's backlog when the block is left.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(server.path)
            sock.sendall(good_prefix(server))
    assert sink.messages("raw") == ["the good one"]


FD_LIMIT_SCRIPT = """
import logging, os, resource, socket, sys
import anyio
from corral._logserver import LogServer
from corral._wire import Hello, Record, encode

async def main():
    got = []
    blocked = anyio.Event()

    class Catch(logging.Handler):
        def emit(self, record):
            if "cannot accept" in record.getMessage():
                blocked.set()

    logging.getLogger("corral.logserver").addHandler(Catch())

    async def deliver(record):
        got.append(record.getMessage())

    async with LogServer(deliver) as server:
        clients = []
        for i in range(8):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(server.path)
            sock.sendall(encode(Hello(1, server.secret, f"c{i}", os.getpid()))
                         + encode(Record(1.0, 20, "INFO", "n", f"from {i}")))
            sock.shutdown(socket.SHUT_WR)
            clients.append(sock)
        # Leave the server no descriptor to accept with.
        open_fds = len(os.listdir("/proc/self/fd")) - 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds, open_fds))
        await blocked.wait()
        for sock in clients:  # descriptors come back: the server catches up
            sock.close()
    print(" ".join(sorted(got)))

anyio.run(main, backend=sys.argv[1])
"""


async def test_accept_survives_running_out_of_descriptors(anyio_backend: str) -> None:
    # In a process of its own, since it lowers the descriptor limit for good.
    result = await anyio.run_process(
        [sys.executable, "-c", FD_LIMIT_SCRIPT, anyio_backend],
        env=child_env(None, "x"),
        check=False,
    )
    assert check(result) == " ".join(f"from {i}" for i in range(8)) + "\n"


async def test_drain_returns_once_an_exited_childs_records_are_delivered() -> None:
    gate = anyio.Event()
    sink = Sink()

    async def gated(record: logging.LogRecord) -> None:
        await gate.wait()
        await sink.deliver(record)

    n = 100  # few enough to sit in the socket's buffers while delivery is held up
    other_code = """
        connect(logging.INFO)
        logging.info("other")
        print("connected", flush=True)
        sys.stdin.readline()
        """
    code = f"""
        connect(logging.INFO)
        for i in range({n}):
            logging.info("r %d", i)
        os._exit(0)
        """
    async with (
        LogServer(gated) as server,
        open_child(other_code, child_env(server, "other")) as other,
    ):
        assert await Lines(other).next() == "connected"
        async with open_child(code, child_env(server, "done"), start_new_session=True) as child:
            assert await child.wait() == 0
        gate.set()
        # The child is gone but its records are still on their way.  `drain` returns when
        # they are all delivered, without waiting for the other child's connection.
        await server.drain("done", child.pid)
        assert sink.messages("done") == [f"r {i}" for i in range(n)]
        assert other.stdin is not None
        await other.stdin.send(b"bye\n")


async def test_drain_accepts_queued_connections_first() -> None:
    sink = Sink()
    async with LogServer(sink.deliver) as server:
        # Connected, written and closed without yielding: still in the listener's backlog.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(server.path)
            sock.sendall(good_prefix(server))
        await server.drain("raw", os.getpgrp())
        assert sink.messages("raw") == ["the good one"]


async def test_two_servers_have_different_secrets() -> None:
    async with LogServer(Sink().deliver) as a, LogServer(Sink().deliver) as b:
        assert a.secret != b.secret and a.path != b.path


async def test_cancelled_exit_lingers_then_closes(warnings_seen: WarningCatcher) -> None:
    sink = Sink()
    async with AsyncExitStack() as processes:  # the child outlives the server here
        with anyio.CancelScope() as scope:
            async with LogServer(sink.deliver, linger=0.3) as server:
                child = await processes.enter_async_context(
                    open_child(
                        """
                        connect(logging.INFO)
                        logging.info("before")
                        print("logged", flush=True)
                        sys.stdin.readline()
                        """,
                        child_env(server, "idle"),
                    )
                )
                assert await Lines(child).next() == "logged"
                await sink.count(1)
                scope.cancel()
                await anyio.sleep_forever()
        # The server was left by a cancellation while the child, alive and connected,
        # had nothing more to say: it waited `linger` seconds, then hung up.
        assert scope.cancelled_caught
        assert child.returncode is None
        (warning,) = [
            r for r in warnings_seen.seen.items if "still open" in getattr(r, "corral_reason", "")
        ]
        assert getattr(warning, "corral_peer_source", None) == "idle"
        assert getattr(warning, "corral_peer_pid", None) == child.pid
        assert sink.messages() == ["before"]
        assert child.stdin is not None
        await child.stdin.send(b"bye\n")
        assert await child.wait() == 0


async def test_deliver_failure_propagates() -> None:
    async def broken(record: logging.LogRecord) -> None:
        raise ValueError("routing bug")

    with pytest.raises(BaseExceptionGroup) as info:
        async with LogServer(broken) as server:
            result = await run_child(
                """
                connect(logging.INFO)
                logging.info("x")
                """,
                child_env(server, "x"),
            )
            check(result)
            await anyio.sleep_forever()  # cancelled when the server's task fails
    assert info.group_contains(ValueError, match="routing bug")
