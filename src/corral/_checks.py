"""Checks of the arguments every layer takes: argument vectors, grace periods, signals, keywords.

Each returns the value in its checked form or raises ``TypeError`` or
``ValueError`` with a message that names the argument, before anything is
started.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import signal
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

__all__ = ["check_argv", "check_grace", "check_keywords", "check_signal", "with_keywords"]

F = TypeVar("F", bound=Callable[..., Any])


def check_argv(argv: object) -> list[str]:
    """The argument vector as a list of strings; ``TypeError`` for a ``str`` or ``bytes``."""
    if isinstance(argv, (str, bytes)):
        raise TypeError(
            f"argv must be a list of arguments, not a {type(argv).__name__} ({argv!r}): a "
            "string would be taken one character per argument. Write ['prog', 'arg'], "
            "or shlex.split('prog arg') for a command line"
        )
    try:
        items = list(argv)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"argv must be a list of arguments, not {type(argv).__name__}") from None
    if not items:
        raise ValueError("argv must name a program: it is empty")
    result = []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            result.append(os.fspath(item) if not isinstance(item, str) else item)
        elif isinstance(item, bytes):
            result.append(os.fsdecode(item))
        else:
            raise TypeError(
                f"every argument must be a str or a path, not {type(item).__name__} ({item!r})"
            )
    return [os.fsdecode(x) if isinstance(x, bytes) else str(x) for x in result]


def check_grace(grace: object, what: str = "grace") -> float:
    """A grace period in seconds: a finite number >= 0."""
    if isinstance(grace, bool) or not isinstance(grace, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(grace).__name__}")
    value = float(grace)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {grace!r}")
    return value


def check_signal(signum: object, what: str = "stop_signal") -> int:
    """A signal a child can be asked to stop with."""
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise TypeError(f"{what} must be a signal number such as signal.SIGTERM, not {signum!r}")
    try:
        sig = signal.Signals(signum)
    except ValueError:
        raise ValueError(f"{what}={signum!r} is not a signal") from None
    if sig in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT):
        raise ValueError(f"{what}={sig.name} does not stop a process")
    return int(sig)


def check_keywords(options: Mapping[str, object], known: Collection[str], what: str) -> None:
    """``TypeError`` for a keyword that is none of ``known``, worded as Python words it."""
    for key in options:
        if key not in known:
            raise TypeError(f"{what}() got an unexpected keyword argument {key!r}")


def with_keywords(options: type[Any]) -> Callable[[F], F]:
    """Give ``fn(..., **options)`` the signature it has: the fields of the dataclass ``options``.

    The keywords are spelled once, as the fields (names, types, defaults) of
    ``options``; this shows them where ``**options`` stands, for
    :func:`help`, :mod:`inspect` and the API pages.  The annotations are
    evaluated, so ``options``'s module must import at run time every name
    they use.
    """
    hints = typing.get_type_hints(options)
    fields = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
        )
        for f in dataclasses.fields(options)
    ]

    def apply(fn: F) -> F:
        signature = inspect.signature(fn)
        params = [
            p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        fn.__signature__ = signature.replace(parameters=[*params, *fields])  # type: ignore[attr-defined]
        return fn

    return apply
