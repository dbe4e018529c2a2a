"""What a stuck monitor client costs a runner: a burst of lines with and without one.

Issue 12's target: a client that connects to the monitor and then never reads
must not slow a 20,000-record burst by more than 10%.  Each repetition runs
one child printing ``--lines`` lines of ``--length`` characters under a runner
with a monitor, and times it from start until a counting handler has every
line.  Repetitions alternate between no client at all (the baseline) and one
stuck client: a raw socket that completes the WebSocket handshake with a
4 KiB receive buffer and then reads nothing.  Medians of ``--reps`` pairs,
each backend in a fresh interpreter.

Run it::

    python bench/monitor.py                # both backends, 21 pairs each
    python bench/monitor.py --markdown     # the table for bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

from _common import print_table  # bench/ is on sys.path when a script runs

BACKENDS = ("asyncio", "trio")

FLOOD = """
import sys
count, length = int(sys.argv[1]), int(sys.argv[2])
pad = "x" * max(0, length - 7)
out = sys.stdout
for i in range(count):
    out.write(f"{i:06d} {pad}\\n")
"""


class _Counter(logging.Handler):
    """Counts the burst's lines; says when all are in."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.target = 0
        self.done = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "corral_source", "").endswith(".burst"):
            self.count += 1
            if self.count == self.target:
                self.done.set()


def _stuck_client(url: str) -> socket.socket:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((parts.hostname, parts.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        byte = sock.recv(1)
        if not byte:
            raise RuntimeError(f"the monitor closed the handshake: {head!r}")
        head += byte
    return sock


async def _measure(args: argparse.Namespace) -> dict[str, list[float]]:
    import anyio

    import corral

    counter = _Counter()
    times: dict[str, list[float]] = {"without": [], "with": []}
    async with corral.open_runner(
        name="bench", monitor=True, console=False, handlers=[counter]
    ) as r:
        assert r.monitor_url is not None
        monitor = r._monitor
        assert monitor is not None

        async def burst() -> float:
            counter.count, counter.target = 0, args.lines
            counter.done.clear()
            start = time.perf_counter()
            argv = [sys.executable, "-c", FLOOD, str(args.lines), str(args.length)]
            await r.run(argv, name="burst")
            await anyio.to_thread.run_sync(counter.done.wait)
            return time.perf_counter() - start

        async def until_clients(n: int) -> None:
            while len(monitor.clients()) != n:
                await anyio.sleep(0.005)

        await burst()  # warm up
        for _ in range(args.reps):
            times["without"].append(await burst())
            sock = await anyio.to_thread.run_sync(_stuck_client, r.monitor_url)
            await until_clients(1)
            times["with"].append(await burst())
            sock.close()
            await until_clients(0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--reps", type=int, default=21, help="pairs of bursts (21)")
    parser.add_argument("--lines", type=int, default=20_000, help="lines per burst")
    parser.add_argument("--length", type=int, default=200, help="characters per line")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    parser.add_argument("--worker", action="store_true", help="one backend, JSON out")
    args = parser.parse_args()

    if args.worker:
        import anyio

        print(json.dumps(anyio.run(_measure, args, backend=args.backend)))
        return

    backends = BACKENDS if args.backend == "both" else (args.backend,)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"# monitor: a stuck client during a burst  ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {load})"
    )
    print(f"# command: python bench/monitor.py {' '.join(sys.argv[1:])}".rstrip())
    header = ("backend", "measure", "measured", "baseline", "ratio", "target", "met")
    rows: list[tuple[str, ...]] = []
    for backend in backends:
        out = subprocess.run(
            [
                *(sys.executable, __file__, "--worker", "--backend", backend),
                *("--reps", str(args.reps), "--lines", str(args.lines)),
                *("--length", str(args.length)),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        times: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        with_stuck = statistics.median(times["with"])
        without = statistics.median(times["without"])
        ratio = with_stuck / without
        rows.append(
            (
                backend,
                f"{args.lines:,}-line burst with a stuck client vs none (median of {args.reps})",
                f"{with_stuck * 1000:.0f} ms",
                f"{without * 1000:.0f} ms",
                f"{ratio:.2f}",
                "<= 1.10x",
                "yes" if ratio <= 1.10 else "**NO**",
            )
        )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
