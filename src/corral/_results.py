"""What a run and a launch return: :class:`CompletedProcess` and :class:`LaunchResult`; how a
run ended, in one word (:func:`end_state`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar, overload

from ._errors import ProcessFailed

__all__ = ["CompletedProcess", "LaunchResult", "end_state"]

T = TypeVar("T")


class CompletedProcess(subprocess.CompletedProcess[bytes | None]):
    """What :meth:`Runner.run` returns: :class:`subprocess.CompletedProcess`, and a little more.

    ``args``, ``returncode``, ``stdout`` and ``stderr`` mean what they mean
    in :mod:`subprocess`: ``stdout`` and ``stderr`` hold the exact bytes when
    the stream was collected (``PIPE`` or ``LOG | PIPE``), and are ``None``
    otherwise (so they are typed ``bytes | None``).  :meth:`check_returncode`
    raises :class:`ProcessFailed`.
    """

    def __init__(
        self,
        args: list[str],
        returncode: int,
        stdout: bytes | None = None,
        stderr: bytes | None = None,
        *,
        name: str,
        pid: int,
        duration: float,
        started_value: object = None,
        stderr_tail: bytes = b"",
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        #: The process's name in its runner.
        self.name = name
        #: Its process id.
        self.pid = pid
        #: Seconds from spawn to exit.
        self.duration = duration
        #: What it reported with :func:`corral.child.started`, if anything.
        self.started_value = started_value
        self._stderr_tail = stderr_tail

    def check_returncode(self) -> None:
        """Raise :class:`ProcessFailed` if the exit code is non-zero."""
        if self.returncode:
            raise ProcessFailed(
                self.returncode,
                self.args,
                name=self.name,
                pid=self.pid,
                stdout=self.stdout,
                stderr=self.stderr if self.stderr is not None else self._stderr_tail,
            )

    def __repr__(self) -> str:
        return (
            f"CompletedProcess(name={self.name!r}, args={self.args!r}, "
            f"returncode={self.returncode})"
        )


class LaunchResult(Sequence[T], Generic[T]):
    """The return values of a launch, in global rank order; ``by_host`` groups them.

    ``results[0]`` is rank 0's value; ``results.by_host["node2"]`` is the list
    of that host's values in local-rank order; ``results.hosts`` the hosts in
    order.
    """

    def __init__(self, values: list[T], hosts: list[str], counts: list[int]) -> None:
        self._values = values
        self.hosts = hosts
        self.by_host: dict[str, list[T]] = {}
        start = 0
        for host, count in zip(hosts, counts, strict=True):
            self.by_host[host] = values[start : start + count]
            start += count

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self._values[index]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[T]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LaunchResult):
            return self._values == other._values
        if isinstance(other, list):
            return self._values == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"LaunchResult({self._values!r})"


def end_state(returncode: int, stop_requested: bool) -> str:
    """How a run of a process ended, in the words of the monitor, its page and the command.

    ``"stopped"`` when its owner stopped it (corral, after another's failure,
    a signal or the end of its scope; whatever it exited with), else
    ``"exited"`` for code 0 and ``"failed"`` for its own failure.
    """
    if stop_requested:
        return "stopped"
    return "exited" if returncode == 0 else "failed"
