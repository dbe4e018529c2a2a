"""What a launch is asked: the keywords of :meth:`Runner.launch`, in one light record.

What :meth:`Runner.launch` and :meth:`Runner.launch_command` take is spelled
once, as the fields of :class:`LaunchSpec` (names, types, defaults), with
:class:`LaunchOptions` beside it for type checkers (``**options:
Unpack[LaunchOptions]``, kept in step by ``tests/core/test_options.py``); what
each means is in :meth:`Runner.launch`'s docstring.  :class:`SSH`, how remote
hosts are reached, is one of its values.

The record goes all the way: :meth:`LaunchSpec.checked` checks each value (with
:mod:`corral._checks`) and gives the record back in its checked form; the
launch machinery (:mod:`corral._launch`) makes its plan from it (the hosts,
the workers on each, their environment) and, from the plan, what goes over
the wire to each host.  This module is light on purpose (the standard
library and :mod:`corral._checks`): the runner names the record in its
signatures without loading any of the launch machinery, which a launch loads
when it begins.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from ._checks import (  # the sizes and the link's deadline: said there, named here too
    DEFAULT_LINK_TIMEOUT,
    MAX_WORKERS,
    MAX_WORKERS_PER_HOST,
    check_globs,
    check_grace,
    check_host,
    check_keywords,
    check_name,
    check_path,
    check_port,
    check_seconds,
)

__all__ = [
    "DEFAULT_LINK_TIMEOUT",
    "DEFAULT_PROCESS_GROUP_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "EVENT_LOOPS",
    "LAUNCH_FIELDS",
    "MAX_WORKERS",
    "MAX_WORKERS_PER_HOST",
    "PROCESS_GROUP_BACKENDS",
    "SSH",
    "LaunchKeywords",
    "LaunchOptions",
    "LaunchSpec",
    "check_backend",
    "check_launch_name",
]

#: Seconds agents get to start and dial back, unless ``start_timeout`` says otherwise.
DEFAULT_START_TIMEOUT = 60.0
#: The process-group backends of a launch's ``backend=`` (torchrunx's, torch's), and "auto".
PROCESS_GROUP_BACKENDS: Final = ("gloo", "nccl", "mpi", "ucc", "xccl", "auto")
#: What the ``backend=`` of a blocking runner names instead: its event loop.
EVENT_LOOPS: Final = ("asyncio", "trio")
#: Seconds of the process group's timeout (``backend=``): torchrunx's ``worker_timeout``.
DEFAULT_PROCESS_GROUP_TIMEOUT = 600.0


@dataclass(frozen=True)
class SSH:
    """How to reach remote hosts with the OpenSSH client.

    Attributes:
        user: the remote user (``ssh -l``); the client's default if ``None``.
        port: the remote port (``ssh -p``).
        identity_file: a private key (``ssh -i``); checked to be readable
            before anything starts.
        options: more ``ssh`` arguments, e.g. ``("-o", "ConnectTimeout=5")``;
            they come before corral's own, and ssh takes the first value it
            sees for an option.
        python: the Python interpreter on the remote hosts; defaults to the
            launcher's own (:data:`sys.executable`), as on a cluster with a
            shared file system.
        cwd: the remote working directory; defaults to the launcher's.
        executable: the ssh client to run.
    """

    user: str | None = None
    port: int | None = None
    identity_file: str | os.PathLike[str] | None = None
    options: Sequence[str] = field(default_factory=tuple)
    python: str | None = None
    cwd: str | os.PathLike[str] | None = None
    executable: str = "ssh"

    def check(self) -> None:
        """Raise a clear error now for what would make every connection fail later."""
        if self.identity_file is not None:
            path = os.fspath(self.identity_file)
            if not os.access(path, os.R_OK):
                raise FileNotFoundError(f"the ssh identity file {path!r} cannot be read")
        if self.port is not None and not (0 < int(self.port) < 65536):
            raise ValueError(f"ssh port {self.port!r} is not a port number")
        if isinstance(self.options, str):
            raise TypeError("SSH.options is a sequence of arguments, not one string")
        if shutil.which(self.executable) is None:
            raise FileNotFoundError(f"the ssh client {self.executable!r} is not installed")

    def argv(self, host: str, command: Sequence[str]) -> list[str]:
        """The ``ssh`` command line that runs ``command`` on ``host``."""
        argv = [self.executable, *self.options, "-o", "BatchMode=yes", "-T"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity_file is not None:
            argv += ["-i", os.fspath(self.identity_file)]
        if self.user is not None:
            argv += ["-l", self.user]
        cwd = os.fspath(self.cwd) if self.cwd is not None else os.getcwd()
        remote = f"cd {shlex.quote(cwd)} && exec {shlex.join(command)}"
        return [*argv, "--", host, remote]

    @property
    def remote_python(self) -> str:
        return self.python or sys.executable


class LaunchKeywords(TypedDict, total=False):
    """The keywords of a launch but ``grace``, ``backend`` and ``name``, which :func:`corral.launch`
    spells its own way (``grace`` and ``name`` are the runner's, whose one launch it is;
    ``backend`` names the event loop or the process group).

    :class:`LaunchOptions` adds them; :func:`corral.launch`'s keywords are these
    and the runner's.
    """

    hosts: Sequence[str] | str | None
    workers_per_host: int | Sequence[int] | None
    extra_env: Mapping[str, str | None] | None
    forward_env: str | Sequence[str]
    copy_env: Sequence[str]
    ssh: SSH | None
    launcher_address: str | None
    start_timeout: float
    link_timeout: float
    log_level: int
    host_log_dir: str | None
    process_group_timeout: float
    master_addr: str | None
    master_port: int | None


class LaunchOptions(LaunchKeywords, total=False):
    """The keywords of :meth:`Runner.launch` and :meth:`Runner.launch_command`, as a TypedDict.

    For code that passes them on and wants them type-checked
    (``**options: Unpack[corral.LaunchOptions]``), as :class:`StartOptions`
    is for :meth:`Runner.start`.  Every key is optional;
    :meth:`Runner.launch` says what each means.  (Its defaults are those of
    corral's own ``LaunchSpec``, which ``tests/core/test_options.py`` keeps in
    step with it.)
    """

    grace: float | None
    backend: str | None
    name: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """What a launch was asked for: the keywords of :meth:`Runner.launch`, with their defaults.

    Not checked yet: :meth:`checked` checks each value, and the launch's plan
    the values together, before anything starts.
    """

    hosts: Sequence[str] | str | None = None
    workers_per_host: int | Sequence[int] | None = None
    extra_env: Mapping[str, str | None] | None = None
    forward_env: str | Sequence[str] = "all"
    copy_env: Sequence[str] = ()
    ssh: SSH | None = None
    launcher_address: str | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT
    link_timeout: float = DEFAULT_LINK_TIMEOUT
    log_level: int = logging.NOTSET
    host_log_dir: str | None = None
    process_group_timeout: float = DEFAULT_PROCESS_GROUP_TIMEOUT
    master_addr: str | None = None
    master_port: int | None = None
    grace: float | None = None
    backend: str | None = None
    name: str | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any], what: str) -> LaunchSpec:
        """From a call's keywords; an unknown one is a ``TypeError``, as for any call."""
        check_keywords(options, LAUNCH_FIELDS, what)
        return cls(**options)

    def checked(self, default_grace: float) -> LaunchSpec:
        """This record with each value checked, in its checked form.

        ``hosts`` becomes a tuple of names (or stays ``None`` or ``"slurm"``),
        ``grace`` a number (the runner's ``default_grace`` for ``None``),
        ``ssh`` an :class:`SSH`, the globs tuples, the seconds floats.  A bad
        value is a ``TypeError`` or ``ValueError`` naming its keyword.
        """
        return dataclasses.replace(
            self,
            hosts=_check_hosts(self.hosts),
            workers_per_host=_check_workers(self.workers_per_host),
            forward_env=_check_forward_env(self.forward_env),
            copy_env=check_globs(self.copy_env, "copy_env"),
            ssh=self.ssh if self.ssh is not None else SSH(),
            launcher_address=_maybe(check_host, self.launcher_address, "launcher_address"),
            start_timeout=check_seconds(self.start_timeout, "start_timeout", positive=True),
            link_timeout=check_seconds(self.link_timeout, "link_timeout", positive=True),
            host_log_dir=_maybe(check_path, self.host_log_dir, "host_log_dir"),
            process_group_timeout=check_seconds(
                self.process_group_timeout, "process_group_timeout", positive=True
            ),
            master_addr=_maybe(check_host, self.master_addr, "master_addr"),
            master_port=_maybe(check_port, self.master_port, "master_port"),
            grace=default_grace if self.grace is None else check_grace(self.grace),
            backend=check_backend(self.backend),
            name=_maybe(check_launch_name, self.name, "launch"),
        )

    @property
    def prefix(self) -> str:
        """What the launch's sources start with in the runner: ``"NAME."``, or nothing."""
        return f"{self.name}." if self.name else ""


LAUNCH_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(LaunchSpec))


def check_launch_name(name: object, what: str = "launch") -> str:
    """A launch's ``name``: a runner's name's rules, and not ``agent-N`` (its agents' own)."""
    name = check_name(name, what)
    if "." in name:
        raise ValueError(f"{what} name {name!r} may not contain a dot: it starts every source")
    if name.startswith("agent-"):
        raise ValueError(f"{what} name {name!r} may not start with 'agent-': its agents' names do")
    return name


def _maybe(check: Any, value: Any, what: str) -> Any:
    """``check(value, what)``, or ``None`` for ``None`` (an option left to its default)."""
    return None if value is None else check(value, what)


def _check_hosts(hosts: object) -> tuple[str, ...] | str | None:
    if hosts is None or hosts == "slurm":
        return hosts
    if isinstance(hosts, str):
        raise TypeError(
            f'hosts must be None, "slurm" or a list of host names, not the string {hosts!r}'
        )
    names = tuple(str(host) for host in hosts)  # type: ignore[attr-defined]
    if not names:
        raise ValueError("hosts is empty: give at least one host, or None for this machine")
    for name in names:
        check_host(name, "hosts")
    if len(set(names)) != len(names):
        raise ValueError(
            f"hosts lists a host twice ({list(names)}); use workers_per_host for more workers"
        )
    return names


def _check_workers(workers: object) -> int | tuple[int, ...] | None:
    """``workers_per_host``: ``None``, or an int or ints, each from 1 to the maximum on a host."""
    if workers is None:
        return None
    if isinstance(workers, int) and not isinstance(workers, bool):
        counts: tuple[int, ...] = (workers,)
    elif isinstance(workers, Sequence) and not isinstance(workers, str):
        counts = tuple(workers)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            raise TypeError(
                f"workers_per_host must be an int or one int per host, not {list(counts)}"
            )
    else:
        raise TypeError("workers_per_host must be an int or one int per host")
    if any(n < 1 for n in counts):
        raise ValueError(f"workers_per_host must be at least 1 everywhere, not {list(counts)}")
    if max(counts, default=1) > MAX_WORKERS_PER_HOST:
        raise ValueError(
            f"workers_per_host may be at most {MAX_WORKERS_PER_HOST} on a host, not {max(counts)}"
        )
    return workers if isinstance(workers, int) else counts


def _check_forward_env(forward_env: object) -> str | tuple[str, ...]:
    """``forward_env``: ``"all"`` or a sequence of globs (a tuple then)."""
    if forward_env == "all":
        return "all"
    if isinstance(forward_env, str):
        raise TypeError(f'forward_env must be "all" or a sequence of globs, not {forward_env!r}')
    return check_globs(forward_env, "forward_env")


def check_backend(backend: object) -> str | None:
    """A launch's ``backend=``: the process group its workers initialise, or ``None``.

    torch's own form of several (``"cpu:gloo,cuda:nccl"``) is taken as well.
    An event loop's name is the other ``backend=``, of :func:`corral.launch`
    and :func:`corral.open_runner_sync`: the message says so.
    """
    if backend is None:
        return None
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a process-group backend such as 'gloo', not {backend!r}")
    if backend in EVENT_LOOPS:
        raise ValueError(
            f"backend={backend!r} is an event loop: give it to open_runner_sync(backend="
            f"{backend!r}) or corral.launch(..., backend={backend!r}); a launch's backend= is "
            "the process group its workers initialise ('gloo', 'nccl', 'mpi', 'ucc', 'auto')"
        )
    names = [part.rpartition(":")[2] for part in backend.split(",")]
    if backend != "auto" and not all(n in PROCESS_GROUP_BACKENDS[:-1] for n in names):
        raise ValueError(
            f"backend={backend!r} is not a process-group backend: 'gloo', 'nccl', 'mpi', "
            "'ucc', 'xccl', 'auto' (NCCL where CUDA is, else Gloo) or None (no process group)"
        )
    return backend
