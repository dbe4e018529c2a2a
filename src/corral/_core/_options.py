"""The options of a start: what :meth:`Runner.start` and :meth:`Runner.run` take, checked once.

They are spelled once, as the fields of a dataclass (names, types, defaults):
:class:`ProcessOptions`, for :meth:`Runner.start` and :meth:`Runner.run` and
their blocking twins; its Popen-style fields are those of
:class:`~corral._sys._platform.PopenArgs`, which it extends.  Beside it stands
its :class:`typing.TypedDict` for type checkers (``**options:
Unpack[StartOptions]``), which ``tests/core/test_options.py`` keeps in step
with it; and :func:`corral._checks.with_keywords` shows the fields in every
signature.  What each means is in :meth:`Runner.start`'s docstring.

:meth:`ProcessOptions.checked` is the one place a start is checked: every
value, alone and with the others, before anything is spawned.  It gives the
:class:`StartSpec` every spawn of the child (its restarts too) is made from.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final, Literal, TypedDict

from .._checks import check_argv, check_grace, check_keywords, check_name, check_signal
from .._sys._childenv import HANDSHAKE_FD
from .._sys._platform import PopenArgs, StrOrPath
from ._stdio import DEVNULL, LOG, LogOption, Plan, plan_input, plan_output

__all__ = [
    "DEFAULT_GRACE",
    "MAX_BACKOFF",
    "Input",
    "Output",
    "ProcessOptions",
    "Restart",
    "RestartPolicy",
    "StartOptions",
    "StartSpec",
    "StrOrPath",
]

Output = LogOption | int | IO[Any] | None
Input = int | IO[Any] | None

Restart = Literal["never", "on-failure", "always"]

#: A restart policy's delay never grows beyond this many seconds.
MAX_BACKOFF = 30.0
#: Seconds between the stop signal and SIGKILL when nobody says otherwise (a runner's default).
DEFAULT_GRACE: Final = 5.0


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

    cwd: StrOrPath | None
    pass_fds: Collection[int]
    start_new_session: bool
    user: str | int | None
    group: str | int | None
    extra_groups: Collection[str | int] | None
    umask: int
    name: str | None
    env: Mapping[str, str] | None
    extra_env: Mapping[str, str | None] | None
    check: bool
    service: bool
    grace: float | None
    stop_signal: int | None
    stdin: Input
    stdout: Output
    stderr: Output
    wait_started: bool
    start_timeout: float | None
    restart: Restart
    max_restarts: int
    backoff: float


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a child is started again after it exited (``restart=`` of :meth:`Runner.start`)."""

    restart: Restart
    max_restarts: int
    backoff: float

    def delay(self, attempt: int) -> float:
        """Seconds before restart number ``attempt`` (1-based): exponential, with jitter."""
        base = self.backoff * 2.0 ** (attempt - 1)
        return min(base * random.uniform(0.8, 1.2), MAX_BACKOFF)


@dataclass(frozen=True, slots=True, kw_only=True)
class StartSpec:
    """A start, checked (:meth:`ProcessOptions.checked`): what every spawn of the child is made of.

    Its fields are those of :class:`ProcessOptions` in their checked form
    (the defaults are there, said once).
    """

    argv: list[str]
    #: The name asked for, or ``None`` (the runner names the child after its program).
    name: str | None
    #: The Popen-style options, as ``Popen`` takes them (see :class:`PopenArgs`).
    popen: PopenArgs
    #: ``env=`` (the whole environment) and ``extra_env=`` (laid over it), as bytes.
    env: dict[bytes, bytes | None] | None
    extra_env: dict[bytes, bytes | None] | None
    stdin: Plan
    stdout: Plan
    stderr: Plan
    check: bool
    service: bool
    #: Seconds of grace and the stop signal; ``None``: the runner's.
    grace: float | None
    stop_signal: int | None
    wait_started: bool
    start_timeout: float | None
    policy: RestartPolicy

    @property
    def program(self) -> str:
        return os.path.basename(self.argv[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessOptions(PopenArgs):
    """What a start was asked for: the keywords of :meth:`Runner.start`, with their defaults.

    The Popen-style ones are :class:`PopenArgs`'s fields; the rest are
    corral's.  Not checked yet: :meth:`checked` checks them, before anything
    is spawned.
    """

    name: str | None = None
    env: Mapping[str, str] | None = None
    extra_env: Mapping[str, str | None] | None = None
    check: bool = True
    service: bool = False
    grace: float | None = None
    stop_signal: int | None = None
    stdin: Input = DEVNULL
    stdout: Output = LOG
    stderr: Output = LOG
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

    def checked(self, argv: object) -> StartSpec:
        """Every check of a start, once: the :class:`StartSpec` of ``argv`` with these options.

        Raises ``TypeError`` or ``ValueError`` naming the keyword, before
        anything is spawned.
        """
        wait_started = bool(self.wait_started)
        start_timeout = self.start_timeout
        if start_timeout is not None:
            if not wait_started:
                raise ValueError("start_timeout needs wait_started=True: it bounds the report")
            start_timeout = check_grace(start_timeout, "start_timeout")
        cwd = self.cwd
        if cwd is not None and not isinstance(cwd, (str, os.PathLike)):
            raise TypeError(f"cwd must be a path, not {type(cwd).__name__}")
        if not isinstance(self.umask, int) or isinstance(self.umask, bool):
            raise TypeError("umask must be an int")
        return StartSpec(
            argv=check_argv(argv),
            name=None if self.name is None else check_name(self.name, "process"),
            popen=PopenArgs(
                cwd=None if cwd is None else os.fspath(cwd),
                pass_fds=_check_pass_fds(self.pass_fds, wait_started),
                start_new_session=bool(self.start_new_session),
                user=self.user,
                group=self.group,
                extra_groups=_check_groups(self.extra_groups),
                umask=self.umask,
            ),
            env=_check_env(self.env, "env"),
            extra_env=_check_env(self.extra_env, "extra_env"),
            stdin=plan_input(self.stdin),
            stdout=plan_output(self.stdout, "stdout"),
            stderr=plan_output(self.stderr, "stderr"),
            check=bool(self.check),
            service=bool(self.service),
            grace=None if self.grace is None else check_grace(self.grace),
            stop_signal=None if self.stop_signal is None else check_signal(self.stop_signal),
            wait_started=wait_started,
            start_timeout=start_timeout,
            policy=_check_restart(self.restart, self.max_restarts, self.backoff),
        )


_PROCESS_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(ProcessOptions))


# -- the checks of checked(), one per option that needs more than a line --------------------


def _check_pass_fds(pass_fds: object, wait_started: bool) -> tuple[int, ...]:
    if not pass_fds:
        return ()
    if not isinstance(pass_fds, Collection) or isinstance(pass_fds, (str, bytes)):
        raise TypeError("pass_fds must be a collection of file descriptors")
    fds = tuple(sorted({int(fd) for fd in pass_fds}))
    if any(fd < 3 for fd in fds):
        raise ValueError("pass_fds are kept at their numbers: use stdin/stdout/stderr for 0-2")
    if wait_started and HANDSHAKE_FD in fds:
        raise ValueError(
            f"pass_fds may not contain {HANDSHAKE_FD} with wait_started=True: "
            "the child receives the start-up handshake pipe there"
        )
    return fds


def _check_groups(extra_groups: object) -> tuple[str | int, ...] | None:
    if extra_groups is None:
        return None
    if isinstance(extra_groups, (str, bytes)) or not isinstance(extra_groups, Collection):
        raise TypeError("extra_groups must be a collection of group names or ids")
    return tuple(extra_groups)


def _check_env(env: object, what: str) -> dict[bytes, bytes | None] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"{what} must be a mapping of names to values, not {type(env).__name__}")
    result: dict[bytes, bytes | None] = {}
    for key, value in env.items():
        if not isinstance(key, (str, bytes)) or not key or "=" in os.fsdecode(key):
            raise ValueError(f"{what}: {key!r} is not a valid variable name")
        if value is not None and not isinstance(value, (str, bytes, os.PathLike)):
            raise TypeError(f"{what}[{key!r}] must be a str, not {type(value).__name__}")
        encoded = None if value is None else os.fsencode(value)
        if encoded is not None and b"\0" in encoded:
            raise ValueError(f"{what}[{key!r}] contains a NUL character")
        result[os.fsencode(key)] = encoded
    return result


def _check_restart(restart: object, max_restarts: object, backoff: object) -> RestartPolicy:
    if restart not in ("never", "on-failure", "always"):
        raise ValueError(f"restart={restart!r}: expected 'never', 'on-failure' or 'always'")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, not {max_restarts!r}")
    policy: Restart = restart
    return RestartPolicy(policy, max_restarts, check_grace(backoff, "backoff"))
