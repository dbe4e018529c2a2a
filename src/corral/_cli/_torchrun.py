"""torchrun's words on ``corral run``: its flags corral takes, and those it names its way for.

The flags corral takes with torchrun's meaning (``--nnodes 1``, ``--master-port``,
``--rdzv-endpoint``, ``--tee``...) are options of ``corral run``; their values are
read here.  Every other flag of torchrun's is a one-line usage error that says
what corral does instead (:data:`TORCHRUN_FLAGS`).
"""

from __future__ import annotations

import click

from .._checks import is_text
from ._io import shorten

__all__ = [
    "TORCHRUN_FLAGS",
    "TorchrunCommand",
    "check_nodes",
    "parse_endpoint",
    "parse_nnodes",
    "parse_rdzv_backend",
    "parse_std_streams",
    "torchrun_hint",
]

#: torchrun's flags that corral has no flag for, and what to do instead (each
#: spelling: torchrun takes ``--a-b`` and ``--a_b`` alike).
TORCHRUN_FLAGS: dict[str, str] = {
    "--rdzv-conf": "there is no rendezvous: corral starts every worker itself",
    "--monitor-interval": "corral does not poll: a worker's exit is seen at once",
    "--role": "ROLE_NAME is 'default'; pass settings of your own with --env NAME=VALUE",
    "--local-addr": "agents dial back to this machine's address on the route to each host",
    "--start-method": "each worker runs the command as a process of its own",
    "--shutdown-timeout": "use --grace SECONDS (the time between the stop signal and SIGKILL)",
    "--signals-to-handle": "corral stops every worker on SIGINT, SIGTERM and SIGHUP",
    "-m": "put the module in the command: corral run -- python -m MODULE",
    "--module": "put the module in the command: corral run -- python -m MODULE",
    "--no-python": "corral runs the command as given: corral run -- ./program",
    "--run-path": "give the interpreter: corral run -- python SCRIPT",
    "--event-log-handler": "corral's own records go to its console and --log-dir",
    "--logs-specs": "--log-dir writes each source's lines to files",
    "--numa-binding": "bind in the command itself: corral run -- numactl ... python SCRIPT",
    "--virtual-local-rank": "set CUDA_VISIBLE_DEVICES in the command from LOCAL_RANK",
    "--duplicate-stdout-filters": "--log-dir writes every line to files: grep them",
    "--duplicate-stderr-filters": "--log-dir writes every line to files: grep them",
}


def torchrun_hint(option: str) -> str | None:
    """The one-line answer to torchrun's ``option`` (either spelling), if corral has none."""
    name = option.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    why = TORCHRUN_FLAGS.get(name)
    if why is None:
        return None
    return f"{option.split('=', 1)[0]} is a torchrun option that corral run does not have; {why}"


class TorchrunCommand(click.Command):
    """``corral run``: an option of torchrun's that corral lacks says what to do instead."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            hint = torchrun_hint(exc.option_name)
            if hint is None:
                raise
            raise click.UsageError(hint, ctx) from None


def parse_nnodes(value: str | None) -> tuple[str, int, int] | None:
    """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX``, as (the text, MIN, MAX)."""
    if value is None:
        return None
    low, colon, high = value.partition(":")
    if not (low.isdigit() and (high.isdigit() or not colon) and len(value) < 12):
        raise click.BadParameter(
            f"{shorten(value)} is not a number of nodes (N, or MIN:MAX)", param_hint="--nnodes"
        )
    least, most = int(low), int(high if colon else low)
    if not 1 <= least <= most:
        raise click.BadParameter(f"{shorten(value)} is no range of nodes", param_hint="--nnodes")
    return value, least, most


def check_nodes(
    nnodes: tuple[str, int, int] | None, node_rank: int | None, hosts: list[str] | str | None
) -> None:
    """torchrun's node options: one corral run on one machine starts every node's workers."""
    every = "one corral run starts the workers of every node: give the nodes with --hosts H1,H2 "
    every += "(or --hosts slurm) and run it once"
    if node_rank:
        raise click.UsageError(f"--node-rank {node_rank}: {every}")
    if nnodes is None:
        return
    text, least, most = nnodes
    if least != most:
        raise click.UsageError(f"--nnodes {text} asks for an elastic number of nodes; {every}")
    if most > 1 and hosts is None:
        raise click.UsageError(f"--nnodes {text}: {every}")
    if isinstance(hosts, list) and len(hosts) != most:
        raise click.UsageError(f"--nnodes {text}, but --hosts names {len(hosts)} hosts")


def parse_rdzv_backend(value: str | None) -> str | None:
    if value is not None and value not in ("c10d", "static"):
        raise click.BadParameter(
            f"{shorten(value)}: corral needs no rendezvous server, it starts every worker itself "
            "(c10d and static are accepted, and change nothing)",
            param_hint="--rdzv-backend",
        )
    return value


def parse_endpoint(value: str | None) -> tuple[str, int | None] | None:
    """``HOST[:PORT]`` or ``[IPv6]:PORT``, as torch reads it (port 29400 by default, 0: None)."""
    if value is None:
        return None
    text = value.strip()
    host, port = text, "29400"
    if ":" in text and not (text.startswith("[") and text.endswith("]")):
        host, port = text.rsplit(":", 1)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not is_text(host) or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(
            f"{shorten(value)} is not HOST[:PORT]", param_hint="--rdzv-endpoint"
        )
    return host, int(port) or None


#: torchrun's ``Std``: 1 stdout, 2 stderr, 3 both.
_STREAMS = {0: frozenset(), 1: frozenset({"stdout"}), 2: frozenset({"stderr"})}
_STREAMS[3] = _STREAMS[1] | _STREAMS[2]


def parse_std_streams(value: str | None, option: str) -> dict[int | None, frozenset[str]] | None:
    """torchrun's ``-r``/``-t``: ``3`` for every local rank, or ``0:1,1:2`` rank by rank."""
    if value is None:
        return None
    chosen: dict[int | None, frozenset[str]] = {}
    for item in value.split(","):
        rank, colon, std = item.strip().rpartition(":")
        if std not in ("0", "1", "2", "3") or (colon and not rank.isdigit()):
            raise click.BadParameter(
                f"{shorten(value)} is not 0-3 (1 stdout, 2 stderr, 3 both), or LOCAL_RANK:0-3,...",
                param_hint=option,
            )
        chosen[int(rank) if colon else None] = _STREAMS[int(std)]
    return chosen if any(chosen.values()) else None
