"""The log path under load: a stdout flood, a logging-record burst and a logging call's cost.

Three jobs (``--targets``, any of ``f``, ``r`` and ``c``; all by default).  Every
corral variant runs next to baselines that do the same work in the same run, so that
drift on the shared machine cancels out.

**f, stdout flood** (``--lines``, 1,000,000).  One child prints ``line 0`` ...
``line N-1``.  ``--child`` picks how (a list; ``bytes`` by default):

``bytes``
    bytes written to its own ``open(1, "wb", buffering=1 << 16, closefd=False)``:
    block-buffered whatever ``PYTHONUNBUFFERED`` says (corral sets it for its
    children, and this machine's shell may set it too).
``loop``
    an f-string per line written to a text stream with a 1 MiB buffer on fd 1.
``blocks``
    ``os.write`` of pre-built 64 KiB blocks of 4,096 lines (numbered 0-4,095, again
    and again): the pipe's own speed.

The same child runs in every variant:

``corral files``
    ``open_runner(console=False, log_dir=tmp)``: every line goes to the child's own
    file and to ``combined.log``.
``corral console+files``
    ``open_runner(console=True, log_dir=tmp)``, the default console, with the
    launcher's file descriptor 2 pointed (``os.dup2``) at a file for the duration of
    the run: the console exactly as shipped (the runner's own ``ConsoleHandler`` on
    ``sys.stderr``, its per-record flush, whatever buffering ``sys.stderr`` has),
    landing in a file instead of a terminal, the case of ``python launcher.py 2> run.log``.
``corral handler``
    ``open_runner(console=False, handlers=[h])`` with one ``logging.Handler`` that
    counts the child's stdout records: every line as a ``LogRecord``.
``corral no handler``
    ``open_runner(console=False)`` and nothing else: what reading and splitting the
    pipe costs when no record is wanted (for reference; it writes nothing to count).
``fair drain`` (the baseline)
    ``anyio.open_process``, 64 KiB reads from the pipe, lines split from the bytes,
    each decoded and written as ``<YYYY-mm-dd HH:MM:SS.mmm> INFO     [stdout] <line>``
    (the time of its chunk) to a 64 KiB-buffered text file, on the loop thread: the
    job of ``corral files`` without ``combined.log``.
``raw drain``
    ``anyio.open_process``, 64 KiB reads, newlines counted and nothing written: how
    fast a loop can empty the pipe.
``subprocess.run``
    ``subprocess.run(argv, stdout=file)`` in a worker thread: the child writes the
    file itself.  The speed limit, the child's own speed.

Figures: **lines/s**, the lines found in the output (file(s), handler or count), from
opening the runner (or the file) until it is closed (files flushed and closed),
divided into that wall time.  Every output file is read back and must hold the
child's lines, each once and in order: the per-source file, ``combined.log`` and the
console file; the handler and the raw drain must count every line.  A variant that
loses, repeats or reorders a line is reported as FAILED, and the script exits with
status 1.  **Launcher CPU**: the change in ``resource.getrusage(RUSAGE_SELF)`` user +
system time over the same window, every thread of the launcher but not the children,
in seconds per 1M lines (= µs per line).  **Worst gap**: the largest gap between
wake-ups of a 1 ms ticker (``bench/_ticker.py``) in the launcher's loop during the
run, minus 1 ms.

**r, records burst** (``--children`` 4 x ``--records`` 50,000).  Each child runs a
tight loop of ``logging.info("record %d of %d", i, n)`` and times it:

``corral``
    each child calls ``corral.child.connect(logging.INFO)``; the launcher runs
    ``open_runner(console=False, log_dir=tmp)`` and concurrent ``r.run(...)`` calls.
    When every ``run`` has returned, the records already in the files are counted
    (outside the measured window): ``run`` returns only once the handlers have every
    record of its child.
``direct`` (the baseline)
    each child puts a ``logging.FileHandler`` on its own file (format
    ``%(asctime)s %(levelname)-8s %(name)s: %(message)s``); the launcher starts the
    children with ``anyio.open_process`` and waits for them.
``torchrunx``
    the design torchrunx uses (the stdlib logging cookbook's): each child puts a
    ``logging.handlers.SocketHandler`` (pickled records over TCP) on its root logger,
    with a record factory that tags every record with its source; a
    ``socketserver.ThreadingTCPServer`` in the launcher's own process
    (``serve_forever`` in a thread, one daemon thread per connection) unpickles
    every record with ``logging.makeLogRecord`` and hands it to that child's
    ``logging.FileHandler``.  As in torchrunx, the server is stopped as soon as the
    children have exited (torchrunx kills its log-server process; here every handler
    thread stops at its next record), and whatever was not written by then is lost.
    Its shutdown is not in the window.
``torchrunx drained`` (with ``--drained``)
    the same, but waiting until every connection has been read to its end before
    stopping the server, which torchrunx does not do.
``NullHandler floor``
    the same children with a ``logging.NullHandler``: the cost of the logging call
    itself under the same load (no records are written).

Figures: **records/s** end to end, from opening the runner (or creating the server,
or starting the first child) until the last child has exited and every file is
closed, counting the records in the per-source files.  For corral and direct each
file must hold ``record 0`` ... ``record N-1`` in order, and corral's
``combined.log`` must hold them all; anything missing is lost, and makes the script
exit with status 1.  torchrunx's losses are counted, not failures.  Also the **worst
ticker gap**, the **launcher's CPU per record**, and the **children's own time per
logging call** (wall and CPU) during the burst.

**c, the cost of one logging call** (``--cost-calls`` 50,000 per round,
``--cost-rounds`` 8).  One child started by a corral runner (``log_dir``, console off)
times its loop of logging calls with the root logger's handlers set in turn to
corral's connected handler, a ``logging.NullHandler`` and a ``SocketHandler`` to a
drained torchrunx-style server in the launcher, in alternating order (ABBA) in the
same process.  The figure is the median over rounds, in µs per call, wall and CPU.

Method: every backend runs in a fresh interpreter (``--worker``).  In it, every
variant is warmed up once with a small job (a 50th of the size), then the
repetitions alternate their order (ABBA) and the median over repetitions is
reported.  The worst gap shows the median of the per-repetition worsts (which
decides "met") and the maximum.  Per-repetition figures go to stderr as the script
runs; the tables go to stdout.  A missed target is reported, never an exit status.

Usage::

    python bench/logs.py --markdown                 # both backends, 5 reps (~15 min)
    python bench/logs.py --backend trio --targets f --reps 3
    python bench/logs.py --targets f --child bytes,loop,blocks
    python bench/logs.py --targets r --drained
    python bench/logs.py --smoke                    # tiny sizes: only checks that it runs (CI)
    PYTHONPATH=/tmp/bench-old/src python bench/logs.py --markdown   # a frozen copy

    # profile the launcher during one variant (the worker alone, a long run):
    py-spy record --threads --format raw -o flood.txt -- \\
        python bench/logs.py --worker --backend asyncio --targets f \\
        --only "corral files" --reps 3

Options: ``--backend asyncio|trio|both``, ``--targets`` (``frc``), ``--reps`` (5),
``--lines`` (1,000,000), ``--child`` (``bytes``), ``--records`` (50,000 per child),
``--children`` (4), ``--drained``, ``--cost-calls`` (50,000), ``--cost-rounds`` (8),
``--only`` (a comma-separated list of variant names to run; the baselines are then
not run unless named, so use it for profiling, not for tables), ``--markdown``.  The
header names the ``corral`` package that was measured: set ``PYTHONPATH`` to measure
another copy; child processes inherit it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import pickle
import re
import resource
import shutil
import socketserver
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from _common import add_smoke, format_table, print_header, run_workers  # bench/ is on sys.path
from _ticker import Ticker

BACKENDS = ("asyncio", "trio")

# Targets from the issues.
FLOOD_RATIO = 0.5  # corral lines/s >= 0.5 x the fair drain
CPU_PER_LINE_US = 2.0  # launcher CPU <= 2 us per line
MAX_GAP_MS = 10.0  # worst 1 ms-ticker gap <= 10 ms
RECORDS_RATIO = 0.8  # corral records/s >= 0.8 x direct
TORCHRUNX_RATIO = 1.5  # corral records/s >= 1.5 x torchrunx
CALL_RATIO = 1.5  # a logging call with corral's handler <= 1.5 x a NullHandler call

FILES, CONSOLE, HANDLER, BARE = (
    "corral files",
    "corral console+files",
    "corral handler",
    "corral no handler",
)
DRAIN, RAW, LIMIT = "fair drain", "raw drain", "subprocess.run"
FLOOD_VARIANTS = (FILES, CONSOLE, HANDLER, BARE, DRAIN, RAW, LIMIT)
JUDGED_FLOOD = (FILES, CONSOLE)  # what the targets are about
CHILDREN = ("bytes", "loop", "blocks")
BLOCK_LINES = 4096  # lines per block of the ``blocks`` child

CORRAL, DIRECT, TORCHRUNX, DRAINED, FLOOR = (
    "corral",
    "direct",
    "torchrunx",
    "torchrunx drained",
    "NullHandler floor",
)
COST = "cost"

RECORD_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"

# --------------------------------------------------------------------------------------
# the children (run as ``python -c CODE args...``)

FLOOD_CHILD = r"""
import os, sys
mode, n = sys.argv[1], int(sys.argv[2])
if mode == "bytes":
    # Block-buffered whatever PYTHONUNBUFFERED says: our own 64 KiB buffer on fd 1.
    out = open(1, "wb", buffering=1 << 16, closefd=False)
    w = out.write
    for i in range(n):
        w(b"line %d\n" % i)
    out.flush()
elif mode == "loop":
    out = open(1, "w", buffering=1 << 20, closefd=False)
    w = out.write
    for i in range(n):
        w(f"line {i}\n")
    out.flush()
elif mode == "blocks":
    per = int(sys.argv[3])
    block = b"".join(b"line %d\n" % i for i in range(per))
    full, rest = divmod(n, per)
    for _ in range(full):
        view = memoryview(block)
        while view:
            view = view[os.write(1, view):]
    view = memoryview(b"".join(b"line %d\n" % i for i in range(rest)))
    while view:
        view = view[os.write(1, view):]
else:
    raise SystemExit(f"unknown mode {mode}")
"""

RECORDS_CHILD = r"""
import json, logging, sys, time
mode, n, target, result, fmt = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
root = logging.getLogger()
if mode == "corral":
    import corral.child
    corral.child.connect(logging.INFO)
    if not root.handlers:
        raise SystemExit("corral.child.connect() added no handler: not started by corral?")
elif mode == "direct":
    handler = logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
elif mode == "socket":
    import logging.handlers
    port, source = target.split("/")
    # As torchrunx does: tag every record with its source through a record factory.
    factory = logging.getLogRecordFactory()
    def tagged(*args, **kwargs):
        record = factory(*args, **kwargs)
        record.bench_source = source
        return record
    logging.setLogRecordFactory(tagged)
    root.addHandler(logging.handlers.SocketHandler("127.0.0.1", int(port)))
    root.setLevel(logging.INFO)
elif mode == "null":
    root.addHandler(logging.NullHandler())  # no basicConfig(), no output: the floor
    root.setLevel(logging.INFO)
else:
    raise SystemExit(f"unknown mode {mode}")
info = logging.info
c0 = time.process_time()
t0 = time.perf_counter()
for i in range(n):
    info("record %d of %d", i, n)
t1 = time.perf_counter()
c1 = time.process_time()
with open(result, "w") as f:
    json.dump({"wall": t1 - t0, "cpu": c1 - c0, "n": n}, f)
"""

COST_CHILD = r"""
import json, logging, logging.handlers, statistics, sys, time
n, rounds, port, result = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import corral.child
root = logging.getLogger()
corral.child.connect(logging.INFO)
if not root.handlers:
    raise SystemExit("corral.child.connect() added no handler: not started by corral?")
handlers = {
    "corral": list(root.handlers),
    "null": [logging.NullHandler()],
    "socket": [logging.handlers.SocketHandler("127.0.0.1", port)],
}
info = logging.info
for hs in handlers.values():  # warm up: the socket's connection, the caches
    root.handlers = hs
    for i in range(min(n, 1000)):
        info("record %d of %d", i, n)
wall = {k: [] for k in handlers}
cpu = {k: [] for k in handlers}
names = list(handlers)
for k in range(rounds):
    for which in names if k % 2 == 0 else names[::-1]:
        root.handlers = handlers[which]
        c0 = time.process_time()
        t0 = time.perf_counter()
        for i in range(n):
            info("record %d of %d", i, n)
        wall[which].append((time.perf_counter() - t0) / n * 1e6)
        cpu[which].append((time.process_time() - c0) / n * 1e6)
root.handlers = handlers["corral"]
handlers["socket"][0].close()
with open(result, "w") as f:
    json.dump({k: {"wall": statistics.median(wall[k]), "cpu": statistics.median(cpu[k])}
               for k in handlers}, f)
"""


def flood_argv(child: str, n: int) -> list[str]:
    return [sys.executable, "-c", FLOOD_CHILD, child, str(n), str(BLOCK_LINES)]


def records_argv(mode: str, n: int, target: str, result: str) -> list[str]:
    return [sys.executable, "-c", RECORDS_CHILD, mode, str(n), target, result, RECORD_FORMAT]


# --------------------------------------------------------------------------------------
# checking what arrived

_LINE = re.compile(rb"(?m)\bline (\d+)$")
_RECORD = re.compile(rb"(?m)\broot: record (\d+) of \d+$")
_expected: dict[tuple[int, int], list[bytes]] = {}


def expected(n: int, period: int = 0) -> list[bytes]:
    """``0`` .. ``n-1`` as bytes; modulo ``period`` if one is given."""
    if (n, period) not in _expected:
        _expected.clear()
        _expected[n, period] = [b"%d" % (i % period if period else i) for i in range(n)]
    return _expected[n, period]


def check_sequence(numbers: list[bytes], want: list[bytes], what: str) -> str | None:
    """None if ``numbers`` is ``want``; else what is wrong."""
    if numbers == want:
        return None
    for i, (got, exp) in enumerate(zip(numbers, want, strict=False)):
        if got != exp:
            return f"{what}: item {i} is {got.decode()}, expected {exp.decode()}"
    return f"{what}: {len(numbers):,} items, expected {len(want):,}"


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def log_files(folder: str) -> tuple[list[str], str | None]:
    """The per-source ``*.log`` files under ``folder``, and ``combined.log`` if there is one."""
    sources: list[str] = []
    combined: str | None = None
    for parent, _, names in os.walk(folder):
        for name in sorted(names):
            if not name.endswith(".log"):
                continue
            if name == "combined.log":
                combined = os.path.join(parent, name)
            else:
                sources.append(os.path.join(parent, name))
    return sources, combined


def check_flood(
    want: list[bytes], *, log_dir: str | None = None, files: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    """Lines counted, and every problem found, in the outputs of one flood run.

    With ``log_dir``: exactly one per-source file must hold the child's lines, and so
    must ``combined.log``.  Every file in ``files`` must hold them as well.  The count
    is the smallest number of lines found in any of those files.
    """
    problems: list[str] = []
    counts: list[int] = []
    if log_dir is not None:
        sources, combined = log_files(log_dir)
        holding = []
        for path in sources:
            numbers = _LINE.findall(read(path))
            if numbers:
                holding.append((path, numbers))
        if len(holding) != 1:
            names = [os.path.basename(p) for p, _ in holding]
            problems.append(f"stdout lines found in {len(holding)} per-source files: {names}")
        for path, numbers in holding:
            counts.append(len(numbers))
            if (bad := check_sequence(numbers, want, os.path.basename(path))) is not None:
                problems.append(bad)
        if combined is None:
            problems.append("no combined.log")
            counts.append(0)
        else:
            numbers = _LINE.findall(read(combined))
            counts.append(len(numbers))
            if (bad := check_sequence(numbers, want, "combined.log")) is not None:
                problems.append(bad)
    for path in files:
        numbers = _LINE.findall(read(path)) if os.path.exists(path) else []
        counts.append(len(numbers))
        if (bad := check_sequence(numbers, want, os.path.basename(path))) is not None:
            problems.append(bad)
    return (min(counts) if counts else 0), problems


def check_records(
    children: int, n: int, sources: list[str], combined: str | None
) -> tuple[int, list[str]]:
    """Records counted in the per-source files (in order), and every problem found."""
    problems: list[str] = []
    found = 0
    holding = 0
    for path in sources:
        numbers = _RECORD.findall(read(path))
        if not numbers:
            continue
        holding += 1
        if (bad := check_sequence(numbers, expected(n), os.path.basename(path))) is not None:
            problems.append(bad)
            found += sum(1 for a, b in zip(numbers, expected(n), strict=False) if a == b)
        else:
            found += n
    if holding != children:
        problems.append(f"records found in {holding} files, expected {children}")
    if combined is not None:
        total = len(_RECORD.findall(read(combined)))
        if total != children * n:
            problems.append(f"combined.log holds {total:,} records, expected {children * n:,}")
    return found, problems


def count_records(paths: list[str]) -> int:
    """Records in ``paths``, in any order (for what may lose some)."""
    return sum(len(_RECORD.findall(read(p))) for p in paths if os.path.exists(p))


# --------------------------------------------------------------------------------------
# measuring (inside a worker process)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Window:
    """The measured window of one run: what a body does ``outside`` it is not counted."""

    def __init__(self, ticker: Ticker) -> None:
        self._ticker = ticker
        self.wall = 0.0
        self.cpu = 0.0
        self.marks: dict[str, float] = {}

    def outside(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` (blocking, on the loop) without counting its time, or its loop gap."""
        c0, t0 = cpu_seconds(), time.perf_counter()
        try:
            return fn()
        finally:
            self.wall += time.perf_counter() - t0
            self.cpu += cpu_seconds() - c0
            self._ticker.skip()

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()


async def measured(body: Callable[[Window], Awaitable[None]]) -> dict[str, Any]:
    """Run ``body`` beside a 1 ms ticker: wall and launcher CPU seconds, worst gap."""
    import anyio

    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        window = Window(ticker)
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        await body(window)
        wall = time.perf_counter() - t0 - window.wall
        cpu = cpu_seconds() - c0 - window.cpu
        tg.cancel_scope.cancel()
    return {"wall": wall, "cpu": cpu, "stall": ticker.worst, "t0": t0, "marks": window.marks}


@contextlib.contextmanager
def stderr_to(path: str) -> Iterator[None]:
    """Point file descriptor 2 (and so ``sys.stderr``) at ``path`` for a while."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


_stamp_cache: tuple[int, str] = (-1, "")


def stamp(now: float) -> str:
    """``YYYY-mm-dd HH:MM:SS.mmm``, the text of the second cached (as corral does)."""
    global _stamp_cache
    second = int(now)
    if _stamp_cache[0] != second:
        _stamp_cache = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)))
    return f"{_stamp_cache[1]}.{int((now - second) * 1000):03d}"


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


# -- the stdout flood ------------------------------------------------------------------


class CountingHandler(logging.Handler):
    """Counts the records of the child's stdout."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "corral_stream", None) == "stdout":
            self.lines += 1


def want_lines(child: str, n: int) -> list[bytes]:
    return expected(n, BLOCK_LINES if child == "blocks" else 0)


async def flood_corral(tmp: str, child: str, n: int, variant: str) -> dict[str, Any]:
    import corral

    log_dir = os.path.join(tmp, "logs")
    console_file = os.path.join(tmp, "console.txt")
    counter = CountingHandler()
    options: dict[str, Any] = {}
    if variant in (FILES, CONSOLE):
        options["log_dir"] = log_dir
    if variant == HANDLER:
        options["handlers"] = [counter]

    async def body(_: Window) -> None:
        async with corral.open_runner(name="bench", console=variant == CONSOLE, **options) as r:
            await r.run(flood_argv(child, n))

    want = want_lines(child, n)
    if variant == CONSOLE:
        with stderr_to(console_file):
            result = await measured(body)
        lines, problems = check_flood(want, log_dir=log_dir, files=(console_file,))
    elif variant == FILES:
        result = await measured(body)
        lines, problems = check_flood(want, log_dir=log_dir)
    elif variant == HANDLER:
        result = await measured(body)
        lines = counter.lines
        problems = [] if lines == n else [f"the handler got {lines:,} lines of {n:,}"]
    else:
        result = await measured(body)
        lines, problems = n, []  # nothing written anywhere: nothing to count
    return result | {"lines": lines, "problems": problems, "counted": variant != BARE}


async def flood_drain(tmp: str, child: str, n: int) -> dict[str, Any]:
    import anyio

    path = os.path.join(tmp, "drain.log")

    async def body(_: Window) -> None:
        with open(path, "w", encoding="utf-8", buffering=1 << 16) as f:
            write = f.write
            async with await anyio.open_process(
                flood_argv(child, n), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None
            ) as proc:
                assert proc.stdout is not None
                pending = b""
                while True:
                    try:
                        chunk = await proc.stdout.receive(65536)
                    except anyio.EndOfStream:
                        break
                    lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
                    pending = lines.pop()
                    head = f"{stamp(time.time())} INFO     [stdout] "
                    for line in lines:
                        write(f"{head}{line.decode('utf-8', 'replace')}\n")
                if pending:
                    write(f"{stamp(time.time())} INFO     [stdout] {pending.decode()}\n")
                await proc.wait()

    result = await measured(body)
    lines, problems = check_flood(want_lines(child, n), files=(path,))
    return result | {"lines": lines, "problems": problems, "counted": True}


async def flood_raw(child: str, n: int) -> dict[str, Any]:
    import anyio

    count = 0

    async def body(_: Window) -> None:
        nonlocal count
        async with await anyio.open_process(
            flood_argv(child, n), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None
        ) as proc:
            assert proc.stdout is not None
            while True:
                try:
                    chunk = await proc.stdout.receive(65536)
                except anyio.EndOfStream:
                    break
                count += chunk.count(b"\n")
            await proc.wait()

    result = await measured(body)
    problems = [] if count == n else [f"counted {count:,} lines of {n:,}"]
    return result | {"lines": count, "problems": problems, "counted": True}


async def flood_limit(tmp: str, child: str, n: int) -> dict[str, Any]:
    import anyio.to_thread

    path = os.path.join(tmp, "limit.out")

    async def body(_: Window) -> None:
        with open(path, "wb") as f:
            run = functools.partial(subprocess.run, flood_argv(child, n), stdout=f, check=True)
            await anyio.to_thread.run_sync(run)

    result = await measured(body)
    lines, problems = check_flood(want_lines(child, n), files=(path,))
    return result | {"lines": lines, "problems": problems, "counted": True}


async def flood_once(variant: str, child: str, n: int) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="corral-bench-logs-")
    try:
        if variant == DRAIN:
            return await flood_drain(tmp, child, n)
        if variant == RAW:
            return await flood_raw(child, n)
        if variant == LIMIT:
            return await flood_limit(tmp, child, n)
        return await flood_corral(tmp, child, n, variant)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the torchrunx-style log server ----------------------------------------------------


class LogServer:
    """``SocketHandler`` records -> ``ThreadingTCPServer`` in this process -> files.

    The logging cookbook's receiver, which torchrunx's is: read a 4-byte length, then
    the pickle, ``makeLogRecord``, hand it to the file of the record's source (its
    ``bench_source``; untagged records go to the file of source ``""``).
    :meth:`kill` stops every connection at its next record, as killing torchrunx's
    log-server process does.
    """

    def __init__(self, files: dict[str, str]) -> None:
        formatter = logging.Formatter(RECORD_FORMAT)
        self.handlers: dict[str, logging.Handler] = {}
        for source, path in files.items():
            handler = logging.FileHandler(path, encoding="utf-8")
            handler.setFormatter(formatter)
            self.handlers[source] = handler
        self.killed = False
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        server = self

        class RecordStreamHandler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with server.lock:
                    server.threads.append(threading.current_thread())
                conn = self.connection
                while not server.killed:
                    chunk = conn.recv(4)
                    if len(chunk) < 4:
                        break
                    slen = struct.unpack(">L", chunk)[0]
                    chunk = conn.recv(slen)
                    while len(chunk) < slen:
                        chunk = chunk + conn.recv(slen - len(chunk))
                    record = logging.makeLogRecord(pickle.loads(chunk))
                    if server.killed:  # the log server is gone: nothing more is written
                        break
                    server.handlers[getattr(record, "bench_source", "")].handle(record)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.tcp = Server(("127.0.0.1", 0), RecordStreamHandler)
        self.port: int = self.tcp.server_address[1]
        # A short poll interval: only shutdown() waits on it, outside the measured window.
        self.serving = threading.Thread(
            target=self.tcp.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.serving.start()

    def drained(self, connections: int) -> bool:
        """Whether ``connections`` connections came and have all been read to their end."""
        with self.lock:
            return len(self.threads) >= connections and not any(t.is_alive() for t in self.threads)

    def kill(self) -> None:
        self.killed = True

    def close(self) -> None:
        """Stop serving, join every thread, close the files (blocking)."""
        self.killed = True
        self.tcp.shutdown()
        self.tcp.server_close()
        self.serving.join()
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join()
        for h in self.handlers.values():
            h.close()


# -- the records burst -----------------------------------------------------------------


async def records_corral(tmp: str, children: int, n: int) -> dict[str, Any]:
    import anyio

    import corral

    log_dir = os.path.join(tmp, "logs")
    results = [os.path.join(tmp, f"cost{i}.json") for i in range(children)]
    at_return = 0

    async def body(window: Window) -> None:
        nonlocal at_return
        async with corral.open_runner(name="bench", console=False, log_dir=log_dir) as r:
            window.mark("opened")
            async with anyio.create_task_group() as tg:
                for i in range(children):
                    argv = records_argv("corral", n, "-", results[i])
                    tg.start_soon(functools.partial(r.run, argv, name=f"c{i}"))
            assert r.log_path is not None
            sources = window.outside(lambda: log_files(r.log_path or "")[0])
            at_return = window.outside(lambda: count_records(sources))
            window.mark("closing")

    result = await measured(body)
    closed = time.perf_counter()
    sources, combined = log_files(log_dir)
    found, problems = check_records(children, n, sources, combined)
    if combined is None:
        problems.append("no combined.log")
    marks = result.pop("marks")
    return result | {
        "found": found,
        "lost": children * n - found,
        "late": found - at_return,  # not in the files yet when every run() had returned
        "problems": problems,
        "children": [read_json(p) for p in results],
        "open": marks["opened"] - result["t0"],
        "close": closed - marks["closing"],
    }


async def records_children(tmp: str, mode: str, children: int, n: int) -> dict[str, Any]:
    """The ``direct`` baseline, or (``null``) the NullHandler floor."""
    import anyio

    files = [os.path.join(tmp, f"direct{i}.log") for i in range(children)]
    results = [os.path.join(tmp, f"cost{i}.json") for i in range(children)]

    async def body(_: Window) -> None:
        procs = [
            await anyio.open_process(
                records_argv(mode, n, files[i], results[i]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,
            )
            for i in range(children)
        ]
        for p in procs:
            code = await p.wait()
            await p.aclose()
            if code != 0:
                raise RuntimeError(f"a {mode} child exited with {code}")

    result = await measured(body)
    result.pop("marks")
    found, problems = 0, list[str]()
    if mode != "null":
        found, problems = check_records(children, n, files, None)
    return result | {
        "found": found,
        "lost": children * n - found if mode != "null" else 0,
        "problems": problems,
        "children": [read_json(p) for p in results],
    }


async def records_torchrunx(tmp: str, children: int, n: int, *, drained: bool) -> dict[str, Any]:
    import anyio
    import anyio.to_thread

    files = {f"b{i}": os.path.join(tmp, f"b{i}.log") for i in range(children)}
    results = [os.path.join(tmp, f"cost{i}.json") for i in range(children)]
    servers: list[LogServer] = []

    async def body(_: Window) -> None:
        server = LogServer(files)
        servers.append(server)
        procs = [
            await anyio.open_process(
                records_argv("socket", n, f"{server.port}/b{i}", results[i]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,
            )
            for i in range(children)
        ]
        for p in procs:
            code = await p.wait()
            await p.aclose()
            if code != 0:
                raise RuntimeError(f"a torchrunx child exited with {code}")
        if drained:
            # Not torchrunx: wait until every connection has been read to its end.
            while not server.drained(children):
                await anyio.sleep(0.001)
        server.kill()  # the log server is gone from here on

    try:
        result = await measured(body)
    finally:
        for server in servers:
            await anyio.to_thread.run_sync(server.close)
    result.pop("marks")
    found = count_records(list(files.values()))
    return result | {
        "found": found,
        "lost": children * n - found,
        "problems": [],  # losses are this design's, not a failure of the benchmark
        "children": [read_json(p) for p in results],
    }


async def cost_once(tmp: str, calls: int, rounds: int) -> dict[str, Any]:
    import anyio.to_thread

    import corral

    path = os.path.join(tmp, "cost.json")
    server = LogServer({"": os.path.join(tmp, "socket.log")})
    try:
        argv = [sys.executable, "-c", COST_CHILD, str(calls), str(rounds), str(server.port), path]
        async with corral.open_runner(
            name="bench", console=False, log_dir=os.path.join(tmp, "logs")
        ) as r:
            await r.run(argv)
    finally:
        await anyio.to_thread.run_sync(server.close)
    costs: dict[str, Any] = read_json(path)
    return costs | {"problems": []}


async def records_once(variant: str, args: argparse.Namespace, scale: int = 1) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="corral-bench-logs-")
    children, n = args.children, max(args.records // scale, 1)
    try:
        if variant == CORRAL:
            return await records_corral(tmp, children, n)
        if variant == DIRECT:
            return await records_children(tmp, "direct", children, n)
        if variant == FLOOR:
            return await records_children(tmp, "null", children, n)
        if variant in (TORCHRUNX, DRAINED):
            return await records_torchrunx(tmp, children, n, drained=variant == DRAINED)
        return await cost_once(tmp, max(args.cost_calls // scale, 1), args.cost_rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the worker ------------------------------------------------------------------------


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _report(backend: str, job: str, rep: str, variant: str, res: dict[str, Any]) -> None:
    if job.startswith("flood"):
        detail = (
            f"{res['wall']:.2f} s, {res['lines'] / res['wall'] / 1e6:.3f} M lines/s, "
            f"CPU {res['cpu']:.2f} s, worst gap {res['stall'] * 1000:.1f} ms"
        )
    elif variant == COST:
        detail = ", ".join(f"{k} {v['wall']:.2f} us/call" for k, v in res.items() if k in _HANDLERS)
    else:
        detail = (
            f"{res['wall']:.2f} s, {res['found'] / res['wall'] / 1e3:.1f} k records/s, "
            f"{res['lost']} lost, CPU {res['cpu']:.2f} s, worst gap {res['stall'] * 1000:.1f} ms"
        )
    _say(f"  [{backend}] {job} {rep} {variant}: {detail}")
    for problem in res["problems"]:
        _say(f"  [{backend}] FAILED {job} {variant}: {problem}")


_HANDLERS = {
    "null": "NullHandler (the floor)",
    "corral": "corral's handler",
    "socket": "SocketHandler (torchrunx)",
}

Job = tuple[str, str, tuple[str, ...], Callable[[str, int], Awaitable[dict[str, Any]]]]


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    only = {v.strip() for v in args.only.split(",")} if args.only else None
    out: dict[str, Any] = {}
    jobs: list[Job] = []
    if "f" in args.targets:
        for child in args.child:

            def flood(v: str, scale: int, child: str = child) -> Awaitable[dict[str, Any]]:
                return flood_once(v, child, max(args.lines // scale, 1))

            jobs.append(("flood", child, FLOOD_VARIANTS, flood))
    if "r" in args.targets:
        burst = (CORRAL, DIRECT, TORCHRUNX, *((DRAINED,) if args.drained else ()), FLOOR)
        jobs.append(("records", "", burst, lambda v, scale: records_once(v, args, scale)))
    if "c" in args.targets:
        jobs.append(("cost", "", (COST,), lambda v, scale: records_once(v, args, scale)))
    for job, child, all_variants, run in jobs:
        variants = [v for v in all_variants if only is None or v in only or v == COST]
        name = f"{job} {child}".strip()
        if not args.smoke:  # a smoke run checks every variant once, cold
            for v in variants:  # warm up: imports, the page cache, worker threads
                await run(v, 50)
        res: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rep in range(args.reps):
            order = variants if rep % 4 in (0, 3) else variants[::-1]
            for v in order:
                gc.collect()
                r = await run(v, 1)
                res[v].append(r)
                _report(args.backend, name, f"rep {rep + 1}/{args.reps}", v, r)
        if job == "flood":
            out.setdefault("flood", {})[child] = res
        else:
            out[job] = res
    return out


def _worker_main(args: argparse.Namespace) -> None:
    import anyio

    result = anyio.run(worker, args, backend=args.backend)
    print(json.dumps(result))


# --------------------------------------------------------------------------------------
# the tables


def _rate(x: float) -> str:
    return f"{x / 1e6:.3f} M/s" if x >= 1e6 / 2 else f"{x / 1e3:.1f} k/s"


def _gap(xs: list[dict[str, Any]]) -> str:
    stalls = [x["stall"] * 1000 for x in xs]
    return f"{statistics.median(stalls):.1f} ms (max {max(stalls):.1f})"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


FLOOD_HEADER = ["backend", "child", "variant", "measure", "measured", "fair drain", "ratio"]
FLOOD_HEADER += ["target", "met"]


def flood_rows(
    backend: str, child: str, res: dict[str, list[dict[str, Any]]], n: int, failures: list[str]
) -> list[list[str]]:
    med = statistics.median
    rows: list[list[str]] = []
    base = res.get(DRAIN)
    b_rate = med(x["lines"] / x["wall"] for x in base) if base else 0.0
    b_cpu = med(x["cpu"] / n * 1e6 for x in base) if base else 0.0
    b_gap = med(x["stall"] * 1000 for x in base) if base else 0.0
    for variant in FLOOD_VARIANTS:
        xs = res.get(variant)
        if not xs:
            continue
        bad = [p for x in xs for p in x["problems"]]
        failures += [f"{backend} flood {child} {variant}: {p}" for p in bad]
        rate = med(x["lines"] / x["wall"] for x in xs)
        cpu = med(x["cpu"] / n * 1e6 for x in xs)
        gap = med(x["stall"] * 1000 for x in xs)
        judged = variant in JUDGED_FLOOD
        note = "" if not bad else " FAILED: lines lost or out of order"
        if not xs[0]["counted"]:
            note = " (nothing written; not counted)"
        first = [backend, child, variant]
        rows.append(
            [
                *first,
                f"lines/s (median of {len(xs)}){note}",
                _rate(rate),
                _rate(b_rate) if base else "-",
                _ratio(rate, b_rate),
                f">= {FLOOD_RATIO}x drain" if judged else "",
                _yes(rate >= FLOOD_RATIO * b_rate and not bad) if judged and base else "",
            ]
        )
        rows.append(
            [
                *first,
                "launcher CPU, s per 1M lines (= µs/line)",
                f"{cpu:.2f}",
                f"{b_cpu:.2f}" if base else "-",
                _ratio(cpu, b_cpu),
                f"<= {CPU_PER_LINE_US:g}" if judged else "",
                _yes(cpu <= CPU_PER_LINE_US) if judged else "",
            ]
        )
        rows.append(
            [
                *first,
                "worst 1 ms-ticker gap, median of reps (max)",
                _gap(xs),
                _gap(base) if base else "-",
                _ratio(gap, b_gap),
                f"<= {MAX_GAP_MS:g} ms" if judged else "",
                _yes(gap <= MAX_GAP_MS) if judged else "",
            ]
        )
    return rows


def records_table(
    backend: str,
    res: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
    failures: list[str],
) -> tuple[list[str], list[list[str]]]:
    """The burst's table: one column per variant, corral's ratios to direct and torchrunx."""
    med = statistics.median
    total = args.children * args.records
    for variant, xs in res.items():
        for x in xs:
            failures += [f"{backend} records {variant}: {p}" for p in x["problems"]]
    variants = [v for v in (CORRAL, DIRECT, TORCHRUNX, DRAINED, FLOOR) if res.get(v)]
    header = ["backend", "measure", *variants, "vs direct", "vs torchrunx", "target", "met"]

    def figure(variant: str, fn: Callable[[list[dict[str, Any]]], float]) -> float | None:
        xs = res.get(variant)
        return fn(xs) if xs else None

    def row(
        measure: str,
        fn: Callable[[list[dict[str, Any]]], float],
        fmt: Callable[[float], str],
        *,
        skip: tuple[str, ...] = (),
        ratios: bool = True,
        target: str = "",
        ok: Callable[[float, float | None, float | None], bool | None] | None = None,
    ) -> list[str]:
        values = {v: None if v in skip else figure(v, fn) for v in variants}
        c, d, t = values.get(CORRAL), values.get(DIRECT), values.get(TORCHRUNX)
        verdict = None if ok is None or c is None else ok(c, d, t)
        met = "" if verdict is None else _yes(verdict)
        return [
            backend,
            measure,
            *("" if values[v] is None else fmt(values[v] or 0.0) for v in variants),
            _ratio(c, d) if ratios and c is not None and d else "",
            _ratio(c, t) if ratios and c is not None and t else "",
            target,
            met,
        ]

    def per_call(key: str) -> Callable[[list[dict[str, Any]]], float]:
        return lambda xs: med(k[key] / k["n"] * 1e6 for x in xs for k in x["children"])

    def ms(x: float) -> str:
        return f"{x * 1000:.1f} ms"

    rows = [
        row(
            f"records/s end to end (median of {args.reps})",
            lambda xs: med(x["found"] / x["wall"] for x in xs),
            _rate,
            skip=(FLOOR,),
            target=f">= {RECORDS_RATIO}x direct, >= {TORCHRUNX_RATIO}x torchrunx",
            # judged only against both baselines
            ok=lambda c, d, t: (
                None
                if d is None or t is None
                else c >= RECORDS_RATIO * d and c >= TORCHRUNX_RATIO * t
            ),
        ),
        row(
            f"records lost, sum over reps (of {total * args.reps:,})",
            lambda xs: sum(x["lost"] for x in xs),
            lambda x: f"{x:,.0f}",
            skip=(FLOOR,),
            ratios=False,
            target="0 (corral)",
            ok=lambda c, d, t: c == 0,
        ),
    ]
    if res.get(CORRAL):
        rows.append(
            row(
                "of them not yet in the files when every run() had returned",
                lambda xs: sum(x["late"] for x in xs),
                lambda x: f"{x:,.0f}",
                skip=tuple(v for v in variants if v != CORRAL),
                target="0",
                ok=lambda c, d, t: c == 0,
            )
        )
    rows += [
        row(
            "worst 1 ms-ticker gap, median of reps (ms)",
            lambda xs: med(x["stall"] * 1000 for x in xs),
            lambda x: f"{x:.1f}",
            target=f"<= {MAX_GAP_MS:g} ms",
            ok=lambda c, d, t: c <= MAX_GAP_MS,
        ),
        row(
            "worst 1 ms-ticker gap, max over reps (ms)",
            lambda xs: max(x["stall"] * 1000 for x in xs),
            lambda x: f"{x:.1f}",
        ),
        row(
            "launcher CPU, µs per record",
            lambda xs: med(x["cpu"] / total * 1e6 for x in xs),
            lambda x: f"{x:.2f}",
        ),
        row("child wall µs per logging call", per_call("wall"), lambda x: f"{x:.2f}"),
        row("child CPU µs per logging call", per_call("cpu"), lambda x: f"{x:.2f}"),
    ]
    if res.get(CORRAL):
        rows.append(
            row(
                "runner open / close (median; in the window)",
                lambda xs: med(x["open"] for x in xs),
                lambda x: f"{ms(x)} / {ms(med(x['close'] for x in res[CORRAL]))}",
                skip=tuple(v for v in variants if v != CORRAL),
            )
        )
    return header, rows


COST_HEADER = ["backend", "handler", "wall µs/call", "CPU µs/call", "wall vs NullHandler"]
COST_HEADER += ["target", "met"]


def cost_rows(backend: str, xs: list[dict[str, Any]]) -> list[list[str]]:
    med = statistics.median
    floor = med(x["null"]["wall"] for x in xs)
    rows = []
    for key, label in _HANDLERS.items():
        wall = med(x[key]["wall"] for x in xs)
        cpu = med(x[key]["cpu"] for x in xs)
        judged = key == "corral"
        rows.append(
            [
                backend,
                label,
                f"{wall:.2f}",
                f"{cpu:.2f}",
                _ratio(wall, floor),
                f"<= {CALL_RATIO}x NullHandler" if judged else "",
                _yes(wall <= CALL_RATIO * floor) if judged else "",
            ]
        )
    return rows


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument(
        "--targets", default="frc", help="f: stdout flood, r: records burst, c: cost of a call"
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each variant (5)")
    parser.add_argument("--lines", type=int, default=1_000_000, help="flood: stdout lines")
    parser.add_argument(
        "--child", default="bytes", help=f"flood: the children, any of {','.join(CHILDREN)}"
    )
    parser.add_argument("--records", type=int, default=50_000, help="burst: records per child")
    parser.add_argument("--children", type=int, default=4, help="burst: children (4)")
    parser.add_argument(
        "--drained", action="store_true", help="burst: also torchrunx waiting for every EOF"
    )
    parser.add_argument("--cost-calls", type=int, default=50_000, help="cost: calls per round")
    parser.add_argument("--cost-rounds", type=int, default=8, help="cost: rounds (8)")
    parser.add_argument(
        "--only", default="", help="comma-separated variant names to run (for profiling)"
    )
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    parser.add_argument("--worker", action="store_true", help="run one backend, print JSON")
    add_smoke(
        parser,
        reps=1,
        lines=2000,
        child="bytes,blocks",
        records=200,
        children=2,
        drained=True,
        cost_calls=200,
        cost_rounds=2,
    )
    args = parser.parse_args()
    args.child = [c.strip() for c in args.child.split(",") if c.strip()]
    if unknown := set(args.child) - set(CHILDREN):
        parser.error(f"unknown --child {', '.join(sorted(unknown))}")
    if args.worker:
        if args.backend == "both":
            parser.error("--worker needs --backend asyncio or --backend trio")
        _worker_main(args)
        return

    print_header("corral log path benchmarks", "logs.py", ("anyio", "trio", "msgspec"))
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    results: dict[str, dict[str, Any]] = run_workers(os.path.abspath(__file__), backends)

    md = args.markdown
    failures: list[str] = []
    if "f" in args.targets:
        rows = []
        for backend in backends:
            for child in args.child:
                res = results[backend]["flood"][child]
                rows += flood_rows(backend, child, res, args.lines, failures)
        print()
        print(
            f"## stdout flood: one child, {args.lines:,} lines; baseline: the fair drain, same run"
        )
        print()
        print(format_table(FLOOD_HEADER, rows, md))
    if "r" in args.targets:
        print()
        print(
            f"## records burst: {args.children} children x {args.records:,} logging.info; "
            "baselines: each child's own FileHandler (direct) and torchrunx's "
            "SocketHandler -> ThreadingTCPServer, same run"
        )
        for backend in backends:
            header, rows = records_table(backend, results[backend]["records"], args, failures)
            print()
            print(format_table(header, rows, md))
    if "c" in args.targets:
        rows = []
        for backend in backends:
            rows += cost_rows(backend, results[backend]["cost"][COST])
        print()
        print(
            f"## one logging call in a child alone: {args.cost_calls:,} calls x "
            f"{args.cost_rounds} rounds per handler, alternating; median of {args.reps} runs"
        )
        print()
        print(format_table(COST_HEADER, rows, md))
    if failures:
        print()
        print("## FAILURES: output missing, repeated or out of order")
        print()
        for failure in failures:
            print(f"- {failure}")
        sys.exit(1)


if __name__ == "__main__":
    main()
