"""The log path under load: a stdout flood and a logging-record burst, against fair baselines.

This script measures the part of the logging issue that is about speed.  It runs
two jobs. Each corral variant runs next to a baseline that does the same work in
the same run, so that drift on the shared machine cancels out.

**stdout flood** (``--lines``, 1,000,000).  One child prints ``line 0`` ...
``line 999999`` with its stdout *block-buffered*: it opens its own
``open(1, "wb", buffering=1 << 16, closefd=False)`` and writes bytes to it, so
the ``PYTHONUNBUFFERED=1`` that corral sets for its children (and that this
machine's shell may set too) changes nothing.  The same child runs in every
variant:

``corral files``
    ``open_runner(console=False, log_dir=tmp)``: every line becomes a record and
    goes to the child's own file and to ``combined.log``.  This is requirement (1)
    with the console off.
``corral console+files``
    ``open_runner(console=True, log_dir=tmp)``, the default console, with the
    launcher's file descriptor 2 pointed (``os.dup2``) at a file for the
    duration of the run.  This measures the console exactly as shipped, with
    the runner's own ``ConsoleHandler`` on ``sys.stderr``, its per-record
    flush and whatever buffering ``sys.stderr`` has.  The only difference is
    that the bytes land in a file instead of a terminal: the case of
    ``python launcher.py 2> run.log``.  A ``ConsoleHandler(stream=file)`` passed
    in ``handlers=`` would be a block-buffered file: not what ``console=True``
    does.  Requirement (1) with the console on.
``corral no handler``
    ``open_runner(console=False)`` with no ``log_dir`` and no handler: what
    reading and splitting the pipe costs when no record is wanted (for reference).
``fair drain`` (the baseline)
    ``anyio.open_process``, 64 KiB reads from the pipe, lines split from the
    bytes, each line decoded and written as
    ``<YYYY-mm-dd HH:MM:SS.mmm> INFO     [stdout] <line>`` (the time of its
    chunk) to a 64 KiB-buffered text file, on the loop thread.  This is the job
    of ``corral files`` without ``combined.log``.
``subprocess.run``
    ``subprocess.run(argv, stdout=file)`` in a worker thread: the child writes
    the file itself.  This is the speed limit, the child's own speed.

For each variant the script reports three figures.  **lines/s**: the lines
actually found in the output file(s), from opening the runner (or the file) to
closing it (files flushed and closed), divided into the wall time.  Every output
file is read back and must hold ``line 0`` ... ``line N-1``, each once and in
order: the per-source file, ``combined.log`` and the console file.  A variant
that loses, repeats or reorders a line is reported as FAILED, and the script
exits with status 1.  The no-handler variant writes no file, so it counts
nothing.  **Launcher CPU** is the change in ``resource.getrusage(RUSAGE_SELF)``
user + system time over the same window.  It covers every thread of the
launcher (loop, worker threads, the runner's own) but not the children, and
is shown as seconds per 1M lines, which is also microseconds per line.  **Worst
gap** is the largest gap between wake-ups of a 1 ms ticker
(``bench/_ticker.py``) running in the launcher's loop during the run, minus
1 ms.  The ticker's own CPU (a few percent) is in every variant's figure alike.

**records burst** (``--children`` 4 x ``--records`` 50,000).  Each child runs a
tight loop of ``logging.info("record %d of %d", i, n)``.

``corral``
    Each child calls ``corral.child.connect(logging.INFO)``.  The launcher runs
    ``open_runner(console=False, log_dir=tmp)`` and four concurrent
    ``r.run(...)`` calls.
``direct`` (the baseline)
    Each child puts a ``logging.FileHandler`` on its own file, with the format
    ``%(asctime)s %(levelname)-8s %(name)s: %(message)s``.  The launcher
    starts the children with ``anyio.open_process`` and waits for them.

Figures: **records/s** end to end, from opening the runner (or starting the first
child) until the last child has exited and every file is closed, counting the
records in the per-source files.  Each file must hold ``record 0`` ...
``record N-1`` in order, and ``combined.log`` must hold them all; anything
missing is reported as lost.  Also the **worst ticker gap** and the launcher's
CPU per record.  **Child cost per call**: one child run by a corral runner
(``log_dir``, console off) times ``--cost-calls`` logging calls
(``time.perf_counter`` around the loop) with the root logger's handlers set
to corral's connected handler and to a ``logging.NullHandler``, in
alternating rounds (ABBA, 8 rounds) in the same process.  The figure is the
median over rounds, in microseconds per call.  The burst's own children time
their loops too: that is the "during the burst" row.

Method: every backend runs in a fresh interpreter (``--worker``).  In it, every
variant is warmed up once with a small job, then the repetitions alternate
their order (ABBA) and the median over repetitions is reported.  The worst gap
shows the median of the per-repetition worsts (which decides "met") and the
maximum.  Per-repetition figures go to stderr as the script runs; the tables go
to stdout.

Usage::

    python bench/logpath.py                         # both backends, 5 reps (~10 min)
    python bench/logpath.py --markdown > after.md   # tables in Markdown
    python bench/logpath.py --backend trio --targets f --reps 3
    PYTHONPATH=/tmp/bench-old/src python bench/logpath.py --markdown   # a frozen copy

    # profile the launcher during one variant (the worker alone, a long run):
    py-spy record --threads --format raw -o flood.txt -- \\
        python bench/logpath.py --worker --backend asyncio --targets f \\
        --only "corral files" --reps 3

Options: ``--backend asyncio|trio|both``, ``--reps`` (5), ``--lines``
(1,000,000), ``--records`` (50,000 per child), ``--children`` (4),
``--cost-calls`` (50,000 per round), ``--targets`` (any of ``f``, the stdout
flood, and ``r``, the records burst with the per-call cost; both by default),
``--only`` (a comma-separated list of variant names to run; with it, the
baselines are not run unless they are named, so use it for profiling, not for
tables), ``--markdown``.  The header names the ``corral`` package that was
measured: set ``PYTHONPATH`` to measure another copy. Child processes inherit
it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from _common import print_header, run_workers  # bench/ is on sys.path when a script runs
from _ticker import Ticker

BACKENDS = ("asyncio", "trio")

# Targets from the issue.
FLOOD_RATIO = 0.5  # corral lines/s >= 0.5 x the fair drain
CPU_PER_LINE_US = 2.0  # launcher CPU <= 2 us per line
MAX_GAP_MS = 10.0  # worst 1 ms-ticker gap <= 10 ms
RECORDS_RATIO = 0.8  # corral records/s >= 0.8 x direct
CALL_RATIO = 1.5  # a logging call with corral's handler <= 1.5 x a NullHandler call

FILES, CONSOLE, BARE, DRAIN, LIMIT = (
    "corral files",
    "corral console+files",
    "corral no handler",
    "fair drain",
    "subprocess.run",
)
FLOOD_VARIANTS = (FILES, CONSOLE, BARE, DRAIN, LIMIT)
CORRAL, DIRECT, COST = "corral", "direct", "cost"
RECORD_VARIANTS = (CORRAL, DIRECT, COST)

RECORD_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"

# --------------------------------------------------------------------------------------
# the children (run as ``python -c CODE args...``)

FLOOD_CHILD = r"""
import sys
n = int(sys.argv[1])
# Block-buffered whatever PYTHONUNBUFFERED says: our own 64 KiB buffer on fd 1.
out = open(1, "wb", buffering=1 << 16, closefd=False)
w = out.write
for i in range(n):
    w(b"line %d\n" % i)
out.flush()
"""

RECORDS_CHILD = r"""
import json, logging, sys, time
mode, n, log_file, result = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
root = logging.getLogger()
if mode == "corral":
    import corral.child
    corral.child.connect(logging.INFO)
    if not root.handlers:
        raise SystemExit("corral.child.connect() added no handler: not started by corral?")
elif mode == "direct":
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter(sys.argv[5]))
    root.addHandler(handler)
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
import json, logging, statistics, sys, time
n, rounds, result = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import corral.child
root = logging.getLogger()
corral.child.connect(logging.INFO)
if not root.handlers:
    raise SystemExit("corral.child.connect() added no handler: not started by corral?")
connected = list(root.handlers)
null = [logging.NullHandler()]
info = logging.info
per_call = {"corral": [], "null": []}
for k in range(rounds):
    order = ("null", "corral") if k % 4 in (0, 3) else ("corral", "null")
    for which in order:
        root.handlers = connected if which == "corral" else null
        t0 = time.perf_counter()
        for i in range(n):
            info("record %d of %d", i, n)
        per_call[which].append((time.perf_counter() - t0) / n * 1e6)
root.handlers = connected
with open(result, "w") as f:
    json.dump({k: statistics.median(v) for k, v in per_call.items()} | {"rounds": per_call}, f)
"""


def flood_argv(n: int) -> list[str]:
    return [sys.executable, "-c", FLOOD_CHILD, str(n)]


# --------------------------------------------------------------------------------------
# checking what arrived

_LINE = re.compile(rb"(?m)\bline (\d+)$")
_RECORD = re.compile(rb"(?m)\broot: record (\d+) of \d+$")
_expected: dict[int, list[bytes]] = {}


def expected(n: int) -> list[bytes]:
    if n not in _expected:
        _expected.clear()
        _expected[n] = [b"%d" % i for i in range(n)]
    return _expected[n]


def check_sequence(numbers: list[bytes], n: int, what: str) -> str | None:
    """None if ``numbers`` is exactly 0 .. n-1 in order; else what is wrong."""
    want = expected(n)
    if numbers == want:
        return None
    for i, (got, exp) in enumerate(zip(numbers, want, strict=False)):
        if got != exp:
            return f"{what}: item {i} is {got.decode()}, expected {exp.decode()}"
    return f"{what}: {len(numbers):,} items, expected {n:,}"


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
    n: int, *, log_dir: str | None = None, files: tuple[str, ...] = ()
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
            if (bad := check_sequence(numbers, n, os.path.basename(path))) is not None:
                problems.append(bad)
        if combined is None:
            problems.append("no combined.log")
            counts.append(0)
        else:
            numbers = _LINE.findall(read(combined))
            counts.append(len(numbers))
            if (bad := check_sequence(numbers, n, "combined.log")) is not None:
                problems.append(bad)
    for path in files:
        numbers = _LINE.findall(read(path)) if os.path.exists(path) else []
        counts.append(len(numbers))
        if (bad := check_sequence(numbers, n, os.path.basename(path))) is not None:
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
        if (bad := check_sequence(numbers, n, os.path.basename(path))) is not None:
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


# --------------------------------------------------------------------------------------
# measuring (inside a worker process)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measured(body: Callable[[], Awaitable[None]]) -> dict[str, float]:
    """Run ``body`` beside a 1 ms ticker: wall and launcher CPU seconds, worst gap."""
    import anyio

    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        await body()
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - c0
        tg.cancel_scope.cancel()
    return {"wall": wall, "cpu": cpu, "stall": ticker.worst, "ticks": ticker.ticks}


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


# -- the stdout flood ------------------------------------------------------------------


async def flood_corral(tmp: str, n: int, variant: str) -> dict[str, Any]:
    import corral

    log_dir = os.path.join(tmp, "logs")
    console_file = os.path.join(tmp, "console.txt")
    options: dict[str, Any] = {}
    if variant in (FILES, CONSOLE):
        options["log_dir"] = log_dir

    async def body() -> None:
        async with corral.open_runner(name="bench", console=variant == CONSOLE, **options) as r:
            await r.run(flood_argv(n))

    if variant == CONSOLE:
        with stderr_to(console_file):
            result = await measured(body)
        lines, problems = check_flood(n, log_dir=log_dir, files=(console_file,))
    elif variant == FILES:
        result = await measured(body)
        lines, problems = check_flood(n, log_dir=log_dir)
    else:
        result = await measured(body)
        lines, problems = n, []  # nothing written anywhere: nothing to count
    return result | {"lines": lines, "problems": problems, "counted": variant != BARE}


async def flood_drain(tmp: str, n: int) -> dict[str, Any]:
    import anyio

    path = os.path.join(tmp, "drain.log")

    async def body() -> None:
        with open(path, "w", encoding="utf-8", buffering=1 << 16) as f:
            write = f.write
            async with await anyio.open_process(
                flood_argv(n), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None
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
    lines, problems = check_flood(n, files=(path,))
    return result | {"lines": lines, "problems": problems, "counted": True}


async def flood_limit(tmp: str, n: int) -> dict[str, Any]:
    import anyio.to_thread

    path = os.path.join(tmp, "limit.out")

    async def body() -> None:
        with open(path, "wb") as f:
            run = functools.partial(subprocess.run, flood_argv(n), stdout=f, check=True)
            await anyio.to_thread.run_sync(run)

    result = await measured(body)
    lines, problems = check_flood(n, files=(path,))
    return result | {"lines": lines, "problems": problems, "counted": True}


async def flood_once(variant: str, n: int) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="corral-bench-logpath-")
    try:
        if variant == DRAIN:
            return await flood_drain(tmp, n)
        if variant == LIMIT:
            return await flood_limit(tmp, n)
        return await flood_corral(tmp, n, variant)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the records burst -----------------------------------------------------------------


def records_argv(mode: str, n: int, log_file: str, result: str) -> list[str]:
    return [sys.executable, "-c", RECORDS_CHILD, mode, str(n), log_file, result, RECORD_FORMAT]


def read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


async def records_corral(tmp: str, children: int, n: int) -> dict[str, Any]:
    import anyio

    import corral

    log_dir = os.path.join(tmp, "logs")
    results = [os.path.join(tmp, f"cost{i}.json") for i in range(children)]

    async def body() -> None:
        async with (
            corral.open_runner(name="bench", console=False, log_dir=log_dir) as r,
            anyio.create_task_group() as tg,
        ):
            for i in range(children):
                tg.start_soon(r.run, records_argv("corral", n, "-", results[i]))

    result = await measured(body)
    sources, combined = log_files(log_dir)
    found, problems = check_records(children, n, sources, combined)
    if combined is None:
        problems.append("no combined.log")
    return result | {
        "found": found,
        "lost": children * n - found,
        "problems": problems,
        "children": [read_json(p) for p in results],
    }


async def records_direct(tmp: str, children: int, n: int) -> dict[str, Any]:
    import anyio

    files = [os.path.join(tmp, f"direct{i}.log") for i in range(children)]
    results = [os.path.join(tmp, f"cost{i}.json") for i in range(children)]

    async def body() -> None:
        procs = [
            await anyio.open_process(
                records_argv("direct", n, files[i], results[i]),
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
                raise RuntimeError(f"a direct child exited with {code}")

    result = await measured(body)
    found, problems = check_records(children, n, files, None)
    return result | {
        "found": found,
        "lost": children * n - found,
        "problems": problems,
        "children": [read_json(p) for p in results],
    }


async def records_cost(tmp: str, calls: int, rounds: int = 8) -> dict[str, Any]:
    import corral

    path = os.path.join(tmp, "cost.json")
    argv = [sys.executable, "-c", COST_CHILD, str(calls), str(rounds), path]
    async with corral.open_runner(
        name="bench", console=False, log_dir=os.path.join(tmp, "logs")
    ) as r:
        await r.run(argv)
    return read_json(path) | {"problems": []}


async def records_once(variant: str, args: argparse.Namespace, scale: int = 1) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="corral-bench-logpath-")
    try:
        if variant == CORRAL:
            return await records_corral(tmp, args.children, args.records // scale)
        if variant == DIRECT:
            return await records_direct(tmp, args.children, args.records // scale)
        return await records_cost(tmp, args.cost_calls // scale)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the worker ------------------------------------------------------------------------


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _report(backend: str, job: str, rep: str, variant: str, res: dict[str, Any]) -> None:
    if job == "flood":
        detail = (
            f"{res['wall']:.2f} s, {res['lines'] / res['wall'] / 1e6:.3f} M lines/s, "
            f"CPU {res['cpu']:.2f} s, worst gap {res['stall'] * 1000:.1f} ms"
        )
    elif variant == COST:
        detail = f"{res['corral']:.2f} us/call vs NullHandler {res['null']:.2f} us/call"
    else:
        detail = (
            f"{res['wall']:.2f} s, {res['found'] / res['wall'] / 1e3:.1f} k records/s, "
            f"{res['lost']} lost, CPU {res['cpu']:.2f} s, worst gap {res['stall'] * 1000:.1f} ms"
        )
    _say(f"  [{backend}] {job} {rep} {variant}: {detail}")
    for problem in res["problems"]:
        _say(f"  [{backend}] FAILED {job} {variant}: {problem}")


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    only = {v.strip() for v in args.only.split(",")} if args.only else None
    out: dict[str, Any] = {}
    jobs: list[tuple[str, tuple[str, ...], Callable[[str, int], Awaitable[dict[str, Any]]]]] = []
    if "f" in args.targets:
        jobs.append(
            ("flood", FLOOD_VARIANTS, lambda v, scale: flood_once(v, max(args.lines // scale, 1)))
        )
    if "r" in args.targets:
        jobs.append(("records", RECORD_VARIANTS, lambda v, scale: records_once(v, args, scale)))
    for job, all_variants, run in jobs:
        variants = [v for v in all_variants if only is None or v in only]
        for v in variants:  # warm up: imports, the page cache, worker threads
            await run(v, 50)
        res: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rep in range(args.reps):
            order = variants if rep % 4 in (0, 3) else variants[::-1]
            for v in order:
                gc.collect()
                r = await run(v, 1)
                res[v].append(r)
                _report(args.backend, job, f"rep {rep + 1}/{args.reps}", v, r)
        out[job] = res
    return out


def _worker_main(args: argparse.Namespace) -> None:
    import anyio

    result = anyio.run(worker, args, backend=args.backend)
    print(json.dumps(result))


# --------------------------------------------------------------------------------------
# the tables


def _table(rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _rate(x: float) -> str:
    return f"{x / 1e6:.3f} M/s" if x >= 1e6 / 2 else f"{x / 1e3:.1f} k/s"


def _gap(xs: list[dict[str, Any]]) -> str:
    stalls = [x["stall"] * 1000 for x in xs]
    return f"{statistics.median(stalls):.1f} ms (max {max(stalls):.1f})"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def flood_rows(
    backend: str, res: dict[str, list[dict[str, Any]]], n: int, failures: list[str]
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
        failures += [f"{backend} flood {variant}: {p}" for p in bad]
        rate = med(x["lines"] / x["wall"] for x in xs)
        cpu = med(x["cpu"] / n * 1e6 for x in xs)
        gap = med(x["stall"] * 1000 for x in xs)
        judged = variant in (FILES, CONSOLE)
        note = "" if not bad else " FAILED: lines lost or out of order"
        if not xs[0]["counted"]:
            note = " (nothing written; not counted)"
        rows.append(
            [
                backend,
                variant,
                f"lines/s (median of {len(xs)}){note}",
                _rate(rate),
                _rate(b_rate) if base else "-",
                _ratio(rate, b_rate),
                f">= {FLOOD_RATIO}x drain" if judged else "",
                _yes(bool(base) and rate >= FLOOD_RATIO * b_rate and not bad) if judged else "",
            ]
        )
        rows.append(
            [
                backend,
                variant,
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
                backend,
                variant,
                "worst 1 ms-ticker gap, median of reps (max)",
                _gap(xs),
                _gap(base) if base else "-",
                _ratio(gap, b_gap),
                f"<= {MAX_GAP_MS:g} ms" if judged else "",
                _yes(gap <= MAX_GAP_MS) if judged else "",
            ]
        )
    return rows


def records_rows(
    backend: str,
    res: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
    failures: list[str],
) -> list[list[str]]:
    med = statistics.median
    rows: list[list[str]] = []
    c, d, cost = res.get(CORRAL), res.get(DIRECT), res.get(COST)
    total = args.children * args.records
    for variant, xs in ((CORRAL, c), (DIRECT, d), (COST, cost)):
        for x in xs or []:
            failures += [f"{backend} records {variant}: {p}" for p in x["problems"]]
    if c:
        c_rate = med(x["found"] / x["wall"] for x in c)
        d_rate = med(x["found"] / x["wall"] for x in d) if d else 0.0
        lost = sum(x["lost"] for x in c)
        ok = bool(d) and c_rate >= RECORDS_RATIO * d_rate and lost == 0
        rows.append(
            [
                backend,
                f"{args.children} x {args.records:,} records",
                f"records/s end to end (median of {len(c)})",
                _rate(c_rate),
                _rate(d_rate) if d else "-",
                _ratio(c_rate, d_rate),
                f">= {RECORDS_RATIO}x direct, 0 lost",
                _yes(ok),
            ]
        )
        rows.append(
            [
                backend,
                "",
                f"records lost (sum over reps, of {total * len(c):,})",
                f"{lost:,}",
                f"{sum(x['lost'] for x in d):,}" if d else "-",
                "",
                "0",
                _yes(lost == 0),
            ]
        )
        c_gap = med(x["stall"] * 1000 for x in c)
        d_gap = med(x["stall"] * 1000 for x in d) if d else 0.0
        rows.append(
            [
                backend,
                "",
                "worst 1 ms-ticker gap, median of reps (max)",
                _gap(c),
                _gap(d) if d else "-",
                _ratio(c_gap, d_gap),
                f"<= {MAX_GAP_MS:g} ms",
                _yes(c_gap <= MAX_GAP_MS),
            ]
        )
        c_cpu = med(x["cpu"] / total * 1e6 for x in c)
        d_cpu = med(x["cpu"] / total * 1e6 for x in d) if d else 0.0
        rows.append(
            [
                backend,
                "",
                "launcher CPU, µs per record",
                f"{c_cpu:.2f}",
                f"{d_cpu:.2f}" if d else "-",
                _ratio(c_cpu, d_cpu),
                "",
                "",
            ]
        )
        c_call = med(k["wall"] / k["n"] * 1e6 for x in c for k in x["children"])
        d_call = med(k["wall"] / k["n"] * 1e6 for x in d for k in x["children"]) if d else 0.0
        rows.append(
            [
                backend,
                "",
                "child µs per logging call during the burst (vs direct's FileHandler)",
                f"{c_call:.2f}",
                f"{d_call:.2f}" if d else "-",
                _ratio(c_call, d_call),
                "",
                "",
            ]
        )
    if cost:
        corral_us = med(x["corral"] for x in cost)
        null_us = med(x["null"] for x in cost)
        rows.append(
            [
                backend,
                f"1 child, {args.cost_calls:,} calls x 8 rounds",
                f"child µs per logging call, corral handler vs NullHandler (median of {len(cost)})",
                f"{corral_us:.2f}",
                f"{null_us:.2f}",
                _ratio(corral_us, null_us),
                f"<= {CALL_RATIO}x NullHandler",
                _yes(corral_us <= CALL_RATIO * null_us),
            ]
        )
    return rows


def main() -> None:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each variant (5)")
    parser.add_argument("--lines", type=int, default=1_000_000, help="flood: stdout lines")
    parser.add_argument("--records", type=int, default=50_000, help="burst: records per child")
    parser.add_argument("--children", type=int, default=4, help="burst: children (4)")
    parser.add_argument(
        "--cost-calls", type=int, default=50_000, help="per-call cost: calls per round"
    )
    parser.add_argument(
        "--targets", default="fr", help="f: the stdout flood, r: the records burst (both)"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated variant names to run (for profiling)"
    )
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    parser.add_argument("--worker", action="store_true", help="run one backend, print JSON")
    args = parser.parse_args()
    if args.worker:
        if args.backend == "both":
            parser.error("--worker needs --backend asyncio or --backend trio")
        _worker_main(args)
        return

    print_header("corral log path benchmarks", "logpath.py", ("anyio", "trio", "msgspec"))
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    results: dict[str, dict[str, Any]] = run_workers(os.path.abspath(__file__), backends)

    md = args.markdown
    failures: list[str] = []
    header = ["backend", "variant", "measure", "measured", "baseline", "ratio", "target", "met"]
    if "f" in args.targets:
        rows = [header]
        for backend in backends:
            rows += flood_rows(backend, results[backend]["flood"], args.lines, failures)
        print()
        print(
            f"## stdout flood: one child, {args.lines:,} lines, block-buffered; "
            "baseline: the fair drain, same run"
        )
        print()
        print(_table(rows, md))
    if "r" in args.targets:
        rows = [header]
        for backend in backends:
            rows += records_rows(backend, results[backend]["records"], args, failures)
        print()
        print(
            f"## records burst: {args.children} children x {args.records:,} logging.info; "
            "baseline: 'direct' (each child's own FileHandler), same run"
        )
        print()
        print(_table(rows, md))
    if failures:
        print()
        print("## FAILURES: output missing, repeated or out of order")
        print()
        for failure in failures:
            print(f"- {failure}")
        sys.exit(1)


if __name__ == "__main__":
    main()
