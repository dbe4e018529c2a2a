"""Log records from children, end to end: real runners, real sockets, real processes.

Every test goes through the public runner API (``open_runner``, ``Runner.start``,
``Runner.run``, ``Process``): children call ``corral.child.connect()`` and their records
reach the runner's handlers.  Where a test needs a raw connection of its own (bad bytes, a
wrong hello), it reads the socket's path and secret from a child's environment and writes
frames made with ``corral._logs._wire.encode``.  Warnings about connections are WARNING records of
the runner's own source (``corral_source == "corral"``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from tests.helpers.loops import BOTH_LOOPS, OTHER_LOOP, one_loop
from tests.helpers.processes import TAG_VAR, ListHandler, group_members, wait_gone
from tests.programs import program

import corral
from corral._logs._collector import DEFAULT_MAX_BYTES
from corral._logs._wire import MAX_FRAME, PROTOCOL_VERSION, Hello, Record, encode

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# One loop (tests/helpers/loops.py): records are decoded, routed and handled on a worker
# thread whatever the loop.  The server's own waits run on the loop (the hello's deadline,
# the accept loop, the drain and linger of a connection at its child's exit): those tests
# run on both.
anyio_backend = one_loop()


PY = sys.executable
PIPE = subprocess.PIPE
RUNNER = "corral"  # the default runner name: the source of the runner's own records
PRELUDE = "import logging, os, sys, threading, time\nfrom corral.child import connect\n"
PRINT_SOCKET = 'print(os.environ["CORRAL_LOG_SOCKET"]); print(os.environ["CORRAL_LOG_SECRET"])'


def script(code: str) -> list[str]:
    return [PY, "-c", PRELUDE + textwrap.dedent(code)]


class Recorder(ListHandler):
    """A ListHandler that a test can wait on (``emit`` runs on the collector's thread)."""

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            super().emit(record)
            self._changed.notify_all()

    def logged(self, source: str) -> list[str]:
        """Messages of the records a child sent over its log connection."""
        return [
            r.getMessage()
            for r in self.records
            if getattr(r, "corral_source", None) == source
            and getattr(r, "corral_stream", None) == "logging"
        ]

    def warnings(self) -> list[str]:
        """The runner's own warnings (about connections, among others)."""
        return [
            r.getMessage()
            for r in self.records
            if getattr(r, "corral_source", None) == RUNNER and r.levelno == logging.WARNING
        ]

    async def wait_for(
        self, match: Callable[[logging.LogRecord], bool], timeout: float = 20
    ) -> logging.LogRecord:
        def find() -> logging.LogRecord | None:
            with self._changed:
                return self._changed.wait_for(
                    lambda: next((r for r in self.records if match(r)), None), timeout
                )

        found = await anyio.to_thread.run_sync(find, abandon_on_cancel=True)
        assert found is not None, "the record never came"
        return found

    async def warning(self, *parts: str) -> str:
        """Wait for a warning of the runner's own that contains every one of ``parts``."""
        record = await self.wait_for(
            lambda r: (
                getattr(r, "corral_source", None) == RUNNER
                and r.levelno == logging.WARNING
                and all(part in r.getMessage() for part in parts)
            )
        )
        return record.getMessage()


class Gated(Recorder):
    """A handler that holds every record (blocking the runner's log worker) until opened."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.blocked = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.gate.is_set():
            self.blocked.set()
            self.gate.wait(30)  # bounded, so that a failing test still ends
        super().emit(record)


class Lines:
    """The lines a child prints on its stdout pipe."""

    def __init__(self, proc: corral.Process) -> None:
        assert proc.stdout is not None
        self._buffered = BufferedByteReceiveStream(proc.stdout)

    async def next(self) -> str:
        return (await self._buffered.receive_until(b"\n", 1 << 16)).decode()


async def socket_of(r: corral.Runner, tag: str) -> tuple[str, str]:
    """The path and secret of the runner's log socket, as its children see them."""
    done = await r.run(script(PRINT_SOCKET), name="probe", stdout=PIPE, extra_env={TAG_VAR: tag})
    assert done.stdout is not None
    path, secret = done.stdout.decode().split()
    return path, secret


def frame(value: object) -> bytes:
    payload = msgspec.msgpack.encode(value)
    return len(payload).to_bytes(4, "big") + payload


def hello(secret: str, source: str = "corral.raw") -> bytes:
    return encode(Hello(PROTOCOL_VERSION, secret, source, os.getpid()))


def good_prefix(secret: str) -> bytes:
    return hello(secret) + encode(
        Record(time.time(), logging.INFO, "INFO", "raw.logger", "the good one")
    )


def kill_daemon(pid: int) -> None:
    """Kill a daemon that leads its own session, and everything in its group."""
    members = {pid, *group_members(pid)}
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert wait_gone(members, 10) == []


# -- what arrives -------------------------------------------------------------------------


async def test_records_keep_their_fields(tag: str) -> None:
    logs = Recorder()
    before = time.time()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        done = await r.run(
            script(
                """
                handler = connect(logging.DEBUG)
                assert handler is not None
                log = logging.getLogger("app.db")
                log.info("hello %s %d", "world", 42)
                log.handle(logging.makeLogRecord({
                    "name": "app.fixed", "levelno": 35, "levelname": "NOTICE",
                    "msg": "100%% fixed at %s", "args": ("noon",), "created": 1234567890.25,
                }))
                logging.addLevelName(25, "VERBOSE")
                log.log(25, "custom")
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
                """
            ),
            name="web",
            stdout=PIPE,
            extra_env={TAG_VAR: tag},
        )
    after = time.time()
    assert done.stdout is not None
    pid = int(done.stdout)
    assert logs.lines("corral.web") == []  # nothing on stderr
    records = [r for r in logs.records if getattr(r, "corral_source", None) == "corral.web"]
    assert [r.getMessage() for r in records] == [
        "hello world 42",
        "100% fixed at noon",
        "custom",
        "it broke",
        "from a thread",
        "where am I",
        "percent %d stays",
    ]
    greeting, fixed, custom, broke, threaded, stack, percent = records
    for r in records:
        assert r.corral_stream == "logging"  # type: ignore[attr-defined]
        assert r.process == pid
        assert r.args is None
        assert r.processName == "MainProcess"
    assert (greeting.levelno, greeting.levelname, greeting.name) == (logging.INFO, "INFO", "app.db")
    assert before <= greeting.created <= after
    assert 0 <= greeting.msecs < 1000
    assert greeting.threadName == "MainThread"
    assert greeting.pathname == "<string>" and greeting.funcName == "<module>"
    assert greeting.lineno > 3  # the line of the call in the child's "-c" script
    assert (fixed.levelno, fixed.levelname, fixed.name) == (35, "NOTICE", "app.fixed")
    assert fixed.created == 1234567890.25  # the child's time stamp, not the arrival's
    assert fixed.msecs == 250
    # A level the launcher never heard of keeps the child's name for it.
    assert (custom.levelno, custom.levelname) == (25, "VERBOSE")
    assert broke.levelno == logging.ERROR
    assert broke.exc_text is not None
    assert broke.exc_text.startswith("Traceback (most recent call last):")
    assert broke.exc_text.endswith("ZeroDivisionError: division by zero")
    assert broke.exc_info is None
    assert threaded.threadName == "worker-7" and threaded.funcName == "work"
    assert threaded.name == "app.worker" and threaded.levelname == "WARNING"
    assert stack.levelno == logging.DEBUG
    assert stack.stack_info is not None and stack.stack_info.startswith("Stack (most recent")
    assert percent.getMessage() == "percent %d stays"
    # The records work with ordinary formatters.
    formatter = logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(process)d %(threadName)s "
        "%(filename)s:%(lineno)d %(funcName)s %(message)s"
    )
    text = formatter.format(broke)
    assert f"ERROR app.db {pid} MainThread <string>:{broke.lineno} <module> it broke\n" in text
    assert text.endswith("ZeroDivisionError: division by zero")
    assert formatter.format(stack).endswith(stack.stack_info)
    assert "2009-02-1" in logging.Formatter("%(asctime)s").format(fixed)  # 1234567890 is then


FLOOD_THEN_EXIT = """
    connect(logging.INFO)
    log = logging.getLogger("flood")
    print("connected", flush=True)
    sys.stdin.readline()
    for i in range({n}):
        log.info("record %d", i)
    os._exit(0)
    """

IDLE = """
    connect(logging.INFO)
    logging.info("other")
    print("connected", flush=True)
    sys.stdin.readline()
    """


@OTHER_LOOP
async def test_flood_then_os_exit_loses_nothing(tag: str) -> None:
    n = 5000
    logs = Recorder()
    env = {TAG_VAR: tag}
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        # Another child stays connected throughout: waiting for the flood does not
        # wait for its connection.
        other = await r.start(script(IDLE), name="other", stdin=PIPE, stdout=PIPE, extra_env=env)
        assert await Lines(other).next() == "connected"
        p = await r.start(
            script(FLOOD_THEN_EXIT.format(n=n)),
            name="flood",
            stdin=PIPE,
            stdout=PIPE,
            extra_env=env,
        )
        assert await Lines(p).next() == "connected"
        assert p.stdin is not None
        await p.stdin.send(b"go\n")
        # wait() returns once every record sent before os._exit reached the handlers.
        assert await p.wait() == 0
        assert logs.logged("corral.flood") == [f"record {i}" for i in range(n)]
        assert other.returncode is None
        assert other.stdin is not None
        await other.stdin.send(b"bye\n")
        assert await other.wait() == 0
    assert logs.logged("corral.other") == ["other"]
    assert logs.warnings() == []


async def test_records_in_flight_survive_an_error_exit(tag: str) -> None:
    n = 2000
    logs = Gated()
    with pytest.raises(ExceptionGroup) as info:
        async with corral.open_runner(console=False, handlers=[logs]) as r:
            p = await r.start(
                script(
                    f"""
                    connect(logging.INFO)
                    for i in range({n}):
                        logging.info("record %d", i)
                    print("logged", flush=True)
                    sys.stdin.readline()  # until the runner stops it
                    """
                ),
                name="late",
                stdin=PIPE,
                stdout=PIPE,
                extra_env={TAG_VAR: tag},
            )
            try:
                assert await Lines(p).next() == "logged"
                # Sent, but held up on their way to the handlers.
                assert logs.blocked.is_set()
                assert logs.logged("corral.late") == []
                raise RuntimeError("body failed")
            finally:
                logs.gate.set()
    assert info.group_contains(RuntimeError, match="body failed")
    assert p.returncode == -signal.SIGTERM
    assert logs.logged("corral.late") == [f"record {i}" for i in range(n)]


async def test_fork_reconnects_with_the_new_pid(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        done = await r.run(
            script(
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
                """
            ),
            name="forker",
            stdout=PIPE,
            extra_env={TAG_VAR: tag},
        )
    assert done.stdout is not None
    parent, child = map(int, done.stdout.split())
    records = [r for r in logs.records if getattr(r, "corral_stream", None) == "logging"]
    by_message = {r.getMessage(): r for r in records}
    assert set(by_message) == {"parent before", f"child {child}", "parent after"}
    assert by_message["parent before"].process == parent
    assert by_message[f"child {child}"].process == child
    assert by_message["parent after"].process == parent
    assert {getattr(r, "corral_source", None) for r in records} == {"corral.forker"}
    assert logs.lines("corral.forker") == []


async def test_threads_big_and_odd_records(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        await r.run(
            script(
                """
                connect(logging.INFO)
                def work(t):
                    log = logging.getLogger(f"thread{t}")
                    for i in range(300):
                        # Some frames far bigger than the socket's buffer: each must
                        # still go out whole, never interleaved with another thread's.
                        size = 300_000 if i % 100 == 7 else 50
                        log.info("%d %d %s", t, i, str(t) * size)
                threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                logging.info("huge " + "y" * 3_000_000)
                logging.info("bad \\udcff surrogate")  # e.g. a file name from surrogateescape
                """
            ),
            name="threads",
            extra_env={TAG_VAR: tag},
        )
    assert logs.lines("corral.threads") == []
    *threaded, huge, odd = [
        r for r in logs.records if getattr(r, "corral_source", None) == "corral.threads"
    ]
    for t in range(6):
        mine = [r.getMessage().split() for r in threaded if r.name == f"thread{t}"]
        assert [int(i) for _, i, _ in mine] == list(range(300))
        assert all(body == str(t) * len(body) for _, _, body in mine)
        assert [len(body) for _, _, body in mine] == [
            300_000 if i % 100 == 7 else 50 for i in range(300)
        ]
    assert len(threaded) == 6 * 300
    message = huge.getMessage()
    assert message.startswith("huge yyy") and message.endswith("yyy")
    assert "\n[corral: " in message and " bytes cut]\n" in message
    cut = int(message.split("[corral: ")[1].split()[0])
    assert len(message.encode()) + cut - len(f"\n[corral: {cut} bytes cut]\n") == 3_000_005
    assert len(message.encode()) < MAX_FRAME
    assert odd.getMessage() == "bad \\udcff surrogate"  # backslash, u, d, c, f, f


async def test_interrupted_send_recovers_on_a_new_connection(tag: str) -> None:
    logs = Gated()
    # The log worker is held up by the handler, so the runner takes no more than its
    # collector's bound plus what the kernel buffers, and no less than that bound less
    # a little overhead.  The child fills that much with records that never block;
    # then it sends a record of 1 MB, which cannot go through (the gate opens only
    # once the child says it was interrupted), so the timer it arms first raises
    # KeyboardInterrupt in a blocked send.  (The timer races with nothing: any delay
    # longer than it takes to fill the socket would do.)
    fill = DEFAULT_MAX_BYTES - 128 * 1024
    code = f"""
        import signal
        handler = connect(logging.INFO)

        class Counting:
            def __init__(self, sock):
                self.sock = sock
                self.sent = 0
            def send(self, data, flags=0):
                n = self.sock.send(data, flags)
                self.sent += n
                return n
            def __getattr__(self, name):
                return getattr(self.sock, name)

        sock = handler._sock = Counting(handler._sock)
        done = 0
        while sock.sent < {fill}:
            logging.info("fill %d %s", done, "f" * 100_000)
            done += 1
        signal.signal(signal.SIGALRM, signal.default_int_handler)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        try:
            logging.info("big %s", "z" * 1_000_000)
            print("never blocked", flush=True)
            os._exit(1)
        except KeyboardInterrupt:
            pass
        print("interrupted", done, flush=True)
        logging.info("after")  # over a new connection
        """
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        p = await r.start(script(code), name="intr", stdout=PIPE, extra_env={TAG_VAR: tag})
        try:
            word, count = (await Lines(p).next()).split()
            assert word == "interrupted"
            assert logs.blocked.is_set()
        finally:
            logs.gate.set()
        assert await p.wait() == 0
    done = int(count)
    messages = logs.logged("corral.intr")
    # Two connections, the abandoned one and the new one: the records of each whole and
    # in order; the interrupted one is dropped.
    assert messages.count("after") == 1
    fills = [m for m in messages if m != "after"]
    assert fills == [f"fill {i} " + "f" * 100_000 for i in range(done)]
    cut_off = [w for w in logs.warnings() if "middle of a frame" in w]
    # Interrupted halfway through its send (the usual case, unless the kernel took none
    # of it): the launcher noted the cut-off frame on the abandoned connection.
    assert len(logs.warnings()) == len(cut_off) <= 1
    for warning in cut_off:
        assert warning.startswith(
            f"log connection from pid {p.pid}, source 'corral.intr': stream ended in the "
            "middle of a frame (got "
        )
        assert warning.endswith(f"closing it after {done} records")
    assert logs.lines("corral.intr") == []


# -- connect() ----------------------------------------------------------------------------


async def test_connect_without_environment_is_a_no_op(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        done = await r.run(
            script(
                """
                for name in ("CORRAL_LOG_SOCKET", "CORRAL_LOG_SECRET", "CORRAL_SOURCE"):
                    del os.environ[name]
                assert connect() is None
                assert connect(logging.INFO) is None
                assert logging.getLogger().handlers == []
                assert logging.getLogger().level == logging.WARNING
                print("ok")
                """
            ),
            name="none",
            stdout=PIPE,
            extra_env={TAG_VAR: tag},
        )
    assert done.stdout == b"ok\n"
    assert logs.lines("corral.none") == []


async def test_connect_is_idempotent(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        await r.run(
            script(
                """
                from corral.child import CorralLogHandler
                first = connect(logging.INFO)
                second = connect(logging.INFO)
                assert first is second
                root = logging.getLogger()
                assert sum(isinstance(h, CorralLogHandler) for h in root.handlers) == 1
                own = logging.getLogger("own")
                third = connect(logger=own)
                assert third is not None and third is not first
                logging.info("once")
                own.warning("twice")  # own handler, then propagated to the root's
                """
            ),
            name="idem",
            extra_env={TAG_VAR: tag},
        )
    assert logs.lines("corral.idem") == []
    # Two connections (one per handler): ordered within each, not across them.
    assert sorted(logs.logged("corral.idem")) == ["once", "twice", "twice"]


async def test_connect_warns_when_the_launcher_is_unreachable(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        await r.run(
            script(
                """
                os.environ["CORRAL_LOG_SOCKET"] = "/nonexistent-corral-test/log.sock"
                assert connect() is None
                logging.warning("still fine")
                """
            ),
            name="lost",
            extra_env={TAG_VAR: tag},
        )
    stderr = "\n".join(logs.lines("corral.lost"))
    assert "RuntimeWarning: corral: cannot send log records" in stderr
    assert "/nonexistent-corral-test/log.sock" in stderr
    assert "still fine" in stderr  # logging's last resort handler
    assert logs.logged("corral.lost") == []


# -- who may connect ----------------------------------------------------------------------


async def test_wrong_secret_is_rejected_and_others_carry_on(tag: str) -> None:
    logs = Recorder()
    env = {TAG_VAR: tag}
    good_code = """
        connect(logging.INFO)
        print("connected", flush=True)
        sys.stdin.readline()
        for i in range(200):
            logging.info("good %d", i)
        """
    bad_code = """
        os.environ["CORRAL_LOG_SECRET"] = "0" * 32
        connect(logging.INFO)
        print("connected", flush=True)
        sys.stdin.readline()
        for i in range(100):
            logging.info("bad %d", i)
        print("alive", flush=True)
        """
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        good = await r.start(script(good_code), name="good", stdin=PIPE, stdout=PIPE, extra_env=env)
        bad = await r.start(script(bad_code), name="bad", stdin=PIPE, stdout=PIPE, extra_env=env)
        assert await Lines(good).next() == "connected"
        bad_lines = Lines(bad)
        assert await bad_lines.next() == "connected"
        warning = await logs.warning(f"pid {bad.pid}", "wrong secret")
        assert warning == f"log connection from pid {bad.pid}: wrong secret"
        # The connection is closed: the bad child's logging fails once, quietly
        # enough, and the child carries on.
        assert bad.stdin is not None and good.stdin is not None
        await bad.stdin.send(b"go\n")
        assert await bad_lines.next() == "alive"
        assert await bad.wait() == 0
        await good.stdin.send(b"go\n")
        assert await good.wait() == 0
    bad_stderr = "\n".join(logs.lines("corral.bad"))
    assert bad_stderr.count("--- Logging error ---") == 1
    assert "BrokenPipeError" in bad_stderr or "ConnectionResetError" in bad_stderr
    assert logs.logged("corral.good") == [f"good {i}" for i in range(200)]
    assert logs.logged("corral.bad") == []
    assert logs.warnings() == [warning]


# name: (bytes to send, given the secret; whether to close our end afterwards; the reason
# the warning gives; whether the hello was accepted, so that the warning names the source
# and the good record before the bad bytes is delivered)
BAD_STREAMS: dict[str, tuple[Callable[[str], bytes], bool, str, bool]] = {
    "garbage": (
        lambda s: good_prefix(s) + b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1",
        False,
        "undecodable payload",
        True,
    ),
    "oversized prefix": (
        lambda s: good_prefix(s) + b"\xff\xff\xff\xff",
        False,
        f"frame of 4294967295 bytes exceeds the limit of {MAX_FRAME} bytes",
        True,
    ),
    "empty frame": (lambda s: good_prefix(s) + b"\x00\x00\x00\x00", False, "empty frame", True),
    "truncated at eof": (
        lambda s: good_prefix(s) + encode(Record(1.0, 20, "INFO", "x", "cut"))[:9],
        True,
        "stream ended in the middle of a frame (got 5 of",
        True,
    ),
    "wrong schema": (
        lambda s: good_prefix(s) + frame(["record", "noon", 20, "INFO", "n", "m"]),
        False,
        "message does not match the schema",
        True,
    ),
    "second hello": (
        lambda s: good_prefix(s) + hello(s),
        False,
        "a second hello on the same connection",
        True,
    ),
    "no hello first": (
        lambda s: encode(Record(1.0, 20, "INFO", "x", "sneaky")),
        False,
        "the first message is not a hello",
        False,
    ),
    "oversized hello": (
        lambda s: b"\xff\xff\xff\xff" + hello(s),
        False,
        "a first frame of 4294967295 bytes is no hello",
        False,
    ),
    "wrong version": (
        lambda s: frame(["hello", PROTOCOL_VERSION + 1, s, "corral.raw", os.getpid()]),
        False,
        f"unsupported protocol version {PROTOCOL_VERSION + 1}",
        False,
    ),
}


@pytest.mark.parametrize("kind", list(BAD_STREAMS))
async def test_bad_bytes_close_only_that_connection(kind: str, tag: str) -> None:
    make, close_after, reason, accepted = BAD_STREAMS[kind]
    logs = Recorder()
    good_code = """
        connect(logging.INFO)
        print("connected", flush=True)
        sys.stdin.readline()
        for i in range(300):
            logging.info("good %d", i)
        """
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        path, secret = await socket_of(r, tag)
        good = await r.start(
            script(good_code), name="good", stdin=PIPE, stdout=PIPE, extra_env={TAG_VAR: tag}
        )
        assert await Lines(good).next() == "connected"
        async with await anyio.connect_unix(path) as raw:
            data = make(secret)
            if not close_after:
                # Nothing after the bad bytes counts, not even a good record.
                data += encode(Record(time.time(), logging.INFO, "INFO", "raw", "too late"))
            await raw.send(data)
            if close_after:
                await raw.send_eof()
            warning = await logs.warning(f"pid {os.getpid()}", reason)
            if not accepted:
                # Refused on the loop: the server hangs up without waiting for more.
                with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
                    await raw.receive()
        if accepted:
            assert warning.startswith(f"log connection from pid {os.getpid()}, source 'corral.raw'")
            assert warning.endswith("closing it after 1 records")
        else:
            assert warning.startswith(f"log connection from pid {os.getpid()}: {reason}")
        # Meanwhile the good child, connected all along, is served as usual.
        assert good.stdin is not None
        await good.stdin.send(b"go\n")
        assert await good.wait() == 0
    assert logs.logged("corral.good") == [f"good {i}" for i in range(300)]
    assert logs.logged("corral.raw") == (["the good one"] if accepted else [])
    assert logs.warnings() == [warning]


async def test_a_bad_frame_is_hung_up_on_at_once(tag: str) -> None:
    # The warning says the connection is being closed; the server must then hang up
    # without waiting for the peer to send more bytes or to close its end.
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        path, secret = await socket_of(r, tag)
        async with await anyio.connect_unix(path) as raw:
            await raw.send(good_prefix(secret) + b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")
            await logs.warning(f"pid {os.getpid()}", "undecodable payload", "closing it")
            with anyio.fail_after(1), pytest.raises(anyio.EndOfStream):
                await raw.receive()


@BOTH_LOOPS
async def test_no_hello_in_time(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        # Reaching in (the only way to shorten the 5 s default for a test): set right
        # after entering, before any connection can exist.
        r._hub.server.hello_timeout = 0.2
        path, _ = await socket_of(r, tag)
        async with await anyio.connect_unix(path) as raw:
            await raw.send(b"\x00\x00")  # not even a whole prefix
            warning = await logs.warning(f"pid {os.getpid()}", "no hello")
            with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
                await raw.receive()
    assert warning == f"log connection from pid {os.getpid()}: no hello within 0.2 s"


@BOTH_LOOPS
@pytest.mark.parametrize("sent", ["nothing", "part of a hello"])
async def test_closed_before_the_hello(sent: str, tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        path, secret = await socket_of(r, tag)
        async with await anyio.connect_unix(path) as raw:
            if sent != "nothing":
                await raw.send(hello(secret)[:7])
            await raw.send_eof()
            warning = await logs.warning(f"pid {os.getpid()}", "closed before the hello")
    assert warning == f"log connection from pid {os.getpid()}: closed before the hello"
    assert logs.warnings() == [warning]


# -- backpressure -------------------------------------------------------------------------


@pytest.mark.slow
@BOTH_LOOPS
async def test_a_blocked_handler_blocks_the_child_not_the_launchers_memory(tag: str) -> None:
    logs = Gated()
    payload = "x" * 4000
    limit = DEFAULT_MAX_BYTES + 2 * 1024 * 1024  # the collector's bound, plus the kernel's
    extra = 500  # about 2 MB more: far beyond what the kernel's buffers hold
    code = f"""
        import select
        handler = connect(logging.INFO)

        class Counting:
            def __init__(self, sock):
                self.sock = sock
                self.sent = 0
            def send(self, data, flags=0):
                n = self.sock.send(data, flags)
                self.sent += n
                return n
            def __getattr__(self, name):
                return getattr(self.sock, name)

        sock = handler._sock = Counting(handler._sock)
        log = logging.getLogger("flood")
        n = 0
        while True:
            if not select.select([], [sock], [], 0)[1]:
                # Unwritable: has the launcher stopped reading, or only fallen behind
                # for a moment?
                if not select.select([], [sock], [], 0.2)[1]:
                    break
            if sock.sent > 8 * {limit}:
                print("never full", flush=True)
                os._exit(1)
            log.info("%d {payload}", n)
            n += 1
        print("full", n, sock.sent, flush=True)
        for i in range(n, n + {extra}):
            log.info("%d {payload}", i)  # these block until the launcher catches up
        print("done", flush=True)
        """
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        p = await r.start(script(code), name="flood", stdout=PIPE, extra_env={TAG_VAR: tag})
        try:
            lines = Lines(p)
            word, count, sent = (await lines.next()).split()
            assert word == "full"
            # The handler holds the first record; nothing reached it, and the launcher
            # stopped reading once it held what its collector takes.
            assert logs.blocked.is_set()
            assert logs.logged("corral.flood") == []
            assert int(sent) <= limit
        finally:
            logs.gate.set()
        assert await lines.next() == "done"
        assert await p.wait() == 0
    total = int(count) + extra
    assert logs.logged("corral.flood") == [f"{i} {payload}" for i in range(total)]
    assert logs.warnings() == []


# -- the socket's own life ----------------------------------------------------------------


async def test_socket_folder_is_private_and_removed_at_exit(tag: str) -> None:
    async with corral.open_runner(name="app", console=False) as r:
        done = await r.run(
            script(PRINT_SOCKET + '; print(os.environ["CORRAL_SOURCE"])'),
            name="probe",
            stdout=PIPE,
            extra_env={TAG_VAR: tag},
        )
        assert done.stdout is not None
        path, secret, source = done.stdout.decode().split()
        folder = os.path.dirname(path)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert len(secret) == 32 and int(secret, 16) >= 0
        assert source == "app.probe"
    assert not os.path.exists(path)
    assert not os.path.exists(folder)


@pytest.mark.slow
async def test_two_runners_have_different_secrets_and_paths(tag: str) -> None:
    async with (
        corral.open_runner(name="a", console=False) as a,
        corral.open_runner(name="b", console=False) as b,
    ):
        path_a, secret_a = await socket_of(a, tag)
        path_b, secret_b = await socket_of(b, tag)
    assert secret_a != secret_b
    assert path_a != path_b
    assert os.path.dirname(path_a) != os.path.dirname(path_b)


@BOTH_LOOPS
async def test_connections_queued_at_exit_are_still_served(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        path, secret = await socket_of(r, tag)
        # Connect, write and hang up without ever yielding to the event loop: the
        # connection is still in the listener's backlog when the block is left.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            sock.sendall(good_prefix(secret))
    assert logs.logged("corral.raw") == ["the good one"]
    assert logs.warnings() == []


@BOTH_LOOPS
async def test_a_child_gone_before_its_connection_was_accepted_is_heard(tag: str) -> None:
    logs = Recorder()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        p = await r.start(
            script(
                """
                connect(logging.INFO)
                for i in range(100):
                    logging.info("r %d", i)
                os._exit(0)
                """
            ),
            name="quick",
            extra_env={TAG_VAR: tag},
        )
        # Hold the event loop until the child is gone: its connection waits in the
        # listener's backlog, unaccepted, when the runner learns of the exit.
        assert wait_gone([p.pid], 20) == []
        assert await p.wait() == 0
        assert logs.logged("corral.quick") == [f"r {i}" for i in range(100)]


async def run_out_of_descriptors(backend: str, when: str, tag: str) -> list[str]:
    # In a process of its own, since it lowers the descriptor limit for good.
    async with corral.open_runner(console=False) as r:
        done = await r.run(
            program("out_of_descriptors", backend, when),
            name="fdlimit",
            stdout=PIPE,
            extra_env={TAG_VAR: tag},
        )
    assert done.stdout is not None
    return done.stdout.decode().splitlines()


@pytest.mark.slow
@BOTH_LOOPS
async def test_accept_survives_running_out_of_descriptors(anyio_backend: str, tag: str) -> None:
    warned, got = await run_out_of_descriptors(anyio_backend, "recover", tag)
    assert warned == "1 cannot accept log connections"
    assert got == " ".join(f"from {i}" for i in range(8))


@BOTH_LOOPS
async def test_exit_while_out_of_descriptors_serves_the_backlog(
    anyio_backend: str, tag: str
) -> None:
    # The runner is left while its accept loop waits to retry (descriptors have come
    # back meanwhile): the exit accepts and serves what waits in the backlog, and the
    # accept loop must end quietly rather than touch the closed listener.
    warned, got = await run_out_of_descriptors(anyio_backend, "exit", tag)
    assert warned == "1 cannot accept log connections"
    assert got == " ".join(f"from {i}" for i in range(8))


# -- connections that outlive their process (issue 7, item 2) -----------------------------


@BOTH_LOOPS
async def test_a_daemon_holding_the_connection_does_not_block_wait(tag: str) -> None:
    logs = Recorder()
    code = """
        import subprocess
        handler = connect(logging.INFO)
        logging.info("before")
        # A daemon that left the process group inherits the log connection.
        fd = handler._sock.fileno()
        os.set_inheritable(fd, True)
        daemon = subprocess.Popen(["sleep", "30"], pass_fds=[fd], start_new_session=True)
        print(daemon.pid, flush=True)
        """
    daemon = 0
    try:
        async with corral.open_runner(console=False, handlers=[logs]) as r:
            p = await r.start(script(code), name="parent", stdout=PIPE, extra_env={TAG_VAR: tag})
            daemon = int(await Lines(p).next())
            start = time.monotonic()
            assert await p.wait() == 0
            waited = time.monotonic() - start
            assert waited < 2.5
            assert os.getpgid(daemon) != p.pid  # it did leave the group, and lives on
        assert time.monotonic() - start < 3  # nor does the runner's exit wait for it
    finally:
        if daemon:
            kill_daemon(daemon)
    assert logs.logged("corral.parent") == ["before"]
    (warning,) = logs.warnings()
    assert warning.startswith(
        f"closed the log connection from pid {p.pid}, source 'corral.parent': silent for"
    )
    assert "after its process exited" in warning


@BOTH_LOOPS
async def test_a_daemon_logging_on_is_cut_after_the_linger_deadline(
    tag: str, tmp_path: Path
) -> None:
    # A sender that is not Python's handler: a shell loop writing ready-made frames.
    record = tmp_path / "record.bin"
    record.write_bytes(encode(Record(time.time(), logging.INFO, "INFO", "sh", "tick")))
    code = f"""
        import socket, subprocess
        from corral._logs._wire import PROTOCOL_VERSION, Hello, encode
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.environ["CORRAL_LOG_SOCKET"])
        sock.sendall(encode(Hello(
            PROTOCOL_VERSION, os.environ["CORRAL_LOG_SECRET"], os.environ["CORRAL_SOURCE"],
            os.getpid(),
        )))
        os.dup2(sock.fileno(), 3)
        # A daemon that left the process group keeps logging slowly on the connection.
        daemon = subprocess.Popen(
            ["sh", "-c", "while cat {record} >&3; do sleep 0.1; done"],
            pass_fds=[3],
            start_new_session=True,
        )
        print(daemon.pid, flush=True)
        """
    logs = Recorder()
    linger = 1.0
    daemon = 0
    try:
        async with corral.open_runner(console=False, handlers=[logs]) as r:
            # Reaching in to shorten the 5 s default, to keep the test short.
            r._hub.server.linger = linger
            p = await r.start(script(code), name="parent", stdout=PIPE, extra_env={TAG_VAR: tag})
            daemon = int(await Lines(p).next())
            await logs.wait_for(lambda r: r.getMessage() == "tick")
            start = time.monotonic()
            assert await p.wait() == 0
            waited = time.monotonic() - start
        assert time.monotonic() - start < linger + 2
    finally:
        if daemon:
            kill_daemon(daemon)
    # Never silent, so never idle: closed at the deadline, not before.
    assert linger - 0.2 <= waited < linger + 1.5
    assert set(logs.logged("corral.parent")) == {"tick"}
    (warning,) = logs.warnings()
    assert warning == (
        f"closed the log connection from pid {p.pid}, source 'corral.parent': still open "
        f"{linger:g} s after its process exited"
    )


@BOTH_LOOPS
async def test_a_daemons_own_connection_is_cut_at_the_runners_exit(tag: str) -> None:
    # A descendant that left the group and connected itself may go on logging under its
    # parent's source after the parent exited; but the runner's exit waits for it only
    # `linger` seconds.  (Without containment: a runner's cgroup would stop the daemon.)
    code = """
        import subprocess
        daemon = subprocess.Popen(
            [sys.executable, "-c", '''if True:
                import logging, time
                from corral.child import connect
                connect(logging.INFO)
                while True:
                    logging.info("tick")
                    time.sleep(0.1)  # a slow logger
            '''],
            start_new_session=True,
        )
        print(daemon.pid, flush=True)
        """
    logs = Recorder()
    linger = 1.0
    daemon = 0
    try:
        async with corral.open_runner(console=False, handlers=[logs], contain=False) as r:
            # Reaching in to shorten the 5 s default, to keep the test short.
            r._hub.server.linger = linger
            p = await r.start(script(code), name="parent", stdout=PIPE, extra_env={TAG_VAR: tag})
            daemon = int(await Lines(p).next())
            with anyio.fail_after(2):
                assert await p.wait() == 0  # not its connection: nothing to wait for
            await logs.wait_for(lambda r: r.getMessage() == "tick")
            start = time.monotonic()
        closed = time.monotonic() - start
    finally:
        if daemon:
            kill_daemon(daemon)
    assert linger - 0.2 <= closed < linger + 1.5
    assert set(logs.logged("corral.parent")) == {"tick"}
    (warning,) = logs.warnings()
    # (Its reason is checked by test_a_daemon_logging_on_is_cut_after_the_linger_deadline.)
    assert warning.startswith(
        f"closed the log connection from pid {daemon}, source 'corral.parent': "
    )
