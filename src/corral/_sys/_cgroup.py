"""A cgroup (v2) of one runner's own: where it is, how to make it, kill it and remove it.

A process that forks, calls ``setsid`` and forks again leaves its parent,
its process group and its session: nothing a runner knows of it leads back
to the child it came from.  Its cgroup does: a process is born in the cgroup
of its parent, and only a privileged hand moves it out.  So a runner that can
make a cgroup of its own (cgroup v2; root, or a subtree delegated to its
user) starts every child in it, and writing ``1`` to its ``cgroup.kill``
(Linux 5.14 and later) kills everything in it and in its sub-cgroups at once,
however the processes regrouped themselves.  Older kernels have no
``cgroup.kill``: then each member is killed through a pidfd, after checking
that it is still a member (so that a pid that was reused is never hit).

Where the cgroup goes: the cgroup v2 hierarchy is found in
``/proc/self/mountinfo`` (``/sys/fs/cgroup`` on a unified host,
``/sys/fs/cgroup/unified`` on a hybrid one), the launcher's own cgroup in
``/proc/self/cgroup`` (its ``0::`` line), and the runner's is made *under* the
launcher's, named ``corral.<runner>.<pid>.<random>``.  Controllers are never
enabled on it, so the rule that a cgroup with controllers for its children
may hold no process of its own never applies: a runner nested in a child of
another (a launch's agent on this host) makes its cgroup under its parent's.

How a child gets into it: the child moves *itself* before it runs a line of
its program (see :func:`self_move`), through the same one-line ``/bin/sh``
step that the start-up handshake uses, so that whatever it forks is born
inside.  A move made by the launcher after the spawn would come too late:
the kernel makes a move wait for an RCU grace period (10-16 ms here when no
other move happened just before), and a shell that backgrounds a ``setsid``
command forks well within that time (measured: 10 escapes in 10 tries).
The launcher moves the child itself (:func:`move`) only where the
child cannot (it starts as another user).
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import signal
from dataclasses import dataclass

__all__ = ["Cgroup", "CgroupUnavailable", "find_hierarchy", "member_of", "move", "self_move"]

_ESCAPE = re.compile(r"\\([0-7]{3})")


class CgroupUnavailable(OSError):
    """No cgroup can be made here; the message says why."""


def _unescape(field: str) -> str:
    """A path as ``/proc/self/mountinfo`` writes it (``\\040`` for a space), decoded."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def find_hierarchy(
    mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup"
) -> tuple[str, str]:
    """This process's own cgroup in the v2 hierarchy: its directory, and its ``0::`` path.

    Raises :class:`CgroupUnavailable` where there is none: no cgroup v2
    mounted (a host with cgroup v1 only), or this process's cgroup outside
    what the mount shows.
    """
    mount: tuple[str, str] | None = None
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(maxsplit=1)[:1] == ["cgroup2"]:
                fields = left.split()
                mount = (_unescape(fields[3]), _unescape(fields[4]))
                break
    if mount is None:
        raise CgroupUnavailable(errno.ENOENT, "no cgroup v2 hierarchy is mounted")
    own: str | None = None
    with open(cgroup, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            if line.startswith("0::"):
                own = line[3:].rstrip("\n")
                break
    root, point = mount
    if own is None or not own.startswith("/"):
        raise CgroupUnavailable(errno.ENOENT, "this process has no cgroup v2 path")
    if root != "/" and own != root and not own.startswith(root.rstrip("/") + "/"):
        raise CgroupUnavailable(
            errno.ENOENT, f"this process's cgroup {own} is outside the mounted {root}"
        )
    below = own[len(root) :] if root != "/" else own
    return os.path.join(point, below.lstrip("/")).rstrip("/") or "/", own


def member_of(pid: int, relative: str) -> bool:
    """Whether ``pid`` is in the cgroup ``relative`` (its ``0::`` path) or below it."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            data = f.read()
    except OSError:
        return False
    for line in data.splitlines():
        if line.startswith(b"0::"):
            path = os.fsdecode(line[3:])
            return path == relative or path.startswith(relative + "/")
    return False


@dataclass(frozen=True)
class Cgroup:
    """A runner's cgroup: ``path`` is its directory, ``relative`` its ``0::`` path."""

    path: str
    relative: str

    @classmethod
    def create(cls, runner: str) -> Cgroup:
        """Make a new cgroup under this process's own; :class:`CgroupUnavailable` if impossible."""
        import secrets  # (with the first cgroup: it loads hashlib)

        parent, own = find_hierarchy()
        name = f"corral.{runner}.{os.getpid()}.{secrets.token_hex(4)}"
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError as exc:
            raise CgroupUnavailable(
                exc.errno, f"cannot make a cgroup under {parent}: {exc.strerror}"
            ) from None
        if not os.path.exists(os.path.join(path, "cgroup.procs")):  # not a cgroup after all
            os.rmdir(path)
            raise CgroupUnavailable(errno.ENOTDIR, f"{parent} is not a cgroup v2 directory")
        return cls(path, own.rstrip("/") + "/" + name)

    @property
    def procs(self) -> str:
        """Its ``cgroup.procs``: writing a pid there moves that process in."""
        return os.path.join(self.path, "cgroup.procs")

    def populated(self) -> bool:
        """Whether a live process is in it or below it (a zombie does not count)."""
        try:
            with open(os.path.join(self.path, "cgroup.events"), "rb") as f:
                return b"populated 1" in f.read()
        except FileNotFoundError:
            return False

    def members(self) -> list[int]:
        """The pids of every live process in it and in its sub-cgroups."""
        pids: list[int] = []
        for directory, _subdirs, _files in os.walk(self.path):
            try:
                with open(os.path.join(directory, "cgroup.procs"), "rb") as f:
                    pids.extend(int(pid) for pid in f.read().split())
            except FileNotFoundError:
                continue  # removed meanwhile
        return pids

    def kill(self) -> None:
        """SIGKILL everything in it and below, at once (blocks for an RCU grace period).

        Through ``cgroup.kill`` where the kernel has it (5.14 and later);
        otherwise each member through a pidfd (:meth:`kill_each`).
        """
        try:
            fd = os.open(os.path.join(self.path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if os.path.isdir(self.path):
                self.kill_each()
            return
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)

    def kill_each(self) -> None:
        """SIGKILL every member by its pidfd, checked a member once the pidfd is held."""
        for pid in self.members():
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone
            try:
                # The pidfd holds the process it was opened on: if the pid was
                # reused before, the check below sees the other process.
                if member_of(pid, self.relative):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)

    def remove(self) -> bool:
        """Remove it (and its sub-cgroups, deepest first); ``False`` while a process is in one."""
        try:
            for directory, _subdirs, _files in os.walk(self.path, topdown=False):
                os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        return True


def self_move(procs: str) -> str:
    """The shell command by which a child moves itself into a cgroup before its program runs.

    ``0`` written to ``cgroup.procs`` means "the writer".  If the write fails,
    the command fails, and the program does not run outside the cgroup.
    """
    return f"echo 0 >{shlex.quote(procs)}"


def move(procs: str, pid: int) -> None:
    """Move ``pid`` into the cgroup of ``procs`` from outside (blocks up to an RCU grace period)."""
    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"%d" % pid)
    finally:
        os.close(fd)
