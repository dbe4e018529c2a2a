"""No orphans when the launcher dies: the lifeline process.

When a runner's process is killed outright (SIGKILL, the OOM killer, a
crash), nothing in it runs any more, so it cannot stop its children.  The
obvious tool, ``PR_SET_PDEATHSIG``, is a poor fit: it fires when the
*thread* that forked the child exits (and event-loop worker threads retire
after a few idle seconds, taking healthy children with them), it reaches only
the direct child (so ``sh -c 'sleep 100 & wait'`` still orphans the
``sleep``), and setting it needs a ``preexec_fn``, which makes every spawn
several times slower.

corral uses a lifeline instead.  Each runner starts one small helper
process, the *lifeline*, whose stdin is a pipe from the runner.  The runner
writes ``+<pgid>`` when it starts a child and ``-<pgid>`` once that child's
group has been reaped.  The helper ignores the usual stop signals and simply
reads.  When the read returns end-of-file, the runner's process is gone — or
the runner closed the pipe on a clean exit — and the helper sends SIGKILL to
every group still on its list, then exits.  End-of-file arrives the moment
the kernel closes the dead launcher's descriptors, so children and
grandchildren die within milliseconds, whatever thread spawned them.

The helper is started with ``python -I -S`` (no site, no user paths): it
imports nothing but ``os`` and ``signal`` and costs a few megabytes.
"""

from __future__ import annotations

import os
import sys

import anyio
import anyio.to_thread

from . import _platform

__all__ = ["Lifeline"]

_HELPER = r"""
import os, signal
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
          signal.SIGUSR2, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
groups = set()
pending = b""
while True:
    try:
        chunk = os.read(0, 65536)
    except InterruptedError:
        continue
    if not chunk:
        break
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Lifeline:
    """The runner's side of the lifeline: start it, tell it about groups, close it."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._write_fd: int | None = None
        self._broken = False

    @property
    def pid(self) -> int | None:
        """The helper's pid while it runs."""
        return self._pid

    def start_blocking(self) -> None:
        """Spawn the helper (blocking; run it in a worker thread)."""
        read_fd, write_fd = os.pipe()
        try:
            devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                env = {b"PATH": os.environb.get(b"PATH", os.defpath.encode())}
                self._pid = _platform.spawn(
                    [sys.executable, "-I", "-S", "-c", _HELPER],
                    env=env,
                    cwd=None,
                    fds={0: read_fd, 1: devnull, 2: devnull},
                )
            finally:
                os.close(devnull)
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._write_fd = write_fd

    def _send(self, line: bytes) -> None:
        # A short line to a pipe that the helper drains at once: the write
        # does not block in practice (the pipe holds 64 KiB).  If the helper
        # was killed by someone, carry on without it.
        if self._write_fd is None or self._broken:
            return
        try:
            os.write(self._write_fd, line)
        except BrokenPipeError:
            self._broken = True

    def add(self, pgid: int) -> None:
        """Put a process group on the helper's list."""
        self._send(b"+%d\n" % pgid)

    def remove(self, pgid: int) -> None:
        """Take a reaped group off the list (its id may now be reused)."""
        self._send(b"-%d\n" % pgid)

    async def aclose(self) -> None:
        """Close the pipe and wait for the helper to exit (it kills nothing: the list is empty)."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        pid, self._pid = self._pid, None
        if pid is None:
            return
        fd = _platform.pidfd_open(pid)
        try:
            with anyio.CancelScope(shield=True):
                await anyio.wait_readable(fd)
        finally:
            os.close(fd)
        _platform.reap(pid)
