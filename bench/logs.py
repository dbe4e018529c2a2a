"""Logging benchmarks: corral's log streaming against the stdlib socket design, on asyncio and Trio.

Targets (issue 4, item 10):

(a) 4 Python children x 50,000 ``logging.info`` records each, written into one
    file per child.  corral: each child calls ``corral.child.connect(logging.INFO)``
    and logs in a tight loop; the launcher runs
    ``corral.open_runner(console=False, log_dir=tmp)`` and waits with
    ``proc.wait()`` (which returns only once every record of that child is in the
    handlers' hands; ``LogFiles`` flushes after every batch).  Baseline: the design
    torchrunx uses (the stdlib logging cookbook's): each child puts a
    ``logging.handlers.SocketHandler`` (pickled records over TCP) on its root
    logger, a ``socketserver.ThreadingTCPServer`` in the launcher's own process
    (``serve_forever`` in a thread, one daemon thread per connection) unpickles
    every record with ``logging.makeLogRecord`` and hands it to that child's
    ``logging.FileHandler``.  As in torchrunx, the server is stopped as soon as the
    children have exited (torchrunx kills its log-server process; here every
    handler thread stops at its next record, which is the same thing in-process),
    and whatever was not written by then is lost.  Figure: end-to-end records/s,
    from the first child's start until every child was waited for (and, for the
    baseline, the server stopped), counting records actually in the files.
    Target: corral >= 1.5x the baseline, and zero records lost by corral.
    Also: the child-side cost of one ``logging.info`` call (``time.perf_counter``
    and ``time.process_time`` around the child's loop) with corral's handler, with
    the ``SocketHandler``, and with no handler at all (a ``NullHandler``: the
    physical floor of the logging call itself).
(b) 1,000,000 stdout lines from one child (the same child for every variant):
    corral (``open_runner(console=False, handlers=[counting handler at INFO])``,
    every line must arrive as a record; also with ``log_dir=`` files instead)
    against a raw pipe drain (``anyio.open_process``, read stdout to EOF, count
    newlines).  Figure: lines/s from the start until ``wait()`` returned.
    Target: corral >= 0.5x raw.  Two children: ``loop`` (a Python loop of
    ``write(f"...{i}\\n")`` into a 1 MiB-buffered text stream on fd 1) and
    ``blocks`` (``os.write`` of pre-built 64 KiB blocks: the pipe's own speed).
(c) the worst stall of a 1 ms ticker (``await anyio.sleep(0.001)`` in the
    launcher's loop; largest gap between wake-ups minus 1 ms) during (a), corral
    beside the baseline (whose server threads share the launcher's GIL).

Absolute times drift on this shared machine, so every figure is compared with its
baseline measured in the same run: each backend runs in a fresh interpreter, the
corral and baseline repetitions alternate (ABBA order), and medians are reported.

Usage::

    python bench/logs.py                       # everything, both backends (~12 min)
    python bench/logs.py --drained --markdown  # as in RESULTS.md (~15 min)
    python bench/logs.py --backend trio --targets a --reps 5
    PYTHONPATH=/tmp/try python bench/logs.py   # measure a modified copy of corral
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import shutil
import socketserver
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _ticker import Ticker  # bench/ is on sys.path when a script runs

BACKENDS = ("asyncio", "trio")
TARGET_A = 1.5
TARGET_B = 0.5

# --------------------------------------------------------------------------------------
# the children (one script, several modes; run with ``python -c CHILD mode ...``)

CHILD = r"""
import json, logging, os, sys, time
mode, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode in ("corral", "socket", "floor"):
    root = logging.getLogger()
    if mode == "corral":
        import corral.child
        assert corral.child.connect(logging.INFO) is not None, "not started by corral"
    elif mode == "socket":
        import logging.handlers
        # As torchrunx does: tag every record with its source via a record factory.
        source = os.environ["BENCH_SOURCE"]
        factory = logging.getLogRecordFactory()
        def tagged(*args, **kwargs):
            record = factory(*args, **kwargs)
            record.bench_source = source
            return record
        logging.setLogRecordFactory(tagged)
        root.setLevel(logging.INFO)
        root.addHandler(logging.handlers.SocketHandler("127.0.0.1", int(os.environ["BENCH_PORT"])))
    else:
        root.setLevel(logging.INFO)
        root.addHandler(logging.NullHandler())  # no basicConfig(), no output: the floor
    info = logging.info
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(n):
        info("record %d of %d", i, n)
    t1 = time.perf_counter()
    c1 = time.process_time()
    with open(out, "w") as f:
        json.dump({"wall": t1 - t0, "cpu": c1 - c0, "n": n}, f)
elif mode == "loop":
    f = open(1, "w", buffering=1 << 20, closefd=False)
    w = f.write
    for i in range(n):
        w(f"stdout line {i:07d}\n")
    f.flush()
elif mode == "blocks":
    per = 4096
    block = "".join(f"stdout line {i:07d}\n" for i in range(per)).encode()
    full, rest = divmod(n, per)
    for _ in range(full):
        view = memoryview(block)
        while view:
            view = view[os.write(1, view):]
    tail = block[: rest * 20]
    while tail:
        tail = tail[os.write(1, tail):]
else:
    raise SystemExit(f"unknown mode {mode}")
"""


def child_argv(mode: str, n: int, out: str = "-") -> list[str]:
    return [sys.executable, "-c", CHILD, mode, str(n), out]


# --------------------------------------------------------------------------------------
# measurement helpers (run inside a worker process)


async def with_ticker(body: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    """Run ``body`` beside a 1 ms ticker; return (its result, worst stall in seconds)."""
    import anyio

    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        await tg.start(ticker.run)
        result = await body()
        tg.cancel_scope.cancel()
    return result, ticker.worst


def read_costs(paths: list[str]) -> list[dict[str, float]]:
    costs = []
    for path in paths:
        with open(path) as f:
            costs.append(json.load(f))
    return costs


def count_in(path: str, needle: bytes) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(needle)
    except FileNotFoundError:
        return 0


# -- (a) corral ------------------------------------------------------------------------


async def corral_records(tmp: str, children: int, n: int) -> dict[str, Any]:
    import corral

    t_open = time.perf_counter()
    async with corral.open_runner(console=False, log_dir=tmp) as r:
        t_opened = time.perf_counter()

        async def body() -> tuple[float, float]:
            c0 = time.process_time()
            t0 = time.perf_counter()
            procs = [
                await r.start(
                    child_argv("corral", n, os.path.join(tmp, f"cost{i}.json")), name=f"c{i}"
                )
                for i in range(children)
            ]
            for p in procs:
                await p.wait()
            return time.perf_counter() - t0, time.process_time() - c0

        (wall, cpu), stall = await with_ticker(body)
        t_body = time.perf_counter()
        log_path = r.log_path
        assert log_path is not None
        # Counted once every proc.wait() has returned, while the runner is still open:
        # wait() promises that the handlers have every record by then (and LogFiles
        # flushes after each batch), so the lines must already be in the files.
        files = [os.path.join(log_path, f"corral.c{i}.log") for i in range(children)]
        at_wait = sum(count_in(f, b"root: record ") for f in files)
        t_counted = time.perf_counter()
    t_closed = time.perf_counter()
    written = sum(count_in(f, b"root: record ") for f in files)
    return {
        "wall": wall,
        "cpu": cpu,
        "stall": stall,
        "written": at_wait,
        "lost": children * n - at_wait,
        "late": written - at_wait,  # lines that appeared only after the runner closed
        "open": t_opened - t_open,
        "close": t_closed - t_counted,
        "total": t_closed - t_open - (t_counted - t_body),
        "costs": read_costs([os.path.join(tmp, f"cost{i}.json") for i in range(children)]),
    }


# -- (a) baseline: SocketHandler -> ThreadingTCPServer, as torchrunx ------------------


class _State:
    def __init__(self) -> None:
        self.killed = False
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()


def _make_server(files: dict[str, logging.Handler], state: _State) -> socketserver.TCPServer:
    class RecordStreamHandler(socketserver.StreamRequestHandler):
        # The logging cookbook's receiver, which torchrunx's is: read a 4-byte
        # length, then the pickle, makeLogRecord, hand it to the handler(s).
        def handle(self) -> None:
            with state.lock:
                state.threads.append(threading.current_thread())
            conn = self.connection
            while not state.killed:
                chunk = conn.recv(4)
                if len(chunk) < 4:
                    break
                slen = struct.unpack(">L", chunk)[0]
                chunk = conn.recv(slen)
                while len(chunk) < slen:
                    chunk = chunk + conn.recv(slen - len(chunk))
                obj = pickle.loads(chunk)
                record = logging.makeLogRecord(obj)
                if state.killed:  # torchrunx kills its log server: nothing more is written
                    break
                files[record.bench_source].handle(record)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    return Server(("127.0.0.1", 0), RecordStreamHandler)


async def baseline_records(tmp: str, children: int, n: int, *, drain: bool) -> dict[str, Any]:
    import subprocess as sp

    import anyio
    import anyio.to_thread

    t_open = time.perf_counter()
    formatter = logging.Formatter("%(asctime)s %(levelname)-8s %(name)s: %(message)s")
    files: dict[str, logging.Handler] = {}
    for i in range(children):
        h = logging.FileHandler(os.path.join(tmp, f"b{i}.log"), encoding="utf-8")
        h.setFormatter(formatter)
        files[f"b{i}"] = h
    state = _State()
    server = _make_server(files, state)
    port = server.server_address[1]
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    t_opened = time.perf_counter()

    async def body() -> tuple[float, float]:
        c0 = time.process_time()
        t0 = time.perf_counter()
        procs = []
        for i in range(children):
            env = {**os.environ, "BENCH_PORT": str(port), "BENCH_SOURCE": f"b{i}"}
            procs.append(
                await anyio.open_process(
                    child_argv("socket", n, os.path.join(tmp, f"cost{i}.json")),
                    stdin=sp.DEVNULL,
                    stdout=sp.DEVNULL,
                    stderr=None,
                    env=env,
                )
            )
        for p in procs:
            await p.wait()
        if drain:
            # Not torchrunx: wait until every connection has been read to its end.
            while True:
                with state.lock:
                    alive = [t for t in state.threads if t.is_alive()]
                if len(state.threads) >= children and not alive:
                    break
                await anyio.sleep(0.001)
        state.killed = True  # the log server is gone from here on
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        for p in procs:
            await p.aclose()
        return wall, cpu

    (wall, cpu), stall = await with_ticker(body)
    t_body = time.perf_counter()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        with state.lock:
            threads = list(state.threads)
        for t in threads:
            t.join()
        for h in files.values():
            h.close()

    await anyio.to_thread.run_sync(stop)
    t_closed = time.perf_counter()
    written = sum(
        count_in(os.path.join(tmp, f"b{i}.log"), b"root: record ") for i in range(children)
    )
    return {
        "wall": wall,
        "cpu": cpu,
        "stall": stall,
        "written": written,
        "lost": children * n - written,
        "open": t_opened - t_open,
        # torchrunx kills its log server: its cleanup (server.shutdown(), which polls
        # every 0.5 s, joining the threads) is not counted.
        "cleanup": t_closed - t_body,
        "total": t_opened - t_open + wall,
        "costs": read_costs([os.path.join(tmp, f"cost{i}.json") for i in range(children)]),
    }


async def floor_records(tmp: str, children: int, n: int) -> dict[str, Any]:
    """The same children with a NullHandler: the cost of the logging call alone."""
    import subprocess as sp

    import anyio

    procs = [
        await anyio.open_process(
            child_argv("floor", n, os.path.join(tmp, f"cost{i}.json")),
            stdin=sp.DEVNULL,
            stdout=sp.DEVNULL,
            stderr=None,
        )
        for i in range(children)
    ]
    for p in procs:
        await p.wait()
        await p.aclose()
    return {"costs": read_costs([os.path.join(tmp, f"cost{i}.json") for i in range(children)])}


async def in_tmp(fn: Callable[..., Awaitable[dict[str, Any]]], *args: Any, **kw: Any) -> Any:
    tmp = tempfile.mkdtemp(prefix="corral-bench-logs-")
    try:
        return await fn(tmp, *args, **kw)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def records_worker(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    children, n = args.children, args.records
    variants = ["corral", "baseline"] + (["drained"] if args.drained else [])
    run = {
        "corral": lambda: in_tmp(corral_records, children, n),
        "baseline": lambda: in_tmp(baseline_records, children, n, drain=False),
        "drained": lambda: in_tmp(baseline_records, children, n, drain=True),
        "floor": lambda: in_tmp(floor_records, children, n),
        "solo-corral": lambda: in_tmp(corral_records, 1, n),
        "solo-baseline": lambda: in_tmp(baseline_records, 1, n, drain=True),
        "solo-floor": lambda: in_tmp(floor_records, 1, n),
    }
    # Warm up every path (imports, the page cache, worker threads).
    await in_tmp(corral_records, children, 2000)
    await in_tmp(baseline_records, children, 2000, drain=True)
    await in_tmp(floor_records, 1, 2000)
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in run}
    for rep in range(args.reps):
        order = variants if rep % 4 in (0, 3) else variants[::-1]
        for which in [*order, "floor"]:
            gc.collect()
            res = await run[which]()
            out[which].append(res)
            detail = ""
            if "wall" in res:
                detail = (
                    f": {res['wall'] * 1000:.0f} ms, {res['written'] / res['wall'] / 1e3:.1f}k "
                    f"records/s, {res['lost']} lost, stall {res['stall'] * 1000:.1f} ms"
                )
            sys.stderr.write(f"  [{args.backend}] (a) rep {rep + 1}/{args.reps} {which}{detail}\n")
    for rep in range(args.solo_reps):
        solo = ["solo-floor", "solo-corral", "solo-baseline"]
        for which in solo if rep % 2 == 0 else solo[::-1]:
            gc.collect()
            out[which].append(await run[which]())
    return out


# -- (b) one child, 1,000,000 stdout lines ----------------------------------------------


class CountingHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "corral_stream", None) == "stdout":
            self.lines += 1


async def raw_lines(child: str, n: int) -> dict[str, Any]:
    import subprocess as sp

    import anyio

    async def body() -> tuple[float, int]:
        t0 = time.perf_counter()
        lines = 0
        async with await anyio.open_process(
            child_argv(child, n), stdin=sp.DEVNULL, stdout=sp.PIPE, stderr=None
        ) as proc:
            assert proc.stdout is not None
            while True:
                try:
                    chunk = await proc.stdout.receive(65536)
                except anyio.EndOfStream:
                    break
                lines += chunk.count(b"\n")
            await proc.wait()
        return time.perf_counter() - t0, lines

    (wall, lines), stall = await with_ticker(body)
    return {"wall": wall, "lines": lines, "stall": stall}


async def corral_lines(child: str, n: int, *, files: bool) -> dict[str, Any]:
    import corral

    tmp = tempfile.mkdtemp(prefix="corral-bench-lines-")
    try:
        counter = CountingHandler()
        options: dict[str, Any] = {"log_dir": tmp} if files else {"handlers": [counter]}
        async with corral.open_runner(console=False, **options) as r:

            async def body() -> float:
                t0 = time.perf_counter()
                proc = await r.start(child_argv(child, n), name="out")
                await proc.wait()
                return time.perf_counter() - t0

            wall, stall = await with_ticker(body)
            log_path = r.log_path
        if files:
            assert log_path is not None
            lines = count_in(os.path.join(log_path, "corral.out.log"), b"[stdout] stdout line ")
        else:
            lines = counter.lines
        return {"wall": wall, "lines": lines, "stall": stall}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def lines_worker(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for child in args.child:
        run = {
            "raw": lambda child=child: raw_lines(child, args.lines),
            "corral": lambda child=child: corral_lines(child, args.lines, files=False),
            "corral+files": lambda child=child: corral_lines(child, args.lines, files=True),
        }
        await raw_lines(child, 20000)
        await corral_lines(child, 20000, files=False)
        await corral_lines(child, 20000, files=True)
        res: dict[str, list[dict[str, Any]]] = {k: [] for k in run}
        variants = list(run)
        for rep in range(args.line_reps):
            for which in variants if rep % 2 == 0 else variants[::-1]:
                gc.collect()
                res[which].append(await run[which]())
                sys.stderr.write(
                    f"  [{args.backend}] (b) {child} rep {rep + 1}/{args.line_reps} {which}\n"
                )
        out[child] = res
    return out


# --------------------------------------------------------------------------------------
# orchestration


def _worker_main(args: argparse.Namespace) -> None:
    import anyio

    result: dict[str, Any] = {}
    if "a" in args.targets or "c" in args.targets:
        result["records"] = anyio.run(records_worker, args, backend=args.backend)
    if "b" in args.targets:
        result["lines"] = anyio.run(lines_worker, args, backend=args.backend)
    print(json.dumps(result))


def _table(rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def _rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M/s"
    return f"{x / 1e3:.1f} k/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--targets", default="abc", help="any of a, b, c (a and c run together)")
    parser.add_argument("--children", type=int, default=4, help="(a) children")
    parser.add_argument("--records", type=int, default=50_000, help="(a) records per child")
    parser.add_argument("--reps", type=int, default=20, help="(a) repetitions of each variant")
    parser.add_argument("--solo-reps", type=int, default=5, help="one-child cost repetitions")
    parser.add_argument(
        "--drained",
        action="store_true",
        help="(a) also run the baseline waiting for every connection's end (not torchrunx)",
    )
    parser.add_argument("--lines", type=int, default=1_000_000, help="(b) stdout lines")
    parser.add_argument("--line-reps", type=int, default=5, help="(b) repetitions of each")
    parser.add_argument(
        "--child", action="append", choices=("loop", "blocks"), help="(b) children (both)"
    )
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.child = args.child or ["loop", "blocks"]
    if args.worker:
        _worker_main(args)
        return

    backends = BACKENDS if args.backend == "both" else (args.backend,)
    md = args.markdown
    med = statistics.median
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("corral")
    where = os.path.dirname(spec.origin) if spec and spec.origin else "?"
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("anyio", "trio", "msgspec")
    )
    print(
        f"# corral logging benchmarks  ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {versions})"
    )
    print(f"# command: python bench/logs.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"# corral measured: {where}")
    sys.stdout.flush()

    results: dict[str, Any] = {}
    for backend in backends:
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker"]
        cmd += ["--backend", backend]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        results[backend] = json.loads(done.stdout.strip().splitlines()[-1])

    verdicts: list[str] = []
    total = args.children * args.records
    if "a" in args.targets or "c" in args.targets:
        rows = [["backend", "measure", "corral", "baseline", "ratio", "target", "met"]]
        loss_rows = [
            [
                "backend",
                "variant",
                "reps",
                "reps with losses",
                "records lost (total)",
                "worst rep",
                "median rep",
            ]
        ]
        stall_rows = [["backend", "measure", "corral", "baseline", "ratio", "target", "met"]]
        for backend in backends:
            rec = results[backend]["records"]
            c, b = rec["corral"], rec["baseline"]
            c_rate = med(x["written"] / x["wall"] for x in c)
            b_rate = med(x["written"] / x["wall"] for x in b)
            ratio = c_rate / b_rate
            ok = ratio >= TARGET_A and all(x["lost"] == 0 for x in c)
            rows.append(
                [
                    backend,
                    f"(a) records/s on disk, {args.children} x {args.records:,} "
                    f"(median of {len(c)})",
                    _rate(c_rate),
                    _rate(b_rate),
                    f"{ratio:.2f}",
                    f">= {TARGET_A}",
                    "yes" if ok else "NO",
                ]
            )
            rows.append(
                [
                    backend,
                    "(a) wall, first start -> all waited (median)",
                    _ms(med(x["wall"] for x in c)),
                    _ms(med(x["wall"] for x in b)),
                    f"{med(x['wall'] for x in c) / med(x['wall'] for x in b):.2f}",
                    "",
                    "",
                ]
            )
            rows.append(
                [
                    backend,
                    "(a) wall incl. runner/server open and close (median)",
                    _ms(med(x["total"] for x in c)),
                    _ms(med(x["total"] for x in b)),
                    f"{med(x['total'] for x in c) / med(x['total'] for x in b):.2f}",
                    "",
                    "",
                ]
            )
            if rec.get("drained"):
                d = rec["drained"]
                d_rate = med(x["written"] / x["wall"] for x in d)
                rows.append(
                    [
                        backend,
                        "(a) records/s vs a baseline that waits for EOF (not torchrunx)",
                        _rate(c_rate),
                        _rate(d_rate),
                        f"{c_rate / d_rate:.2f}",
                        "",
                        "",
                    ]
                )
            for name, xs in (
                ("corral", c),
                ("baseline", b),
                ("drained baseline", rec.get("drained") or []),
            ):
                if not xs:
                    continue
                losses = [x["lost"] for x in xs]
                loss_rows.append(
                    [
                        backend,
                        name,
                        str(len(xs)),
                        str(sum(1 for v in losses if v)),
                        f"{sum(losses):,} of {total * len(xs):,}",
                        f"{max(losses):,}",
                        f"{med(losses):,.0f}",
                    ]
                )
            cs, bs = med(x["stall"] for x in c), med(x["stall"] for x in b)
            ok_c = cs <= bs
            stall_rows.append(
                [
                    backend,
                    "(c) worst ticker stall (median of per-rep worst)",
                    _ms(cs),
                    _ms(bs),
                    f"{cs / bs:.2f}",
                    "<= 1.00",
                    "yes" if ok_c else "NO",
                ]
            )
            stall_rows.append(
                [
                    backend,
                    "(c) worst ticker stall (max over reps)",
                    _ms(max(x["stall"] for x in c)),
                    _ms(max(x["stall"] for x in b)),
                    f"{max(x['stall'] for x in c) / max(x['stall'] for x in b):.2f}",
                    "",
                    "",
                ]
            )
            verdicts.append(
                f"{backend} (a) records/s ratio {ratio:.2f}, corral lost "
                f"{sum(x['lost'] for x in c)}: {'met' if ok else 'NOT met'}"
            )
            verdicts.append(
                f"{backend} (c) stall ratio {cs / bs:.2f}: {'met' if ok_c else 'NOT met'}"
            )

        cost_rows = [
            [
                "backend",
                "children at once",
                "handler",
                "wall µs/call",
                "CPU µs/call",
                "wall - floor",
                "CPU - floor",
            ]
        ]
        for backend in backends:
            rec = results[backend]["records"]

            def per_call(runs: list[dict[str, Any]], key: str) -> float:
                return float(med(cst[key] / cst["n"] * 1e6 for x in runs for cst in x["costs"]))

            for label, prefix in ((f"{args.children} (during (a))", ""), ("1 (alone)", "solo-")):
                floor = rec[prefix + "floor"]
                if not floor:
                    continue
                fw, fc = per_call(floor, "wall"), per_call(floor, "cpu")
                for handler, key in (
                    ("none (NullHandler): the floor", "floor"),
                    ("corral CorralLogHandler", "corral"),
                    ("stdlib SocketHandler (baseline)", "baseline"),
                ):
                    runs = rec[prefix + key]
                    if not runs:
                        continue
                    w, cpu = per_call(runs, "wall"), per_call(runs, "cpu")
                    cost_rows.append(
                        [
                            backend,
                            label,
                            handler,
                            f"{w:.2f}",
                            f"{cpu:.2f}",
                            "" if key == "floor" else f"{w - fw:+.2f}",
                            "" if key == "floor" else f"{cpu - fc:+.2f}",
                        ]
                    )

        print()
        print(
            f"## (a) {args.children} children x {args.records:,} logging.info records into "
            "per-source files; corral and baseline alternate in one process"
        )
        print()
        print(_table(rows, md))
        print()
        print("records lost (lines missing from the files), per variant:")
        print()
        print(_table(loss_rows, md))
        print()
        print("child-side cost of one logging.info call (median over children and reps):")
        print()
        print(_table(cost_rows, md))
        print()
        print("## (c) loop stall during (a)")
        print()
        print(_table(stall_rows, md))

    if "b" in args.targets:
        rows = [["backend", "child", "measure", "corral", "raw anyio", "ratio", "target", "met"]]
        for backend in backends:
            lines = results[backend]["lines"]
            for child, res in lines.items():
                raw_rate = med(args.lines / x["wall"] for x in res["raw"])
                for variant, label in (
                    ("corral", "counting handler"),
                    ("corral+files", "log_dir files"),
                ):
                    xs = res[variant]
                    rate = med(x["lines"] / x["wall"] for x in xs)
                    ratio = rate / raw_rate
                    complete = all(x["lines"] == args.lines for x in xs)
                    ok = ratio >= TARGET_B and complete
                    rows.append(
                        [
                            backend,
                            child,
                            f"(b) lines/s, {label} (median of {len(xs)})"
                            + ("" if complete else " INCOMPLETE"),
                            _rate(rate),
                            _rate(raw_rate),
                            f"{ratio:.2f}",
                            f">= {TARGET_B}",
                            "yes" if ok else "NO",
                        ]
                    )
                    verdicts.append(
                        f"{backend} (b) {child} {label}: ratio {ratio:.2f}, "
                        f"every line {'arrived' if complete else 'did NOT arrive'}: "
                        f"{'met' if ok else 'NOT met'}"
                    )
                rows.append(
                    [
                        backend,
                        child,
                        "(b) wall, corral (counting) / raw (median)",
                        _ms(med(x["wall"] for x in res["corral"])),
                        _ms(med(x["wall"] for x in res["raw"])),
                        "",
                        "",
                        "",
                    ]
                )
                rows.append(
                    [
                        backend,
                        child,
                        "(b) worst ticker stall (median)",
                        _ms(med(x["stall"] for x in res["corral"])),
                        _ms(med(x["stall"] for x in res["raw"])),
                        "",
                        "",
                        "",
                    ]
                )
        print()
        print(f"## (b) {args.lines:,} stdout lines from one child; corral and raw alternate")
        print()
        print(_table(rows, md))

    if verdicts:
        print()
        for v in verdicts:
            print("- " + v)


if __name__ == "__main__":
    main()
