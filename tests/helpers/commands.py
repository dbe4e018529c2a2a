"""Programs the tests run and talk to: the ``corral`` command, launchers, stuck clients.

:func:`corral_argv` is how every test runs the command (the installed console script, or
``python -m corral._cli`` where it is not installed); :class:`Child` runs a program and reads
its stdout line by line with deadlines; :func:`launched` runs a launcher program (a script that
opens a runner and obeys commands on its stdin) until it said its monitor's address;
:func:`stuck_client` is a WebSocket client of a monitor that completes its handshake and then
never reads, the client of every test of what a slow reader costs.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar


def corral_argv(*args: str) -> list[str]:
    """The installed ``corral`` console script (or ``python -m corral._cli``) with ``args``."""
    script = Path(sys.executable).with_name("corral")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "corral._cli"]
    return [*base, *args]


class Child:
    """A program whose stdout is read line by line, with deadlines; stderr goes to a file."""

    def __init__(
        self,
        argv: list[str],
        stderr: Path,
        *,
        stdin: bool = False,
        merge: bool = False,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.stderr_path = stderr
        self._stderr = open(stderr, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else self._stderr,
            env=env,
            cwd=cwd,
        )
        self.url = ""  # a launcher's monitor URL
        self.lines: list[str] = []
        self._buffer = b""
        self._eof = False
        self._next = 0  # the first line wait_line has not looked at

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _read(self, deadline: float) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"nothing more came in time; so far:\n{self.text()}")
        data = os.read(fd, 65536)
        if not data:
            self._eof = True
            if self._buffer:
                self.lines.append(self._buffer.decode())
                self._buffer = b""
            return
        *complete, self._buffer = (self._buffer + data).split(b"\n")
        self.lines += [line.decode() for line in complete]

    def wait_line(self, predicate: Callable[[str], bool], timeout: float = 15) -> str:
        """The next line (after those already looked at) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            while self._next < len(self.lines):
                line = self.lines[self._next]
                self._next += 1
                if predicate(line):
                    return line
            if self._eof:
                raise AssertionError(f"the output ended without the line; it was:\n{self.text()}")
            self._read(deadline)

    def command(self, *command: Any) -> str:
        """Send a command to a launcher; return its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()
        return self.wait_line(lambda line: line.startswith("ok "))

    def end_input(self) -> None:
        """Close its stdin (a launcher then ends its runner)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def finish(self, timeout: float = 15) -> int:
        """Close its stdin, read its output to the end, and return its exit code."""
        self.end_input()
        deadline = time.monotonic() + timeout
        while not self._eof:
            self._read(deadline)
        return self.proc.wait(max(0.1, deadline - time.monotonic()))

    def text(self) -> str:
        return (
            "\n".join(self.lines) + "\n--- stderr\n" + self.stderr_path.read_text(errors="replace")
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._stderr.close()


C = TypeVar("C", bound=Child)


@contextmanager
def launched(
    kind: type[C], argv: list[str], path: Path, *, env: dict[str, str] | None = None
) -> Iterator[C]:
    """The launcher program ``argv`` (``tests/programs/launcher.py``), once it is up.

    A launcher prints ``url URL`` first (its monitor's address, or ``url -``), which is then its
    :attr:`Child.url`, and obeys the commands it reads on its stdin; its stderr goes to the file
    ``path`` with the suffix ``.err``.  It is killed at the end if it is still running.
    """
    with kind(argv, path.with_suffix(".err"), stdin=True, env=env) as child:
        child.url = child.wait_line(lambda line: line.startswith("url ")).split()[1]
        yield child


def websocket_request(url: str, extra: str = "") -> bytes:
    """The HTTP request that opens a WebSocket to the monitor at ``url`` (its token included)."""
    parts = urllib.parse.urlsplit(url)
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()


def stuck_client(url: str) -> socket.socket:
    """A socket that completes the WebSocket handshake with ``url`` and then never reads.

    Its receive buffer is as small as the kernel allows, so that the kernel holds little of
    what the monitor sends it: what the monitor cannot send stays in the monitor.  The caller
    closes it (it is a context manager).
    """
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # no kernel slack either
        sock.settimeout(10)
        sock.connect((parts.hostname, parts.port))
        sock.sendall(websocket_request(url))
        head = b""
        while b"\r\n\r\n" not in head:
            byte = sock.recv(1)
            assert byte, f"closed during the handshake: {head!r}"
            head += byte
        assert head.startswith(b"HTTP/1.1 101 "), head
    except BaseException:
        sock.close()
        raise
    return sock
