"""What stuck monitor clients cost a runner: time and memory of a flood with and without them.

Issue 15's targets: clients that connect to the monitor and then never read
must not slow a flood by more than 10%, however many (200 here), and must
cost the launcher a bounded amount of memory, per client and in total.  Each
repetition runs one child printing ``--lines`` lines of ``--length``
characters under a runner with a monitor, and times it from start until a
counting handler has every line.  Repetitions alternate between no client at
all (the baseline) and N stuck clients: raw sockets that complete the
WebSocket handshake with a 4 KiB receive buffer and then read nothing.
Medians of ``--reps`` pairs, each backend in a fresh interpreter.

Memory: for each number of stuck clients (0 included: the baseline), the
peak resident size of the launcher (``VmHWM``, reset through
``/proc/self/clear_refs``) during one flood of ``--big-lines`` lines of 16 KiB,
above what it held before; and the same for ``--huge-lines`` lines of 1 MiB,
under a runner whose monitor has no client at all against a runner with no
monitor (the baseline).  Each memory figure comes from a fresh interpreter.

Run it::

    python bench/monitor.py                # both backends, 21 pairs each, 1 and 200 clients
    python bench/monitor.py --markdown     # the tables for bench/RESULTS.md
    python bench/monitor.py --smoke        # tiny sizes: only checks that it runs (CI)
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

from _common import add_smoke, print_header, print_table  # bench/ is on sys.path
from _private import monitor_clients

BACKENDS = ("asyncio", "trio")

FLOOD = """
import os, sys
count, length = int(sys.argv[1]), int(sys.argv[2])
line = b"x" * (length - 1) + b"\\n"
per_write = max(1, 65536 // length)
block = line * per_write
written = 0
while written < count:
    n = min(per_write, count - written)
    os.write(1, block if n == per_write else line * n)
    written += n
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


def _peak_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def _reset_peak() -> int:
    """Reset the peak resident size; the resident size now (KiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    import corral

    counter = _Counter()
    counts = [int(n) for n in args.clients.split(",")]
    times: dict[str, list[float]] = {"0": [], **{str(n): [] for n in counts}}
    async with corral.open_runner(
        name="bench", monitor=True, console=False, handlers=[counter]
    ) as r:
        assert r.monitor_url is not None
        url = r.monitor_url

        async def burst(lines: int, length: int) -> float:
            counter.count, counter.target = 0, lines
            counter.done.clear()
            start = time.perf_counter()
            argv = [sys.executable, "-c", FLOOD, str(lines), str(length)]
            await r.run(argv, name="burst")
            await anyio.to_thread.run_sync(counter.done.wait)
            return time.perf_counter() - start

        async def until_clients(n: int) -> None:
            while monitor_clients(r) != n:
                await anyio.sleep(0.005)

        async def connect(n: int) -> list[socket.socket]:
            socks = await anyio.to_thread.run_sync(lambda: [_stuck_client(url) for _ in range(n)])
            await until_clients(n)
            await burst(args.lines, args.length)  # let every one of them get stuck
            return socks

        async def disconnect(socks: list[socket.socket]) -> None:
            for sock in socks:
                sock.close()
            await until_clients(0)

        await burst(args.lines, args.length)  # warm up
        for n in counts:
            for _ in range(args.reps):
                times["0"].append(await burst(args.lines, args.length))
                socks = await connect(n)
                times[str(n)].append(await burst(args.lines, args.length))
                await disconnect(socks)
    return {"times": times}


#: ``--memory`` values that are no number of stuck clients: floods of 1 MiB lines.
UNWATCHED, NO_MONITOR = -1, -2


async def _memory(args: argparse.Namespace) -> float:
    """In a fresh interpreter: the peak growth of one flood, with ``args.memory`` stuck
    clients (of 16 KiB lines), or (of 1 MiB lines) with a monitor nobody connects to
    (:data:`UNWATCHED`) or with no monitor at all (:data:`NO_MONITOR`)."""
    import anyio

    import corral

    stuck = args.memory
    monitor = stuck != NO_MONITOR
    async with corral.open_runner(name="bench", monitor=monitor, console=False) as r:
        url = r.monitor_url
        assert (url is not None) == monitor
        flood = [sys.executable, "-c", FLOOD]
        length = 16384 if stuck >= 0 else 1 << 20
        lines = args.big_lines if stuck >= 0 else args.huge_lines
        await r.run([*flood, str(max(lines // 10, 1)), str(length)])  # warm up
        socks = await anyio.to_thread.run_sync(
            lambda: [_stuck_client(url) for _ in range(max(stuck, 0)) if url]
        )
        while monitor and monitor_clients(r) != max(stuck, 0):
            await anyio.sleep(0.005)
        before = _reset_peak()
        await r.run([*flood, str(lines), str(length)])
        grown = (_peak_kib() - before) / 1024
        for sock in socks:
            sock.close()
    return grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--reps", type=int, default=21, help="pairs of bursts per count (21)")
    parser.add_argument("--lines", type=int, default=50_000, help="lines per burst (50,000)")
    parser.add_argument("--length", type=int, default=200, help="characters per line (200)")
    parser.add_argument("--clients", default="1,200", help="stuck clients, a list (1,200)")
    parser.add_argument(
        "--big-lines", type=int, default=20_000, help="lines of 16 KiB for memory (20,000)"
    )
    parser.add_argument(
        "--huge-lines", type=int, default=300, help="lines of 1 MiB for memory (300)"
    )
    parser.add_argument("--markdown", action="store_true", help="the tables in Markdown")
    parser.add_argument("--worker", action="store_true", help="one backend, JSON out")
    parser.add_argument("--memory", type=int, help="one memory figure, JSON out")
    add_smoke(parser, reps=1, lines=500, clients="3", big_lines=100, huge_lines=5)
    args = parser.parse_args()

    if args.worker or args.memory is not None:
        import anyio

        work = _measure if args.worker else _memory
        print(json.dumps(anyio.run(work, args, backend=args.backend)))
        return

    backends = BACKENDS if args.backend == "both" else (args.backend,)
    print_header("monitor: stuck clients during a flood", "monitor.py", ("anyio", "trio"))
    print()
    header = ("backend", "measure", "measured", "baseline", "ratio", "target", "met")
    rows: list[tuple[str, ...]] = []
    for backend in backends:
        out = subprocess.run(
            [
                *(sys.executable, __file__, "--worker", "--backend", backend),
                *("--reps", str(args.reps), "--lines", str(args.lines)),
                *("--length", str(args.length), "--clients", args.clients),
                *("--big-lines", str(args.big_lines)),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        times = result["times"]
        memory = {}
        for n in ["0", *args.clients.split(","), str(UNWATCHED), str(NO_MONITOR)]:
            out = subprocess.run(
                [
                    *(sys.executable, __file__, "--memory", n, "--backend", backend),
                    *("--big-lines", str(args.big_lines), "--huge-lines", str(args.huge_lines)),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            memory[n] = float(out.stdout.strip().splitlines()[-1])
        without = statistics.median(times["0"])
        for n in args.clients.split(","):
            with_stuck = statistics.median(times[n])
            ratio = with_stuck / without
            rows.append(
                (
                    backend,
                    f"{args.lines:,}-line flood with {n} stuck clients vs none "
                    f"(median of {args.reps})",
                    f"{with_stuck * 1000:.0f} ms",
                    f"{without * 1000:.0f} ms",
                    f"{ratio:.2f}",
                    "<= 1.10x",
                    "yes" if ratio <= 1.10 else "**NO**",
                )
            )
        for n in args.clients.split(","):
            grown = memory[n]
            rows.append(
                (
                    backend,
                    f"peak growth, {args.big_lines:,} lines of 16 KiB, {n} stuck clients vs none",
                    f"{grown:.1f} MiB",
                    f"{memory['0']:.1f} MiB",
                    f"{grown - memory['0']:+.1f} MiB",
                    "bounded",
                    "",
                )
            )
        unwatched, bare = memory[str(UNWATCHED)], memory[str(NO_MONITOR)]
        rows.append(
            (
                backend,
                f"peak growth, {args.huge_lines:,} lines of 1 MiB, a monitor nobody connects to "
                "vs no monitor",
                f"{unwatched:.1f} MiB",
                f"{bare:.1f} MiB",
                f"{unwatched - bare:+.1f} MiB",
                "bounded",
                "",
            )
        )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
