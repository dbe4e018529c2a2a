"""The options of a runner: what :func:`open_runner` (and :func:`corral.launch`) take.

They are spelled once, as the fields of a dataclass (names, types, defaults):
:class:`RunnerSpec`, for :func:`open_runner`, :class:`Runner`,
:func:`open_runner_sync` and :func:`corral.launch`.  Beside it stands its
:class:`typing.TypedDict` for type checkers (``**options:
Unpack[RunnerOptions]``), which ``tests/core/test_options.py`` keeps in step
with it; and :func:`corral._checks.with_keywords` shows the fields in every
signature.  What each means is in :func:`open_runner`'s docstring.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict

from .._checks import check_keywords
from .._core._options import StrOrPath
from .._logs._router import Route
from .._scaleout import LaunchKeywords

__all__ = ["RunnerLaunchOptions", "RunnerOptions", "RunnerSpec"]


class RunnerOptions(TypedDict, total=False):
    """The keywords of :func:`open_runner`, as a :class:`typing.TypedDict`.

    :func:`open_runner`, :class:`Runner`, :func:`open_runner_sync` and
    :func:`corral.launch` take them all (``**options: Unpack[RunnerOptions]``),
    and so may code that passes them on::

        def my_runner(**options: Unpack[corral.RunnerOptions]) -> corral.Runner:
            return corral.open_runner(name="app", **options)

    Every key is optional; :func:`open_runner` says what each means.  (Its
    defaults are those of corral's own ``RunnerSpec``, which
    ``tests/core/test_options.py`` keeps in step with it.)
    """

    name: str
    grace: float
    stop_signal: int
    console: bool
    handlers: Sequence[logging.Handler | Route]
    log_dir: StrOrPath | None
    propagate: bool
    handle_signals: bool | None
    monitor: str | bool | None
    contain: bool
    subreaper: bool
    usage: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSpec:
    """What a runner was asked for: the keywords of :func:`open_runner`, with their defaults.

    Not checked yet: the :class:`Runner` checks each value.
    """

    name: str = "corral"
    grace: float = 5.0
    stop_signal: int = signal.SIGTERM
    console: bool = True
    handlers: Sequence[logging.Handler | Route] = ()
    log_dir: StrOrPath | None = None
    propagate: bool = False
    handle_signals: bool | None = None
    monitor: str | bool | None = None
    contain: bool = True
    subreaper: bool = False
    usage: bool = True

    @classmethod
    def of(cls, options: Mapping[str, Any], what: str) -> RunnerSpec:
        """From a call's keywords; an unknown one is a ``TypeError``, as for any call."""
        check_keywords(options, _RUNNER_FIELDS, what)
        return cls(**options)


_RUNNER_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(RunnerSpec))


class RunnerLaunchOptions(RunnerOptions, LaunchKeywords, total=False):
    """The keywords of :func:`corral.launch`, as a :class:`typing.TypedDict`.

    Those of :func:`open_runner` (a :class:`RunnerOptions`) and those of
    :meth:`Runner.launch` (a :class:`LaunchOptions`), with ``grace`` once: the
    runner's, a number of seconds, which the launch inherits.
    """
