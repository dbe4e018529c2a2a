"""A worker of a launch: ``python -m corral._worker`` runs one call of the function.

Started by an agent (or, on the launcher's own host, by the launcher) as a
managed child with the torchrun-compatible environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``...).  It reads the pickled function and
arguments from its stdin, sends its :mod:`logging` records home
(:func:`corral.child.connect`: no set-up code in the function), calls the
function, and writes the outcome — the pickled return value, or the
exception — as one frame of the link protocol (:mod:`corral._launch._link`) to the
descriptor named by ``CORRAL_RESULT_FD``.

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

__all__ = ["main"]

RESULT_FD = "CORRAL_RESULT_FD"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> int:
    from . import _link

    fd = int(os.environ.pop(RESULT_FD))
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
        value = func(*args)
    except BaseException as exc:  # report everything, even SystemExit
        outcome: _link.LinkMessage = _error(local_rank, exc)
        code = 1
    else:
        try:
            outcome = _link.WorkerResult(local_rank, memoryview(pickle.dumps(value)))
            code = 0
        except Exception as exc:
            exc.add_note(f"the return value of rank {os.environ.get('RANK')} could not be pickled")
            outcome = _error(local_rank, exc)
            code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    _write_all(fd, _link.encode(outcome))
    os.close(fd)
    return code


def _error(local_rank: int, exc: BaseException) -> _link.WorkerError:

    text = "".join(traceback.format_exception(exc))
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
