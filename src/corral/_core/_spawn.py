"""Spawning one child: its options checked, its descriptors and environment made.

:class:`SpawnSpec` is what :meth:`Runner.start` was asked for, checked once
(so that bad input raises before anything starts, and a restart spawns from
the same spec).  :class:`Spawner` turns a spec into a running child:

* it makes the pipes the spec asks for (stdout and stderr for the log or for
  collection, stdin for input, one for the start-up handshake), retrying
  once the descriptor limit was raised if the process ran out
  (``RLIMIT_NOFILE``), and raises :class:`~corral.ResourceLimitError` before
  anything is spawned if that is not enough, or if the system refuses a new
  process (``EAGAIN``: ``RLIMIT_NPROC``, a ``pids`` cgroup) or a new file
  (``ENFILE``), naming the limit, the child and how many run;
* it builds the environment: ``env`` replaces the launcher's, ``extra_env``
  lays variables over it (a ``None`` value removes one), and corral adds its
  own (``PYTHONUNBUFFERED=1`` unless set, the log socket, the handshake, the
  lifeline's marker);
* it tells the lifeline before and after, so that even a launcher killed in
  the middle of a spawn leaves no child behind;
* and it reserves the descriptors a child needs after its spawn (its pidfd,
  and with the handshake a descriptor on its ``/proc`` status) before
  spawning, so running out of descriptors can never strand a spawned child,
  nor make its supervision fail later.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from .._checks import check_argv
from .._errors import ResourceLimitError
from .._sys import _childenv, _platform
from .._sys._lifeline import Lifeline
from . import _handshake
from ._stdio import Plan, plan_input, plan_output

if TYPE_CHECKING:
    from ._options import ProcessOptions

__all__ = ["SpawnSpec", "Spawned", "Spawner", "describe_argv"]

T = TypeVar("T")

StrOrPath = str | os.PathLike[str]


def _check_env(env: object, what: str) -> dict[bytes, bytes | None] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"{what} must be a mapping of names to values, not {type(env).__name__}")
    result: dict[bytes, bytes | None] = {}
    for key, value in env.items():
        if not isinstance(key, (str, bytes)) or not key or "=" in os.fsdecode(key):
            raise ValueError(f"{what}: {key!r} is not a valid variable name")
        if value is not None and not isinstance(value, (str, bytes, os.PathLike)):
            raise TypeError(f"{what}[{key!r}] must be a str, not {type(value).__name__}")
        encoded = None if value is None else os.fsencode(value)
        if encoded is not None and b"\0" in encoded:
            raise ValueError(f"{what}[{key!r}] contains a NUL character")
        result[os.fsencode(key)] = encoded
    return result


@dataclass(frozen=True)
class SpawnSpec:
    """A child to spawn, as :meth:`Runner.start` was asked (checked)."""

    argv: list[str]
    env: dict[bytes, bytes | None] | None = None
    extra_env: dict[bytes, bytes | None] | None = None
    cwd: str | None = None
    stdin: Plan = field(default_factory=lambda: plan_input(subprocess.DEVNULL))
    stdout: Plan = field(default_factory=lambda: Plan(log=True))
    stderr: Plan = field(default_factory=lambda: Plan(log=True))
    pass_fds: tuple[int, ...] = ()
    start_new_session: bool = False
    user: str | int | None = None
    group: str | int | None = None
    extra_groups: tuple[str | int, ...] | None = None
    umask: int = -1
    wait_started: bool = False

    @classmethod
    def make(cls, argv: object, options: ProcessOptions) -> SpawnSpec:
        """``argv`` and the spawn's part of ``options``, checked: ``TypeError``, ``ValueError``."""
        env, extra_env, cwd = options.env, options.extra_env, options.cwd
        stdin, stdout, stderr = options.stdin, options.stdout, options.stderr
        pass_fds, start_new_session = options.pass_fds, options.start_new_session
        user, group, extra_groups = options.user, options.group, options.extra_groups
        umask, wait_started = options.umask, options.wait_started
        if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
            raise TypeError(f"cwd must be a path, not {type(cwd).__name__}")
        fds: tuple[int, ...] = ()
        if pass_fds:
            if not isinstance(pass_fds, Collection) or isinstance(pass_fds, (str, bytes)):
                raise TypeError("pass_fds must be a collection of file descriptors")
            fds = tuple(sorted({int(fd) for fd in pass_fds}))
            if any(fd < 3 for fd in fds):
                raise ValueError(
                    "pass_fds are kept at their numbers: use stdin/stdout/stderr for 0-2"
                )
        if not isinstance(umask, int) or isinstance(umask, bool):
            raise TypeError("umask must be an int")
        groups: tuple[str | int, ...] | None = None
        if extra_groups is not None:
            if isinstance(extra_groups, (str, bytes)) or not isinstance(extra_groups, Collection):
                raise TypeError("extra_groups must be a collection of group names or ids")
            groups = tuple(extra_groups)
        return cls(
            argv=check_argv(argv),
            env=_check_env(env, "env"),
            extra_env=_check_env(extra_env, "extra_env"),
            cwd=os.fspath(cwd) if cwd is not None else None,
            stdin=plan_input(stdin),
            stdout=plan_output(stdout, "stdout"),
            stderr=plan_output(stderr, "stderr"),
            pass_fds=fds,
            start_new_session=bool(start_new_session),
            user=user,
            group=group,
            extra_groups=groups,
            umask=umask,
            wait_started=bool(wait_started),
        )

    @property
    def program(self) -> str:
        return os.path.basename(self.argv[0])


@dataclass
class Spawned:
    """A child just spawned, and the launcher's ends of its pipes."""

    pid: int
    pidfd: int
    started_at: float
    stdin: int | None = None
    stdout: int | None = None
    stderr: int | None = None
    handshake: int | None = None
    #: With the handshake: a descriptor on the child's ``/proc/<pid>/stat``
    #: (see :func:`corral._sys._platform.open_status`), held until the start is decided.
    status: int | None = None

    def fds(self) -> list[int]:
        return [
            fd for fd in (self.stdin, self.stdout, self.stderr, self.handshake) if fd is not None
        ]


class Spawner:
    """Spawns the children of one runner (on the loop thread, one at a time)."""

    def __init__(
        self,
        runner_name: str,
        lifeline: Lifeline,
        log: Callable[[int, str], None],
        live_count: Callable[[], int],
        *,
        cgroup: str | None = None,
    ) -> None:
        self._runner_name = runner_name
        #: The ``cgroup.procs`` of the runner's cgroup, where every child goes (or None).
        self._cgroup = cgroup
        self._lifeline = lifeline
        self._log = log
        self._live_count = live_count
        self._child = ""  # the child being spawned, for errors

    def spawn(
        self, spec: SpawnSpec, extra: Mapping[bytes, bytes], name: str | None = None
    ) -> Spawned:
        """Spawn ``spec``, the child ``name``, with corral's variables ``extra`` in its env."""
        self._child = name if name is not None else spec.program
        env = self._environment(spec, extra)
        opened: list[int] = []  # everything to close if we fail
        child_ends: list[int] = []
        ours: dict[str, int] = {}
        try:
            # Reserve the descriptors the child will need after the spawn
            # *before* spawning: its pidfd, and with the handshake the status
            # descriptor that tells a child that closed it from one exiting.
            reserve = self._allocate(_open_devnull, opened)
            status_reserve = self._allocate(_open_devnull, opened) if spec.wait_started else None
            ends: dict[str, int | None] = {}
            plans = (("stdin", spec.stdin), ("stdout", spec.stdout), ("stderr", spec.stderr))
            for stream, plan in plans:
                if plan.log or plan.pipe:
                    read_end, write_end = self._allocate(os.pipe, opened)
                    if stream == "stdin":
                        child_end, our_end = read_end, write_end
                    else:
                        child_end, our_end = write_end, read_end
                    ours[stream] = our_end
                    child_ends.append(child_end)
                    ends[stream] = child_end
                elif plan.special is not None:
                    ends[stream] = plan.special
                elif plan.fd is not None:
                    ends[stream] = plan.fd
                else:
                    ends[stream] = None  # inherit
            handshake: int | None = None
            if spec.wait_started:
                read_end, write_end = self._allocate(os.pipe, opened)
                ours["handshake"] = read_end
                child_ends.append(write_end)
                handshake = write_end
                env[_childenv.STARTED_FD.encode()] = b"%d" % _handshake.FD
                env[_childenv.STARTED_PIPE.encode()] = _handshake.pipe_identity(write_end)
            number = self._lifeline.announce(env)
            started_at = time.monotonic()
            try:
                pid = self._allocate(
                    lambda: _platform.spawn(
                        spec.argv,
                        env=env,
                        cwd=spec.cwd,
                        stdin=_slot(ends["stdin"], 0),
                        stdout=_slot(ends["stdout"], 1),
                        stderr=_slot(ends["stderr"], 2),
                        handshake=handshake,
                        pass_fds=spec.pass_fds,
                        start_new_session=spec.start_new_session,
                        user=spec.user,
                        group=spec.group,
                        extra_groups=spec.extra_groups,
                        umask=spec.umask,
                        cgroup=self._cgroup,
                    ),
                    None,
                )
            except BaseException:
                self._lifeline.failed(number)
                raise
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        self._lifeline.spawned(number, pid)
        for fd in child_ends:
            os.close(fd)
        os.close(reserve)
        if status_reserve is not None:
            os.close(status_reserve)
        status: int | None = None
        try:
            try:
                pidfd = _platform.pidfd_open(pid)
            except ProcessLookupError:
                # Gone already, and reaped by someone else (SIGCHLD ignored, or
                # the application reaps children itself): stand in a descriptor
                # that is readable at once; the supervisor then finds the status
                # lost.
                pidfd = _platform.exited_stand_in()
            if status_reserve is not None:
                try:
                    status = _platform.open_status(pid)
                except (FileNotFoundError, ProcessLookupError):
                    pass  # reaped elsewhere, as above: no status counts as exiting
                except OSError:
                    os.close(pidfd)
                    raise
        except OSError as exc:
            # Another thread took a reserved slot meanwhile.  Nothing is ours
            # to supervise the child with: it must not run unsupervised.
            _platform.signal_group(pid, signal.SIGKILL)
            try:
                _platform.wait_blocking(pid)
            except _platform.StatusLost:
                pass
            _platform.reap(pid)
            self._lifeline.remove(pid)
            for fd in ours.values():
                os.close(fd)
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise self._limit_error(exc.errno) from exc
            raise
        return Spawned(
            pid,
            pidfd,
            started_at,
            stdin=ours.get("stdin"),
            stdout=ours.get("stdout"),
            stderr=ours.get("stderr"),
            handshake=ours.get("handshake"),
            status=status,
        )

    def _environment(self, spec: SpawnSpec, extra: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
        # Bytes all the way: os.environb is the cheapest copy, and the spawn
        # takes bytes without re-encoding.
        if spec.env is not None:
            env = {k: v for k, v in spec.env.items() if v is not None}
        else:
            env = dict(os.environb)
        overrides = spec.extra_env or {}
        if b"PYTHONUNBUFFERED" not in env and b"PYTHONUNBUFFERED" not in overrides:
            env[b"PYTHONUNBUFFERED"] = b"1"
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        # The launcher's own handshake and marker variables are not the child's.
        for variable in (_childenv.STARTED_FD, _childenv.STARTED_PIPE):
            env.pop(variable.encode(), None)
        env.update(extra)
        return env

    def _allocate(self, make: Callable[[], T], opened: list[int] | None) -> T:
        """Call ``make`` (which opens descriptors); on EMFILE raise the soft limit and retry.

        Descriptors it returns are added to ``opened`` (unless that is ``None``).
        """
        while True:
            try:
                result = make()
            except OSError as exc:
                if exc.errno in (errno.ENFILE, errno.EAGAIN):
                    raise self._limit_error(exc.errno) from exc
                if exc.errno != errno.EMFILE:
                    raise
                if _platform.raise_fd_limit():
                    soft, hard = _platform.fd_limits()
                    self._log(
                        logging.INFO,
                        f"raised the soft RLIMIT_NOFILE to {soft} (hard limit {hard})",
                    )
                    continue
                raise self._limit_error(errno.EMFILE) from exc
            if opened is not None:
                if isinstance(result, tuple):
                    opened.extend(result)
                elif isinstance(result, int):
                    opened.append(result)
            return result

    def _limit_error(self, number: int) -> ResourceLimitError:
        """The error of a start refused for want of ``number`` (EMFILE, ENFILE or EAGAIN)."""
        what = f"cannot start {self._child!r} in runner {self._runner_name!r}"
        running = f"the runner has {self._live_count()} children running"
        per_child = f"it holds up to {_platform.FD_PER_CHILD} descriptors per running child"
        if number == errno.EAGAIN:
            return ResourceLimitError(
                number,
                f"{what}: the system refused a new process (EAGAIN: "
                f"{_platform.process_limits()}); {running}. Raise the limit (ulimit -u, or "
                "LimitNPROC=/TasksMax= under systemd) or run fewer processes at once",
            )
        if number == errno.ENFILE:
            return ResourceLimitError(
                number,
                f"{what}: the system's table of open files is full (ENFILE: "
                f"{_platform.file_table()}); {running} and {per_child}. Raise fs.file-max "
                "(sysctl) or close files elsewhere",
            )
        soft, hard = _platform.fd_limits()
        return ResourceLimitError(
            number,
            f"{what}: out of file descriptors (RLIMIT_NOFILE soft={soft}, hard={hard}); "
            f"{running} and {per_child}. Raise the hard limit (ulimit -Hn, or LimitNOFILE= "
            "under systemd) or run fewer children at once",
        )


def _open_devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)


def _slot(end: int | None, number: int) -> int:
    """What to give the spawn for slot ``number`` (0-2): a descriptor, DEVNULL or STDOUT."""
    if end is None:
        return number  # inherited: the launcher's own descriptor of that number
    return end


def describe_argv(argv: Sequence[str]) -> str:
    import shlex

    return shlex.join(argv)
