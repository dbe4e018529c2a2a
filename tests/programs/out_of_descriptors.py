"""A runner that runs out of descriptors while log connections wait to be accepted.

``out_of_descriptors.py BACKEND WHEN``: eight raw log connections (hello and one record each)
wait in the runner's backlog; then every descriptor below the highest in use is taken and
the limit lowered to it, so the runner cannot accept (it warns).  The connections are then
closed (descriptors come back).  WHEN ``recover``: the runner stays open until it served all
eight; WHEN ``exit``: it is left at once, while its accept loop waits to retry.  It prints
the number of warnings and the first one's start, then the eight records' messages.  (In a
process of its own: it lowers its descriptor limit for good.)
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import anyio
import anyio.to_thread

import corral
from corral._logs._wire import PROTOCOL_VERSION, Hello, Record, encode

PROBE = "import os; print(os.environ['CORRAL_LOG_SOCKET']); print(os.environ['CORRAL_LOG_SECRET'])"


class Catch(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.records.append(record)
            self.changed.notify_all()

    def wait_for(self, text: str) -> bool:
        with self.changed:
            return self.changed.wait_for(
                lambda: any(text in r.getMessage() for r in self.records), 20
            )


async def main(when: str) -> None:
    catch = Catch()
    async with corral.open_runner(console=False, handlers=[catch]) as r:
        done = await r.run([sys.executable, "-c", PROBE], name="probe", stdout=subprocess.PIPE)
        assert done.stdout is not None
        path, secret = done.stdout.decode().split()
        clients = []
        for i in range(8):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            sock.sendall(
                encode(Hello(PROTOCOL_VERSION, secret, f"corral.c{i}", os.getpid()))
                + encode(Record(time.time(), 20, "INFO", "n", f"from {i}"))
            )
            sock.shutdown(socket.SHUT_WR)
            clients.append(sock)
        # Leave the runner no descriptor to accept with: fill every gap below the
        # highest descriptor in use, then make that the limit.
        fillers = []
        top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        while (fd := os.open(os.devnull, os.O_RDONLY)) < top:
            fillers.append(fd)
        os.close(fd)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
        blocked = await anyio.to_thread.run_sync(catch.wait_for, "cannot accept log connections")
        assert blocked, "no warning"
        for sock in clients:  # descriptors come back: the runner catches up
            sock.close()
        if when == "recover":
            # Served while the runner is open: accepting resumed.
            await anyio.to_thread.run_sync(catch.wait_for, "from 7")
        # else: leave at once, while accepting still waits to retry.
    got = sorted(
        r.getMessage() for r in catch.records if getattr(r, "corral_stream", None) == "logging"
    )
    warned = [r.getMessage() for r in catch.records if "cannot accept" in r.getMessage()]
    print(len(warned), warned[0].split(":")[0])
    print(" ".join(got))


if __name__ == "__main__":
    anyio.run(main, sys.argv[2], backend=sys.argv[1])
