"""Everything that is specific to Linux, in one place.

corral needs a handful of operating-system facilities that the standard
library exposes thinly or not at all:

* spawning a child as the leader of a process group of its own, with chosen
  descriptors in chosen slots and nothing else inherited.  :class:`subprocess.Popen`
  does this well (``process_group=0``, ``close_fds``, ``cwd``, ``user``...,
  with ``vfork`` and ``close_range`` under the hood, as fast as
  ``posix_spawn`` here), so corral uses it for the spawn alone and manages
  the child itself from then on;
* a *pidfd*, a descriptor that becomes readable when a process exits, so
  that waiting for a child is an ordinary "wait until readable" on the event
  loop rather than a thread blocked in ``waitpid`` or a polling loop;
* reading a child's exit status *without* reaping it (``waitid`` with
  ``WNOWAIT``): while the exited leader stays a zombie, its process-group id
  cannot be handed to another process, so the runner can still signal what
  the child left behind in its group safely;
* ``/proc``: whether a process has begun to exit, and its process group;
* the descriptor limit (``RLIMIT_NOFILE``).

A port to another Unix replaces this module (and the lifeline's ``/proc``
scan) and nothing else.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import resource
import select
import shlex
import shutil
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._errors import CorralError
from . import _cgroup

__all__ = [
    "FD_PER_CHILD",
    "PopenArgs",
    "StrOrPath",
    "StatusLost",
    "ended",
    "exit_status",
    "has_exited",
    "fd_limits",
    "file_table",
    "is_exiting",
    "open_status",
    "pidfd_open",
    "process_limits",
    "raise_fd_limit",
    "require_pidfd",
    "reap",
    "signal_group",
    "spawn",
    "wait_blocking",
]

#: Descriptors the launcher holds per running child at most: the pidfd and
#: the read ends of its stdout and stderr pipes.  Features that add channels
#: (a log connection, ``stdin=PIPE``) add one each while in use; the start-up
#: handshake adds two until the start is decided (its pipe, and the child's
#: ``/proc`` status).
FD_PER_CHILD = 3

# The start-up handshake needs the pipe at descriptor 3 in the child, and
# Popen can place descriptors only at 0, 1 and 2; a child contained in a
# cgroup must move itself there before its program runs (see _cgroup).  So
# such a child is started through a one-line shell script that does either
# or both (the handshake pipe arrives as its stdin and is moved to 3, the real
# stdin set up) and then *replaces itself* with the program: the pid, process
# group, argv (argv[0] included) and environment are the program's own (dash
# exports PWD: the script puts it back as it was).  dash handles single-digit
# descriptors only, so a stdin other than /dev/null, which arrives at a
# number above 9, is moved by bash.
_HANDSHAKE_NULL: Final = "exec 3>&0 0</dev/null"
_HANDSHAKE_FD: Final = "exec 3>&0 0<&{fd} {fd}<&-"
_SHIM_NAME: Final = "corral-handshake"
_CONTAIN_NAME: Final = "corral-contain"


class StatusLost(ChildProcessError):
    """A child's exit status could not be read: someone else reaped it.

    Happens when the application ignores ``SIGCHLD`` (the kernel then reaps
    every child itself) or reaps children on its own (``waitpid(-1)``).
    """


def _resolve(program: str, env: Mapping[bytes, bytes], cwd: str | None) -> None:
    """Raise as :mod:`subprocess` would if ``program`` cannot be executed.

    For a child started through the shell step, whose own ``exec`` failing
    would only be an exit code: no such file, not executable, and the common
    causes of ``ENOEXEC`` (neither a binary nor a ``#!`` script) and of
    ``ENOENT`` on an existing script (its interpreter missing).
    """
    if os.sep in program:
        path = program if cwd is None else os.path.join(cwd, program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(errno.EACCES, "Permission denied", program)
    else:
        search = env.get(b"PATH")
        where = os.fsdecode(search) if search is not None else os.defpath
        found = shutil.which(program, path=where)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
        path = found
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return  # executable but not readable: only exec can tell
    if head.startswith(b"#!"):
        interpreter = head[2:].split(b"\n", 1)[0].split()
        if interpreter and not os.path.exists(interpreter[0]):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
    elif not _runnable_elf(head):
        raise OSError(errno.ENOEXEC, "Exec format error", program)


_native_elf: bytes | None = None


def _elf_kind(head: bytes) -> bytes:
    """What the kernel checks first of an ELF header: class, byte order, version, machine."""
    # e_type: 2 an executable, 3 a shared object (a PIE); in the file's byte order.
    kind = int.from_bytes(head[16:18], "little" if head[5:6] == b"\x01" else "big")
    return head[4:7] + (head[18:20] if kind in (2, 3) else b"?")


def _runnable_elf(head: bytes) -> bool:
    """Whether ``head`` starts an ELF executable for this machine (as this Python is)."""
    global _native_elf
    if not head.startswith(b"\x7fELF") or len(head) < 20:
        return False
    if _native_elf is None:
        with open("/proc/self/exe", "rb") as f:
            _native_elf = _elf_kind(f.read(20))
    return _elf_kind(head) == _native_elf


StrOrPath = str | os.PathLike[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PopenArgs:
    """The options of a child's spawn that :class:`subprocess.Popen` takes, as Popen names them.

    One record carries them from the keywords of :meth:`Runner.start` to the
    one ``Popen`` call in :func:`spawn`: the start options
    (:class:`corral._core._options.ProcessOptions`) are these fields and
    corral's own, :meth:`~corral._core._options.ProcessOptions.checked` checks
    them all at once and keeps this part as a record of its own, the spawner
    hands that record here, and :func:`spawn` passes every field to ``Popen``
    under its own name.  The walk of ``cwd``: ``r.start(argv, cwd="/srv")``
    makes a ``ProcessOptions`` whose ``cwd`` is ``"/srv"`` (defaults come
    from the fields below), ``checked()`` makes sure it is a path and keeps
    ``PopenArgs(cwd="/srv", ...)`` in the start's record, every spawn of the
    child (restarts too) gives that record to :func:`spawn`, which gives
    ``cwd="/srv"`` to ``Popen``.  So a new Popen-style option is one field
    here (its type and its default; :class:`~corral.StartOptions`, the typed
    keywords, lists it too, and a test keeps the two in step) and its check
    in ``checked()``.
    """

    cwd: StrOrPath | None = None
    pass_fds: Collection[int] = ()
    start_new_session: bool = False
    user: str | int | None = None
    group: str | int | None = None
    extra_groups: Collection[str | int] | None = None
    umask: int = -1

    def popen_keywords(self, **changes: Any) -> dict[str, Any]:
        """Every field of this record (of :class:`PopenArgs`'s), as ``Popen``'s keywords."""
        keywords = {f.name: getattr(self, f.name) for f in dataclasses.fields(PopenArgs)}
        keywords.update(changes)
        return keywords


def spawn(
    argv: Sequence[str | bytes | os.PathLike[str] | os.PathLike[bytes]],
    *,
    env: Mapping[bytes, bytes],
    stdin: int,
    stdout: int,
    stderr: int,
    handshake: int | None = None,
    popen: PopenArgs = PopenArgs(),
    cgroup: str | None = None,
) -> int:
    """Start ``argv`` as the leader of a new process group and return its pid.

    ``stdin``, ``stdout`` and ``stderr`` are descriptors of ours that the
    child gets as 0, 1 and 2 (or :data:`subprocess.DEVNULL`); ``handshake``,
    if given, becomes its descriptor 3.  Nothing else the launcher has open
    leaks into the child (``close_fds``), except ``popen.pass_fds``; the rest
    of ``popen`` (checked already: see :class:`PopenArgs`) goes to
    :class:`subprocess.Popen` as it is.  Errors that :mod:`subprocess`
    reports as exceptions (no such program, no such directory, not
    executable) are raised here, with nothing left running.

    ``cgroup``, the ``cgroup.procs`` of a cgroup, puts the child there
    before its program runs: it moves itself (see :mod:`corral._sys._cgroup`),
    or, if it starts as another ``user``, ``group`` or ``extra_groups`` (it
    could not), the launcher moves it right after the spawn, which leaves a
    window: what it forks before that stays outside.

    This call blocks for the few hundred microseconds a ``vfork``-style
    spawn takes; CPython holds the GIL through it, so a worker thread would
    stall the event loop just as long.  The runner calls it on the loop
    thread, one child at a time, and yields in between.
    """
    if not argv:
        raise ValueError("argv must name a program")
    args = list(argv)
    passed = set(popen.pass_fds)
    cwd = popen.cwd
    steps: list[str] = []
    as_other = popen.user is not None or popen.group is not None or popen.extra_groups is not None
    if cgroup is not None and not as_other and os.access(cgroup, os.W_OK, effective_ids=True):
        # (A launcher that gave up the right to write there, by seteuid, starts it outside.)
        steps.append(_cgroup.self_move(cgroup))
    if steps or handshake is not None:
        program = os.fsdecode(args[0])
        cwd_text = os.fsdecode(cwd) if cwd is not None else None
        if cwd_text is not None and not os.path.isdir(cwd_text):
            if os.path.exists(cwd_text):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", cwd_text)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", cwd_text)
        _resolve(program, env, cwd_text)
        name = _CONTAIN_NAME if handshake is None else _SHIM_NAME
        if handshake is None or stdin == subprocess.DEVNULL:
            if handshake is not None:
                steps.append(_HANDSHAKE_NULL)
            pwd = env.get(b"PWD")
            steps.append("unset PWD" if pwd is None else f"PWD={shlex.quote(os.fsdecode(pwd))}")
            steps.append('exec "$@"')
            args = ["/bin/sh", "-c", " && ".join(steps), name, *args]
        else:
            if not os.path.exists("/bin/bash"):  # pragma: no cover - bash is everywhere here
                raise OSError(
                    errno.ENOENT,
                    "wait_started=True with a stdin other than DEVNULL needs /bin/bash",
                )
            passed.add(stdin)
            steps += [_HANDSHAKE_FD.format(fd=stdin), 'exec "$@"']
            args = ["/bin/bash", "-p", "-c", " && ".join(steps), name, *args]
        if handshake is not None:
            stdin = handshake
    child = subprocess.Popen(
        args,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=env,
        close_fds=True,
        # A new session makes the child the leader of a new group already.
        process_group=None if popen.start_new_session else 0,
        **popen.popen_keywords(pass_fds=tuple(sorted(passed))),
    )
    # From here on the child is ours: the runner waits for it on a pidfd and
    # reaps it itself.  Mark the Popen object finished so that it never calls
    # waitpid on the child (its __del__ would, via subprocess._cleanup).
    child.returncode = 0
    pid: int = child.pid
    if cgroup is not None and as_other:
        try:
            _cgroup.move(cgroup, pid)
        except OSError:
            signal_group(pid, signal.SIGKILL)
            try:
                wait_blocking(pid)
            except StatusLost:
                pass
            reap(pid)
            raise
    return pid


def pidfd_open(pid: int) -> int:
    """A descriptor that becomes readable when ``pid`` exits (close-on-exec)."""
    return os.pidfd_open(pid)


_pidfd_works = False


def require_pidfd() -> None:
    """Raise :class:`~corral.CorralError` unless this system gives pidfds.

    corral waits for every child on its pidfd (``pidfd_open``, Linux 5.3 and
    later).  Where the call is missing (an older kernel) or forbidden (a
    seccomp filter, such as an older container runtime's default profile),
    nothing else would work; better to say so, once, at the runner's entry
    than to fail at the first child with a bare ``ENOSYS`` or ``EPERM``.
    """
    global _pidfd_works
    if _pidfd_works:
        return
    if not hasattr(os, "pidfd_open"):
        raise CorralError(
            "corral needs os.pidfd_open (Python on Linux 5.3 or later) to wait for its "
            "children; this Python does not have it"
        )
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EACCES):
            raise
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        raise CorralError(
            f"corral cannot wait for its children here: the pidfd_open system call fails "
            f"with {name} ({exc.strerror}). corral needs Linux 5.3 or later, with "
            "pidfd_open allowed: a seccomp filter (a container's profile, a sandbox) "
            "that forbids it must allow it"
        ) from exc
    os.close(fd)
    _pidfd_works = True


def exited_stand_in() -> int:
    """A descriptor that is readable at once: the pidfd of a child that is already gone."""
    return os.eventfd(1, os.EFD_CLOEXEC)


def exit_status(pid: int) -> int | None:
    """The exit status of ``pid`` if it has exited, without reaping it.

    Returns ``None`` while it runs; otherwise the code in the convention of
    :mod:`subprocess`: the exit code, or ``-signum`` if a signal killed it.
    Raises :class:`StatusLost` if the child was reaped by someone else.
    """
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        raise StatusLost(
            errno.ECHILD, f"the exit status of pid {pid} was collected elsewhere"
        ) from None
    if result is None or result.si_pid == 0:
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return -result.si_status


def has_exited(pidfd: int) -> bool:
    """Whether the child of ``pidfd`` has exited (or was reaped elsewhere), without reaping it.

    Through the pidfd, so a pid that was reaped elsewhere and reused is never mistaken.
    """
    try:
        result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return result is not None and result.si_pid != 0


def ended(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has ended: a child of ours or not, reaped or not."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def describe_status(returncode: int) -> str:
    """``"exited with code 3"`` or ``"killed by SIGTERM"``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def describe_exit(pid: int) -> str:
    """How an exited child ended, for a message (without reaping it)."""
    try:
        status = exit_status(pid)
    except StatusLost:
        return "its exit status was collected elsewhere"
    return "still running" if status is None else describe_status(status)


def wait_blocking(pid: int) -> int:
    """Wait for ``pid`` to exit and return its status without reaping it (blocks).

    Raises :class:`StatusLost` if the child was reaped by someone else.
    """
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        raise StatusLost(
            errno.ECHILD, f"the exit status of pid {pid} was collected elsewhere"
        ) from None
    if result is None:  # pragma: no cover - cannot happen without WNOHANG
        raise StatusLost(errno.ECHILD, f"no exit status for pid {pid}")
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


_PF_EXITING = 0x4


def _parse_stat(stat: bytes) -> list[bytes]:
    return stat[stat.rfind(b")") + 2 :].split()


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or ``None`` if gone.

    Opens a descriptor for the read: raises :class:`OSError` (``EMFILE``) when
    the process has none left.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return _parse_stat(stat)


def open_status(pid: int) -> int:
    """A descriptor on ``/proc/<pid>/stat``, for :func:`is_exiting` to read without opening one.

    Taken right after the spawn, while the child cannot have been reaped (so
    its pid is still its own), and kept as long as the answer may be needed.
    """
    return os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)


def is_exiting(status: int) -> bool:
    """Whether the process has begun to exit (or is gone), even before it is a zombie.

    A process closes its descriptors early in its exit, before its parent
    can see the exit status; a reader that sees end-of-file on a pipe from
    the child asks this to tell "the child closed it" from "the child is
    exiting".  Reads the ``PF_EXITING`` flag from ``/proc/<pid>/stat``,
    through ``status``, a descriptor from :func:`open_status`: the answer
    never needs a new descriptor, so it holds at the descriptor limit too.
    """
    try:
        stat = os.pread(status, 4096, 0)
    except ProcessLookupError:
        return True  # reaped
    fields = _parse_stat(stat)
    state, flags = fields[0], int(fields[6])
    return state in (b"Z", b"X", b"x") or bool(flags & _PF_EXITING)


def gone_or_in_group(pid: int, pgid: int) -> bool:
    """Whether ``pid`` has exited (or is a zombie) or is still a member of group ``pgid``.

    Asks ``getpgid`` first, which needs no descriptor; only a process in
    another group costs a read of ``/proc`` (to tell a zombie).  If that read
    is impossible (no descriptor left), the process counts as alive elsewhere.
    """
    try:
        if os.getpgid(pid) == pgid:
            return True
    except ProcessLookupError:
        return True
    except OSError:
        pass
    try:
        fields = _stat_fields(pid)
    except OSError:
        return False
    if fields is None:
        return True
    return fields[0] in (b"Z", b"X", b"x") or int(fields[2]) == pgid


def reap(pid: int) -> None:
    """Collect an exited child so that its pid (and process-group id) are released."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to every process in group ``pgid``; ``False`` if none is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed its credentials (setuid); the rest got the signal.
        return True
    return True


def fd_limits() -> tuple[int, int]:
    """The soft and hard ``RLIMIT_NOFILE``."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_fd_limit() -> bool:
    """Raise the soft descriptor limit toward the hard one; ``False`` if already there."""
    soft, hard = fd_limits()
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return False
    target = soft * 2 if soft > 0 else 1024
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return False
    return True


def process_limits() -> str:
    """What bounds this user's processes here, and how many it has: for an error message.

    ``RLIMIT_NPROC`` counts the threads of every process of the real user;
    a ``pids`` cgroup (``TasksMax=`` under systemd) bounds the tasks of its
    members.  Scans ``/proc``: for an error path only.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    uid, tasks = os.getuid(), 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                tasks += int(fields[b"Threads"])
        except (OSError, KeyError, ValueError):
            continue  # not a process, or gone meanwhile
    said = [
        f"RLIMIT_NPROC soft={_limit(soft)}, hard={_limit(hard)} (ulimit -u); "
        f"user {uid} has {tasks} processes and threads"
    ]
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line[3:].strip() for line in f if line.startswith("0::"))
        with open(f"/sys/fs/cgroup{path}/pids.max") as f:
            pids_max = f.read().strip()
        with open(f"/sys/fs/cgroup{path}/pids.current") as f:
            pids_current = f.read().strip()
        if pids_max != "max":
            said.append(f"cgroup {path} pids.max={pids_max} (pids.current={pids_current})")
    except (OSError, StopIteration):
        pass
    return "; ".join(said)


def file_table() -> str:
    """The system's table of open files, used and size (``/proc/sys/fs/file-nr``)."""
    try:
        with open("/proc/sys/fs/file-nr") as f:
            allocated, _, size = f.read().split()
    except (OSError, ValueError):
        return "fs.file-max"
    return f"{allocated} of fs.file-max={size} in use"


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)
