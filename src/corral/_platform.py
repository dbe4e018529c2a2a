"""Everything that is specific to Linux, in one place.

corral needs a handful of operating-system facilities that the standard
library exposes thinly or not at all:

* spawning a child in a process group of its own, with chosen descriptors
  in chosen slots, without a ``preexec_fn`` (which would force ``fork``
  instead of ``vfork`` and make every spawn several times slower);
* a *pidfd*, a descriptor that becomes readable when a process exits, so
  that waiting for a child is an ordinary "wait until readable" on the event
  loop rather than a thread blocked in ``waitpid`` or a polling loop;
* reading a child's exit status *without* reaping it (``waitid`` with
  ``WNOWAIT``): while the exited leader stays a zombie, its process-group id
  cannot be handed to another process, so the runner can still signal what
  the child left behind in its group safely;
* the descriptor limit (``RLIMIT_NOFILE``).

A port to another Unix replaces this module and nothing else.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
from collections.abc import Mapping, Sequence

__all__ = [
    "FD_PER_CHILD",
    "exit_status",
    "fd_limits",
    "gone_or_in_group",
    "is_exiting",
    "pidfd_open",
    "raise_fd_limit",
    "reap",
    "wait_blocking",
    "signal_group",
    "spawn",
]

#: Signals a child gets back at their default disposition even when the
#: launcher ignores them (a launcher started in the background by a
#: non-interactive shell ignores SIGINT, for instance).  Without this, the
#: runner's own stop and forwarding signals could be silently ignored.
_RESET_SIGNALS = tuple(
    s
    for s in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGPIPE,
        signal.SIGXFSZ,
        signal.SIGUSR1,
        signal.SIGUSR2,
    )
)

#: Descriptors the launcher holds per running child at most: the pidfd and
#: the read ends of its stdout and stderr pipes.  Features that add channels
#: (the start-up handshake, a log connection) add one each while in use.
FD_PER_CHILD = 3

# ``posix_spawn`` cannot change directory portably (glibc's
# ``addchdir_np`` is not exposed by Python), so a child with a ``cwd`` is
# started through a one-line POSIX shell script that changes directory and
# then *replaces itself* with the real program: the pid, process group and
# descriptors are the child's own.
_CHDIR_SHIM = 'cd -- "$1" || exit 126; shift; exec "$@"'


def _resolve(program: str, env: Mapping[bytes, bytes], cwd: str | None) -> str:
    """Find ``program`` the way ``execvp`` would, raising as :mod:`subprocess` does."""
    if os.sep in program:
        path = program if cwd is None else os.path.join(cwd, program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(errno.EACCES, "Permission denied", program)
        return program
    search = env.get(b"PATH")
    found = shutil.which(program, path=os.fsdecode(search) if search is not None else os.defpath)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
    return found


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[bytes, bytes],
    cwd: str | None,
    fds: Mapping[int, int],
) -> int:
    """Start ``argv`` as the leader of a new process group and return its pid.

    ``fds`` maps each descriptor number the child should have (0, 1, 2 and
    any others) to a descriptor of ours that it is a copy of.  Everything
    else the launcher has open is close-on-exec (Python's default since PEP
    446) and does not leak into the child.  Errors that the standard library
    reports as exceptions (no such program, no such directory, not
    executable) are raised here, before anything has been spawned.

    This call blocks for the few hundred microseconds a ``vfork``-style
    spawn takes.  CPython holds the GIL throughout ``os.posix_spawn``, so a
    worker thread would stall the event loop just as long; the runner calls
    it on the loop thread, one child at a time, and yields in between.
    """
    if not argv:
        raise ValueError("argv must name a program")
    program = _resolve(argv[0], env, cwd)
    if cwd is not None:
        if not os.path.isdir(cwd):
            if os.path.exists(cwd):
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", cwd)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", cwd)
        exec_path = "/bin/sh"
        exec_argv = ["sh", "-c", _CHDIR_SHIM, "sh", cwd, program, *argv[1:]]
        # argv[0] is the program path here, not the caller's argv[0]; the
        # shell's ``exec`` cannot set a different one portably.
    else:
        exec_path = program
        exec_argv = list(argv)
    file_actions = [(os.POSIX_SPAWN_DUP2, source, target) for target, source in sorted(fds.items())]
    return os.posix_spawn(
        exec_path,
        exec_argv,
        env,
        file_actions=file_actions,
        setpgroup=0,
        setsigmask=(),
        setsigdef=_RESET_SIGNALS,
    )


def pidfd_open(pid: int) -> int:
    """A descriptor that becomes readable when ``pid`` exits (close-on-exec)."""
    return os.pidfd_open(pid)


def exit_status(pid: int) -> int | None:
    """The exit status of ``pid`` if it has exited, without reaping it.

    Returns ``None`` while it runs; otherwise the code in the convention of
    :mod:`subprocess`: the exit code, or ``-signum`` if a signal killed it.
    """
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if result is None or result.si_pid == 0:
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return -result.si_status


def wait_blocking(pid: int) -> int:
    """Wait for ``pid`` to exit and return its status without reaping it (blocks)."""
    result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    if result is None:  # pragma: no cover - cannot happen without WNOHANG
        raise ChildProcessError(pid)
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


_PF_EXITING = 0x4


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or ``None`` if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def is_exiting(pid: int) -> bool:
    """Whether ``pid`` has begun to exit (or is gone), even before it is a zombie.

    A process closes its descriptors early in its exit, before its parent
    can see the exit status; a reader that sees end-of-file on a pipe from
    the child asks this to tell "the child closed it" from "the child is
    exiting".  Reads the ``PF_EXITING`` flag from ``/proc/<pid>/stat``.
    """
    fields = _stat_fields(pid)
    if fields is None:
        return True
    state, flags = fields[0], int(fields[6])
    return state in (b"Z", b"X", b"x") or bool(flags & _PF_EXITING)


def gone_or_in_group(pid: int, pgid: int) -> bool:
    """Whether ``pid`` has exited (or is a zombie) or is still a member of group ``pgid``."""
    fields = _stat_fields(pid)
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
