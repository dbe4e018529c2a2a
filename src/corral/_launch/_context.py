"""What a launch needs of the runner it runs in: a way to start children, and its log service.

A launch does not know :class:`~corral.Runner`, which stands on top of it:
:meth:`Runner.launch` hands it a :class:`LaunchContext` (its ``start``, its log
service), and the children it starts are :class:`~corral.Process` objects
of the core, below it.  The launch machinery is loaded only when a launch
begins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Unpack

if TYPE_CHECKING:
    from .._core._options import StartOptions, StrOrPath
    from .._core._process import Process
    from .._logs._wire import Record
    from .._sys._proc import ResourceUsage

__all__ = ["LaunchContext", "LogForwarder", "StartFn", "UsageSink"]


class StartFn(Protocol):
    """Start one child as :meth:`Runner.start` does (a runner's bound ``start`` is one)."""

    def __call__(
        self, argv: Sequence[StrOrPath], /, **options: Unpack[StartOptions]
    ) -> Awaitable[Process]:
        """Start ``argv`` with ``options``; the :class:`~corral.Process`, once it runs."""


class LogForwarder(Protocol):
    """Where a launch hands what its agents on other hosts send: the runner's log service.

    ``relative`` is the source within the runner (``agent-0.worker-3``),
    ``peer`` the agent it came from, for messages about it.
    """

    async def lines(
        self, relative: str, stream: str, level: int, created: float, text: bytes, *, peer: str
    ) -> None:
        """Complete lines one source wrote to ``stream``, logged at ``level``."""

    async def records(self, relative: str, records: list[Record], *, peer: str) -> None:
        """:mod:`logging` records of one source, as the log wire format carries them."""

    def warn(self, message: str) -> None:
        """A warning of the runner's own (a stranger knocked on the link, say)."""


class UsageSink(Protocol):
    """Where a launch hands what its agents say their workers cost (the runner's sampler)."""

    def remote(self, agent: str, figures: Mapping[str, ResourceUsage]) -> None:
        """``agent``'s workers' figures (``agent-1``: each worker by its name in the
        runner, ``agent-1.worker-0``); none once the agent is done."""


@dataclass(frozen=True)
class LaunchContext:
    """The runner a launch runs in, as the launch sees it."""

    #: Starts the agents' commands (ssh, srun) and this host's workers.
    start: StartFn
    #: The runner's log service, for what agents forward.
    logs: LogForwarder
    #: The runner's default grace period.
    grace: float
    #: Where the figures of the agents' workers go, if the runner samples its children's.
    usage: UsageSink | None = None
    #: The signal that stops the runner, if one does (SIGINT for a Ctrl-C the runner holds):
    #: its own children got it, so remote workers get it too.  ``None``: their stop signal.
    stop_signal: Callable[[], int | None] = lambda: None
    #: Returns once a second signal said "now": every grace on every host ends at once.
    aborted: Callable[[], Awaitable[None]] | None = None
    #: The runner's private temporary folder, removed by its lifeline if the launcher is
    #: killed: where this host's workers' error files go.
    scratch: str | None = None
