"""The test session's reaper: whatever the session set up is undone once the session is gone.

Fixtures stop their daemons and remove their namespaces in their teardown, but a teardown does
not run when the session ends another way: pytest-timeout's ``thread`` method (``os._exit``
after dumping the threads), SIGKILL, a crash.  So ``tests/conftest.py`` starts this module as a
small watchdog process for each session, joined to pytest by a ``SOCK_SEQPACKET`` socket pair.
Fixtures tell it, as they go, what to undo (each message a JSON object, a process sent as its
pidfd so that there is no doubt which process it is); when pytest's end of the socket closes,
for whatever reason, the reaper undoes everything it was not told is undone already:

1. it SIGKILLs, and waits for, every process it holds a pidfd of, every process in a network
   namespace it was given, every process whose command line or environment mentions a text it
   was given (a fixture's private directory), and every process whose environment carries the
   session's marker, :data:`MARKER`\\ ``=<unique value>`` (which every process the suite
   starts inherits, unless a test gives it an environment of its own);
2. it then deletes the veth links and network namespaces, puts back ``/etc/hosts`` lines, and
   removes the directories, in the reverse order of their registration.

Nothing is killed by name.  The reaper ignores SIGINT and SIGHUP and runs in a session of its
own, so neither a Ctrl-C meant for pytest nor a closed terminal stops it before it is done.  It
writes its pid into each private directory (:data:`PID_FILE`), so that a next session that
finds the directory waits for it to finish rather than race it for the same names.

This file is both the reaper's program (``python reaper.py``; standard library only) and the
client the fixtures use (:func:`session`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: The variable that marks every process of one test session.
MARKER = "CORRAL_TEST_SESSION"
#: The file in a fixture's private directory that names the reaper which will remove it.
PID_FILE = "reaper.pid"
#: How long killed processes may take to be gone.
KILL_DEADLINE = 10.0
#: The largest message (a JSON object) either end sends.
_MESSAGE = 64 * 1024


# --------------------------------------------------------------------------------------------
# The client, in pytest
# --------------------------------------------------------------------------------------------


class Reaper:
    """pytest's end of the reaper: start it, tell it what to undo, and what is undone."""

    def __init__(self) -> None:
        value = f"{os.getpid()}-{uuid.uuid4().hex}"
        #: ``MARKER=value``: what every process of the session has in its environment.
        self.marker = f"{MARKER}={value}"
        os.environ[MARKER] = value
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), self.marker],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._link = ours
        self._keys = 0
        #: The reaper's pid.
        self.pid: int = self._proc.pid

    def _send(self, message: dict[str, Any], fds: Iterable[int] = ()) -> None:
        data = json.dumps(message).encode()
        try:
            socket.send_fds(self._link, [data], list(fds))
        except OSError as exc:
            raise RuntimeError(
                f"the test session's reaper (pid {self.pid}) is gone ({exc}): nothing would "
                "clean up after this session if it died"
            ) from None

    def _register(self, message: dict[str, Any], fds: Iterable[int] = ()) -> int:
        self._keys += 1
        self._send({"key": self._keys, **message}, fds)
        return self._keys

    def process(self, pid: int) -> int:
        """Kill ``pid`` (one of our children, so not reused yet) if the session dies."""
        fd = os.pidfd_open(pid)
        try:
            return self._register({"op": "process", "pid": pid}, [fd])
        finally:
            os.close(fd)

    def netns(self, name: str, root_link: str) -> int:
        """Kill what runs in namespace ``name``, delete ``root_link`` and the namespace."""
        return self._register({"op": "netns", "name": name, "link": root_link})

    def mentioning(self, text: str) -> int:
        """Kill every process whose command line or environment contains ``text``."""
        return self._register({"op": "mentioning", "text": text})

    def etc_hosts(self, mark: str) -> int:
        """Drop the lines of ``/etc/hosts`` that end with ``mark``."""
        return self._register({"op": "etc_hosts", "mark": mark})

    def directory(self, path: Path) -> int:
        """Remove ``path``; the reaper's pid is written into it (see :data:`PID_FILE`)."""
        (path / PID_FILE).write_text(f"{self.pid}\n")
        return self._register({"op": "directory", "path": str(path)})

    def forget(self, key: int) -> None:
        """What ``key`` registered has been undone by the session itself."""
        self._send({"op": "forget", "key": key})

    def end(self, timeout: float = 3 * KILL_DEADLINE) -> None:
        """End the session now, as its end would: the reaper undoes what is left, and exits.

        For scripts that use the fixtures' set-up outside pytest (``bench/scale.py``), so that
        the reaper is gone, its work done, before they exit.
        """
        self._link.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the reaper (pid {self.pid}) is still at work") from None


_session: Reaper | None = None


def session() -> Reaper:
    """The session's reaper, started on first use (``tests/conftest.py`` starts it at once)."""
    global _session
    if _session is None:
        _session = Reaper()
    return _session


def end_session() -> None:
    """End the session's reaper (see :meth:`Reaper.end`), if one was started."""
    global _session
    if _session is not None:
        reaper, _session = _session, None
        reaper.end()


def wait_for_reaper_of(directory: Path, deadline: float) -> bool:
    """Wait until the reaper named in ``directory`` (if any, and alive) is gone; ``False`` if not.

    The pid is checked to be a reaper (its command line runs this file) before it is waited for.
    """
    try:
        pid = int((directory / PID_FILE).read_text())
        fd = os.pidfd_open(pid)
    except (OSError, ValueError):
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if os.path.basename(__file__).encode() not in f.read():
                return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(deadline - time.monotonic(), 0) * 1000))
    except OSError:
        return True
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# The reaper itself
# --------------------------------------------------------------------------------------------


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(f"corral test reaper (pid {os.getpid()}): {message}\n")
        sys.stderr.flush()


def _receive(link: socket.socket) -> Iterator[tuple[dict[str, Any], list[int]]]:
    """The messages, until the other end closes."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(link, _MESSAGE, 4)
        except InterruptedError:
            continue
        except OSError as exc:
            _say(f"reading from the session failed: {exc}")
            return
        if not data:
            for fd in fds:
                os.close(fd)
            return
        try:
            message = json.loads(data)
            int(message["key"])
        except (ValueError, KeyError, TypeError):
            _say(f"a message it cannot read: {data[:200]!r}")
            for fd in fds:
                os.close(fd)
            continue
        yield message, fds


def _processes(skip: set[int]) -> Iterator[tuple[int, bytes, bytes]]:
    """Every live process but those in ``skip``: pid, command line, environment."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        yield int(entry), cmdline, environ


def _netns_pids(name: str) -> list[int]:
    if not Path("/run/netns", name).exists():
        return []
    done = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, check=False, timeout=10
    )
    return [int(pid) for pid in done.stdout.split()]


def _kill_all(pidfds: list[int], pids: Iterable[int]) -> None:
    """SIGKILL every process of ``pidfds`` and ``pids``; wait (on pidfds) until all are gone."""
    fds = list(pidfds)
    for pid in set(pids):
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:
            continue
    poller = select.poll()
    for fd in fds:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller.register(fd, select.POLLIN)
    waiting = set(fds)
    deadline = time.monotonic() + KILL_DEADLINE
    while waiting and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            waiting.discard(fd)
            poller.unregister(fd)
    if waiting:
        _say(f"{len(waiting)} processes still alive {KILL_DEADLINE} s after SIGKILL")


def _undo(action: dict[str, Any]) -> None:
    op = action["op"]
    if op == "netns":
        if Path("/sys/class/net", action["link"]).exists():
            subprocess.run(["ip", "link", "del", action["link"]], capture_output=True, timeout=10)
        if Path("/run/netns", action["name"]).exists():
            subprocess.run(["ip", "netns", "del", action["name"]], capture_output=True, timeout=10)
    elif op == "etc_hosts":
        with open("/etc/hosts", "r+") as f:  # rewritten in place: it is often a bind mount
            lines = f.read().splitlines(keepends=True)
            kept = [line for line in lines if not line.rstrip().endswith(action["mark"])]
            if kept != lines:
                f.seek(0)
                f.write("".join(kept))
                f.truncate()
    elif op == "directory":
        shutil.rmtree(action["path"], ignore_errors=True)


def _clean_up(
    marker: bytes, session: int, actions: dict[int, dict[str, Any]], pidfds: dict[int, int]
) -> None:
    texts = [a["text"].encode() for a in actions.values() if a["op"] == "mentioning"]
    pids = []
    for pid, cmdline, environ in _processes({os.getpid(), session}):
        if marker in environ.split(b"\0") or any(t in cmdline or t in environ for t in texts):
            pids.append(pid)
    for action in actions.values():
        if action["op"] == "netns":
            try:
                pids += _netns_pids(action["name"])
            except (OSError, subprocess.SubprocessError) as exc:
                _say(f"cannot list the processes of {action['name']}: {exc}")
    if pids or pidfds:
        _say(f"killing {len(pids) + len(pidfds)} processes the session left behind")
    _kill_all(list(pidfds.values()), pids)
    for key in sorted(actions, reverse=True):
        try:
            _undo(actions[key])
        except (OSError, subprocess.SubprocessError) as exc:
            _say(f"cannot undo {actions[key]}: {exc}")


def main(marker: str) -> None:
    session = os.getppid()  # pytest: gone, or going, when the cleanup starts
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    link = socket.socket(fileno=0)
    actions: dict[int, dict[str, Any]] = {}
    pidfds: dict[int, int] = {}
    for message, fds in _receive(link):
        key = int(message["key"])
        kept = None
        if message["op"] == "forget":
            actions.pop(key, None)
            fd = pidfds.pop(key, None)
            if fd is not None:
                os.close(fd)
        elif message["op"] == "process":
            if fds:
                kept = pidfds[key] = fds[0]
        else:
            actions[key] = message
        for fd in fds:
            if fd != kept:
                os.close(fd)
    _clean_up(marker.encode(), session, actions, pidfds)


if __name__ == "__main__":
    main(sys.argv[1])
