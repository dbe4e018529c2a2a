"""``corral run``: N copies of a command per host, as torchrun runs them."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import click

from .._checks import DEFAULT_LINK_TIMEOUT, MAX_WORKERS, is_text
from ._group import (
    CONTEXT,
    MAX_COPIES,
    Output,
    name_option,
    output_options,
    seconds,
    text_option,
)
from ._io import exit_code, say, shorten
from ._procfile import EnvFileError, parse_env_file, read_input_file
from ._torchrun import (
    TorchrunCommand,
    check_nodes,
    parse_endpoint,
    parse_nnodes,
    parse_rdzv_backend,
    parse_std_streams,
)

if TYPE_CHECKING:
    from corral import SSH, Runner

    from ._loop import Status

__all__ = ["run"]

_EXAMPLES_RUN = """
\b
Examples:
  corral run -n 4 -- python train.py --epochs 3
  corral run -n 8 --hosts node1,node2 -- python train.py
  corral run --hosts slurm -- python train.py        (inside salloc/sbatch)
  corral run -n 2 --max-restarts 3 -- ./worker.sh     (restarts on failure)
  corral run -n auto --env DATASET_SIZE=256 -- python train.py
"""


class _Nproc(click.ParamType[int]):
    """``-n``: a number of copies, or torchrun's ``auto``, ``cpu`` or ``gpu``."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text in ("auto", "cpu", "gpu"):
            from .._launch._hosts import workers_here  # (not for --help)

            try:
                return workers_here(text)
            except ValueError as exc:
                self.fail(f"{text}: {exc}", param, ctx)
        try:
            number = int(text)
        except ValueError:
            self.fail(f"{shorten(text)} is not a number of copies, auto, cpu or gpu", param, ctx)
        if not 1 <= number <= MAX_COPIES:
            self.fail(f"{number} is not in the range 1<=x<={MAX_COPIES}", param, ctx)
        return number


@click.command(
    cls=TorchrunCommand,
    context_settings={**CONTEXT, "allow_interspersed_args": False},
    epilog=_EXAMPLES_RUN,
)
@click.option(
    "-n",
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc",
    type=_Nproc(),
    metavar="N|auto",
    default=None,
    help="Copies of the command on each host (default: 1, or the tasks per node of "
    f"the Slurm allocation with --hosts slurm; at most {MAX_COPIES}).  auto: the GPUs "
    "visible here, else the CPUs this process may use; cpu, gpu: those alone (torchrun's words).",
)
@click.option(
    "--hosts",
    metavar="H1,H2|slurm",
    callback=text_option,
    help="Run on these hosts over ssh, or on the Slurm allocation's nodes.",
)
@name_option("run")
@click.option(
    "--restart",
    type=click.Choice(["never", "on-failure"]),
    default=None,
    help="Restart the whole group of workers when one fails, as torchrun does "
    "(default: never; on-failure with --max-restarts).",
)
@click.option(
    "--max-restarts",
    "--max_restarts",
    "max_restarts",
    type=click.IntRange(min=0),
    default=None,
    help="Restart on failure up to this many times, as torchrun does "
    "(3 with --restart on-failure alone).",
)
@click.option(
    "--env",
    "env_vars",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="A variable for every worker on every host (repeatable); NAME alone passes this "
    "shell's value, if it has one.",
)
@click.option(
    "--env-file",
    "env_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="The variables of a .env file for every worker, read as corral up reads .env "
    "(repeatable; --env wins).",
)
@click.option(
    "--standalone",
    is_flag=True,
    help="Accepted for torchrun's sake, and changes nothing: corral needs no rendezvous.",
)
@click.option(
    "--link-timeout",
    metavar="SECONDS",
    type=float,
    default=DEFAULT_LINK_TIMEOUT,
    callback=seconds("--link-timeout", positive=True),
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
@click.option(
    "--nnodes",
    metavar="1|N|MIN:MAX",
    callback=lambda _ctx, _param, value: parse_nnodes(value),
    help="torchrun's: 1 (or 1:1) on this machine; with --hosts, their number.",
)
@click.option(
    "--node-rank",
    "--node_rank",
    "node_rank",
    type=click.IntRange(min=0),
    help="torchrun's: 0 (one corral run starts every node's workers).",
)
@click.option(
    "--master-addr",
    "--master_addr",
    "master_addr",
    callback=text_option,
    help="MASTER_ADDR for every worker, where rank 0 serves the store (default: this "
    "machine, or the first host).",
)
@click.option(
    "--master-port",
    "--master_port",
    "master_port",
    type=click.IntRange(1, 65535),
    help="MASTER_PORT for every worker (default: a port that was free).",
)
@click.option(
    "--rdzv-backend",
    "--rdzv_backend",
    "rdzv_backend",
    callback=lambda _ctx, _param, value: parse_rdzv_backend(value),
    help="torchrun's c10d or static: accepted; corral starts every worker itself.",
)
@click.option(
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "rdzv_endpoint",
    metavar="HOST[:PORT]",
    callback=lambda _ctx, _param, value: parse_endpoint(value),
    help="torchrun's: MASTER_ADDR and MASTER_PORT for every worker (port 0: a free one).",
)
@click.option(
    "--rdzv-id",
    "--rdzv_id",
    "rdzv_id",
    callback=text_option,
    help="torchrun's: the run's TORCHELASTIC_RUN_ID (default: a fresh uuid4).",
)
@click.option(
    "-t",
    "--tee",
    "tee",
    metavar="0-3|L:S,...",
    callback=lambda _ctx, _param, value: parse_std_streams(value, "--tee"),
    help="torchrun's: every line is shown anyway, and also goes to files "
    "(--log-dir, or a new folder in the temporary directory).",
)
@click.option(
    "-r",
    "--redirects",
    "redirects",
    metavar="0-3|L:S,...",
    callback=lambda _ctx, _param, value: parse_std_streams(value, "--redirects"),
    help="torchrun's: these streams (1 stdout, 2 stderr, 3 both) of every local rank, or of "
    "rank L, go to the files alone, not the console.",
)
@output_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(**params: Any) -> None:
    """Run COMMAND NPROC times per host, as torchrun would, and show every line.

    Each copy gets torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
    TORCHELASTIC_ERROR_FILE..., and OMP_NUM_THREADS=1 unless it is set.
    Copies on other hosts get this shell's environment too, but for
    host-specific names (HOME, USER, SSH_*...).  A COMMAND that starts with a
    .py file runs it with this Python, as torchrun runs its script.  Their
    stdout lines go to stdout, their stderr lines to stderr, as under
    torchrun.  The exit code is 0 when every copy succeeded, otherwise the
    first failure's (128 + N for a signal N); 130 after Ctrl-C.  Put the
    command after "--" (or after the options).
    """
    from ._loop import main_loop  # the runner, the console: only once a command runs

    main_loop(*plan_run(**params))


def plan_run(
    nproc: int | None,
    hosts: str | None,
    name: str,
    restart: str | None,
    max_restarts: int | None,
    env_vars: tuple[str, ...],
    env_files: tuple[str, ...],
    standalone: bool,
    link_timeout: float,
    ssh_user: str | None,
    ssh_identity: str | None,
    ssh_option: tuple[str, ...],
    ranks: frozenset[int] | None,
    local_ranks: frozenset[int] | None,
    log_dir: str | None,
    allow_log_loss: bool,
    no_prefix: bool,
    no_color: bool,
    raw: bool,
    no_status: bool,
    grace: float,
    monitor: str | None,
    no_contain: bool,
    command: tuple[str, ...],
    nnodes: tuple[str, int, int] | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    rdzv_backend: str | None = None,
    rdzv_endpoint: tuple[str, int | None] | None = None,
    rdzv_id: str | None = None,
    tee: dict[int | None, frozenset[str]] | None = None,
    redirects: dict[int | None, frozenset[str]] | None = None,
) -> tuple[str, Output, _RunJob]:
    """What ``corral run`` runs, from its options: the run's name, its output and the job.

    Everything is checked here, before anything starts (a usage error is one
    line); ``run`` then runs it.
    """
    del standalone, rdzv_backend  # one corral run starts every worker: no rendezvous to pick
    restart, max_restarts = _restart_policy(restart, max_restarts)
    extra_env = _extra_env(env_files, env_vars)
    host_list = _host_list(hosts, nproc)
    ssh = _ssh(host_list, ssh_user, ssh_identity, ssh_option)
    check_nodes(nnodes, node_rank, host_list)
    if rdzv_endpoint is not None:  # torchrun's rule: the endpoint, else the master's address
        master_addr, master_port = rdzv_endpoint[0], rdzv_endpoint[1] or master_port
    output = Output.of(
        _files_for(tee, redirects, log_dir),
        no_prefix,
        no_color,
        no_status,
        monitor,
        raw=raw,
        allow_log_loss=allow_log_loss,
        no_contain=no_contain,
        split_stderr=True,
    )
    if redirects:
        from ._console import redirected

        output.quiet = redirected(redirects)
    _default_omp_threads(nproc, extra_env)
    job = _RunJob(
        _script(command),
        nproc,
        host_list,
        ssh,
        restart,
        max_restarts,
        grace,
        link_timeout,
        extra_env,
    )
    job.master_addr, job.master_port = master_addr, master_port
    if rdzv_id is not None:
        job.run_id = rdzv_id  # torchrun's TORCHELASTIC_RUN_ID is its --rdzv-id
    from ._console import rank_label

    job.label = rank_label(_per_host(nproc, host_list), ranks, local_ranks)
    return name, output, job


def _restart_policy(restart: str | None, max_restarts: int | None) -> tuple[str, int]:
    """``--restart`` and ``--max-restarts``, as torchrun means them: (the policy, the most)."""
    if restart == "never" and max_restarts is not None:
        raise click.UsageError(
            "--max-restarts restarts on failure: it cannot go with --restart never"
        )
    if max_restarts is not None:
        return "on-failure", max_restarts
    if restart == "on-failure":
        return restart, 3
    return "never", 0


def _host_list(hosts: str | None, nproc: int | None) -> list[str] | str | None:
    """``--hosts``: ``None`` (this machine), ``"slurm"``, or the hosts, each once."""
    if hosts is None:
        return None
    if hosts == "slurm":
        return "slurm"
    host_list = [h for h in hosts.split(",") if h]
    if len(set(host_list)) < len(host_list):
        twice = sorted({h for h in host_list if host_list.count(h) > 1})
        raise click.BadParameter(
            f"{shorten(','.join(twice))} is listed twice; use -n for more workers on a host",
            param_hint="--hosts",
        )
    if not host_list:
        raise click.BadParameter("give at least one host", param_hint="--hosts")
    if (nproc or 1) * len(host_list) > MAX_WORKERS:
        raise click.BadParameter(
            f"at most {MAX_WORKERS} copies in all, not {(nproc or 1) * len(host_list)}",
            param_hint="--hosts",
        )
    return host_list


def _ssh(
    host_list: list[str] | str | None,
    user: str | None,
    identity: str | None,
    options: tuple[str, ...],
) -> SSH:
    """How to reach the hosts, checked now; for ``--hosts slurm``, the allocation's nodes."""
    from .._launch._hosts import slurm_hosts
    from .._scaleout import SSH

    ssh = SSH(user=user, identity_file=identity, options=tuple(options))
    if isinstance(host_list, list):
        try:
            ssh.check()
        except (OSError, ValueError, TypeError) as exc:
            hint = "--ssh-identity" if identity and str(identity) in str(exc) else None
            raise click.BadParameter(str(exc), param_hint=hint) from None
    elif host_list == "slurm":
        import corral

        try:
            anyio.run(slurm_hosts)
        except corral.LaunchError as exc:
            raise click.BadParameter(str(exc), param_hint="--hosts") from None
    return ssh


def _files_for(
    tee: dict[int | None, frozenset[str]] | None,
    redirects: dict[int | None, frozenset[str]] | None,
    log_dir: str | None,
) -> str | None:
    """``--log-dir``; with ``--tee`` or ``--redirects`` alone, a new folder, as torchrun makes."""
    if not (tee or redirects) or log_dir is not None:
        return log_dir
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="corral-logs-")
    say(
        f"corral: {'--tee' if tee else '--redirects'}: every line also goes to files under "
        f"{log_dir} (--log-dir DIR chooses the folder)"
    )
    return log_dir


def _default_omp_threads(nproc: int | None, extra_env: dict[str, str]) -> None:
    """``OMP_NUM_THREADS=1`` for several copies, unless it is set: as torchrun does, and says."""
    if (nproc or 1) > 1 and "OMP_NUM_THREADS" not in os.environ | extra_env:
        # Once, before anything starts.
        from .._launch._torchenv import OMP_NOTICE

        say(f"corral: {OMP_NOTICE}")
        extra_env["OMP_NUM_THREADS"] = "1"


def _script(command: tuple[str, ...]) -> list[str]:
    """The command; torchrun's TRAINING_SCRIPT (a ``.py`` file first) runs with this Python."""
    argv = list(command)
    if argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    return argv


def _extra_env(env_files: tuple[str, ...], env_vars: tuple[str, ...]) -> dict[str, str]:
    """What ``--env-file`` and ``--env`` give every worker, in order (the last one wins)."""
    env: dict[str, str] = {}
    for path in env_files:
        env.update(parse_env_file(read_input_file(path, EnvFileError), path))
    for item in env_vars:
        name, equals, value = item.partition("=")
        if not name or "\0" in item or not is_text(name):
            raise click.BadParameter(
                f"{shorten(item)} is not NAME or NAME=VALUE", param_hint="--env"
            )
        if equals:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]  # NAME alone: this shell's value, as docker's -e NAME
    return env


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
    extra_env: dict[str, str] = field(default_factory=dict)
    #: The rendezvous address every worker sees, if not corral's choice.
    master_addr: str | None = None
    master_port: int | None = None
    #: The run's id for every attempt, as torchrun keeps one across restarts.
    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))
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
        import logging

        import corral

        from .._core._options import ProcessOptions, RestartPolicy

        attempt = 0
        while True:
            env = {
                **self.extra_env,
                "TORCHELASTIC_RUN_ID": self.run_id,
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            }
            try:
                await r.launch_command(
                    self.argv,
                    hosts=self.hosts,
                    workers_per_host=self.nproc,
                    extra_env=env,
                    ssh=self.ssh,
                    grace=self.grace,
                    link_timeout=self.link_timeout,
                    master_addr=self.master_addr,
                    master_port=self.master_port,
                )
                return 0
            except corral.WorkerFailed as failure:
                if self.restart != "on-failure" or attempt >= self.max_restarts:
                    from ._status import describe_failure

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
                backoff = ProcessOptions().backoff
                delay = RestartPolicy("on-failure", self.max_restarts, backoff).delay(attempt)
                r.log(
                    logging.WARNING,
                    f"restarting the worker group in {delay:.2f} s (restart {attempt} of "
                    f"{self.max_restarts}): {failure}",
                )
                await anyio.sleep(delay)
