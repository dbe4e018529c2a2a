"""A launch's plan: the hosts, the workers on each, their environment, each host's job.

:func:`make_plan` checks a launch's options (a :class:`~corral._scaleout.LaunchSpec`),
finds its hosts, counts the workers on each and makes their environment;
the :class:`Plan` then makes what goes over the wire from it: each host's
:class:`~corral._launch._link.Job` and each agent's configuration (whose
fields named as an option take that option's value, :meth:`Plan.agent_config`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._checks import check_argv
from .._scaleout import LAUNCH_FIELDS, MAX_WORKERS, SSH, LaunchSpec
from . import _link
from ._hosts import environment_for_hosts, slurm_hosts, slurm_workers_per_host
from ._torchenv import OMP_NOTICE, launch_variables
from ._worker import PROCESS_GROUP

__all__ = ["Plan", "make_plan"]


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

    def agent(self, index: int) -> str:
        """The name of agent ``index`` in the runner: ``agent-1``, after the launch's name."""
        return f"{self.options.prefix}agent-{index}"

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
            if name in LAUNCH_FIELDS
        }
        return _link.encode_config(**launch, **agent)


async def make_plan(
    spec: LaunchSpec, default_grace: float, argv: Sequence[str] | None = None
) -> Plan:
    """The plan of a launch of these options (of the command ``argv``, if not ``None``).

    Checks the options, finds the hosts (a Slurm allocation's, asking
    ``scontrol`` off the event loop), counts the workers on each, and
    makes their environment.  Nothing has started if it raises.
    """
    options = spec.checked(default_grace)
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
    plan = Plan(options, hosts, counts, *_environment(options, max(counts)), command)
    if plan.remote and not plan.slurm:
        plan.ssh.check()
    return plan


def _environment(
    options: LaunchSpec, most_per_host: int
) -> tuple[dict[str, str | None], list[str]]:
    """The workers' environment, and the notices it needs in the runner's log.

    Workers on this machine inherit the launcher's environment: torchrun's
    variables and ``extra_env`` (with its removals) go on top.  Remote ones
    get the launcher's variables as ``forward_env`` says, under the same.
    """
    env: dict[str, str | None] = {}
    if options.hosts is not None:
        env = environment_for_hosts(options.forward_env, options.copy_env, None)
    torch_env, omp_defaulted = launch_variables(most_per_host, options.extra_env)
    env.update(torch_env)
    env.update(options.extra_env or {})
    if options.backend is not None:
        env[PROCESS_GROUP] = f"{options.backend} {options.process_group_timeout!r}"
    return env, [OMP_NOTICE] if omp_defaulted else []


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
