"""A launch's plan: the hosts, the workers on each, their environment, and the job they get."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._checks import check_grace
from . import _link
from ._hosts import (
    MAX_WORKERS,
    MAX_WORKERS_PER_HOST,
    SSH,
    check_forward_env,
    environment_for_hosts,
    slurm_hosts,
    slurm_workers_per_host,
)
from ._options import EVENT_LOOPS, PROCESS_GROUP_BACKENDS, LaunchSpec
from ._torchenv import OMP_NOTICE, launch_variables
from ._worker import PROCESS_GROUP

__all__ = [
    "Plan",
    "check_backend",
    "job_for",
    "make_plan",
    "pickle_job",
]


@dataclass
class Plan:
    hosts: list[str]  # names as given ("localhost" for this machine)
    counts: list[int]
    remote: bool
    slurm: bool
    ssh: SSH
    env: dict[str, str | None]
    grace: float
    start_timeout: float
    link_timeout: float
    log_level: int
    host_log_dir: str | None
    argv: list[str] = field(default_factory=list)  # a command, not a function
    firsts: list[int] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # for the runner's log, once it starts
    backend: str | None = None  # the process group the workers initialise
    master_addr: str | None = None  # the rendezvous address, if not corral's choice
    master_port: int | None = None

    @property
    def world_size(self) -> int:
        return sum(self.counts)


def make_plan(default_grace: float, spec: LaunchSpec) -> Plan:
    """The plan of a launch: ``spec`` checked, hosts and workers counted, environments made."""
    hosts, workers_per_host, extra_env = spec.hosts, spec.workers_per_host, spec.extra_env
    copy_env, ssh, start_timeout = spec.copy_env, spec.ssh, spec.start_timeout
    link_timeout, grace, log_level = spec.link_timeout, spec.grace, spec.log_level
    host_log_dir = spec.host_log_dir
    slurm = hosts == "slurm"
    if hosts is None:
        names = ["localhost"]
        remote = False
    elif slurm:
        names = slurm_hosts()
        remote = True
        if workers_per_host is None:
            workers_per_host = slurm_workers_per_host()
    elif isinstance(hosts, str):
        raise TypeError(
            f'hosts must be None, "slurm" or a list of host names, not the string {hosts!r}'
        )
    else:
        names = [str(host) for host in hosts]
        if not names:
            raise ValueError("hosts is empty: give at least one host, or None for this machine")
        for name in names:
            if not name or not name.isprintable() or not _is_utf8(name):
                raise ValueError(f"hosts: {name!r} is not a host name (printable UTF-8 text)")
        if len(set(names)) != len(names):
            raise ValueError(
                f"hosts lists a host twice ({names}); use workers_per_host for more workers"
            )
        remote = True
    if workers_per_host is None:
        workers_per_host = 1
    if isinstance(workers_per_host, int) and not isinstance(workers_per_host, bool):
        counts = [workers_per_host] * len(names)
    elif isinstance(workers_per_host, Sequence) and not isinstance(workers_per_host, str):
        counts = list(workers_per_host)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            raise TypeError(f"workers_per_host must be an int or one int per host, not {counts}")
        if len(counts) != len(names):
            raise ValueError(f"workers_per_host has {len(counts)} entries for {len(names)} hosts")
    else:
        raise TypeError("workers_per_host must be an int or one int per host")
    if any(n < 1 for n in counts):
        raise ValueError(f"workers_per_host must be at least 1 everywhere, not {counts}")
    if max(counts) > MAX_WORKERS_PER_HOST:
        raise ValueError(
            f"workers_per_host may be at most {MAX_WORKERS_PER_HOST} on a host, not {max(counts)}"
        )
    if sum(counts) > MAX_WORKERS:
        raise ValueError(
            f"a launch may have at most {MAX_WORKERS} workers in all, not {sum(counts)} "
            f"({len(names)} hosts)"
        )
    if isinstance(copy_env, str):
        raise TypeError("copy_env is a sequence of globs, not one string")
    forward_env = check_forward_env(spec.forward_env)
    ssh = ssh if ssh is not None else SSH()
    if remote and not slurm:
        ssh.check()
    if not (math.isfinite(start_timeout) and start_timeout > 0):
        raise ValueError(f"start_timeout must be a positive number of seconds, not {start_timeout}")
    link_timeout = _link.check_link_timeout(link_timeout)
    backend = check_backend(spec.backend)
    group_timeout = spec.process_group_timeout
    if isinstance(group_timeout, bool) or not isinstance(group_timeout, (int, float)):
        raise TypeError(f"process_group_timeout must be a number of seconds, not {group_timeout!r}")
    if not (math.isfinite(group_timeout) and group_timeout > 0):
        raise ValueError(
            f"process_group_timeout must be a positive number of seconds, not {group_timeout}"
        )
    master_addr, master_port = spec.master_addr, spec.master_port
    if master_addr is not None and (
        not isinstance(master_addr, str) or not master_addr or not master_addr.isprintable()
    ):
        raise ValueError(f"master_addr must be a host name or an address, not {master_addr!r}")
    if master_port is not None and (
        isinstance(master_port, bool)
        or not isinstance(master_port, int)
        or not 0 < master_port < 65536
    ):
        raise ValueError(f"master_port must be a TCP port, 1 to 65535, not {master_port!r}")
    # Workers here inherit the launcher's environment: torchrun's variables
    # and extra_env (with its removals) go on top.  Remote ones get the
    # launcher's variables as forward_env says, under the same.
    env: dict[str, str | None] = (
        environment_for_hosts(forward_env, copy_env, None) if remote else {}
    )
    torch_env, omp_defaulted = launch_variables(max(counts), extra_env)
    env.update(torch_env)
    env.update(extra_env or {})
    if backend is not None:
        env[PROCESS_GROUP] = f"{backend} {float(group_timeout)!r}"
    plan = Plan(
        hosts=names,
        counts=counts,
        remote=remote,
        slurm=slurm,
        ssh=ssh,
        env=env,
        grace=default_grace if grace is None else check_grace(grace),
        start_timeout=start_timeout,
        link_timeout=link_timeout,
        log_level=log_level,
        host_log_dir=host_log_dir,
        notices=[OMP_NOTICE] if omp_defaulted else [],
        backend=backend,
        master_addr=master_addr,
        master_port=master_port,
    )
    first = 0
    for count in counts:
        plan.firsts.append(first)
        first += count
    return plan


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


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates: bytes of an argument that were not UTF-8
        return False
    return True


def pickle_job(func: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    if not callable(func):
        raise TypeError(f"launch needs a callable, not {type(func).__name__}")
    from . import _source

    try:
        return _source.dumps((func, args))
    except Exception as exc:
        raise TypeError(
            f"cannot send {func!r} and its arguments to the workers: {exc} "
            "(they travel pickled with cloudpickle)"
        ) from exc


def job_for(plan: Plan, host: int, payload: bytes, master_addr: str, master_port: int) -> _link.Job:
    return _link.Job(
        payload=payload,
        world_size=plan.world_size,
        first_rank=plan.firsts[host],
        workers=plan.counts[host],
        group_rank=host,
        groups=len(plan.hosts),
        master_addr=plan.master_addr or master_addr,
        master_port=plan.master_port or master_port,
        env=plan.env,
        grace=plan.grace,
        log_level=plan.log_level,
        argv=plan.argv,
    )
