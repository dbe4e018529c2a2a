"""``corral run``: N copies of a command per host, as torchrun runs them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import click

from .._launch._hosts import MAX_WORKERS
from .._launch._options import DEFAULT_LINK_TIMEOUT
from ._console import rank_label
from ._group import (
    CONTEXT,
    MAX_COPIES,
    Output,
    check_link_timeout,
    output_options,
    run_name,
    text_option,
)
from ._io import exit_code
from ._loop import Status, main_loop
from ._status import describe_failure

if TYPE_CHECKING:
    from corral import SSH, Runner

__all__ = ["run"]

_EXAMPLES_RUN = """
\b
Examples:
  corral run -n 4 -- python train.py --epochs 3
  corral run -n 8 --hosts node1,node2 -- python train.py
  corral run --hosts slurm -- python train.py        (inside salloc/sbatch)
  corral run -n 2 --restart on-failure --max-restarts 3 -- ./worker.sh
"""


@click.command(
    context_settings={**CONTEXT, "allow_interspersed_args": False},
    epilog=_EXAMPLES_RUN,
)
@click.option(
    "-n",
    "--nproc-per-node",
    "nproc",
    type=click.IntRange(min=1, max=MAX_COPIES),
    default=None,
    help="Copies of the command on each host (default: 1, or the tasks per node of "
    f"the Slurm allocation with --hosts slurm; at most {MAX_COPIES}).",
)
@click.option(
    "--hosts",
    metavar="H1,H2|slurm",
    callback=text_option,
    help="Run on these hosts over ssh, or on the Slurm allocation's nodes.",
)
@click.option(
    "--name",
    default="run",
    show_default=True,
    callback=lambda _ctx, _param, value: run_name(value),
    help="The name of the run (it starts every source's name; no dots, spaces or slashes).",
)
@click.option(
    "--restart",
    type=click.Choice(["never", "on-failure"]),
    default="never",
    show_default=True,
    help="Restart the whole group of workers when one fails, as torchrun does.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Restarts allowed with --restart on-failure.",
)
@click.option(
    "--link-timeout",
    metavar="SECONDS",
    type=float,
    default=DEFAULT_LINK_TIMEOUT,
    callback=lambda _ctx, _param, value: check_link_timeout(value),
    show_default=True,
    help="With --hosts: a host whose link stays silent this long counts as lost "
    "(its workers are stopped, the run fails).",
)
@click.option("--ssh-user", callback=text_option, help="The remote user for --hosts.")
@click.option(
    "--ssh-identity",
    type=click.Path(dir_okay=False),
    callback=text_option,
    help="An ssh private key.",
)
@click.option(
    "--ssh-option",
    multiple=True,
    metavar="OPTION",
    callback=text_option,
    help="An extra ssh argument (repeatable).",
)
@click.option(
    "--ranks",
    metavar="R1,R2",
    callback=lambda _ctx, _param, value: _rank_list(value, "--ranks"),
    help="Show only these global ranks' lines on the console (files and the monitor keep all).",
)
@click.option(
    "--local-ranks-filter",
    "--local_ranks_filter",
    "local_ranks",
    metavar="L1,L2",
    callback=lambda _ctx, _param, value: _rank_list(value, "--local-ranks-filter"),
    help="torchrun's filter: show only these local ranks (on every host) on the console.",
)
@output_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    nproc: int | None,
    hosts: str | None,
    name: str,
    restart: str,
    max_restarts: int,
    link_timeout: float,
    ssh_user: str | None,
    ssh_identity: str | None,
    ssh_option: tuple[str, ...],
    ranks: frozenset[int] | None,
    local_ranks: frozenset[int] | None,
    log_dir: str | None,
    no_prefix: bool,
    no_color: bool,
    no_status: bool,
    grace: float,
    monitor: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND NPROC times per host, as torchrun would, and show every line.

    Each copy gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    MASTER_ADDR and MASTER_PORT.  The exit code is 0 when every copy
    succeeded, otherwise the first failure's (128 + N for a signal N); 130
    after Ctrl-C.  Put the command after "--" (or after the options).
    """
    host_list: list[str] | str | None = None
    if hosts is not None:
        host_list = "slurm" if hosts == "slurm" else [h for h in hosts.split(",") if h]
        if not host_list:
            raise click.BadParameter("give at least one host", param_hint="--hosts")
        if host_list != "slurm" and (nproc or 1) * len(host_list) > MAX_WORKERS:
            raise click.BadParameter(
                f"at most {MAX_WORKERS} copies in all, not {(nproc or 1) * len(host_list)}",
                param_hint="--hosts",
            )
    from .._launch._hosts import SSH, slurm_hosts

    ssh = SSH(user=ssh_user, identity_file=ssh_identity, options=tuple(ssh_option))
    if host_list is not None and host_list != "slurm":
        try:
            ssh.check()
        except (OSError, ValueError, TypeError) as exc:
            hint = "--ssh-identity" if ssh_identity and str(ssh_identity) in str(exc) else None
            raise click.BadParameter(str(exc), param_hint=hint) from None
    if host_list == "slurm":
        try:
            slurm_hosts()
        except (RuntimeError, OSError) as exc:
            raise click.BadParameter(str(exc), param_hint="--hosts") from None
    output = Output.of(log_dir, no_prefix, no_color, no_status, monitor)
    job = _RunJob(list(command), nproc, host_list, ssh, restart, max_restarts, grace, link_timeout)
    job.label = rank_label(_per_host(nproc, host_list), ranks, local_ranks)
    main_loop(name, output, job)


def _rank_list(value: str | None, option: str) -> frozenset[int] | None:
    """``"0,3"`` as ranks; ``None`` if the option was not given."""
    if value is None:
        return None
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items or not all(item.isdigit() and len(item) <= 6 for item in items):
        raise click.BadParameter(
            f"{value[:40]!r} is not a comma-separated list of ranks (0,3)", param_hint=option
        )
    return frozenset(int(item) for item in items)


def _per_host(nproc: int | None, hosts: list[str] | str | None) -> int:
    """The workers on each host: rank ``i * per_host + j`` is agent ``i``'s worker ``j``."""
    if nproc is not None:
        return nproc
    if hosts == "slurm":
        from .._launch._hosts import slurm_workers_per_host

        try:
            return slurm_workers_per_host()
        except (RuntimeError, OSError, ValueError):
            return 1
    return 1


@dataclass
class _RunJob:
    argv: list[str]
    nproc: int | None
    hosts: list[str] | str | None
    ssh: SSH
    restart: str
    max_restarts: int
    grace: float
    link_timeout: float
    #: The console's label of each source (the global rank), set by the command.
    label: Callable[[str], str | None] | None = None

    @property
    def programs(self) -> list[str]:
        """The programs the job starts."""
        return self.argv[:1]

    @property
    def what(self) -> str:
        """What a stop stops."""
        hosts = 1 if not isinstance(self.hosts, list) else len(self.hosts)
        count = (self.nproc or 1) * hosts
        where = "" if hosts == 1 else f" on {hosts} hosts"
        return f"{count} worker{'s' if count != 1 else ''}{where}"

    async def __call__(self, r: Runner, status: Status) -> int:
        import corral

        from .._core._options import RestartPolicy

        attempt = 0
        while True:
            try:
                await r.launch_command(
                    self.argv,
                    hosts=self.hosts,
                    workers_per_host=self.nproc,
                    ssh=self.ssh,
                    grace=self.grace,
                    link_timeout=self.link_timeout,
                )
                return 0
            except corral.WorkerFailed as failure:
                if self.restart != "on-failure" or attempt >= self.max_restarts:
                    status.stopping()
                    where = f"local rank {failure.local_rank} on host {failure.host}"
                    status.failure = describe_failure(
                        f"rank {failure.rank} ({where})",
                        failure.returncode,
                        failure.stderr,
                        failure.remote_traceback,
                    )
                    return exit_code(failure.returncode if failure.returncode is not None else 1)
                attempt += 1
                status.restarted(attempt)
                # The library's policy: 1 s doubled each time, with jitter, at most 30 s.
                delay = RestartPolicy("on-failure", self.max_restarts).delay(attempt)
                r.log(
                    logging.WARNING,
                    f"restarting the worker group in {delay:.2f} s (restart {attempt} of "
                    f"{self.max_restarts}): {failure}",
                )
                await anyio.sleep(delay)
