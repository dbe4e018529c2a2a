"""The options of a launch, one record from the call to the agents: :class:`LaunchSpec`.

What :meth:`Runner.launch` and :meth:`Runner.launch_command` take is spelled
once, as the fields of :class:`LaunchSpec` (names, types, defaults), with
:class:`LaunchOptions` beside it for type checkers (``**options:
Unpack[LaunchOptions]``, kept in step by ``tests/core/test_options.py``); what
each means is in :meth:`Runner.launch`'s docstring.

The record goes all the way: :meth:`LaunchSpec.checked` checks each value (with
:mod:`corral._checks`) and gives the record back in its checked form;
:meth:`LaunchSpec.plan` makes the launch's :class:`Plan` (the hosts, the workers
on each, their environment), which carries the checked record on; and the
plan makes what goes over the wire from it: each host's
:class:`~corral._launch._link.Job` and each agent's configuration (whose fields
named as an option take that option's value, :meth:`Plan.agent_config`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from .._checks import (
    check_argv,
    check_globs,
    check_grace,
    check_host,
    check_keywords,
    check_path,
    check_port,
    check_seconds,
)
from . import _link
from ._hosts import (
    MAX_WORKERS,
    MAX_WORKERS_PER_HOST,
    SSH,
    environment_for_hosts,
    slurm_hosts,
    slurm_workers_per_host,
)
from ._torchenv import OMP_NOTICE, launch_variables
from ._worker import PROCESS_GROUP

__all__ = [
    "DEFAULT_LINK_TIMEOUT",
    "DEFAULT_PROCESS_GROUP_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "EVENT_LOOPS",
    "PROCESS_GROUP_BACKENDS",
    "LaunchKeywords",
    "LaunchOptions",
    "LaunchSpec",
    "Plan",
]

#: Seconds agents get to start and dial back, unless ``start_timeout`` says otherwise.
DEFAULT_START_TIMEOUT = 60.0
#: Seconds a link may stay silent before it counts as cut, unless ``link_timeout`` says otherwise.
DEFAULT_LINK_TIMEOUT = _link.DEFAULT_LINK_TIMEOUT
#: The process-group backends of a launch's ``backend=`` (torchrunx's, torch's), and "auto".
PROCESS_GROUP_BACKENDS: Final = ("gloo", "nccl", "mpi", "ucc", "xccl", "auto")
#: What the ``backend=`` of a blocking runner names instead: its event loop.
EVENT_LOOPS: Final = ("asyncio", "trio")
#: Seconds of the process group's timeout (``backend=``): torchrunx's ``worker_timeout``.
DEFAULT_PROCESS_GROUP_TIMEOUT = 600.0


class LaunchKeywords(TypedDict, total=False):
    """The keywords of a launch but ``grace`` and ``backend``, which :func:`corral.launch` spells
    its own way (``grace`` is the runner's; ``backend`` names the event loop or the process group).

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


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """What a launch was asked for: the keywords of :meth:`Runner.launch`, with their defaults.

    Not checked yet: :meth:`checked` checks each value, and :meth:`plan` the
    values together, before anything starts.
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

    @classmethod
    def of(cls, options: Mapping[str, Any], what: str) -> LaunchSpec:
        """From a call's keywords; an unknown one is a ``TypeError``, as for any call."""
        check_keywords(options, _LAUNCH_FIELDS, what)
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
        )

    async def plan(self, default_grace: float, argv: Sequence[str] | None = None) -> Plan:
        """The plan of a launch of these options (of the command ``argv``, if not ``None``).

        Checks the options, finds the hosts (a Slurm allocation's, asking
        ``scontrol`` off the event loop), counts the workers on each, and
        makes their environment.  Nothing has started if it raises.
        """
        options = self.checked(default_grace)
        if argv is not None and options.backend is not None:
            raise ValueError(
                f"backend={options.backend!r} initialises a process group for a function; a "
                "command initialises its own (torch.distributed.init_process_group), as under "
                "torchrun"
            )
        command = check_argv(argv) if argv is not None else []
        if options.hosts == "slurm":
            hosts = await slurm_hosts()
        else:
            hosts = list(options.hosts or ["localhost"])
        counts = _count_workers(options.workers_per_host, hosts, options.hosts == "slurm")
        plan = Plan(options, hosts, counts, *options._environment(max(counts)), command)
        if plan.remote and not plan.slurm:
            plan.ssh.check()
        return plan

    def _environment(self, most_per_host: int) -> tuple[dict[str, str | None], list[str]]:
        """The workers' environment, and the notices it needs in the runner's log.

        Workers on this machine inherit the launcher's environment: torchrun's
        variables and ``extra_env`` (with its removals) go on top.  Remote ones
        get the launcher's variables as ``forward_env`` says, under the same.
        """
        env: dict[str, str | None] = {}
        if self.hosts is not None:
            env = environment_for_hosts(self.forward_env, self.copy_env, None)
        torch_env, omp_defaulted = launch_variables(most_per_host, self.extra_env)
        env.update(torch_env)
        env.update(self.extra_env or {})
        if self.backend is not None:
            env[PROCESS_GROUP] = f"{self.backend} {self.process_group_timeout!r}"
        return env, [OMP_NOTICE] if omp_defaulted else []


_LAUNCH_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(LaunchSpec))


@dataclass
class Plan:
    """A launch's plan: its checked options, the hosts, the workers on each, their environment."""

    options: LaunchSpec  # checked (LaunchSpec.checked)
    hosts: list[str]  # names as given ("localhost" for this machine)
    counts: list[int]  # workers on each host
    env: dict[str, str | None]  # every worker's variables (None: remove it)
    notices: list[str]  # for the runner's log, once it starts
    argv: list[str] = field(default_factory=list)  # a command, not a function
    firsts: list[int] = field(init=False)  # each host's first global rank

    def __post_init__(self) -> None:
        self.firsts = [0, *itertools.accumulate(self.counts)][:-1]

    @property
    def remote(self) -> bool:
        """Whether agents on other hosts run the workers (not this runner)."""
        return self.options.hosts is not None

    @property
    def slurm(self) -> bool:
        return self.options.hosts == "slurm"

    @property
    def grace(self) -> float:
        assert self.options.grace is not None  # checked: the runner's for None
        return self.options.grace

    @property
    def ssh(self) -> SSH:
        assert self.options.ssh is not None  # checked: SSH() for None
        return self.options.ssh

    @property
    def world_size(self) -> int:
        return sum(self.counts)

    def job(self, host: int, payload: bytes, master_addr: str, master_port: int) -> _link.Job:
        """What host ``host`` runs; the master's address and port unless the options say."""
        return _link.Job(
            payload=payload,
            world_size=self.world_size,
            first_rank=self.firsts[host],
            workers=self.counts[host],
            group_rank=host,
            groups=len(self.hosts),
            master_addr=self.options.master_addr or master_addr,
            master_port=self.options.master_port or master_port,
            env=self.env,
            grace=self.grace,
            log_level=self.options.log_level,
            argv=self.argv,
        )

    def agent_config(self, **agent: Any) -> str:
        """An agent's configuration, encoded: ``agent``'s fields, and the launch's options.

        Each field of :class:`~corral._launch._link.AgentConfig` that is named
        as an option of the launch takes that option's (checked) value.
        """
        launch = {
            name: getattr(self.options, name)
            for name in _link.AgentConfig.__struct_fields__
            if name in _LAUNCH_FIELDS
        }
        return _link.encode_config(**launch, **agent)


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


def _count_workers(workers: int | Sequence[int] | None, hosts: list[str], slurm: bool) -> list[int]:
    """The workers on each host (``workers_per_host`` checked), within the launch's maximum."""
    if workers is None:
        workers = slurm_workers_per_host() if slurm else 1
    if isinstance(workers, int):
        counts = [workers] * len(hosts)
    else:
        counts = list(workers)
        if len(counts) != len(hosts):
            raise ValueError(f"workers_per_host has {len(counts)} entries for {len(hosts)} hosts")
    if sum(counts) > MAX_WORKERS:
        raise ValueError(
            f"a launch may have at most {MAX_WORKERS} workers in all, not {sum(counts)} "
            f"({len(hosts)} hosts)"
        )
    return counts


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
