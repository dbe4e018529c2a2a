"""A worker of a launch: ``python -m corral._worker`` runs one call of the function.

Started by an agent (or, on the launcher's own host, by the launcher) as a
managed child with the torchrun-compatible environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``...).  It reads the pickled function and
arguments from its stdin, sends its :mod:`logging` records home
(:func:`corral.child.connect`: no set-up code in the function), calls the
function, and writes the outcome — the pickled return value, or the
exception — as one frame of the link protocol (:mod:`corral._launch._link`) to the
descriptor named by ``CORRAL_RESULT_FD``.

With ``CORRAL_PROCESS_GROUP`` set (a launch's ``backend=``, as
``"gloo 600.0"``: the backend and the timeout in seconds) it initialises
torch's default process group before the function runs (``env://``: the
torchrun variables say where rank 0's store is), as torchrunx does, and
destroys it once the function has returned; torch is imported then, and only
then.  A failed worker's group ends with its process.

An exception is sent pickled only if it survives a pickle round trip here
(an exception whose ``__init__`` takes other arguments than its message may
not); otherwise as its type name, message and traceback text, which the
launcher raises as :class:`corral.WorkerFailed`.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import _link

__all__ = ["PROCESS_GROUP", "main"]

RESULT_FD = "CORRAL_RESULT_FD"
#: The process group to initialise before the function runs: ``"<backend> <seconds>"``.
PROCESS_GROUP = "CORRAL_PROCESS_GROUP"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> int:
    from . import _link

    fd = int(os.environ.pop(RESULT_FD))
    group = os.environ.pop(PROCESS_GROUP, None)  # not the function's, nor its children's
    os.set_inheritable(fd, False)  # the function's own children must not hold it
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    payload = sys.stdin.buffer.read()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the function gets an empty stdin, not our job pipe
    os.close(devnull)
    import logging

    import corral.child

    # As if the function had called logging.basicConfig(level=logging.INFO):
    # its logging.info() records arrive, as its print() lines do.  A function
    # that wants DEBUG sets the root logger's level itself.
    corral.child.connect(logging.INFO)
    try:
        try:
            func, args = pickle.loads(payload)
        except ImportError as exc:
            exc.add_note(
                "the function or its arguments refer to a module this worker cannot import: "
                "make it importable here (same path, PYTHONPATH), define the function in "
                "__main__, or call cloudpickle.register_pickle_by_value(module) in the launcher"
            )
            raise
        if group is not None:
            _init_process_group(group)
        value = func(*args)
        if group is not None:
            _destroy_process_group()
    except BaseException as exc:  # report everything, even SystemExit
        outcome: _link.LinkMessage = _error(local_rank, exc, group)
        code = 1
    else:
        try:
            pickled = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            code = 0
        except Exception as exc:
            exc.add_note(f"the return value of rank {os.environ.get('RANK')} could not be pickled")
            outcome = _error(local_rank, exc, group)
            code = 1
        del value
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        _write_result(fd, local_rank, pickled)
    else:
        _write_all(fd, _link.encode(outcome))
    os.close(fd)
    return code


def _write_result(fd: int, local_rank: int, pickled: bytes) -> None:
    """The pickled return value: in parts of ``PART_SIZE`` bytes, the last as the result."""
    from . import _link

    view = memoryview(pickled)
    size = _link.PART_SIZE
    while len(view) > size:
        _write_all(fd, _link.encode(_link.ResultPart(local_rank, view[:size])))  # type: ignore[arg-type]
        view = view[size:]
    _write_all(fd, _link.encode(_link.WorkerResult(local_rank, view)))  # type: ignore[arg-type]


def _init_process_group(group: str) -> None:
    """torchrunx's set-up: ``init_process_group`` with the launch's backend and timeout."""
    import datetime

    import torch.distributed as dist

    backend, _, seconds = group.rpartition(" ")
    if backend == "auto":  # torchrunx 0.2's "auto": NCCL where CUDA is, else Gloo
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(seconds)))
    except BaseException as exc:
        exc.add_note(f"corral: while initialising the process group (backend={backend!r})")
        raise


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # the function may have destroyed it itself
        dist.destroy_process_group()


#: What torch says when a collective runs without a process group.
_NO_PROCESS_GROUP = "process group has not been initialized"


def _error(local_rank: int, exc: BaseException, group: str | None) -> _link.WorkerError:
    if group is None and _NO_PROCESS_GROUP in str(exc):
        exc.add_note(
            "corral: this launch initialised no process group: launch it with "
            'backend="gloo" (or "nccl", "auto"), as torchrunx\'s backend=, and each worker '
            "initialises one before the function runs"
        )
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # this module's frames: the function's are what the user reads
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    payload: bytes | None
    try:
        payload = pickle.dumps(exc)
        back = pickle.loads(payload)
        if type(back) is not type(exc):
            payload = None
    except Exception:
        payload = None
    from . import _link

    return _link.WorkerError(
        local_rank,
        f"{type(exc).__module__}.{type(exc).__qualname__}",
        str(exc),
        text,
        payload,
    )


if __name__ == "__main__":
    sys.exit(main())
