"""Helpers the tests share: the test tag, a handler that keeps records, the process table.

Nothing is mocked: these read the real ``/proc``.  A child started with
``env={TAG_VAR: tag}`` (the ``tag`` fixture) can be found by :func:`tagged_pids`
wherever it went, and :func:`wait_gone` waits for exits on pidfds.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import anyio
import anyio.to_thread

#: The variable that tags every process a test starts (see the ``tag`` fixture).
TAG_VAR = "CORRAL_TEST_TAG"


class ListHandler(logging.Handler):
    """Keeps every record it is handed (DEBUG and up unless told otherwise).

    A test can wait for the records it expects with :meth:`wait_for`.
    """

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether ``predicate()`` came to hold within ``timeout`` seconds.

        Waits in a worker thread, so that the event loop (and the runner's log
        service, which calls :meth:`emit`) runs on meanwhile.
        """

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(predicate, timeout)

        return await anyio.to_thread.run_sync(wait)

    def messages(self, source: str | None = None) -> list[str]:
        """Messages of every record, or of one source's."""
        return [
            r.getMessage()
            for r in self.records
            if source is None or getattr(r, "corral_source", None) == source
        ]

    def lines(self, source: str) -> list[str]:
        """The stdout and stderr lines of one source."""
        return [
            r.getMessage()
            for r in self.records
            if getattr(r, "corral_source", None) == source
            and getattr(r, "corral_stream", None) in ("stdout", "stderr")
        ]


_GONE = (b"Z", b"X")  # zombie, dead: not running any more


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the name (state, ppid, pgid...), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every process there is: its pid and the fields of its stat."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None:
                yield int(entry), fields


def tagged_pids(tag: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries ``CORRAL_TEST_TAG=tag``."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for pid, fields in _processes():
        if fields[0] in _GONE:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(pid)
    return found


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid``."""
    return [pid for pid, f in _processes() if f[0] not in _GONE and int(f[2]) == pgid]


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Block until every pid has exited (via pidfds, no polling); return those still alive."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        remaining = set(fds)
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                remaining.discard(fd)
                poller.unregister(fd)
        return [fds[fd] for fd in remaining]
    finally:
        for fd in fds:
            os.close(fd)


#: Signals whose default action ends a process (SIGKILL whatever it does).
_FATAL = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def is_dying(pid: int) -> bool:
    """Whether ``pid`` has a signal pending that ends it: it exits once the kernel runs it.

    SIGKILL always ends a process; the others of :data:`_FATAL` do when the
    process neither catches, ignores nor blocks them.  Between the signal and
    the exit, ``/proc`` still shows the process running: under load, for
    milliseconds.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    masks = {k: int(status.get(k, "0").strip(), 16) for k in ("SigPnd", "ShdPnd", "SigBlk")}
    spared = (
        masks["SigBlk"] | int(status.get("SigIgn", "0"), 16) | int(status.get("SigCgt", "0"), 16)
    )
    pending = masks["SigPnd"] | masks["ShdPnd"]
    for sig in _FATAL:
        bit = 1 << (sig - 1)
        if pending & bit and (sig == signal.SIGKILL or not spared & bit):
            return True
    return False


def still_running(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Those of ``pids`` that live on: the dying ones (:func:`is_dying`) are waited for first.

    Sampling the process table right after a launcher killed its children is
    a race with the kernel, not a leak: a killed process is still listed
    until it was scheduled to exit.
    """
    pids = list(pids)
    wait_gone([pid for pid in pids if is_dying(pid)], timeout)
    return [pid for pid in pids if is_alive(pid)]


def is_alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in _GONE


def children_of(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (zombies included: an unreaped child leaks too)."""
    return [child for child, fields in _processes() if int(fields[1]) == pid]


def release(fifo: Path) -> None:
    """Let a child blocked in ``read x < fifo`` go on (blocks until it opened the FIFO)."""
    fd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
