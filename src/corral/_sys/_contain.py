"""Containment: what a runner's children leave behind, found and stopped.

A runner stops its children by process group.  A descendant that left its
group (a daemon: fork, ``setsid``, fork again) is out of reach of that, and
two mechanisms find it again:

* **a cgroup** of the runner's own (:mod:`corral._sys._cgroup`): every
  descendant is born in it, and stays there whatever it does to its group or
  session.  It needs cgroup v2 and the right to make a cgroup (root, or a
  delegated subtree); it touches nothing but the runner's own children, so a
  runner uses one wherever it can (``contain=True``, the default).
* **a child subreaper** (``PR_SET_CHILD_SUBREAPER``): an orphaned descendant
  is handed to the nearest ancestor that is one, instead of to init.  That
  is a property of the whole process, which then also has to reap every
  orphan that comes to it: the ``corral`` command, which owns its process,
  is one; a library never becomes one unless asked (``subreaper=True``).

:class:`Containment` holds both for one runner.  Once its children are gone,
:meth:`Containment.strays` lists what is left: the live members of its
cgroup, and, as a subreaper, the orphans it adopted that came from its
children (members of its cgroup, or carrying its marker in their
environment; an application's own children are neither).  They are stopped
as children are, by the one stop of :mod:`corral._core._stop`: the stop
signal, the grace period, then SIGKILL (``cgroup.kill``); the orphans are
reaped.  The steps it takes of them are here (:meth:`Containment.hold`,
``send``, ``kill``, ``reap``): every process is signalled and reaped through
a pidfd, so a pid that was reused is never hit.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from ._cgroup import Cgroup, CgroupUnavailable, member_of

if TYPE_CHECKING:
    import ctypes

__all__ = [
    "KILL_WAIT",
    "Containment",
    "children",
    "describe",
    "is_subreaper",
    "set_subreaper",
]

#: How long killed strays may take to be gone (a process in uninterruptible
#: sleep, on a dead NFS server say, may take longer: it is then left).
KILL_WAIT: Final = 5.0

_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37

_libc: ctypes.CDLL | None = None


def _prctl(option: int, arg: object) -> None:
    import ctypes  # (only for the subreaper role: a runner without it never loads it)

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def is_subreaper() -> bool:
    """Whether this process is a child subreaper."""
    import ctypes

    value = ctypes.c_int(0)
    _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.pointer(value))
    return bool(value.value)


def set_subreaper(on: bool) -> None:
    """Make this process a child subreaper (or not any more): process-wide."""
    _prctl(_PR_SET_CHILD_SUBREAPER, int(on))


#: Runners of this process that hold the subreaper, and whether it was one before.
_holders = 0
_was_subreaper = False


def _hold_subreaper() -> None:
    global _holders, _was_subreaper
    if _holders == 0:
        _was_subreaper = is_subreaper()
        if not _was_subreaper:
            set_subreaper(True)
    _holders += 1


def _release_subreaper() -> None:
    global _holders
    _holders -= 1
    if _holders == 0 and not _was_subreaper:
        set_subreaper(False)


def children() -> list[int]:
    """The pids of this process's children, zombies included."""
    pids: list[int] = []
    me = os.getpid()
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):  # no CONFIG_PROC_CHILDREN
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _parent(int(entry)) == me:
                pids.append(int(entry))
        return pids
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{task}/children", "rb") as f:
                pids.extend(int(pid) for pid in f.read().split())
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return pids


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def _carries(pid: int, marker: bytes) -> bool:
    """Whether ``pid``'s environment has a variable that begins with ``marker``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False  # gone, a zombie (no environment any more), or not ours to read
    return environ.startswith(marker) or b"\0" + marker in environ


def describe(pids: Iterable[int], most: int = 5) -> str:
    """``"pid 12 (sleep), pid 13 (sh)"``, the first ``most`` of them."""
    pids = list(pids)
    words = []
    for pid in pids[:most]:
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                name = f.read().strip().decode("utf-8", "replace")
        except OSError:
            name = "gone"
        words.append(f"pid {pid} ({name!r})" if not name.isprintable() else f"pid {pid} ({name})")
    if len(pids) > most:
        words.append(f"and {len(pids) - most} more")
    return ", ".join(words)


def _send(pidfd: int, signum: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signum)
    except (ProcessLookupError, PermissionError):
        pass  # gone; or it changed its credentials (setuid): the cgroup's kill still applies


class Containment:
    """One runner's containment: its cgroup (if one could be made) and its subreaper role.

    ``marker`` is what every child of the runner carries in its environment
    (``CORRAL_LIFELINE=<token>.``); ``adopt_all`` makes every child of the
    process a stray (the ``corral`` command's last sweep, when nothing else
    can be running).
    """

    def __init__(
        self,
        runner: str,
        *,
        cgroup: bool,
        subreaper: bool,
        marker: bytes = b"",
        adopt_all: bool = False,
    ) -> None:
        for keyword, value in (("contain", cgroup), ("subreaper", subreaper)):
            if not isinstance(value, bool):
                raise TypeError(f"{keyword} must be True or False, not {value!r}")
        self._runner = runner
        self._want_cgroup = cgroup
        self._subreaper = subreaper
        self._marker = marker
        self._adopt_all = adopt_all
        self.cgroup: Cgroup | None = None
        #: Why there is no cgroup, when one was wanted.
        self.unavailable: str | None = None
        self._held = False

    def open(self) -> None:
        """Make the cgroup (if possible) and become a subreaper (if asked); raises nothing else."""
        if self._want_cgroup:
            try:
                self.cgroup = Cgroup.create(self._runner)
            except CgroupUnavailable as exc:
                self.unavailable = exc.strerror or str(exc)
        if self._subreaper:
            try:
                _hold_subreaper()
            except BaseException:
                if self.cgroup is not None:
                    self.cgroup.remove()
                    self.cgroup = None
                raise
            self._held = True

    # -- what is left ---------------------------------------------------------------------

    def _ours(self, pid: int) -> bool:
        if self._adopt_all:
            return True
        if self.cgroup is not None and member_of(pid, self.cgroup.relative):
            return True
        return bool(self._marker) and _carries(pid, self._marker)

    def strays(self) -> list[int]:
        """What the runner's children left: live members of its cgroup, and orphans of theirs.

        Orphans only as a subreaper (they are this process's children then);
        zombies among them too (they need reaping), but only those still known
        by their cgroup: a zombie has no environment to tell where it came from.
        """
        found = self.cgroup.members() if self.cgroup is not None else []
        if self._subreaper or self._adopt_all:
            seen = set(found)
            found += [pid for pid in children() if pid not in seen and self._ours(pid)]
        return found

    # -- stopping it (the stop itself is corral._core._stop's, for strays as for children) ---

    def hold(self, held: dict[int, int]) -> None:
        """Hold a pidfd on every stray not held yet, in ``held`` (pid -> pidfd)."""
        for pid in self.strays():
            if pid in held:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone (and reaped)
            if self._ours(pid):
                held[pid] = pidfd
            else:
                os.close(pidfd)  # the pid was reused: not ours

    @staticmethod
    def send(held: dict[int, int], signum: int) -> None:
        """``signum`` to every held stray, through its pidfd."""
        for pidfd in held.values():
            _send(pidfd, signum)

    def kill(self, held: dict[int, int]) -> None:
        """SIGKILL to every stray: the cgroup's kill, and each held one.

        Blocks (the cgroup's kill waits for an RCU grace period): call it from
        a worker thread.
        """
        if self.cgroup is not None and self.cgroup.populated():
            self.cgroup.kill()
        self.hold(held)
        for pidfd in held.values():
            _send(pidfd, signal.SIGKILL)

    @staticmethod
    def reap(held: dict[int, int]) -> None:
        """Reap (if it is a child of ours) and let go of every held process that has exited."""
        for pid, pidfd in list(held.items()):
            try:
                exited = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                # Not a child of ours: exited once its pidfd is readable.
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                if not poller.poll(0):
                    continue
            else:
                if exited is None or exited.si_pid == 0:
                    continue
                try:
                    os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
                except ChildProcessError:
                    pass
            del held[pid]
            os.close(pidfd)

    def close(self) -> bool:
        """Remove the cgroup and let go of the subreaper; ``False`` if the cgroup is still busy."""
        removed = True
        if self.cgroup is not None:
            removed = self.cgroup.remove()
        if self._held:
            self._held = False
            _release_subreaper()
        return removed
