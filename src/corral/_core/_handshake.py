"""The start-up handshake: a child says "I am ready" without anyone polling.

With ``await r.start(argv, wait_started=True)`` the runner gives the child
one extra descriptor, the write end of a pipe, and puts its number in the
environment variable ``CORRAL_STARTED_FD``.  The number is always 3: a single
digit, because ``dash`` (``/bin/sh`` on Debian) only accepts one-digit
descriptors in redirections such as ``>&$CORRAL_STARTED_FD``.  A second
variable, ``CORRAL_STARTED_PIPE``, names the pipe itself (``<st_dev>:<st_ino>``),
so that :func:`corral.child.started` in a grandchild that inherited the
variables but not the pipe does nothing rather than write into its own
descriptor 3.

The child reports by writing **one line of JSON** to it (a Python child
calls :func:`corral.child.started`), or by closing it, which reports
``null``.  The runner reads the pipe as its data arrives — a readiness wait
on the event loop, never a poll, never a blocking read — and
:meth:`Runner.start` returns as soon as the line is complete, however many
pieces it came in.  The line may be up to :data:`MAX_REPORT` bytes long.

The runner keeps reading (and discarding) until the child exits, so a child
that writes more — a shell script that reports twice — is never killed by
``SIGPIPE`` for it.

If the child exits before reporting, ``start`` raises
:class:`~corral.StartupFailed` with the child's exit status and stderr tail;
if it writes something that is not JSON, or more than :data:`MAX_REPORT`
bytes without a newline, :class:`~corral.HandshakeError` naming the process
and quoting what it wrote; and if ``start_timeout`` passes first, the child
is stopped and ``start`` raises :class:`TimeoutError`.
"""

from __future__ import annotations

import json
import os

import anyio
import anyio.lowlevel

from .._sys import _childenv

__all__ = ["ENV_VAR", "FD", "MAX_REPORT", "HandshakeReader", "pipe_identity"]

#: The environment variable naming the handshake descriptor.
ENV_VAR = _childenv.STARTED_FD

#: The descriptor number the child gets (3-9 so that dash can use it).
FD = _childenv.HANDSHAKE_FD

#: The longest start-up report accepted, in bytes.
MAX_REPORT = 1024 * 1024

_CHUNK = 64 * 1024


def pipe_identity(fd: int) -> bytes:
    """``<st_dev>:<st_ino>`` of a pipe, as the child checks it."""
    info = os.fstat(fd)
    return f"{info.st_dev}:{info.st_ino}".encode()


class HandshakeReader:
    """Reads one JSON line (or end-of-file) from the handshake pipe, then discards the rest."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()
        self.complete = False
        self.too_long = False
        self.eof = False
        self._finishing = False
        self._scope: anyio.CancelScope | None = None
        os.set_blocking(fd, False)

    @property
    def decided(self) -> bool:
        """Whether the report is in (complete, too long) or cannot come (end-of-file)."""
        return self.complete or self.too_long or self.eof

    def _read_available(self) -> None:
        while not self.eof:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            if self.complete or self.too_long:
                continue  # a second report, or the rest of an oversized one: discard
            newline = chunk.find(b"\n")
            if newline >= 0:
                self.data += chunk[:newline]
                self.complete = True
            else:
                self.data += chunk
            if len(self.data) > MAX_REPORT:
                self.too_long = True
                del self.data[200:]

    async def read(self, on_decided: object = None) -> None:
        """Read until end-of-file or :meth:`finish`; call ``on_decided()`` once decided."""
        announced = False
        while not self.eof and not self._finishing:
            with anyio.CancelScope() as self._scope:
                await anyio.wait_readable(self.fd)
            self._scope = None
            self._read_available()
            if self.decided and not announced:
                announced = True
                if callable(on_decided):
                    on_decided()
            await anyio.lowlevel.checkpoint()
        self._read_available()

    def finish(self) -> None:
        """The child has exited: read what is left and stop."""
        self._finishing = True
        if self._scope is not None:
            self._scope.cancel()

    @property
    def reported(self) -> bool:
        """Whether the child has sent a complete line (or, with text, closed it)."""
        return self.complete or (self.eof and bool(self.data.strip()))

    def value(self) -> object:
        """Decode the value; raises :class:`ValueError` on malformed JSON."""
        text = bytes(self.data).decode("utf-8")
        if not text.strip():
            return None
        return json.loads(text)

    def close(self) -> None:
        """Close our end (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
