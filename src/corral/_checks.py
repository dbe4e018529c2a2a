"""Checks of the arguments every layer takes: argument vectors, seconds, signals, names, texts,
ports, globs, paths and keywords.

The one home of each: the option records' ``checked()`` methods and the
commands call these.  Each returns the value in its checked form or raises
``TypeError`` or ``ValueError`` with a message that names the argument, before
anything is started.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import re
import signal
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, TypeVar

__all__ = [
    "DEFAULT_LINK_TIMEOUT",
    "MAX_NAME",
    "MAX_WORKERS",
    "MAX_WORKERS_PER_HOST",
    "check_argv",
    "check_globs",
    "check_grace",
    "check_host",
    "check_keywords",
    "check_name",
    "check_path",
    "check_port",
    "check_seconds",
    "check_signal",
    "is_text",
    "with_keywords",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The longest name a runner or process may have.
MAX_NAME: Final = 100

# A launch's sizes and its link's deadline: the launch's record (corral._scaleout) names them,
# and the command line shows them in its help, which loads none of the launch's code.

#: The most workers of a launch on one host (``workers_per_host``; the
#: command line's ``-n`` and ``-c``): each is a process there, with its
#: descriptors here.
MAX_WORKERS_PER_HOST: Final = 4096
#: The most workers of a launch, all hosts together (``WORLD_SIZE``).
MAX_WORKERS: Final = 65536
#: Seconds a link may stay silent before it counts as cut, unless ``link_timeout`` says otherwise.
DEFAULT_LINK_TIMEOUT: Final = 5.0

_NAME_OK = re.compile(r"[^\s/\\\0]+")


def check_name(name: object, what: str) -> str:
    """``name`` if it may name a runner or a process (``what`` says which), else ``ValueError``.

    A name is part of every log source (``<runner>.<process>``) and of a log
    file's name: 1 to :data:`MAX_NAME` characters, no spaces or slashes.
    """
    if not isinstance(name, str) or not _NAME_OK.fullmatch(name) or len(name) > MAX_NAME:
        raise ValueError(
            f"{what} name {name!r} must be 1-{MAX_NAME} characters, without spaces or slashes"
        )
    return name


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


def check_seconds(value: object, what: str, *, positive: bool = False) -> float:
    """A number of seconds: finite, and ``> 0`` if ``positive`` (a deadline), else ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if positive and not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def check_grace(grace: object, what: str = "grace") -> float:
    """A grace period in seconds: a finite number >= 0."""
    return check_seconds(grace, what)


def is_text(value: str) -> bool:
    """Whether ``value`` is printable UTF-8 text (an argument of bytes that are not is not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes of an argument that were not UTF-8
        return False
    return value.isprintable()


def check_host(host: object, what: str) -> str:
    """A host name or an address: non-empty printable UTF-8 text."""
    if not isinstance(host, str) or not host or not is_text(host):
        raise ValueError(
            f"{what}: {host!r} is not a host name or an address (printable UTF-8 text)"
        )
    return host


def check_port(port: object, what: str) -> int:
    """A TCP port: an int from 1 to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{what} must be a TCP port, 1 to 65535, not {port!r}")
    return port


def check_globs(globs: object, what: str) -> tuple[str, ...]:
    """A sequence of :mod:`fnmatch` patterns (not one string), as a tuple."""
    if isinstance(globs, str) or not isinstance(globs, Sequence):
        raise TypeError(f"{what} must be a sequence of globs, not {globs!r}")
    for glob in globs:
        if not isinstance(glob, str):
            raise TypeError(f"{what}: {glob!r} is not a glob (a string)")
    return tuple(globs)


def check_path(path: object, what: str) -> str:
    """A path (a ``str`` or an :class:`os.PathLike`), as a ``str``; no NUL in it."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path, not {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "\0" in text:
        raise ValueError(f"{what} must be a path (text without NUL), not {path!r}")
    return text


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


def with_keywords(options: type) -> Callable[[F], F]:
    """Give ``fn(..., **options)`` the signature it has: the fields of the dataclass ``options``.

    The keywords are spelled once, as the fields (names, types, defaults) of
    ``options``; this shows them where ``**options`` stands, for
    :func:`help`, :mod:`inspect` and the API pages.  The annotations are
    evaluated, so ``options``'s module must import at run time every name
    they use.
    """
    fields = _keyword_parameters(options)

    def apply(fn: F) -> F:
        signature = inspect.signature(fn)
        params = [
            p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        fn.__signature__ = signature.replace(parameters=[*params, *fields])  # type: ignore[attr-defined]
        return fn

    return apply


@functools.cache
def _keyword_parameters(options: type) -> tuple[inspect.Parameter, ...]:
    """The fields of the dataclass ``options`` as keyword-only parameters: once per class
    (evaluating the annotations is most of a runner's import; each record serves two or more
    signatures)."""
    hints = typing.get_type_hints(options)
    return tuple(
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
        )
        for f in dataclasses.fields(options)
    )
