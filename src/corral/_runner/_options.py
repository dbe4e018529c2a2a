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

from .._checks import check_grace, check_keywords, check_name, check_signal
from .._core._options import DEFAULT_GRACE, StrOrPath
from .._logs._route import Route
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
    monitor_origins: Sequence[str]
    contain: bool
    subreaper: bool
    usage: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSpec:
    """What a runner was asked for: the keywords of :func:`open_runner`, with their defaults.

    Not checked yet: :meth:`checked` checks the runner's own values.
    """

    name: str = "corral"
    grace: float = DEFAULT_GRACE
    stop_signal: int = signal.SIGTERM
    console: bool = True
    handlers: Sequence[logging.Handler | Route] = ()
    log_dir: StrOrPath | None = None
    propagate: bool = False
    handle_signals: bool | None = None
    monitor: str | bool | None = None
    monitor_origins: Sequence[str] = ()
    contain: bool = True
    subreaper: bool = False
    usage: bool = True

    @classmethod
    def of(cls, options: Mapping[str, Any], what: str) -> RunnerSpec:
        """From a call's keywords; an unknown one is a ``TypeError``, as for any call."""
        check_keywords(options, _RUNNER_FIELDS, what)
        return cls(**options)

    def checked(self) -> RunnerSpec:
        """This record with the runner's own values checked (its name, its stop's defaults).

        What is passed on is checked where it is taken: the handlers by the
        log service, the monitor's address by the monitor.
        """
        name = check_name(self.name, "runner")
        if "." in name:
            raise ValueError(f"runner name {name!r} may not contain a dot: it starts every source")
        if self.handle_signals not in (None, True, False):
            raise TypeError("handle_signals must be None, True or False")
        if self.monitor_origins and self.monitor in (None, False):
            raise ValueError("monitor_origins= names pages that may reach a monitor: give monitor=")
        return dataclasses.replace(
            self, grace=check_grace(self.grace), stop_signal=check_signal(self.stop_signal)
        )


_RUNNER_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(RunnerSpec))


class RunnerLaunchOptions(RunnerOptions, LaunchKeywords, total=False):
    """The keywords of :func:`corral.launch`, as a :class:`typing.TypedDict`.

    Those of :func:`open_runner` (a :class:`RunnerOptions`) and those of
    :meth:`Runner.launch` (a :class:`LaunchOptions`), with ``grace`` once: the
    runner's, a number of seconds, which the launch inherits.
    """
