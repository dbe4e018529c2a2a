"""The lifeline's helper process: ``python -I -S _lifeline_helper.py`` (see :mod:`._lifeline`).

Run as a script of its own, never imported by the launcher: it imports
nothing but ``os`` and ``signal`` (and ``time`` once the launcher is gone),
so it starts in a few tens of milliseconds and costs a few megabytes.  Its
standard input is the runner's end of a socket pair; it reads the runner's
one-line notes until end-of-file, which means the runner's process is gone
(or the runner closed its end on a clean exit), then kills what is left and
exits.  The notes, and why each exists, are described in
:mod:`corral._sys._lifeline`.
"""

from __future__ import annotations

import os
import signal

#: What the helper ignores: it must outlive every stop signal the launcher's session gets.
IGNORED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
)
#: Seconds to look for announced children in ``/proc``, and for a cgroup to empty.
FIND_FOR = 2.0
#: Seconds between two looks.
LOOK_EVERY = 0.01


class Notes:
    """What the runner said: the live groups, the spawns in flight, folders and cgroups."""

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.pending: set[bytes] = set()
        self.folders: set[bytes] = set()
        self.cgroups: set[bytes] = set()

    def take(self, line: bytes) -> None:
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            pgid, _, n = rest.partition(b" ")
            self.groups.add(int(pgid))
            self.pending.discard(n)
        elif kind == b"-":
            self.groups.discard(int(rest))
        elif kind == b"?":
            self.pending.add(rest)
        elif kind == b"!":
            self.pending.discard(rest)
        elif kind == b"d":
            self.folders.add(rest)
        elif kind == b"g":
            self.cgroups.add(rest)
        elif kind == b"G":
            self.cgroups.discard(rest)


def read_until_gone(notes: Notes) -> None:
    """Take the runner's notes until its end of the socket pair is closed."""
    buffered = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError:
            return
        if not chunk:
            return
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            notes.take(line)


def kill_groups(groups: set[int]) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def kill_cgroups(cgroups: set[bytes]) -> None:
    for cgroup in cgroups:
        try:
            fd = os.open(cgroup + b"/cgroup.kill", os.O_WRONLY)
        except OSError:
            # No cgroup.kill (Linux < 5.14): each member (the launcher is gone,
            # nobody else can move them or reap them meanwhile but their parents).
            for directory, _, _ in os.walk(cgroup):
                try:
                    with open(directory + b"/cgroup.procs", "rb") as f:
                        pids = f.read().split()
                except OSError:
                    continue
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
            continue
        try:
            os.write(fd, b"1")
        except OSError:
            pass
        os.close(fd)


def kill_in_flight(marker: bytes, pending: set[bytes]) -> None:
    """Kill the announced children whose pid the runner never heard, found by their marker.

    ``marker`` is the runner's (``CORRAL_LIFELINE=<token>.``); child number
    *n* carries it followed by *n*, as one entry of its environment.

    A child being spawned shows its marker only once it has exec'd: between
    fork and exec its environment is still the launcher's.  So look again,
    briefly, until every spawn in flight is found (or had time to exec, or to
    fail).
    """
    import time

    wanted = {marker + n for n in pending}
    deadline = time.monotonic() + FIND_FOR
    while wanted and time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/" + entry + "/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            found = wanted.intersection(env)
            if found:
                wanted -= found
                pid = int(entry)
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        if wanted:
            time.sleep(LOOK_EVERY)


def remove_cgroups(cgroups: set[bytes]) -> None:
    """Wait (briefly) for each killed cgroup to empty, then remove it."""
    import time

    deadline = time.monotonic() + FIND_FOR
    for cgroup in cgroups:
        while time.monotonic() < deadline:
            try:
                with open(cgroup + b"/cgroup.events", "rb") as f:
                    if b"populated 1" not in f.read():
                        break
            except OSError:
                break
            time.sleep(LOOK_EVERY)
        try:
            for directory, _, _ in os.walk(cgroup, topdown=False):
                os.rmdir(directory)
        except OSError:
            pass


def remove_folders(folders: set[bytes]) -> None:
    for folder in folders:
        # The log socket's folder holds the socket alone: no shutil to import.
        try:
            for entry in os.scandir(folder):
                os.unlink(entry.path)
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:
            import shutil

            shutil.rmtree(os.fsdecode(folder), ignore_errors=True)


def main() -> None:
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    marker = os.environb[b"CORRAL_LIFELINE_MARKER"]
    notes = Notes()
    read_until_gone(notes)
    kill_groups(notes.groups)
    kill_cgroups(notes.cgroups)
    kill_in_flight(marker, notes.pending)
    if notes.cgroups:
        kill_cgroups(notes.cgroups)  # whatever a child caught in flight had forked meanwhile
        remove_cgroups(notes.cgroups)
    remove_folders(notes.folders)
    os._exit(0)


if __name__ == "__main__":
    main()
