"""The options of a launch: what :meth:`Runner.launch` and :meth:`Runner.launch_command` take.

They are spelled once, as the fields of :class:`LaunchSpec` (names, types,
defaults), with :class:`LaunchOptions` beside it for type checkers
(``**options: Unpack[LaunchOptions]``); what each means is in
:meth:`Runner.launch`'s docstring.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict

from .._checks import check_keywords
from . import _link
from ._hosts import SSH

__all__ = [
    "DEFAULT_LINK_TIMEOUT",
    "DEFAULT_PROCESS_GROUP_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "EVENT_LOOPS",
    "PROCESS_GROUP_BACKENDS",
    "LaunchKeywords",
    "LaunchOptions",
    "LaunchSpec",
]

#: Seconds agents get to start and dial back, unless ``start_timeout`` says otherwise.
DEFAULT_START_TIMEOUT = 60.0
#: Seconds a link may stay silent before it counts as cut, unless ``link_timeout`` says otherwise.
DEFAULT_LINK_TIMEOUT = _link.DEFAULT_LINK_TIMEOUT
#: The process-group backends of a launch's ``backend=`` (torchrunx's, torch's), and "auto".
PROCESS_GROUP_BACKENDS: Final = ("gloo", "nccl", "mpi", "ucc", "xccl", "auto")
#: What the ``backend=`` of a blocking runner names instead: its event loop.
EVENT_LOOPS: Final = ("asyncio", "trio")
#: Seconds of the process group's timeout (``backend=``): torchrunx's ``worker_timeout``.
DEFAULT_PROCESS_GROUP_TIMEOUT = 600.0


class LaunchKeywords(TypedDict, total=False):
    """The keywords of a launch but ``grace`` and ``backend``, which :func:`corral.launch` spells
    its own way (``grace`` is the runner's; ``backend`` names the event loop or the process group).

    :class:`LaunchOptions` adds them; :func:`corral.launch`'s keywords are these
    and the runner's.
    """

    hosts: Sequence[str] | str | None
    workers_per_host: int | Sequence[int] | None
    extra_env: Mapping[str, str | None] | None
    forward_env: str | Sequence[str]
    copy_env: Sequence[str]
    ssh: SSH | None
    launcher_address: str | None
    start_timeout: float
    link_timeout: float
    log_level: int
    host_log_dir: str | None
    process_group_timeout: float
    master_addr: str | None
    master_port: int | None


class LaunchOptions(LaunchKeywords, total=False):
    """The keywords of :meth:`Runner.launch` and :meth:`Runner.launch_command`, as a TypedDict.

    For code that passes them on and wants them type-checked
    (``**options: Unpack[corral.LaunchOptions]``), as :class:`StartOptions`
    is for :meth:`Runner.start`.  Every key is optional;
    :meth:`Runner.launch` says what each means.  (Its defaults are those of
    corral's own ``LaunchSpec``, which ``tests/core/test_options.py`` keeps in
    step with it.)
    """

    grace: float | None
    backend: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """What a launch was asked for: the keywords of :meth:`Runner.launch`, with their defaults.

    Not checked yet: the launch's plan checks each value, before anything starts.
    """

    hosts: Sequence[str] | str | None = None
    workers_per_host: int | Sequence[int] | None = None
    extra_env: Mapping[str, str | None] | None = None
    forward_env: str | Sequence[str] = "all"
    copy_env: Sequence[str] = ()
    ssh: SSH | None = None
    launcher_address: str | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT
    link_timeout: float = DEFAULT_LINK_TIMEOUT
    log_level: int = logging.NOTSET
    host_log_dir: str | None = None
    process_group_timeout: float = DEFAULT_PROCESS_GROUP_TIMEOUT
    master_addr: str | None = None
    master_port: int | None = None
    grace: float | None = None
    backend: str | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any], what: str) -> LaunchSpec:
        """From a call's keywords; an unknown one is a ``TypeError``, as for any call."""
        check_keywords(options, _LAUNCH_FIELDS, what)
        return cls(**options)


_LAUNCH_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(LaunchSpec))
