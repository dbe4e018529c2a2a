"""Spawning one child: its descriptors and environment made, then the spawn itself.

:class:`Spawner` turns a checked start (a :class:`~corral._core._options.StartSpec`,
made once, so that bad input raises before anything starts and a restart
spawns from the same record) into a running child:

* it makes the pipes the spec asks for (stdout and stderr for the log or for
  collection, stdin for input, one for the start-up handshake), retrying
  once the descriptor limit was raised if the process ran out
  (``RLIMIT_NOFILE``), and raises :class:`~corral.ResourceLimitError` before
  anything is spawned if that is not enough, or if the system refuses a new
  process (``EAGAIN``: ``RLIMIT_NPROC``, a ``pids`` cgroup) or a new file
  (``ENFILE``), naming the limit, the child and how many run;
* it builds the environment: ``env`` replaces the launcher's, ``extra_env``
  lays variables over it (a ``None`` value removes one), and corral adds its
  own (its start-up hook for prompt lines unless ``PYTHONUNBUFFERED`` is
  named: :func:`corral._sys._childenv.prompt_lines`; the log socket, the
  handshake, the lifeline's marker);
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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from .._errors import ResourceLimitError
from .._sys import _childenv, _platform
from .._sys._lifeline import Lifeline
from . import _handshake

if TYPE_CHECKING:
    from ._options import StartSpec

__all__ = ["Spawned", "Spawner", "describe_argv"]

T = TypeVar("T")


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
        self, spec: StartSpec, extra: Mapping[bytes, bytes], name: str | None = None
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
                        stdin=_slot(ends["stdin"], 0),
                        stdout=_slot(ends["stdout"], 1),
                        stderr=_slot(ends["stderr"], 2),
                        handshake=handshake,
                        popen=spec.popen,
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

    def _environment(self, spec: StartSpec, extra: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
        # Bytes all the way: os.environb is the cheapest copy, and the spawn
        # takes bytes without re-encoding.
        if spec.env is not None:
            env = {k: v for k, v in spec.env.items() if v is not None}
        else:
            env = dict(os.environb)
        overrides = spec.extra_env or {}
        prompt = b"PYTHONUNBUFFERED" not in env and b"PYTHONUNBUFFERED" not in overrides
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        if prompt:  # a Python child's prints come promptly, block-buffered
            _childenv.prompt_lines(env)
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
