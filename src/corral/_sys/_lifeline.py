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
process, the *lifeline*, whose stdin is one end of a socket pair; the runner
keeps the other.  The runner tells it, one short line each:

``?<n>``
    "I am about to spawn child number *n*".  The child carries the marker
    ``CORRAL_LIFELINE=<token>.<n>`` in its environment, so the lifeline can
    find it in ``/proc`` even if the launcher dies after the spawn but before
    it heard the child's pid (``posix_spawn`` and ``Popen`` return only once
    the child has exec'd: there is such a window).
``+<pgid> <n>``
    child *n* runs as the leader of process group *pgid*.
``!<n>``
    child *n* was never spawned (the spawn failed).
``-<pgid>``
    that group was reaped (its id may be reused from now on).
``d<path>``
    remove that folder when the launcher is gone (the log socket's; on a
    clean exit the runner has removed it already).
``g<path>`` and ``G<path>``
    kill everything in the runner's cgroup (see :mod:`corral._sys._contain`)
    and remove it when the launcher is gone; forget it (removed already).

The helper ignores the usual stop signals and simply reads.  When the read
returns end-of-file, the runner's process is gone — or the runner closed its
end on a clean exit — and the helper sends SIGKILL to every group still on
its list and to every process in ``/proc`` that carries the marker of a child
that was announced but not registered, removes the folders on its list, and
exits.  (A child between fork and exec still shows the launcher's
environment, without its marker; so while an announced child is not found,
the helper looks again every 10 ms for up to 2 s: long enough for it to
exec, or for its spawn to have failed.)  End-of-file arrives the moment the
kernel closes the dead launcher's descriptors, so children and grandchildren
die within milliseconds, whatever thread spawned them.

Descendants that left their process group (a daemon that called ``setsid``)
are killed through the runner's cgroup, where it has one: the helper writes
its ``cgroup.kill`` after the groups (and once more after the scan for
children in flight), waits up to 2 s for it to empty, and removes it.
Without a cgroup they are not found (they may have cleared their
environment too).  Children started with ``start_new_session=True`` are
leaders of their own group and are killed like any other.

The runner watches the helper through a pidfd: if it dies (killed by an
administrator or the OOM killer), the runner logs an ERROR and starts a new
one that adopts every live group.  It writes with ``MSG_NOSIGNAL``, so a dead
helper can never turn into a ``SIGPIPE`` that kills the launcher.

The helper is :mod:`corral._sys._lifeline_helper`, run by its path with
``python -I -S`` (no site, no user paths, nothing of corral imported): it
imports nothing but ``os`` and ``signal`` until the launcher dies, and costs a
few megabytes.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio

from . import _childenv, _platform
from ._backend import outlast_native_cancel

__all__ = ["Lifeline"]

#: The helper's program (run by path, as a script: see its module).
HELPER: Final = str(Path(__file__).with_name("_lifeline_helper.py"))

_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


class Lifeline:
    """The runner's side of the lifeline: start it, tell it about children, watch it."""

    def __init__(self, on_error: Callable[[str], None] | None = None) -> None:
        self._token = secrets.token_hex(8)
        self._on_error = on_error
        self._pid: int | None = None
        self._pidfd: int | None = None
        self._sock: socket.socket | None = None
        self._groups: set[int] = set()
        self._folders: set[str] = set()
        self._cgroups: set[str] = set()
        self._next = 0
        #: Announced spawns not yet reported spawned or failed.
        self._pending: set[bytes] = set()
        self._closing = False
        #: Set once :meth:`release` has killed an idle helper.
        self._killed = False
        self._restarts = 0
        #: Set when a helper was started: wakes a watch() that has none to watch.
        self._started: anyio.Event | None = None
        #: A replacement failed; the next change tries again.
        self._lost = False

    @property
    def pid(self) -> int | None:
        """The helper's pid while it runs."""
        return self._pid

    @property
    def marker(self) -> bytes:
        """What every child of the runner has in its environment: ``CORRAL_LIFELINE=<token>.``."""
        return f"{_childenv.LIFELINE}={self._token}.".encode()

    @property
    def restarts(self) -> int:
        """How many times a dead helper was replaced."""
        return self._restarts

    def start(self) -> None:
        """Spawn the helper (a few hundred microseconds, on the calling thread)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = {
                b"PATH": os.environb.get(b"PATH", os.defpath.encode()),
                b"CORRAL_LIFELINE_MARKER": self.marker,
            }
            pid = _platform.spawn(
                [sys.executable, "-I", "-S", HELPER],
                env=env,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                popen=_platform.PopenArgs(cwd="/"),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            pidfd = _platform.pidfd_open(pid)
        except BaseException:
            ours.close()
            os.kill(pid, signal.SIGKILL)
            _platform.wait_blocking(pid)
            _platform.reap(pid)
            raise
        self._pid = pid
        self._pidfd = pidfd
        self._sock = ours
        if self._started is not None:
            self._started.set()
        state = [b"+%d 0\n" % pgid for pgid in self._groups]
        state += [b"d" + os.fsencode(folder) + b"\n" for folder in self._folders]
        state += [b"g" + os.fsencode(cgroup) + b"\n" for cgroup in self._cgroups]
        if state:
            self._send(b"".join(state))

    # -- what the runner tells it -------------------------------------------------------

    def announce(self, env: dict[bytes, bytes]) -> bytes:
        """Before a spawn: put the marker into the child's ``env``; returns the spawn's number."""
        self._next += 1
        number = b"%d" % self._next
        env[_childenv.LIFELINE.encode()] = self._token.encode() + b"." + number
        self._pending.add(number)
        self._send(b"?" + number + b"\n")
        return number

    def spawned(self, number: bytes, pgid: int) -> None:
        """The announced child runs as the leader of group ``pgid``."""
        self._groups.add(pgid)
        self._pending.discard(number)
        self._send(b"+%d " % pgid + number + b"\n")

    def failed(self, number: bytes) -> None:
        """The announced child was never spawned."""
        self._pending.discard(number)
        self._send(b"!" + number + b"\n")

    def remove(self, pgid: int) -> None:
        """Take a reaped group off the list (its id may now be reused)."""
        self._groups.discard(pgid)
        self._send(b"-%d\n" % pgid)

    def add_folder(self, path: str) -> None:
        """Remove ``path`` if the launcher dies."""
        self._folders.add(path)
        self._send(b"d" + os.fsencode(path) + b"\n")

    def add_cgroup(self, path: str) -> None:
        """Kill everything in the cgroup at ``path`` and remove it if the launcher dies."""
        self._cgroups.add(path)
        self._send(b"g" + os.fsencode(path) + b"\n")

    def remove_cgroup(self, path: str) -> None:
        """The cgroup at ``path`` was removed: nothing to do about it any more."""
        self._cgroups.discard(path)
        self._send(b"G" + os.fsencode(path) + b"\n")

    def _send(self, line: bytes) -> None:
        # A short line into a socket that the helper drains at once: the send
        # does not block in practice.  If the helper is gone, replace it.
        if self._closing:
            return
        # Not started yet; or an earlier replacement failed (out of
        # descriptors): then try again.  The new helper gets the groups and
        # folders as they are now, so only an announcement is still to send.
        if self._sock is None and (not self._lost or not self._replace(None) or line[:1] != b"?"):
            return
        assert self._sock is not None
        try:
            self._sock.send(line, _SEND_FLAGS)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
            # As above: only a pending announcement ("?n") would be lost.
            if self._replace("its socket was closed") and line[:1] == b"?":
                assert self._sock is not None
                self._sock.send(line, _SEND_FLAGS)

    # -- watching it --------------------------------------------------------------------

    def _replace(self, why: str | None) -> bool:
        """Start a new helper in place of a dead one; ``False`` if that failed.

        A failure (the launcher is out of descriptors or processes) is
        reported and tried again at the next change, never raised: the
        children run on, supervised as before, and are unprotected only
        against the launcher's own sudden death until a helper runs again.
        """
        pid = self._pid
        self._drop()
        if why is not None:
            self._restarts += 1
            if self._on_error is not None:
                self._on_error(
                    f"the lifeline process (pid {pid}) died ({why}); starting a new one that "
                    f"adopts {len(self._groups)} running process group(s)"
                )
        try:
            self.start()
        except OSError as exc:
            if not self._lost and self._on_error is not None:
                self._on_error(
                    f"cannot start a new lifeline process ({exc}); until one runs, the "
                    "children are not killed if the launcher itself dies (trying again "
                    "at the next start or exit of a child)"
                )
            self._lost = True
            return False
        if self._lost and self._on_error is not None:
            self._on_error(f"a new lifeline process (pid {self._pid}) runs again")
        self._lost = False
        return True

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pidfd is not None:
            # watch() may be waiting on it: wake it before the number is reused.
            anyio.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self._pid is not None:
            _platform.reap(self._pid)
            self._pid = None

    async def watch(self, until: anyio.Event) -> None:
        """Replace the helper whenever it dies, until ``until`` is set (a runner task)."""
        async with anyio.create_task_group() as tg:

            async def stop_at_end() -> None:
                await until.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stop_at_end)
            while True:
                fd = self._pidfd
                if fd is None:
                    # A replacement failed: wait until a later one succeeds.
                    self._started = anyio.Event()
                    await self._started.wait()
                    continue
                try:
                    await anyio.wait_readable(fd)
                except anyio.ClosedResourceError:
                    continue  # replaced meanwhile (a send found it dead)
                if self._closing or fd != self._pidfd:
                    continue
                assert self._pid is not None
                self._replace(_platform.describe_exit(self._pid))

    def release(self) -> bool:
        """At a runner's exit, once every child is reaped: let the helper go now.

        With nothing on its list (no group, no spawn in flight, no cgroup) the helper
        has nothing left to guard, so it is sent SIGKILL, which ends it
        within the kernel's own time, without waiting for a scheduler turn
        to read end-of-file on a busy machine; :meth:`aclose` reaps it later.
        With something still on its list, nothing happens here: the helper
        must stay and :meth:`aclose` closes it the usual way.  Returns
        whether the helper was let go.
        """
        if self._closing or self._groups or self._pending or self._cgroups:
            return False
        self._closing = True
        if self._pidfd is not None:
            # Through its pidfd: a host that reaps every child may have reaped
            # it already, and its pid may be another process's by now.  Before
            # our end is closed: woken by end-of-file first, the helper would
            # run its sweep (a scan of /proc) for nothing, on a CPU we need.
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._killed = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        return True

    async def aclose(self) -> None:
        """Close our end and wait (briefly) for the helper to exit; it kills nothing then.

        After :meth:`release` the helper is dead already, or dies within a
        few hundred microseconds: this only reaps it.
        """
        self._closing = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        pid, fd = self._pid, self._pidfd
        self._pid = self._pidfd = None
        if pid is None or fd is None:
            return
        try:
            if _platform.has_exited(fd):
                return  # gone already: nothing to wait for
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(0.5 if self._killed else 5) as deadline:
                    await outlast_native_cancel(lambda: anyio.wait_readable(fd), deadline)
                    return
                # Stopped by someone (SIGSTOP)?  It has nothing left to do.
                os.kill(pid, signal.SIGKILL)
                await outlast_native_cancel(lambda: anyio.wait_readable(fd))
        finally:
            os.close(fd)
            _platform.reap(pid)
