"""The variables torchrun gives its workers, given by corral with the same meaning.

Launch-wide, laid under ``extra_env=`` (which may set them: a loop of
restarts sets ``TORCHELASTIC_RESTART_COUNT``):

``ROLE_NAME``
    ``default``, torchrun's ``--role`` default.
``TORCHELASTIC_RESTART_COUNT`` / ``TORCHELASTIC_MAX_RESTARTS``
    ``0`` and ``0``: one launch is one attempt (``corral run --max-restarts``
    sets both).
``TORCHELASTIC_RUN_ID``
    a fresh uuid4 per launch, as ``torchrun --standalone`` makes.
``TORCHELASTIC_USE_AGENT_STORE``
    ``False``: no agent hosts a TCP store at ``MASTER_ADDR:MASTER_PORT``, so
    ``init_process_group`` on rank 0 must host it, as it does when it reads
    ``False`` (torchrun's ``True`` would make every rank wait for a store
    that nobody serves).
``TORCH_NCCL_ASYNC_ERROR_HANDLING``
    the launcher's value, else ``1``.
``OMP_NUM_THREADS``
    ``1`` when the launcher has no ``OMP_NUM_THREADS`` (nor ``extra_env``) and
    a host gets more than one worker, with one notice: N workers each with an
    OpenMP thread per core overload the machine.

Per worker, always corral's: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_RANK``,
``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``TORCHELASTIC_ERROR_FILE``: a file in a private folder of the host's
workers for this launch, where
``torch.distributed.elastic.multiprocessing.errors.record`` writes the
exception that ends the worker.  corral reads it (at most
:data:`MAX_ERROR_FILE` bytes) when the worker fails, and puts its message and
traceback into the failure (:class:`~corral.WorkerFailed`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from . import _link

__all__ = [
    "ERROR_FILE",
    "MAX_ERROR_FILE",
    "OMP_NOTICE",
    "ErrorFiles",
    "launch_variables",
    "worker_variables",
]

ERROR_FILE: Final = "TORCHELASTIC_ERROR_FILE"

#: The most of a worker's error file corral reads (a larger one is named, not read).
MAX_ERROR_FILE: Final = 256 * 1024

#: What corral says, once per run, when it sets ``OMP_NUM_THREADS=1`` (torchrun says as much).
OMP_NOTICE: Final = (
    "setting OMP_NUM_THREADS=1 for each worker, as torchrun does, to avoid overloading the "
    "machine; set OMP_NUM_THREADS yourself to tune it"
)


def launch_variables(
    most_per_host: int,
    extra_env: Mapping[str, str | None] | None,
    launcher_env: Mapping[str, str] = os.environ,
) -> tuple[dict[str, str], bool]:
    """The launch-wide variables of torchrun's, and whether ``OMP_NUM_THREADS`` was defaulted."""
    extra = extra_env or {}
    env = {
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": str(uuid.uuid4()),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": launcher_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    defaulted = most_per_host > 1 and "OMP_NUM_THREADS" not in launcher_env
    defaulted = defaulted and "OMP_NUM_THREADS" not in extra
    if defaulted:
        env["OMP_NUM_THREADS"] = "1"
    return env, defaulted


def worker_variables(job: _link.Job, local_rank: int, error_file: str) -> dict[str, str]:
    """The variables of one worker that say where it stands: its ranks, the world, the store."""
    rank = str(job.first_rank + local_rank)
    return {
        "RANK": rank,
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(job.world_size),
        "LOCAL_WORLD_SIZE": str(job.workers),
        "GROUP_RANK": str(job.group_rank),
        "GROUP_WORLD_SIZE": str(job.groups),
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": str(job.world_size),
        "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": str(job.master_port),
        ERROR_FILE: error_file,
    }


class ErrorFiles:
    """The error files of one host's workers for one launch, in a private folder.

    The folder is made in ``parent`` (the runner's own temporary folder,
    which its lifeline removes if the launcher is killed), else in the
    system's temporary folder.  The blocking calls (:meth:`make`,
    :meth:`read`, :meth:`remove`) belong in a thread.
    """

    def __init__(self, parent: str | None = None) -> None:
        self.folder: str | None = None
        self._parent = parent

    def make(self, workers: int) -> None:
        folder = tempfile.mkdtemp(prefix="corral-errors-", dir=self._parent)
        for local_rank in range(workers):
            os.mkdir(os.path.join(folder, str(local_rank)))
        self.folder = folder

    def path(self, local_rank: int) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, str(local_rank), "error.json")

    def read(self, local_rank: int) -> tuple[str, str]:
        """What worker ``local_rank`` wrote there: the message and the traceback (or ``""``)."""
        if self.folder is None:
            return "", ""
        try:
            with open(self.path(local_rank), "rb") as f:
                data = f.read(MAX_ERROR_FILE + 1)
        except OSError:
            return "", ""  # it wrote none: a crash, a signal, no @record
        if len(data) > MAX_ERROR_FILE:
            return f"(its error file is larger than {MAX_ERROR_FILE // 1024} KiB: not read)", ""
        return parse_error_file(data)

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def parse_error_file(data: bytes) -> tuple[str, str]:
    """The message and the traceback of an error file, in either of torch's formats."""
    try:
        doc: Any = json.loads(data)
    except ValueError:
        return "(its error file is not JSON)", ""
    message: Any = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(message, dict):  # {"message": {"message": ..., "extraInfo": {...}}}
        extra = message.get("extraInfo")
        traceback = extra.get("py_callstack", "") if isinstance(extra, dict) else ""
        text = message.get("message", "")
        return str(text), str(traceback or "")
    if isinstance(message, str):  # the "new format": a message and a top-level timestamp
        return message, ""
    return "(its error file has no message)", ""
