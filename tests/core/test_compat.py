"""What AnyIO's and Trio's own subprocess test suites check, asked of corral.

The ideas come from AnyIO's ``tests/test_subprocesses.py`` and Trio's
``_tests/test_subprocess.py`` (see the checklist of the port); the tests are
written for corral's API, which speaks the vocabulary of :mod:`subprocess`,
:func:`anyio.open_process` and :func:`trio.run_process`.  Where the two
libraries disagree, the test pins corral's documented choice.

Every test runs real processes on both backends.  Nothing waits by sleeping:
the tests wait for lines, records, descriptors and exits, each bound by a
deadline (only the test that pins a wait that never ends gives it half a
second).  Every child carries the test's tag, so a leaked process fails it.
"""

from __future__ import annotations

import grp
import inspect
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import DEVNULL, PIPE, STDOUT

import anyio
import pytest
from anyio.abc import ByteReceiveStream
from tests.helpers.processes import (
    TAG_VAR,
    ListHandler,
    group_members,
    is_alive,
    tagged_pids,
    wait_gone,
)

import corral
from corral import LOG
from corral._sys import _childenv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

PY = sys.executable

#: Child code: ``fds()`` lists the child's open descriptors (not the one listdir used).
LIST_FDS = (
    "import os\n"
    "def fds():\n"
    "    found = []\n"
    "    for n in os.listdir('/proc/self/fd'):\n"
    "        try:\n"
    "            os.readlink(f'/proc/self/fd/{n}')\n"
    "        except OSError:\n"
    "            continue\n"
    "        found.append(int(n))\n"
    "    return sorted(found)\n"
)

#: A leader (Python) with one grandchild in its group.  argv[1] is a beacon
#: descriptor.  The grandchild installs handlers for SIGTERM and SIGUSR1 that
#: write ``got N`` to the beacon, then writes ``ready <its pid>``.  The leader,
#: on the same signals, waits for the grandchild and then dies of the signal,
#: so the grandchild's report cannot race the runner's clean-up of the group.
GRANDCHILD = (
    "import os, signal, sys\n"
    "fd = int(sys.argv[1])\n"
    "def got(n, frame):\n"
    "    os.write(fd, b'got %d\\n' % n)\n"
    "    os._exit(0)\n"
    "for s in (signal.SIGTERM, signal.SIGUSR1):\n"
    "    signal.signal(s, got)\n"
    "os.write(fd, b'ready %d\\n' % os.getpid())\n"
    "while True:\n"
    "    signal.pause()\n"
)
FAMILY = (
    "import os, signal, subprocess, sys\n"
    "fd = int(sys.argv[1])\n"
    "g = None\n"
    "def die(n, frame):\n"
    "    signal.signal(n, signal.SIG_DFL)\n"
    "    g.wait()\n"
    "    os.kill(os.getpid(), n)\n"
    "for s in (signal.SIGTERM, signal.SIGUSR1):\n"
    "    signal.signal(s, die)\n"
    f"g = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, str(fd)], pass_fds=[fd])\n"
    "while True:\n"
    "    signal.pause()\n"
)


def py(code: str, *args: str) -> list[str]:
    return [PY, "-c", code, *args]


def tagged(tag: str) -> dict[str, str | None]:
    return {TAG_VAR: tag}


class Beacon:
    """A pipe children write lines to (pass :attr:`w` with ``pass_fds``); read on the loop."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self._buffer = b""

    async def line(self, timeout: float = 10) -> bytes:
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                await anyio.wait_readable(self.r)
                try:
                    data = os.read(self.r, 4096)
                except BlockingIOError:
                    continue
                if not data:
                    raise EOFError("the beacon was closed without a line")
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


@contextmanager
def beacon() -> Iterator[Beacon]:
    b = Beacon()
    try:
        yield b
    finally:
        b.close()


async def receive_all(stream: ByteReceiveStream) -> bytes:
    data = bytearray()
    while True:
        try:
            data += await stream.receive()
        except anyio.EndOfStream:
            return bytes(data)


async def receive_exactly(stream: ByteReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        data += await stream.receive(size - len(data))
    return bytes(data)


async def receive_line(stream: ByteReceiveStream) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n"):
        data += await stream.receive(1)
    return bytes(data)


def fd_table() -> dict[int, str]:
    """This process's open descriptors and what they point to."""
    table = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            table[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the one listdir used
    return table


def current_umask() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


async def cancel_run_when_ready(
    run: Callable[[], Awaitable[object]], ready: Beacon
) -> tuple[bytes, bool]:
    """Run ``run()`` and cancel it once ``ready`` has a line; return the line and the outcome."""
    seen: list[bytes] = []
    with anyio.CancelScope() as scope:

        async def cancel_when_ready() -> None:
            seen.append(await ready.line())
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_when_ready)
            await run()
    return seen[0], scope.cancelled_caught


# -- input and output ---------------------------------------------------------------------


async def test_run_input_roundtrip(tag: str) -> None:
    argv = ["cat"]
    reverse = py("import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])")
    async with corral.open_runner(console=False) as r:
        done = await r.run(argv, input=b"abc", stdout=PIPE, extra_env=tagged(tag))
        assert isinstance(done, corral.CompletedProcess)
        assert isinstance(done, subprocess.CompletedProcess)
        assert done.returncode == 0
        assert done.stdout == b"abc"
        assert done.stderr is None
        assert done.args == argv
        assert done.pid > 0 and done.name == "cat" and done.duration >= 0
        backwards = await r.run(reverse, input=b"abc\n", stdout=PIPE, extra_env=tagged(tag))
        assert backwards.stdout == b"\ncba"
        assert backwards.args == reverse


async def test_run_large_binary_roundtrip(tag: str) -> None:
    data = os.urandom(256 * 1024 + 123)
    # Echoes as it reads (so stdin and stdout are busy at once), then writes
    # everything reversed to stderr: more than a pipe holds, every way.
    echo = (
        "import sys\n"
        "seen = bytearray()\n"
        "while chunk := sys.stdin.buffer.read1(4096):\n"
        "    seen += chunk\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "    sys.stdout.buffer.flush()\n"
        "sys.stderr.buffer.write(bytes(seen[::-1]))\n"
    )
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(15):
            done = await r.run(
                py(echo), input=data, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag)
            )
            plain = await r.run(["cat"], input=data, stdout=PIPE, extra_env=tagged(tag))
    assert done.returncode == 0
    assert done.stdout == data
    assert done.stderr == data[::-1]
    assert plain.stdout == data


@pytest.mark.slow
async def test_run_uncaptured_is_none_and_empty_is_empty_bytes(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        for option in (LOG, DEVNULL, None):
            done = await r.run(["true"], stdout=option, stderr=option, extra_env=tagged(tag))
            assert (done.stdout, done.stderr) == (None, None), option
        done = await r.run(["true"], stdout=PIPE, stderr=PIPE, extra_env=tagged(tag))
        assert (done.stdout, done.stderr) == (b"", b"")
        done = await r.run(["true"], stdout=LOG | PIPE, stderr=PIPE | LOG, extra_env=tagged(tag))
        assert (done.stdout, done.stderr) == (b"", b"")


@pytest.mark.slow
async def test_run_log_or_pipe(tag: str) -> None:
    logs = ListHandler()
    script = "import sys; print('a'); print('b'); print('c', file=sys.stderr)"
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        done = await r.run(
            py(script), name="both", stdout=LOG | PIPE, stderr=LOG | PIPE, extra_env=tagged(tag)
        )
        assert done.stdout == b"a\nb\n"
        assert done.stderr == b"c\n"
        p = await r.start(
            py(script),
            name="both-start",
            stdout=LOG | PIPE,
            stderr=LOG | PIPE,
            extra_env=tagged(tag),
        )
        assert p.stdout is not None and p.stderr is not None
        with anyio.fail_after(10):
            assert await receive_all(p.stdout) == b"a\nb\n"
            assert await receive_all(p.stderr) == b"c\n"
            assert await p.wait() == 0
    for source in ("corral.both", "corral.both-start"):
        records = [
            (rec.getMessage(), rec.corral_stream, rec.levelno)  # type: ignore[attr-defined]
            for rec in logs.records
            if getattr(rec, "corral_source", None) == source
            and getattr(rec, "corral_stream", None) in ("stdout", "stderr")
        ]
        assert sorted(records) == [
            ("a", "stdout", logging.INFO),
            ("b", "stdout", logging.INFO),
            ("c", "stderr", logging.WARNING),
        ]


async def test_run_empty_input_gives_eof(tag: str) -> None:
    script = (
        "import os, sys\n"
        "print(os.readlink('/proc/self/fd/0').split(':')[0])\n"
        "print(repr(sys.stdin.buffer.read()))\n"
    )
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            done = await r.run(py(script), input=b"", stdout=PIPE, extra_env=tagged(tag))
    # An empty pipe, closed at once: not the launcher's stdin, not /dev/null.
    assert done.stdout == b"pipe\nb''\n"


async def test_run_input_ignores_broken_pipe(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            done = await r.run(
                py("import os; os.close(0)"), input=b"x" * 1_000_000, extra_env=tagged(tag)
            )
    assert done.returncode == 0
    assert (done.stdout, done.stderr) == (None, None)


async def test_run_input_rejects_str(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with pytest.raises(TypeError, match="input"):
            await r.run(["cat"], input="text", extra_env=tagged(tag))  # type: ignore[arg-type]
        assert r.processes == ()
    assert tagged_pids(tag) == []


@pytest.mark.slow
async def test_start_pipes_concurrent_feed_and_drain(tag: str) -> None:
    message = os.urandom(200_000)
    script = (
        "import sys\n"
        "data = sys.stdin.buffer.read()\n"
        "sys.stdout.buffer.write(data)\n"
        "sys.stderr.buffer.write(data[::-1])\n"
    )
    got: dict[str, bytes] = {}
    async with corral.open_runner(console=False) as r:
        p = await r.start(py(script), stdin=PIPE, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag))
        stdin, stdout, stderr = p.stdin, p.stdout, p.stderr
        assert stdin is not None and stdout is not None and stderr is not None

        async def feed() -> None:
            async with stdin:
                await stdin.send(message)

        async def drain(name: str, stream: ByteReceiveStream) -> None:
            got[name] = await receive_all(stream)

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                tg.start_soon(drain, "stdout", stdout)
                tg.start_soon(drain, "stderr", stderr)
            assert await p.wait() == 0
    assert got == {"stdout": message, "stderr": message[::-1]}


async def test_start_interactive_line_protocol(tag: str) -> None:
    # Each request line gets "<length>:<line>" on stdout and one '#' per byte on stderr.
    script = (
        "import sys\n"
        "for line in sys.stdin.buffer:\n"
        "    body = line.rstrip(b'\\n')\n"
        "    sys.stdout.buffer.write(b'%d:%s\\n' % (len(body), body))\n"
        "    sys.stdout.buffer.flush()\n"
        "    sys.stderr.buffer.write(b'#' * len(body) + b'\\n')\n"
        "    sys.stderr.buffer.flush()\n"
    )
    async with corral.open_runner(console=False) as r:
        p = await r.start(py(script), stdin=PIPE, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag))
        assert p.stdin is not None and p.stdout is not None and p.stderr is not None
        with anyio.fail_after(10):
            # A line in two pieces is answered once, as a whole: the first
            # piece alone was not answered.
            await p.stdin.send(b"hel")
            await p.stdin.send(b"lo\n")
            assert await receive_exactly(p.stdout, 8) == b"5:hello\n"
            assert await receive_exactly(p.stderr, 6) == b"#####\n"
            # Several requests in one write.
            await p.stdin.send(b"a\nbb\nccc\n")
            assert await receive_exactly(p.stdout, 15) == b"1:a\n2:bb\n3:ccc\n"
            assert await receive_exactly(p.stderr, 9) == b"#\n##\n###\n"
            await p.stdin.aclose()
            assert await receive_all(p.stdout) == b""
            assert await receive_all(p.stderr) == b""
            assert await p.wait() == 0


@pytest.mark.slow
async def test_stderr_to_stdout(tag: str, capfd: pytest.CaptureFixture[str]) -> None:
    script = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True)"
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        with anyio.fail_after(10):
            # start: one stream, no stderr stream.
            p = await r.start(py(script), stdout=PIPE, stderr=STDOUT, extra_env=tagged(tag))
            assert p.stderr is None and p.stdout is not None
            assert await receive_all(p.stdout) == b"out\nerr\n"
            assert await p.wait() == 0
            # run: merged into the result's stdout.
            done = await r.run(py(script), stdout=PIPE, stderr=STDOUT, extra_env=tagged(tag))
            assert (done.stdout, done.stderr) == (b"out\nerr\n", None)
            # stdout inherited: both on the launcher's fd 1.
            capfd.readouterr()
            done = await r.run(py(script), stdout=None, stderr=STDOUT, extra_env=tagged(tag))
            assert (done.stdout, done.stderr) == (None, None)
            captured = capfd.readouterr()
            assert (captured.out, captured.err) == ("out\nerr\n", "")
            # stdout a raw descriptor: both on its read end.
            read_end, write_end = os.pipe()
            try:
                await r.run(py(script), stdout=write_end, stderr=STDOUT, extra_env=tagged(tag))
                os.close(write_end)
                with os.fdopen(read_end, "rb") as f:
                    assert f.read() == b"out\nerr\n"
            finally:
                for fd in (read_end, write_end):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            # stdout logged: stderr lines become records of the stdout stream.
            await r.run(py(script), name="merged", stderr=STDOUT, extra_env=tagged(tag))
            # stdout discarded: stderr with it.
            done = await r.run(
                py(script), name="quiet", stdout=DEVNULL, stderr=STDOUT, extra_env=tagged(tag)
            )
            assert (done.stdout, done.stderr) == (None, None)
    merged = [
        (rec.getMessage(), rec.corral_stream)  # type: ignore[attr-defined]
        for rec in logs.records
        if getattr(rec, "corral_source", None) == "corral.merged"
        and getattr(rec, "corral_stream", None) in ("stdout", "stderr")
    ]
    assert merged == [("out", "stdout"), ("err", "stdout")]
    assert logs.lines("corral.quiet") == []
    assert capfd.readouterr() == ("", "")
    async with corral.open_runner(console=False) as r:
        with pytest.raises(ValueError, match="STDOUT"):
            await r.run(["true"], stdout=STDOUT, extra_env=tagged(tag))


@pytest.mark.slow
async def test_output_flood_no_deadlock(tag: str) -> None:
    size = 10 * 1024 * 1024
    pattern = "bytes(range(256)) * (10 * 1024 * 1024 // 256)"
    script = f"import sys; sys.stdout.buffer.write({pattern})"
    expected = bytes(range(256)) * (size // 256)
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(20):
            done = await r.run(py(script), stdout=PIPE, extra_env=tagged(tag))
            assert done.stdout == expected
            p = await r.start(py(script), stdout=PIPE, extra_env=tagged(tag))
            assert p.stdout is not None
            assert await receive_all(p.stdout) == expected
            assert await p.wait() == 0


# -- stdio options ------------------------------------------------------------------------

COPY_STDIN = (
    "import sys\n"
    "sys.stdout.buffer.write(b'got ' + sys.stdin.buffer.read())\n"
    "sys.stderr.buffer.write(b'to err\\n')\n"
)


async def test_stdio_file_objects_run_and_start(tag: str, tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"line one\nline two\n")
    async with corral.open_runner(console=False) as r:
        for how in ("run", "start"):
            out, err = tmp_path / f"out-{how}", tmp_path / f"err-{how}"
            with (
                open(tmp_path / "in", "rb") as fin,
                open(out, "wb") as fout,
                open(err, "wb") as ferr,
            ):
                options = dict(stdin=fin, stdout=fout, stderr=ferr, extra_env=tagged(tag))
                with anyio.fail_after(10):
                    if how == "run":
                        done = await r.run(py(COPY_STDIN), **options)  # type: ignore[arg-type]
                        assert (done.returncode, done.stdout, done.stderr) == (0, None, None)
                    else:
                        p = await r.start(py(COPY_STDIN), **options)  # type: ignore[arg-type]
                        assert (p.stdin, p.stdout, p.stderr) == (None, None, None)
                        assert await p.wait() == 0
            assert out.read_bytes() == b"got line one\nline two\n", how
            assert err.read_bytes() == b"to err\n", how


async def test_stdio_raw_fds(tag: str, tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"raw\n")
    fin = os.open(tmp_path / "in", os.O_RDONLY)
    fout = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o644)
    ferr = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        async with corral.open_runner(console=False) as r:
            with anyio.fail_after(10):
                done = await r.run(
                    py(COPY_STDIN), stdin=fin, stdout=fout, stderr=ferr, extra_env=tagged(tag)
                )
        assert (done.stdout, done.stderr) == (None, None)
        # The caller's descriptors are the caller's: still open.
        for fd in (fin, fout, ferr):
            os.fstat(fd)
    finally:
        for fd in (fin, fout, ferr):
            os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"got raw\n"
    assert (tmp_path / "err").read_bytes() == b"to err\n"


@pytest.mark.slow
async def test_stdio_inherit_none(tag: str, capfd: pytest.CaptureFixture[str]) -> None:
    logs = ListHandler()
    script = "import sys; print('to out'); print('to err', file=sys.stderr)"
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        capfd.readouterr()
        done = await r.run(py(script), name="inh", stdout=None, stderr=None, extra_env=tagged(tag))
        p = await r.start(py(script), name="inh2", stdout=None, stderr=None, extra_env=tagged(tag))
        with anyio.fail_after(10):
            assert await p.wait() == 0
    assert (done.stdout, done.stderr) == (None, None)
    captured = capfd.readouterr()
    assert captured.out == "to out\n" * 2
    assert captured.err == "to err\n" * 2
    assert logs.lines("corral.inh") == [] and logs.lines("corral.inh2") == []


async def test_stdio_devnull(tag: str) -> None:
    logs = ListHandler()
    # The exit code says what was wrong (stdout and stderr lead nowhere).
    script = (
        "import os, sys\n"
        "bad = 0\n"
        "for n in (0, 1, 2):\n"
        "    if os.readlink(f'/proc/self/fd/{n}') != '/dev/null':\n"
        "        bad |= 1 << n\n"
        "if sys.stdin.buffer.read() != b'':\n"
        "    bad |= 8\n"
        "print('discarded'); print('discarded', file=sys.stderr)\n"
        "sys.exit(bad)\n"
    )
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        with anyio.fail_after(10):
            done = await r.run(
                py(script),
                name="null",
                stdin=DEVNULL,
                stdout=DEVNULL,
                stderr=DEVNULL,
                extra_env=tagged(tag),
            )
    assert (done.returncode, done.stdout, done.stderr) == (0, None, None)
    assert logs.lines("corral.null") == []


@pytest.mark.slow
async def test_stdin_default(tag: str) -> None:
    script = (
        "import os, sys\n"
        "print(os.readlink('/proc/self/fd/0'))\n"
        "print(repr(sys.stdin.buffer.read()))\n"
    )
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            done = await r.run(py(script), stdout=PIPE, extra_env=tagged(tag))
            p = await r.start(py(script), stdout=PIPE, extra_env=tagged(tag))
            assert p.stdin is None and p.stdout is not None
            started = await receive_all(p.stdout)
            assert await p.wait() == 0
    # DEVNULL, corral's documented default (subprocess would inherit).
    assert done.stdout == started == b"/dev/null\nb''\n"


async def test_input_and_stdin_conflict(tag: str, tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"")
    async with corral.open_runner(console=False) as r:
        with open(tmp_path / "in", "rb") as f:
            for stdin in (f, f.fileno(), None, PIPE):
                with pytest.raises(ValueError, match="stdin and input"):
                    await r.run(["cat"], input=b"x", stdin=stdin, extra_env=tagged(tag))
        assert r.processes == ()
    assert tagged_pids(tag) == []


async def test_run_stdin_pipe_without_input(tag: str) -> None:
    script = (
        "import os, sys\n"
        "print(os.readlink('/proc/self/fd/0').split(':')[0])\n"
        "print(repr(sys.stdin.buffer.read()))\n"
    )
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            done = await r.run(py(script), stdin=PIPE, stdout=PIPE, extra_env=tagged(tag))
    # Decided: empty input (an immediately closed pipe), as subprocess does.
    assert done.stdout == b"pipe\nb''\n"


@pytest.mark.slow
async def test_pass_fds(tag: str) -> None:
    script = LIST_FDS + (
        "import sys\n"
        "w = int(sys.argv[1])\n"
        "print(fds())\n"
        "os.write(w, b'through pass_fds\\n')\n"
        "import corral.child\n"
        "corral.child.started()\n"
    )
    # Descriptors the child must not get: ours that are not passed.
    decoy_r, decoy_w = os.pipe()
    os.set_inheritable(decoy_r, True)  # even an inheritable one stays home
    try:
        with beacon() as b:
            async with corral.open_runner(console=False) as r:
                with anyio.fail_after(10):
                    done = await r.run(
                        py(script, str(b.w)), pass_fds=[b.w], stdout=PIPE, extra_env=tagged(tag)
                    )
                    assert json.loads(done.stdout) == [0, 1, 2, b.w]
                    assert await b.line() == b"through pass_fds"
                    done = await r.run(
                        py(script, str(b.w)),
                        pass_fds=[b.w],
                        stdout=PIPE,
                        wait_started=True,
                        extra_env=tagged(tag),
                    )
                    assert json.loads(done.stdout) == [0, 1, 2, 3, b.w]
                    assert await b.line() == b"through pass_fds"
                    # Every stream option at once, none of corral's descriptors leaks.
                    p = await r.start(
                        py(script, str(b.w)),
                        pass_fds=[b.w],
                        stdin=PIPE,
                        stdout=LOG | PIPE,
                        stderr=PIPE,
                        extra_env=tagged(tag),
                    )
                    assert p.stdout is not None
                    assert json.loads(await receive_line(p.stdout)) == [0, 1, 2, b.w]
                    assert await b.line() == b"through pass_fds"
                    assert await p.wait() == 0
                    await p.aclose()
                with pytest.raises(ValueError, match="pass_fds"):
                    await r.run(["true"], pass_fds=[1], extra_env=tagged(tag))
    finally:
        os.close(decoy_r)
        os.close(decoy_w)


# -- environment, directory, session, identity --------------------------------------------


def parse_env(output: bytes) -> dict[str, str]:
    return dict(item.decode().split("=", 1) for item in output.split(b"\0") if item)


async def test_env_replaces(tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_COMPAT_PARENT_ONLY", "parent")
    env_program = shutil.which("env")
    assert env_program is not None
    async with corral.open_runner(console=False) as r:
        done = await r.run([env_program, "-0"], env={"A": "1"}, stdout=PIPE, extra_env=tagged(tag))
    child = parse_env(done.stdout)
    assert child["A"] == "1"
    assert "CORRAL_COMPAT_PARENT_ONLY" not in child
    assert "PATH" not in child and "HOME" not in child
    # extra_env goes on top of env (that is how the tag got there).
    assert child[TAG_VAR] == tag
    # What else is there is corral's: its own variables and its start-up hook.
    assert {k for k in child if not k.startswith("CORRAL_")} == {"A", "PYTHONPATH"}
    assert child["PYTHONPATH"] == _childenv.HOOK_DIR


async def test_extra_env_overlays(tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_COMPAT_KEEP", "kept")
    monkeypatch.setenv("CORRAL_COMPAT_OVERRIDE", "old")
    monkeypatch.setenv("CORRAL_COMPAT_REMOVE", "gone")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    async with corral.open_runner(console=False) as r:
        done = await r.run(
            ["env", "-0"],
            stdout=PIPE,
            extra_env={
                TAG_VAR: tag,
                "A": "1",
                "CORRAL_COMPAT_OVERRIDE": "new",
                "CORRAL_COMPAT_REMOVE": None,
            },
        )
        child = parse_env(done.stdout)
        assert child["A"] == "1"
        assert child["CORRAL_COMPAT_KEEP"] == "kept"
        assert child["CORRAL_COMPAT_OVERRIDE"] == "new"
        assert "CORRAL_COMPAT_REMOVE" not in child
        assert child["PATH"] == os.environ["PATH"]
        # No PYTHONUNBUFFERED: prompt lines from corral's start-up hook instead.
        assert "PYTHONUNBUFFERED" not in child
        assert child["PYTHONPATH"].split(os.pathsep)[0] == _childenv.HOOK_DIR
        assert child[_childenv.FLUSH_EVERY] == str(_childenv.FLUSH_INTERVAL)
        # Naming PYTHONUNBUFFERED (even to remove it) leaves it to the caller.
        for value in (None, "1"):
            done = await r.run(
                ["env", "-0"], stdout=PIPE, extra_env={TAG_VAR: tag, "PYTHONUNBUFFERED": value}
            )
            child = parse_env(done.stdout)
            assert child.get("PYTHONUNBUFFERED") == value
            assert _childenv.HOOK_DIR not in child.get("PYTHONPATH", "")
            assert _childenv.FLUSH_EVERY not in child
    # The launcher's own environment is untouched.
    assert os.environ["CORRAL_COMPAT_OVERRIDE"] == "old"
    assert os.environ["CORRAL_COMPAT_REMOVE"] == "gone"


@pytest.mark.slow
async def test_cwd_path_and_str(tag: str, tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    prog.write_text('#!/bin/sh\necho "$0"\npwd\n')
    prog.chmod(0o755)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "prog").write_text('#!/bin/sh\necho "wrong one"\n')
    (tmp_path / "sub" / "prog").chmod(0o755)
    script = "import os; print(os.getcwd())"
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            for cwd in (tmp_path, str(tmp_path)):
                done = await r.run(py(script), cwd=cwd, stdout=PIPE, extra_env=tagged(tag))
                assert done.stdout == f"{tmp_path}\n".encode()
            # A relative program is found in cwd, and argv[0] stays as written.
            done = await r.run(["./prog"], cwd=tmp_path, stdout=PIPE, extra_env=tagged(tag))
            assert done.stdout == f"./prog\n{tmp_path}\n".encode()
            assert done.args == ["./prog"]
            # The same through the start-up handshake's shim.
            report = '#!/bin/sh\necho \'"up"\' >&3\nexec 3>&-\necho "$0"\npwd\n'
            (tmp_path / "reporter").write_text(report)
            (tmp_path / "reporter").chmod(0o755)
            p = await r.start(
                ["./reporter"], cwd=tmp_path, stdout=PIPE, wait_started=True, extra_env=tagged(tag)
            )
            assert p.started_value == "up"
            assert p.args == ["./reporter"]
            assert p.stdout is not None
            assert await receive_all(p.stdout) == f"./reporter\n{tmp_path}\n".encode()
            assert await p.wait() == 0
        # A missing directory, or a file, fails the spawn and leaves nothing.
        with pytest.raises(FileNotFoundError):
            await r.run(["true"], cwd=tmp_path / "missing", extra_env=tagged(tag))
        with pytest.raises(NotADirectoryError):
            await r.run(["true"], cwd=prog, extra_env=tagged(tag))
        assert r.processes == ()
    assert tagged_pids(tag) == []


@pytest.mark.slow
async def test_start_new_session(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with beacon() as b:
            with anyio.fail_after(10):
                # Default: the launcher's session, a group of its own.
                p = await r.start(py(FAMILY, str(b.w)), pass_fds=[b.w], extra_env=tagged(tag))
                gpid = int((await b.line()).split()[1])
                assert os.getsid(p.pid) == os.getsid(0)
                assert os.getpgid(p.pid) == p.pid == os.getpgid(gpid)
                p.terminate()
                assert await b.line() == b"got %d" % signal.SIGTERM
                assert await p.wait() == -signal.SIGTERM
                # New session: it leads the session and its group; signals still
                # reach the whole group, by terminate() and by stop().
                for how in ("terminate", "stop"):
                    q = await r.start(
                        py(FAMILY, str(b.w)),
                        pass_fds=[b.w],
                        start_new_session=True,
                        extra_env=tagged(tag),
                    )
                    gpid = int((await b.line()).split()[1])
                    assert os.getsid(q.pid) == q.pid == os.getpgid(q.pid)
                    assert os.getsid(gpid) == q.pid == os.getpgid(gpid)
                    if how == "terminate":
                        q.terminate()
                        code = await q.wait()
                    else:
                        code = await q.stop()
                    assert await b.line() == b"got %d" % signal.SIGTERM
                    assert code == -signal.SIGTERM
                    assert group_members(q.pid) == []


@pytest.mark.slow
async def test_user_group_extra_groups_self(tag: str) -> None:
    uid, gid = os.getuid(), os.getgid()
    user_name = pwd.getpwuid(uid).pw_name
    group_name = grp.getgrgid(gid).gr_name
    script = "import json, os; print(json.dumps([os.getuid(), os.getgid(), os.getgroups()]))"
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            for user, group, extra in ((uid, gid, [gid]), (user_name, group_name, [group_name])):
                done = await r.run(
                    py(script),
                    user=user,
                    group=group,
                    extra_groups=extra,
                    stdout=PIPE,
                    extra_env=tagged(tag),
                )
                child_uid, child_gid, child_groups = json.loads(done.stdout)
                assert (child_uid, child_gid, child_groups) == (uid, gid, [gid])
                p = await r.start(py(script), user=user, group=group, extra_env=tagged(tag))
                assert await p.wait() == 0
        with pytest.raises(KeyError):
            await r.run(["true"], user="no-such-user-corral", extra_env=tagged(tag))
        assert r.processes == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
async def test_user_nobody_as_root(tag: str) -> None:
    nobody = pwd.getpwnam("nobody")
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            done = await r.run(
                ["sh", "-c", "id -u; id -g; id -G"],
                user="nobody",
                group=nobody.pw_gid,
                extra_groups=[],
                stdout=PIPE,
                extra_env=tagged(tag),
            )
            gid = str(nobody.pw_gid).encode()
            assert done.stdout == b"%d\n%s\n%s\n" % (nobody.pw_uid, gid, gid)
            # Only the uid changes when only user= is given.
            done = await r.run(["id", "-u"], user="nobody", stdout=PIPE, extra_env=tagged(tag))
            assert done.stdout == b"%d\n" % nobody.pw_uid
            # A child of another user is stopped like any other.
            p = await r.start(["sleep", "1000"], user=nobody.pw_uid, extra_env=tagged(tag))
            assert os.stat(f"/proc/{p.pid}").st_uid == nobody.pw_uid
            assert await p.stop() == -signal.SIGTERM


@pytest.mark.slow
async def test_umask_applied(tag: str, tmp_path: Path) -> None:
    script = (
        "import os, sys\n"
        "old = os.umask(0)\n"
        "os.umask(old)\n"
        "path = sys.argv[1]\n"
        "open(path, 'w').close()\n"
        "print(oct(old), oct(os.stat(path).st_mode & 0o777))\n"
    )
    parent = current_umask()
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            done = await r.run(
                py(script, str(tmp_path / "a")), umask=0o077, stdout=PIPE, extra_env=tagged(tag)
            )
            assert done.stdout == b"0o77 0o600\n"
            done = await r.run(
                py(script, str(tmp_path / "b")), umask=0, stdout=PIPE, extra_env=tagged(tag)
            )
            assert done.stdout == b"0o0 0o666\n"
            done = await r.run(py(script, str(tmp_path / "c")), stdout=PIPE, extra_env=tagged(tag))
            assert done.stdout == f"{oct(parent)} {oct(0o666 & ~parent)}\n".encode()
            p = await r.start(py(script, str(tmp_path / "d")), umask=0o027, extra_env=tagged(tag))
            assert await p.wait() == 0
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o640
    assert current_umask() == parent


def test_spawn_option_parity() -> None:
    run = inspect.signature(corral.Runner.run).parameters
    start = inspect.signature(corral.Runner.start).parameters
    assert set(run) - {"input"} == set(start)
    for name in start:
        if name in ("self", "argv", "check"):
            continue
        assert run[name].default == start[name].default, name
        assert run[name].kind == start[name].kind == inspect.Parameter.KEYWORD_ONLY, name
    # run() and subprocess.run agree on what check means, not on its default.
    assert run["check"].default is True


# -- check and return codes ----------------------------------------------------------------

TWO_STREAMS_EXIT_1 = "import sys; print('to out'); print('to err', file=sys.stderr); sys.exit(1)"


@pytest.mark.slow
async def test_nonzero_raises_process_failed(tag: str) -> None:
    argv = py(TWO_STREAMS_EXIT_1)
    async with corral.open_runner(console=False) as r:
        with pytest.raises(corral.ProcessFailed) as info:
            await r.run(argv, name="bad", stdout=PIPE, stderr=PIPE, extra_env=tagged(tag))
        err = info.value
        assert isinstance(err, subprocess.CalledProcessError)
        assert (err.returncode, err.cmd, err.name, err.signal) == (1, argv, "bad", None)
        assert err.stdout == err.output == b"to out\n"
        assert err.stderr == b"to err\n"
        assert err.pid > 0
        # Logged streams: stdout was not collected; stderr is its tail.
        with pytest.raises(corral.ProcessFailed) as info:
            await r.run(argv, extra_env=tagged(tag))
        assert (info.value.stdout, info.value.stderr) == (None, b"to err\n")
        # Streams that went elsewhere.
        with pytest.raises(corral.ProcessFailed) as info:
            await r.run(argv, stdout=DEVNULL, stderr=DEVNULL, extra_env=tagged(tag))
        assert (info.value.stdout, info.value.stderr) == (None, b"")
        # The failure of run() was raised here and does not fail the runner.
    assert tagged_pids(tag) == []


async def test_check_false_returns_result(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        done = await r.run(
            py(TWO_STREAMS_EXIT_1), check=False, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag)
        )
        assert (done.returncode, done.stdout, done.stderr) == (1, b"to out\n", b"to err\n")
        with pytest.raises(corral.ProcessFailed):
            done.check_returncode()
        done = await r.run(["sh", "-c", "kill -USR1 $$"], check=False, extra_env=tagged(tag))
        assert done.returncode == -signal.SIGUSR1
        p = await r.start(["sh", "-c", "exit 5"], check=False, extra_env=tagged(tag))
        assert await p.wait() == 5


async def test_signal_codes_are_negative(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        for how, expected in (
            ("kill", -signal.SIGKILL),
            ("terminate", -signal.SIGTERM),
            ("send_signal", -signal.SIGUSR1),
        ):
            # send_signal's exits are failures: check=False for that one.
            p = await r.start(["sleep", "1000"], check=how != "send_signal", extra_env=tagged(tag))
            if how == "send_signal":
                assert p.send_signal(signal.SIGUSR1) is None
            else:
                assert getattr(p, how)() is None
            with anyio.fail_after(2):
                assert await p.wait() == expected, how
            assert p.returncode == expected
        with pytest.raises(corral.ProcessFailed) as info:
            await r.run(["sh", "-c", "kill -USR1 $$"], extra_env=tagged(tag))
        assert info.value.returncode == -signal.SIGUSR1
        assert info.value.signal == signal.SIGUSR1
        assert "killed by SIGUSR1" in str(info.value)
    # A send_signal() exit of a check=True child fails the runner.
    with pytest.raises(ExceptionGroup) as group:
        async with corral.open_runner(console=False) as r:
            p = await r.start(["sleep", "1000"], name="signalled", extra_env=tagged(tag))
            p.send_signal(signal.SIGUSR1)
            await anyio.sleep_forever()
    assert group.group_contains(corral.ProcessFailed, match="killed by SIGUSR1")
    assert p.returncode == -signal.SIGUSR1


@pytest.mark.slow
async def test_child_sigterm_handler_exit_code(tag: str) -> None:
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(2))\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(10):
            p = await r.start(py(script), stdout=PIPE, extra_env=tagged(tag))
            assert p.stdout is not None
            assert await receive_line(p.stdout) == b"ready\n"
            p.terminate()
            assert await p.wait() == 2
    # Pinned: an exit that terminate() caused is not a failure, whatever its
    # code; one that send_signal() caused is.
    with pytest.raises(ExceptionGroup) as group:
        async with corral.open_runner(console=False) as r:
            p = await r.start(py(script), stdout=PIPE, extra_env=tagged(tag))
            assert p.stdout is not None
            with anyio.fail_after(10):
                assert await receive_line(p.stdout) == b"ready\n"
            p.send_signal(signal.SIGTERM)
            await anyio.sleep_forever()
    assert group.group_contains(corral.ProcessFailed, match="exited with code 2")
    assert p.returncode == 2


async def test_background_start_failure_fails_runner(tag: str) -> None:
    with pytest.raises(ExceptionGroup) as group:
        async with corral.open_runner(console=False) as r:
            sibling = await r.start(["sleep", "1000"], extra_env=tagged(tag))
            p = await r.start(
                ["sh", "-c", "echo why >&2; exit 1"], name="doomed", extra_env=tagged(tag)
            )
            await anyio.sleep_forever()
    failures = [e for e in group.value.exceptions if isinstance(e, corral.ProcessFailed)]
    assert len(failures) == 1
    failure = failures[0]
    assert (failure.returncode, failure.name, failure.cmd) == (1, "doomed", p.args)
    assert failure.stderr == b"why\n"
    assert p.returncode == 1
    assert sibling.returncode == -signal.SIGTERM


SIGCHLD_IGNORED = """
import json, logging, signal, sys
import anyio, corral

class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []
    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))

async def main():
    keep = Keep()
    async with corral.open_runner(console=False, handlers=[keep]) as r:
        # Quick exits: the kernel may reap them before the runner looks at all.
        quick = [(await r.run(["true"])).returncode for _ in range(20)]
        failed = await r.run(["sh", "-c", "exit 3"])
        p = await r.start(["sh", "-c", "exit 5"])
        waited = await p.wait()
    warnings = [m for level, m in keep.records if level == logging.WARNING]
    print(json.dumps([quick, failed.returncode, waited, p.returncode, warnings]))

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.slow
async def test_sigchld_ignored(tag: str, anyio_backend: str) -> None:
    # In a launcher of its own, so that this process's SIGCHLD stays as it is.
    async with corral.open_runner(console=False) as r:
        with anyio.fail_after(20):
            done = await r.run(
                py(SIGCHLD_IGNORED, anyio_backend), stdout=PIPE, extra_env=tagged(tag)
            )
    quick, failed, waited, returncode, warnings = json.loads(done.stdout)
    # The status is gone: 0, like subprocess and Trio, with a warning each.
    assert (quick, failed, waited, returncode) == ([0] * 20, 0, 0, 0)
    assert len(warnings) == 22
    assert all("exit status was collected elsewhere" in w for w in warnings)


# -- cancellation -------------------------------------------------------------------------


async def test_cancel_run_stops_and_reaps(tag: str) -> None:
    logs = ListHandler()
    script = (
        "import os, sys, time; os.write(int(sys.argv[1]), b'%d\\n' % os.getpid()); time.sleep(1000)"
    )
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        with beacon() as b:
            line, cancelled = await cancel_run_when_ready(
                lambda: r.run(
                    py(script, str(b.w)), name="cancelled", pass_fds=[b.w], extra_env=tagged(tag)
                ),
                b,
            )
        pid = int(line)
        assert cancelled
        # Stopped and reaped before the cancellation went on.
        assert not is_alive(pid)
        assert group_members(pid) == []
        assert r.processes == ()
    assert any(f"cancelled (pid {pid}) killed by SIGTERM" in m for m in logs.messages("corral"))


async def test_cancel_run_uses_stop_signal_then_grace(tag: str) -> None:
    logs = ListHandler()
    script = (
        "import os, signal, sys\n"
        "fd = int(sys.argv[1])\n"
        "def bye(n, frame):\n"
        "    os.write(fd, b'got %d\\n' % n)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, bye)\n"
        "os.write(fd, b'%d\\n' % os.getpid())\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        with beacon() as b:
            began = time.monotonic()
            line, cancelled = await cancel_run_when_ready(
                lambda: r.run(
                    py(script, str(b.w)),
                    name="polite",
                    pass_fds=[b.w],
                    stop_signal=signal.SIGUSR1,
                    grace=20,
                    extra_env=tagged(tag),
                ),
                b,
            )
            assert cancelled
            assert await b.line() == b"got %d" % signal.SIGUSR1
        # It left on its own, well within the grace.
        assert time.monotonic() - began < 10
        pid = int(line)
        assert not is_alive(pid)
    messages = logs.messages("corral")
    assert any(f"polite (pid {pid}) exited with code 0" in m for m in messages)
    assert not any("killing it" in m for m in messages)


async def test_cancel_escalates_to_sigkill_after_grace(tag: str) -> None:
    logs = ListHandler()
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "os.write(int(sys.argv[1]), b'%d\\n' % os.getpid())\n"
        "time.sleep(1000)\n"
    )
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        with beacon() as b:
            began = time.monotonic()
            line, cancelled = await cancel_run_when_ready(
                lambda: r.run(
                    py(script, str(b.w)),
                    name="stubborn",
                    pass_fds=[b.w],
                    grace=0.3,
                    extra_env=tagged(tag),
                ),
                b,
            )
            elapsed = time.monotonic() - began
        assert cancelled
        pid = int(line)
        assert not is_alive(pid)
    warnings = [rec.getMessage() for rec in logs.records if rec.levelno == logging.WARNING]
    assert f"stubborn (pid {pid}) did not stop within 0.3 s; killing it" in warnings
    assert any(f"stubborn (pid {pid}) killed by SIGKILL" in m for m in logs.messages("corral"))
    assert 0.3 <= elapsed < 5


async def test_cancel_during_aclose_does_not_orphan(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        for how in ("aclose", "async with"):
            p = await r.start(
                ["sleep", "1000"], stdin=PIPE, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag)
            )
            with anyio.CancelScope() as scope:
                scope.cancel()
                if how == "aclose":
                    await p.aclose()
                else:
                    async with p:
                        pass
            # The stop itself was shielded: the child is dead and reaped.
            assert p.returncode == -signal.SIGTERM, how
            assert not is_alive(p.pid)
            assert group_members(p.pid) == []
            # ...and the streams are closed.
            assert p.stdin is not None and p.stdout is not None and p.stderr is not None
            with pytest.raises(anyio.ClosedResourceError):
                await p.stdin.send(b"x")
            with pytest.raises(anyio.ClosedResourceError):
                await p.stdout.receive()
            with pytest.raises(anyio.ClosedResourceError):
                await p.stderr.receive()
            with anyio.fail_after(5):
                assert await p.wait() == -signal.SIGTERM


async def test_stop_signal_failure_is_handled(tag: str) -> None:
    logs = ListHandler()
    async with corral.open_runner(console=False, handlers=[logs]) as r:
        with anyio.fail_after(10):
            p = await r.start(["true"], extra_env=tagged(tag))
            # Wait for the exit on a pidfd of our own: the group may or may
            # not be reaped yet when stop() looks (the ESRCH race).
            pidfd = os.pidfd_open(p.pid)
            try:
                await anyio.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            assert await p.stop() == 0
            p.terminate()
            p.kill()
            p.send_signal(signal.SIGUSR1)
            await p.aclose()
            assert await p.wait() == 0
    assert [m for m in logs.messages() if "stop signal" in m or "killing" in m] == []


async def test_cancelled_waiters_dont_break_wait(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], extra_env=tagged(tag))
        with anyio.fail_after(10):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(p.wait)
                    await anyio.wait_all_tasks_blocked()
                    scope.cancel()
            assert p.returncode is None
            codes: list[int] = []

            async def waiter() -> None:
                codes.append(await p.wait())

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                p.kill()
        assert codes == [-signal.SIGKILL] * 3
        assert await p.wait() == -signal.SIGKILL


# -- descriptor leaks -----------------------------------------------------------------------


@pytest.mark.slow
async def test_no_fd_leak_across_outcomes(tag: str, tmp_path: Path) -> None:
    not_executable = tmp_path / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    env = tagged(tag)

    async def success(r: corral.Runner) -> None:
        await r.run(["true"], extra_env=env)
        await r.run(["cat"], input=b"x", stdout=PIPE, stderr=PIPE, extra_env=env)

    async def failed(r: corral.Runner) -> None:
        with pytest.raises(corral.ProcessFailed):
            await r.run(["sh", "-c", "echo e >&2; exit 1"], extra_env=env)

    async def missing(r: corral.Runner) -> None:
        with pytest.raises(FileNotFoundError):
            await r.run(["corral-no-such-program"], stdout=PIPE, stderr=PIPE, extra_env=env)
        with pytest.raises(FileNotFoundError):
            await r.run(["corral-no-such-program"], wait_started=True, extra_env=env)

    async def not_allowed(r: corral.Runner) -> None:
        with pytest.raises(PermissionError):
            await r.run([str(not_executable)], input=b"x", stdout=PIPE, extra_env=env)

    async def bad_cwd(r: corral.Runner) -> None:
        with pytest.raises(FileNotFoundError):
            await r.run(["true"], cwd=tmp_path / "missing", stdout=PIPE, extra_env=env)

    async def cancelled(r: corral.Runner) -> None:
        script = "import os, sys, time; os.write(int(sys.argv[1]), b'up\\n'); time.sleep(1000)"
        with beacon() as b:
            _, was_cancelled = await cancel_run_when_ready(
                lambda: r.run(
                    py(script, str(b.w)), pass_fds=[b.w], input=b"", stdout=PIPE, extra_env=env
                ),
                b,
            )
        assert was_cancelled

    async def start_pipe_aclose(r: corral.Runner) -> None:
        p = await r.start(["sleep", "1000"], stdin=PIPE, stdout=PIPE, stderr=PIPE, extra_env=env)
        await p.aclose()
        q = await r.start(["sleep", "1000"], stdout=LOG | PIPE, stderr=LOG, extra_env=env)
        await q.aclose()

    async def handshake(r: corral.Runner) -> None:
        await r.run(
            py("import corral.child; corral.child.started()"), wait_started=True, extra_env=env
        )

    async def nothing(r: corral.Runner) -> None:
        pass

    for outcome in (
        nothing,
        success,
        failed,
        missing,
        not_allowed,
        bad_cwd,
        cancelled,
        start_pipe_aclose,
        handshake,
    ):
        before = fd_table()
        with anyio.fail_after(10):
            async with corral.open_runner(console=False) as r:
                inside = fd_table()
                await outcome(r)
                # Per child: nothing is kept once it is gone.
                assert fd_table() == inside, outcome.__name__
        assert fd_table() == before, outcome.__name__


# -- the Process object ---------------------------------------------------------------------


async def test_returncode_none_while_running_then_set(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], name="sleeper", extra_env=tagged(tag))
        assert p.returncode is None and p.poll() is None
        assert repr(p) == f"<corral.Process 'sleeper' pid={p.pid} running>"
        pidfd = os.pidfd_open(p.pid)
        try:
            p.kill()
            with anyio.fail_after(5):
                await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        # The exit shows without anyone having awaited wait().
        assert p.poll() == -signal.SIGKILL
        assert p.returncode == -signal.SIGKILL
        assert repr(p) == f"<corral.Process 'sleeper' pid={p.pid} killed by SIGKILL>"
        assert await p.wait() == -signal.SIGKILL


async def test_poll_reap_wakes_waiter(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["sleep", "1000"], extra_env=tagged(tag))
        codes: list[int] = []

        async def waiter() -> None:
            codes.append(await p.wait())

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                p.kill()
                # Spin synchronously, never yielding to the loop.
                deadline = time.monotonic() + 5
                while p.poll() is None:
                    assert time.monotonic() < deadline, "poll() never saw the exit"
                assert p.poll() == -signal.SIGKILL
        assert codes == [-signal.SIGKILL]


async def test_multi_wait(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(
            py("import sys; sys.stdin.read(); sys.exit(3)"),
            stdin=PIPE,
            check=False,
            extra_env=tagged(tag),
        )
        assert p.stdin is not None
        codes: list[int] = []

        async def waiter() -> None:
            codes.append(await p.wait())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                assert codes == []
                await p.stdin.aclose()
        assert codes == [3] * 5


async def test_repr_states(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(
            ["sh", "-c", "read x; exit 3"],
            name="three",
            stdin=PIPE,
            check=False,
            extra_env=tagged(tag),
        )
        assert repr(p) == f"<corral.Process 'three' pid={p.pid} running>"
        assert p.stdin is not None
        await p.stdin.send(b"go\n")
        with anyio.fail_after(10):
            assert await p.wait() == 3
        assert repr(p) == f"<corral.Process 'three' pid={p.pid} exited with code 3>"
        q = await r.start(["sleep", "1000"], name="term", extra_env=tagged(tag))
        q.terminate()
        with anyio.fail_after(10):
            await q.wait()
        assert repr(q) == f"<corral.Process 'term' pid={q.pid} killed by SIGTERM>"
        done = await r.run(["true"], name="done", extra_env=tagged(tag))
        assert repr(done) == "CompletedProcess(name='done', args=['true'], returncode=0)"


@pytest.mark.slow
async def test_signals_are_sync_and_reach_group(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        with beacon() as b:
            for how, sig in (
                ("terminate", signal.SIGTERM),
                ("send_signal", signal.SIGUSR1),
                ("kill", signal.SIGKILL),
            ):
                p = await r.start(
                    py(FAMILY, str(b.w)), pass_fds=[b.w], check=False, extra_env=tagged(tag)
                )
                gpid = int((await b.line()).split()[1])
                assert os.getpgid(gpid) == p.pid
                # Plain calls, not coroutines: the signal is sent when they return.
                result = p.send_signal(sig) if how == "send_signal" else getattr(p, how)()
                assert result is None
                if sig != signal.SIGKILL:
                    assert await b.line() == b"got %d" % sig  # the grandchild got it too
                with anyio.fail_after(5):
                    assert await p.wait() == -sig
                assert wait_gone([gpid], 5) == []
                assert group_members(p.pid) == []


@pytest.mark.parametrize(
    ("how", "stdout"),
    [("start", PIPE), ("start", LOG), ("run", PIPE), ("run", LOG | PIPE)],
    ids=["start-PIPE", "start-LOG", "run-PIPE", "run-LOG|PIPE"],
)
async def test_wait_returns_when_leader_exits_despite_escaped_grandchild(
    tag: str, how: str, stdout: object
) -> None:
    # The grandchild leaves the group (setsid) with stdout and stderr still open.
    script = (
        "import os, subprocess, sys\n"
        "g = subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
        "os.write(int(sys.argv[1]), b'%d\\n' % g.pid)\n"
        "print('leader done')\n"
    )
    gpid = 0
    try:
        async with corral.open_runner(console=False) as r:
            with beacon() as b:
                with anyio.fail_after(5):
                    if how == "start":
                        p = await r.start(
                            py(script, str(b.w)),
                            pass_fds=[b.w],
                            stdout=stdout,  # type: ignore[arg-type]
                            extra_env=tagged(tag),
                        )
                        gpid = int(await b.line())
                        assert await p.wait() == 0
                        if stdout is PIPE:
                            assert p.stdout is not None
                            assert await receive_all(p.stdout) == b"leader done\n"
                    else:
                        done = await r.run(
                            py(script, str(b.w)),
                            pass_fds=[b.w],
                            stdout=stdout,  # type: ignore[arg-type]
                            extra_env=tagged(tag),
                        )
                        gpid = int(await b.line())
                        assert done.returncode == 0
                        assert done.stdout == b"leader done\n"
                assert is_alive(gpid)  # it really escaped, and still holds the pipes
    finally:
        if gpid:
            os.kill(gpid, signal.SIGKILL)
            assert wait_gone([gpid], 5) == []


async def test_stream_states(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(["true"], stdin=PIPE, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag))
        assert p.stdin is not None and p.stdout is not None and p.stderr is not None
        with anyio.fail_after(10):
            assert await p.wait() == 0
            # The peer is gone: broken (at most after a few sends), end of stream.
            with pytest.raises(anyio.BrokenResourceError):
                for _ in range(10):
                    await p.stdin.send(b"x" * 1024)
            with pytest.raises(anyio.EndOfStream):
                await p.stdout.receive()
            with pytest.raises(anyio.EndOfStream):
                await p.stderr.receive()
            await p.aclose()
        # Closed by us: closed, whatever the state of the peer.
        with pytest.raises(anyio.ClosedResourceError):
            await p.stdin.send(b"x")
        with pytest.raises(anyio.ClosedResourceError):
            await p.stdout.receive()
        with pytest.raises(anyio.ClosedResourceError):
            await p.stderr.receive()
        # The same for a logged-and-piped stream.
        q = await r.start(
            ["echo", "hi"], stdout=LOG | PIPE, stderr=LOG | PIPE, extra_env=tagged(tag)
        )
        assert q.stdout is not None and q.stderr is not None
        with anyio.fail_after(10):
            assert await q.wait() == 0
            assert await receive_all(q.stdout) == b"hi\n"
            with pytest.raises(anyio.EndOfStream):
                await q.stderr.receive()
            await q.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await q.stdout.receive()
        with pytest.raises(anyio.ClosedResourceError):
            await q.stderr.receive()


@pytest.mark.parametrize("stdout", [PIPE, LOG | PIPE], ids=["PIPE", "LOG|PIPE"])
async def test_close_stream_while_receiving(tag: str, stdout: object) -> None:
    async with corral.open_runner(console=False) as r:
        p = await r.start(
            ["sleep", "1000"],
            stdout=stdout,
            extra_env=tagged(tag),  # type: ignore[arg-type]
        )
        stream = p.stdout
        assert stream is not None
        outcome: list[str] = []

        async def receiver() -> None:
            try:
                await stream.receive()
            except anyio.ClosedResourceError:
                outcome.append("closed")

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver)
                await anyio.wait_all_tasks_blocked()
                await stream.aclose()
        assert outcome == ["closed"]
        p.terminate()
        with anyio.fail_after(5):
            assert await p.wait() == -signal.SIGTERM


async def test_receive_rejects_bad_max_bytes(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        for stdout in (PIPE, LOG | PIPE):
            p = await r.start(["echo", "hi"], stdout=stdout, extra_env=tagged(tag))
            assert p.stdout is not None
            for bad in (0, -1):
                with pytest.raises(ValueError):
                    await p.stdout.receive(bad)
            with anyio.fail_after(5):
                assert await receive_all(p.stdout) == b"hi\n"
                await p.aclose()


async def test_aclose_unread_output_no_hang(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        for size in (25_000, 1024 * 1024):
            script = (
                f"import sys; sys.stdout.buffer.write(b'x' * {size}); sys.stdout.flush();"
                "print('done', file=sys.stderr, flush=True); sys.stdin.read()"
            )
            # Wait until the child has written what fits, then leave without reading.
            async with await r.start(
                py(script), stdin=PIPE, stdout=PIPE, stderr=PIPE, extra_env=tagged(tag)
            ) as p:
                if size < 65536:
                    assert p.stderr is not None
                    with anyio.fail_after(10):
                        assert await receive_line(p.stderr) == b"done\n"
            with anyio.fail_after(5):
                assert await p.wait() == -signal.SIGTERM
            assert not is_alive(p.pid)


async def test_runner_exit_with_blocked_unread_pipe(tag: str) -> None:
    # Pinned by observation: the end of the block waits for children as a
    # nursery waits for its tasks, and a child blocked on a full stdout pipe
    # that nobody reads does not finish; the runner stops it only when
    # cancelled.
    script = "import sys; sys.stdout.buffer.write(b'x' * (1024 * 1024))"
    with anyio.CancelScope() as scope:
        async with corral.open_runner(console=False) as r:
            p = await r.start(py(script), stdout=PIPE, extra_env=tagged(tag))
            # From the start on (which a loaded machine may take more than 0.5 s to make):
            scope.deadline = anyio.current_time() + 0.5
    assert scope.cancelled_caught
    assert p.returncode == -signal.SIGTERM


# -- errors -----------------------------------------------------------------------------------


async def test_str_argv_type_error(tag: str) -> None:
    async with corral.open_runner(console=False) as r:
        for call in (r.run, r.start):
            with pytest.raises(TypeError, match="list of arguments"):
                await call("true", extra_env=tagged(tag))  # type: ignore[operator]
            with pytest.raises(TypeError, match="list of arguments"):
                await call(b"true", extra_env=tagged(tag))  # type: ignore[operator]
            with pytest.raises(ValueError, match="empty"):
                await call([], extra_env=tagged(tag))  # type: ignore[operator]
            with pytest.raises(TypeError):
                await call(["echo", 3], extra_env=tagged(tag))  # type: ignore[operator]
        assert r.processes == ()
        # Paths and bytes items are fine, and arrive as str.
        done = await r.run([Path("/bin/echo"), b"x"], stdout=PIPE, extra_env=tagged(tag))
        assert done.args == ["/bin/echo", "x"]
        assert done.stdout == b"x\n"
    assert tagged_pids(tag) == []


@pytest.mark.parametrize(
    "keyword",
    [
        {"text": True},
        {"encoding": "utf-8"},
        {"errors": "strict"},
        {"universal_newlines": True},
        {"shell": True},
        {"capture_output": True},
    ],
    ids=lambda k: next(iter(k)),
)
async def test_text_mode_keywords_refused(tag: str, keyword: dict[str, object]) -> None:
    async with corral.open_runner(console=False) as r:
        for call in (r.run, r.start):
            with pytest.raises(TypeError, match="unexpected keyword"):
                await call(["true"], extra_env=tagged(tag), **keyword)  # type: ignore[operator]
        assert r.processes == ()
    assert tagged_pids(tag) == []


async def test_missing_program_file_not_found(tag: str, tmp_path: Path) -> None:
    async with corral.open_runner(console=False) as r:
        for argv in (["corral-no-such-program"], [str(tmp_path / "missing")], ["./missing"]):
            for start in (False, True):
                with pytest.raises(FileNotFoundError):
                    if start:
                        await r.start(argv, extra_env=tagged(tag))
                    else:
                        await r.run(argv, extra_env=tagged(tag))
        # The runner is fine afterwards.
        assert r.processes == ()
        assert (await r.run(["true"], extra_env=tagged(tag))).returncode == 0
    assert tagged_pids(tag) == []


async def test_non_executable_permission_error(tag: str, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\necho should not run\n")
    plain.chmod(0o644)
    async with corral.open_runner(console=False) as r:
        for argv in ([str(plain)], [str(tmp_path)]):
            for start in (False, True):
                with pytest.raises(PermissionError):
                    if start:
                        await r.start(argv, extra_env=tagged(tag))
                    else:
                        await r.run(argv, extra_env=tagged(tag))
        assert r.processes == ()
    assert tagged_pids(tag) == []
