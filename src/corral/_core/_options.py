"""The options of a start: what :meth:`Runner.start` and :meth:`Runner.run` take.

They are spelled once, as the fields of a dataclass (names, types, defaults):
:class:`ProcessOptions`, for :meth:`Runner.start` and :meth:`Runner.run` and
their blocking twins.  Beside it stands its :class:`typing.TypedDict` for type
checkers (``**options: Unpack[StartOptions]``), which
``tests/core/test_options.py`` keeps in step with it; and
:func:`corral._checks.with_keywords` shows the fields in every signature.
What each means is in :meth:`Runner.start`'s docstring.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final, Literal, TypedDict

from .._checks import check_grace, check_keywords
from ._stdio import DEVNULL, LOG, LogOption

__all__ = [
    "MAX_BACKOFF",
    "Input",
    "Output",
    "ProcessOptions",
    "Restart",
    "RestartPolicy",
    "StartOptions",
    "StrOrPath",
]

StrOrPath = str | os.PathLike[str]
Output = LogOption | int | IO[Any] | None
Input = int | IO[Any] | None

Restart = Literal["never", "on-failure", "always"]

#: A restart policy's delay never grows beyond this many seconds.
MAX_BACKOFF = 30.0


class StartOptions(TypedDict, total=False):
    """The keywords of :meth:`Runner.start` and :meth:`Runner.run`, as a :class:`typing.TypedDict`.

    For code that passes them on and wants them type-checked::

        async def start_service(
            r: corral.Runner, argv: list[str], **options: Unpack[corral.StartOptions]
        ) -> corral.Process:
            return await r.start(argv, wait_started=True, **options)

    Every key is optional; :meth:`Runner.start` says what each means.  (Its
    defaults are those of corral's own ``ProcessOptions``, which
    ``tests/core/test_options.py`` keeps in step with it.)
    """

    name: str | None
    env: Mapping[str, str] | None
    extra_env: Mapping[str, str | None] | None
    cwd: StrOrPath | None
    check: bool
    service: bool
    grace: float | None
    stop_signal: int | None
    stdin: Input
    stdout: Output
    stderr: Output
    pass_fds: Collection[int]
    start_new_session: bool
    user: str | int | None
    group: str | int | None
    extra_groups: Collection[str | int] | None
    umask: int
    wait_started: bool
    start_timeout: float | None
    restart: Restart
    max_restarts: int
    backoff: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessOptions:
    """What a start was asked for: the keywords of :meth:`Runner.start`, with their defaults.

    Not checked yet: :class:`~corral._core._spawn.SpawnSpec` and the runner
    check each value, before anything is spawned.
    """

    name: str | None = None
    env: Mapping[str, str] | None = None
    extra_env: Mapping[str, str | None] | None = None
    cwd: StrOrPath | None = None
    check: bool = True
    service: bool = False
    grace: float | None = None
    stop_signal: int | None = None
    stdin: Input = DEVNULL
    stdout: Output = LOG
    stderr: Output = LOG
    pass_fds: Collection[int] = ()
    start_new_session: bool = False
    user: str | int | None = None
    group: str | int | None = None
    extra_groups: Collection[str | int] | None = None
    umask: int = -1
    wait_started: bool = False
    start_timeout: float | None = None
    restart: Restart = "never"
    max_restarts: int = 3
    backoff: float = 1.0

    @classmethod
    def of(cls, options: Mapping[str, Any], what: str) -> ProcessOptions:
        """From a call's keywords; an unknown one is a ``TypeError``, as for any call."""
        check_keywords(options, _PROCESS_FIELDS, what)
        return cls(**options)

    def replace(self, **changes: Any) -> ProcessOptions:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


_PROCESS_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(ProcessOptions))


@dataclass(frozen=True)
class RestartPolicy:
    """When a child is started again after it exited (``restart=`` of :meth:`Runner.start`)."""

    restart: Restart = "never"
    max_restarts: int = 3
    backoff: float = 1.0

    @classmethod
    def make(cls, restart: object, max_restarts: object, backoff: object) -> RestartPolicy:
        if restart not in ("never", "on-failure", "always"):
            raise ValueError(f"restart={restart!r}: expected 'never', 'on-failure' or 'always'")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, not {max_restarts!r}")
        policy: Restart = restart
        return cls(policy, max_restarts, check_grace(backoff, "backoff"))

    def delay(self, attempt: int) -> float:
        """Seconds before restart number ``attempt`` (1-based): exponential, with jitter."""
        base = self.backoff * 2.0 ** (attempt - 1)
        return min(base * random.uniform(0.8, 1.2), MAX_BACKOFF)
