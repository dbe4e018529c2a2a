"""Where a launch runs: this machine, a list of hosts over OpenSSH, or a Slurm allocation.

:meth:`Runner.launch` takes ``hosts=``:

* ``None`` (the default): this machine alone.  No ssh, no agent process:
  the launcher's own runner starts the workers.
* a list of host names or addresses: one agent per host, started with the
  OpenSSH client (``ssh -o BatchMode=yes``; user, port, identity file and
  extra options in an :class:`SSH` object).
* ``"slurm"``: the hosts of the current allocation (``scontrol show hostnames
  $SLURM_JOB_NODELIST``), with one agent per node started by a single
  ``srun --ntasks-per-node=1`` step, which Slurm fans out.

**The environment** reaches remote workers as ``srun --export=ALL`` sends
it: every variable of the launcher but those that describe the launcher's own
host, login or terminal (:data:`HOST_ENV_NAMES`: ``HOME``, ``USER``,
``SHELL``, ``PWD``, ``SSH_*``, ``DISPLAY``, ``SLURM_*``...), which the remote
side has values of its own for.  ``forward_env=`` narrows that to a list of
globs (``forward_env=DEFAULT_ENV_PATTERNS`` is corral's former rule: the
search paths, the virtual environment, CUDA, NCCL, Gloo, Torch,
OpenMP...), ``copy_env=`` globs are forwarded on top, even names of
:data:`HOST_ENV_NAMES`, and ``extra_env=`` is laid over them all.  Workers on
this machine inherit the launcher's whole environment, plus ``extra_env``.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from .._errors import LaunchError
from .._scaleout import SSH

__all__ = [
    "DEFAULT_ENV_PATTERNS",
    "HOST_ENV_NAMES",
    "cpus_available",
    "dial_back_addresses",
    "environment_for_hosts",
    "forwarded",
    "free_port",
    "route_address",
    "slurm_hosts",
    "slurm_workers_per_host",
    "visible_gpus",
    "workers_here",
]

#: The variables of the launcher that describe its own host, login, session
#: or terminal (shell-style globs): never forwarded to other hosts, which have
#: values of their own (``srun --export=ALL`` sends them, and a remote
#: ``HOME`` or ``USER`` then names the launcher's).  ``CORRAL_*`` variables
#: are corral's own contract with each child and are never forwarded either.
HOST_ENV_NAMES: Final[tuple[str, ...]] = (
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "OLDPWD",
    "HOSTNAME",
    "SHLVL",
    "_",
    "MAIL",
    "SSH_*",
    "DISPLAY",
    "XAUTHORITY",
    "XDG_*",
    "DBUS_SESSION_BUS_ADDRESS",
    "TMUX",
    "TMUX_PANE",
    "STY",
    "WINDOWID",
    "SLURM_*",
    "SLURMD_*",
)

#: Variables of the launcher that remote workers get with ``forward_env=DEFAULT_ENV_PATTERNS``
#: (shell-style globs): what corral forwarded before it forwarded everything.
DEFAULT_ENV_PATTERNS: Final[tuple[str, ...]] = (
    "PATH",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "LD_LIBRARY_PATH",
    "LANG",
    "LC_*",
    "TZ",
    "CUDA*",
    "NCCL*",
    "GLOO_*",
    "TORCH*",
    "OMP_*",
    "MKL_*",
    "OPENBLAS_*",
    "HF_*",
    "TRANSFORMERS_*",
    "TOKENIZERS_*",
    "WANDB_*",
    "MLFLOW_*",
)


def environment_for_hosts(
    forward_env: str | Sequence[str],
    copy_env: Sequence[str],
    extra_env: Mapping[str, str | None] | None,
) -> dict[str, str | None]:
    """The variables every remote worker gets: forwarded, then ``extra_env``.

    ``forward_env`` is ``"all"`` (every variable but :data:`HOST_ENV_NAMES`)
    or globs; the launcher's variables matching a ``copy_env`` glob come too.
    A ``None`` value stays in the result: the remote side removes that
    variable from whatever environment the agent found there.
    """
    copied = tuple(copy_env)
    env: dict[str, str | None] = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CORRAL_")
        and (forwarded(name, forward_env) or _matches(name, copied))
    }
    env.update(extra_env or {})
    return env


def forwarded(name: str, forward_env: str | Sequence[str]) -> bool:
    """Whether ``forward_env`` (``"all"``, or globs) forwards the launcher's variable ``name``."""
    if forward_env == "all":
        return not _matches(name, HOST_ENV_NAMES)
    return _matches(name, forward_env)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def route_address(host: str) -> str:
    """This machine's address on the route to ``host`` (where agents dial back to)."""
    infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    if not infos:  # pragma: no cover - getaddrinfo raises instead
        raise OSError(f"cannot resolve {host!r}")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(address)  # UDP: no packet is sent, the kernel picks the route
        local: str = probe.getsockname()[0]
    return local


async def dial_back_addresses(hosts: Sequence[str], ssh: SSH) -> list[str]:
    """For each host, this machine's address on the route to it.

    A name this machine cannot resolve may still be one ssh knows (a
    ``Host`` alias of its configuration): ``ssh -G`` says which host name it
    stands for.  A host that cannot be resolved either way gets the address
    of another host's route, or of this machine's name; ssh then fails on it
    with a message of its own, which is the error the caller will see.

    Cancellable at any point: each name lookup runs in a worker thread that a
    cancellation abandons (a lookup cannot be interrupted; the thread ends
    when the resolver gives up), and ``ssh -G`` is a child process that a
    cancellation kills.
    """
    import anyio.to_thread

    async def in_thread(function: Callable[[str], str | None], name: str) -> str | None:
        return await anyio.to_thread.run_sync(function, name, abandon_on_cancel=True)

    found: list[str | None] = []
    for host in hosts:
        address = await in_thread(_route_of, host)
        if address is None:  # ssh -G only for a name this machine cannot resolve
            alias = await _ssh_hostname(host, ssh)
            if alias is not None:
                address = await in_thread(_route_of, alias)
        found.append(address)
    fallback = next((a for a in found if a is not None), None)
    if fallback is None:
        fallback = await in_thread(_address_of, socket.gethostname()) or "127.0.0.1"
    return [a if a is not None else fallback for a in found]


def _route_of(name: str) -> str | None:
    """This machine's address on the route to ``name``; ``None`` if it is not a name here."""
    try:
        return route_address(name)
    except (OSError, UnicodeError, ValueError):  # not a name: ssh will say so
        return None


def _address_of(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except (OSError, UnicodeError):
        return None


#: Seconds ``ssh -G`` (which reads configuration files, and may run ``Match exec``) may take.
SSH_G_TIMEOUT: Final = 10.0


async def _ssh_hostname(host: str, ssh: SSH) -> str | None:
    """The host name ssh's configuration gives ``host`` (``ssh -G``), if it differs.

    Its output is decoded as the arguments were encoded (bytes that are not
    UTF-8 as lone surrogates): a host or an option that is not UTF-8 comes
    back as it went.
    """
    import anyio

    with anyio.move_on_after(SSH_G_TIMEOUT):
        try:
            out = await anyio.run_process(
                [ssh.executable, *ssh.options, "-G", "--", host],
                check=False,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except (OSError, ValueError):  # ValueError: a NUL in an argument
            return None
        for line in out.stdout.decode("utf-8", "surrogateescape").splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname" and value and value != host:
                return value
    return None


#: Seconds ``scontrol show hostnames`` (which asks the Slurm controller) may take.
SCONTROL_TIMEOUT: Final = 30.0


async def slurm_hosts() -> list[str]:
    """The nodes of the current Slurm allocation, in order: ``scontrol show hostnames``.

    ``scontrol`` runs as a child process, awaited (cancellable, at most
    :data:`SCONTROL_TIMEOUT` seconds); :class:`~corral.LaunchError` if there is
    no allocation, or ``scontrol`` cannot say.
    """
    import anyio

    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError(
            'hosts="slurm" needs a Slurm allocation (SLURM_JOB_NODELIST is not set): '
            "run the launcher under salloc or sbatch"
        )
    command = ["scontrol", "show", "hostnames", nodelist]
    try:
        with anyio.fail_after(SCONTROL_TIMEOUT):
            out = await anyio.run_process(command, check=False, stdin=subprocess.DEVNULL)
    except TimeoutError:  # an OSError too
        raise LaunchError(
            f"scontrol show hostnames {nodelist} did not answer within {SCONTROL_TIMEOUT:g} s"
        ) from None
    except OSError as exc:
        raise LaunchError(f"cannot run scontrol show hostnames {nodelist}: {exc}") from None
    if out.returncode != 0:
        error = out.stderr.decode(errors="replace").strip()
        raise LaunchError(f"scontrol show hostnames {nodelist} failed: {error}")
    hosts = out.stdout.decode(errors="replace").split()
    if not hosts:
        raise LaunchError(f"the Slurm allocation {nodelist!r} has no hosts")
    return hosts


def slurm_workers_per_host() -> int:
    """Workers per node from the allocation: tasks per node, else GPUs on the node, else 1."""
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        value = os.environ.get(name, "")
        head = value.split("(")[0].split(",")[0]
        if head.isdigit() and int(head) > 0:
            return int(head)
    return 1


def free_port(host: str) -> int:
    """A TCP port that is free on ``host`` (an address of this machine) now, for ``MASTER_PORT``.

    ``""`` is every address of this machine (an agent's host), ``"127.0.0.1"``
    loopback (a launch on this machine alone).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def cpus_available() -> int:
    """The CPUs this process may run on (its affinity: taskset, a cpuset), as torch counts."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        return os.cpu_count() or 1


def visible_gpus() -> int:
    """The CUDA devices this process may use: what ``torch.cuda.device_count()`` says.

    Without an NVIDIA driver (no ``/proc/driver/nvidia/gpus``) that is 0, and
    torch is not even imported.  With one, torch answers if it is installed;
    otherwise the driver's devices, as ``CUDA_VISIBLE_DEVICES`` narrows them
    (its entries up to the first that names no device).
    """
    try:
        devices = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    try:
        import torch
    except ImportError:
        pass
    else:
        return int(torch.cuda.device_count())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return devices
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if (entry.isdigit() and int(entry) < devices) or entry.startswith(("GPU-", "MIG-")):
            count += 1
        else:
            break
    return min(count, devices)


def workers_here(spec: str) -> int:
    """``torchrun --nproc-per-node``'s words, counted on this machine.

    ``"auto"``: the visible GPUs if there are any, else the CPUs this process
    may use; ``"cpu"``: those CPUs; ``"gpu"``: the visible GPUs (a
    ``ValueError`` if there are none).
    """
    if spec == "cpu":
        return cpus_available()
    if spec == "gpu":
        gpus = visible_gpus()
        if not gpus:
            raise ValueError("no CUDA device is visible here")
        return gpus
    if spec == "auto":
        return visible_gpus() or cpus_available()
    raise ValueError(f"{spec!r} is not auto, cpu or gpu")
