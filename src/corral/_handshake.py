"""The start-up handshake: a child says "I am ready" without anyone polling.

With ``await r.start(argv, wait_started=True)`` the runner gives the child
one extra descriptor, the write end of a pipe, and puts its number in the
environment variable ``CORRAL_STARTED_FD``.  The number is always 3: a single
digit, because ``dash`` (``/bin/sh`` on Debian) only accepts one-digit
descriptors in redirections such as ``>&$CORRAL_STARTED_FD``.

The child reports by writing **one line of JSON** to it (exactly one: the
runner closes its end once the line is in, so a second write fails with
``EPIPE``) (a Python child
calls :func:`corral.child.started`), or by closing it, which reports
``null``.  The runner reads the pipe as its data arrives — a readiness wait on
the event loop, never a poll, never a blocking read — and :meth:`Runner.start`
returns as soon as the line is complete, however many pieces it came in
and however long it is.

If the child exits before reporting, ``start`` raises
:class:`~corral.StartupFailed` with the child's exit status and stderr tail;
if it writes something that is not JSON, :class:`~corral.HandshakeError`
naming the process and quoting what it wrote; and if ``start_timeout``
passes first, the child is stopped and ``start`` raises :class:`TimeoutError`.
"""

from __future__ import annotations

import json
import os

import anyio

__all__ = ["ENV_VAR", "FD", "HandshakeReader"]

#: The environment variable naming the handshake descriptor.
ENV_VAR = "CORRAL_STARTED_FD"

#: The descriptor number the child gets (3-9 so that dash can use it).
FD = 3

_CHUNK = 64 * 1024


class HandshakeReader:
    """Reads one JSON line (or end-of-file) from the handshake pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()
        self.complete = False
        self.eof = False
        os.set_blocking(fd, False)

    def _read_available(self) -> None:
        while not (self.complete or self.eof):
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            newline = chunk.find(b"\n")
            if newline >= 0:
                self.data += chunk[:newline]
                self.complete = True
            else:
                self.data += chunk

    async def read(self) -> None:
        """Wait until a whole line or end-of-file has arrived."""
        while not (self.complete or self.eof):
            await anyio.wait_readable(self.fd)
            self._read_available()
            if not (self.complete or self.eof):
                await anyio.lowlevel.checkpoint()

    def drain(self) -> None:
        """Read whatever is already in the pipe (after the child has exited)."""
        self._read_available()

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
        """Close our end (idempotent); a child writing again gets EPIPE."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
