"""What a child's stdin, stdout and stderr are connected to.

Each stream takes what :mod:`subprocess` and :func:`anyio.open_process`
take, with the same meaning, plus corral's own :data:`LOG`:

=======================  ==================================================================
value                    meaning
=======================  ==================================================================
:data:`LOG` (default)    each line becomes a log record of the child's source
                         (stdout at INFO, stderr at WARNING); not for stdin
``subprocess.PIPE``      :meth:`Runner.run`: collected as exact bytes into the result;
                         :meth:`Runner.start`: an AnyIO byte stream on the
                         :class:`Process` (``proc.stdout``, ``proc.stdin``...)
``LOG | PIPE``           both: logged, and collected (``run``) or readable (``start``)
``subprocess.DEVNULL``   ``/dev/null`` (the default for stdin)
``None``                 inherited from the launcher
``subprocess.STDOUT``    stderr only: into the same place as stdout
a file or a descriptor   that file (anything with ``fileno()``, or an ``int``)
=======================  ==================================================================
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import IO, Any, Final, TypeAlias

__all__ = [
    "DEVNULL",
    "LOG",
    "PIPE",
    "STDOUT",
    "InputOption",
    "LogOption",
    "OutputOption",
    "Plan",
    "plan_input",
    "plan_output",
]

PIPE: Final = subprocess.PIPE
DEVNULL: Final = subprocess.DEVNULL
STDOUT: Final = subprocess.STDOUT


class LogOption:
    """The type of :data:`LOG` (and of ``LOG | PIPE``)."""

    __slots__ = ("_pipe",)

    def __init__(self, pipe: bool) -> None:
        self._pipe = pipe

    @property
    def pipe(self) -> bool:
        """Whether the stream is collected (or readable) as well as logged."""
        return self._pipe

    def __or__(self, other: object) -> LogOption:
        if isinstance(other, LogOption):
            return _LOG_AND_PIPE if self._pipe or other._pipe else LOG
        if isinstance(other, int) and not isinstance(other, bool) and other == PIPE:
            return _LOG_AND_PIPE
        return NotImplemented

    __ror__ = __or__

    def __repr__(self) -> str:
        return "corral.LOG | subprocess.PIPE" if self._pipe else "corral.LOG"

    def __reduce__(self) -> str:
        return "_LOG_AND_PIPE" if self._pipe else "LOG"


LOG: Final = LogOption(False)
"""Each line of the stream becomes a log record (see :doc:`howto/logging`)."""
_LOG_AND_PIPE: Final = LogOption(True)

OutputOption: TypeAlias = "LogOption | int | IO[Any] | None"
InputOption: TypeAlias = "int | IO[Any] | None"


@dataclass(frozen=True)
class Plan:
    """How one stream is connected."""

    log: bool = False
    pipe: bool = False
    fd: int | None = None  # the child's end: a descriptor of the caller's, or None
    special: int | None = None  # DEVNULL or STDOUT, for the spawn
    # None of the above: inherited from the launcher.


def _descriptor(value: object, what: str) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if value < 0:
            return None
        return value
    fileno = getattr(value, "fileno", None)
    if callable(fileno):
        try:
            fd = fileno()
        except (OSError, ValueError) as exc:
            raise ValueError(f"{what}={value!r} has no usable file descriptor: {exc}") from None
        if isinstance(fd, int) and fd >= 0:
            return fd
    return None


def plan_output(value: object, what: str) -> Plan:
    """The plan for ``stdout=value`` or ``stderr=value`` (``what`` names it)."""
    if isinstance(value, LogOption):
        return Plan(log=True, pipe=value.pipe)
    if value is None:
        return Plan()
    if isinstance(value, int) and not isinstance(value, bool):
        if value == PIPE:
            return Plan(pipe=True)
        if value == DEVNULL:
            return Plan(special=DEVNULL)
        if value == STDOUT:
            if what != "stderr":
                raise ValueError("subprocess.STDOUT is only for stderr")
            return Plan(special=STDOUT)
    fd = _descriptor(value, what)
    if fd is None:
        raise TypeError(
            f"{what}={value!r}: expected corral.LOG, corral.LOG | subprocess.PIPE, "
            "subprocess.PIPE, subprocess.DEVNULL, None (inherit), "
            + ("subprocess.STDOUT, " if what == "stderr" else "")
            + "a file object or a file descriptor"
        )
    return Plan(fd=fd)


def plan_input(value: object) -> Plan:
    """The plan for ``stdin=value``."""
    if isinstance(value, LogOption):
        raise TypeError("stdin cannot be corral.LOG: a child's input is not a log")
    if value is None:
        return Plan()
    if isinstance(value, int) and not isinstance(value, bool):
        if value == PIPE:
            return Plan(pipe=True)
        if value == DEVNULL:
            return Plan(special=DEVNULL)
    fd = _descriptor(value, "stdin")
    if fd is None:
        raise TypeError(
            f"stdin={value!r}: expected subprocess.DEVNULL, subprocess.PIPE, None (inherit), "
            "a file object or a file descriptor"
        )
    return Plan(fd=fd)
