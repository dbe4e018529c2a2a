"""``Runner.launch`` over ssh on 2 to 16 hosts: what each agent costs the launcher.

Issue 17, item 6.  Each host is a network namespace with its own ``sshd``, built
by the test suite's own fixture code (``tests/helpers/hosts.py``, ``start_ssh_hosts``:
names ``corral<slot>-s<i>`` and subnets ``10.<213 + slot>.<100 + i>.0/24``, so a
test session of the same ``CORRAL_TEST_SLOT`` is never disturbed).  For each
host count N the launcher, a fresh interpreter, first launches once on one host
(imports and first-use costs stay out of the figures), then runs::

    await r.launch(up, sock, hosts=hosts[:N], workers_per_host=W, ssh=ssh)

where ``up`` stamps ``time.time()`` as the worker starts, sends the stamp over
a Unix socket of the launcher's (a path on the shared filesystem, which crosses
network namespaces) and waits there until told to return.  Once the last
worker has reported, everything is sampled while every agent and worker is up:

* time from the ``launch()`` call to the first and to the last worker up, and
  to ``launch()`` returning once the workers are released (its end included);
* when the first and last ``ssh`` client started (their ``/proc`` start times,
  10 ms resolution): before the first one the launcher looks up each host's
  route back (``dial_back_addresses``, which runs ``ssh -G`` once per host);
* the launcher's own CPU time (``time.process_time()``) from the call until all
  are up, and for the whole call; the CPU of its reaped children (the ``ssh``
  clients, ``ssh -G``) over the whole call;
* its open descriptors (``/proc/self/fd``: sockets, pipes, pidfds) and threads,
  less those before the call and less the bench's own sockets (one per
  worker).  The launcher listens on one socket per distinct dial-back address:
  here one per host, as each namespace has a subnet of its own (on a cluster
  network, where every host reaches the launcher by one address, one in all);
* its RSS growth, and its peak RSS growth (``VmHWM``, reset through
  ``/proc/self/clear_refs`` before the call);
* the local ``ssh`` clients (children of the launcher): how many, and their RSS
  and PSS (``smaps_rollup``: the shared pages of ssh and its libraries counted
  once, split between the clients);
* then for ``--hold`` seconds, with nothing to do but heartbeats, the CPU of the
  launcher and of the ssh clients (the link's steady cost);
* the time from releasing the workers until ``launch()`` returns (results
  home, agents done, ssh clients exited).

The baseline, in the same interpreter right after: one ``ssh`` per host at
once, each starting W + 1 interpreters there that ``import corral`` (what an
agent and its workers load before they run anything), until all have exited:
its wall time ("raw ssh") and its ssh clients' CPU.  On this one machine every
"host" shares the same 2 cores, so both a launch and its baseline are mostly
the hosts' interpreters starting one after another: the per-host slope of
"all up" is this machine's, not the launcher's.  What is the launcher's is its
own CPU, descriptors, memory and its ssh clients.

Per-agent costs are the least-squares slope of each figure over N, with the
intercept (the fixed part).  Medians over ``--reps`` fresh interpreters per N,
run in alternating order (N ascending, then descending).  The machine's load
average is printed with each repetition: on a shared machine the times are
only as good as it was quiet.

Usage (as root: namespaces and sshd)::

    python bench/scale.py                     # N = 2, 4, 8, 16; 4 workers; 3 reps (about 2 min)
    python bench/scale.py --markdown --reps 5
    python bench/scale.py --hosts 2,4 --workers 2 --backend trio
    python bench/scale.py --smoke             # N = 2, 1 worker, once (CI; a few seconds)

Everything it starts (sshd, namespaces, links, agents, workers) is removed when
it ends, however it ends: by ``tests/helpers/hosts.py``'s teardown, and if the script
is killed, by the test suite's reaper process that it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shlex
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_smoke, print_header, print_table  # bench/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parent.parent
SLOT = os.environ.get("CORRAL_TEST_SLOT", "0")
SLOT_TAG = "" if SLOT == "0" else SLOT
FIRST_SUBNET = 101  # host i is 10.<213 + slot>.<100 + i>.2; the tests' hosts use .1 and .2
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------------------------
# The worker's function (sent by value: this file is __main__ in the launcher)
# --------------------------------------------------------------------------------------------


def up(path: str) -> float:
    """Stamp the start, tell the launcher at ``path``, and return once it says so."""
    started = time.time()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        conn.sendall(struct.pack("!d", started))
        conn.recv(1)  # the launcher's go (or its end: b"")
    return started


def noop() -> None:
    """The warm-up launch's work."""


# --------------------------------------------------------------------------------------------
# The launcher (one fresh interpreter per measurement)
# --------------------------------------------------------------------------------------------


def _status(field: str) -> int:
    """A field of /proc/self/status, in kB or as a count."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _cpu() -> tuple[float, float]:
    """This process's CPU seconds (ns clock), and its reaped children's (clock ticks)."""
    t = os.times()
    return time.process_time(), t.children_user + t.children_system


def _fd_kinds() -> dict[str, int]:
    """This process's descriptors by kind: sockets, pipes, pidfds, other."""
    kinds = {"socket": 0, "pipe": 0, "pidfd": 0, "other": 0}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":", 1)[0]
        if target == "anon_inode:[pidfd]":
            kind = "pidfd"
        kinds[kind if kind in kinds else "other"] += 1
    return kinds


def _ssh_children() -> list[dict[str, float]]:
    """The launcher's ssh clients: start (s since boot), CPU seconds, RSS bytes."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            name = stat[stat.index(b"(") + 1 : stat.rindex(b")")]
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[1]) != me or name != b"ssh":
                continue
            with open(f"/proc/{entry}/smaps_rollup", "rb") as f:
                rollup = {
                    line.split(b":")[0]: int(line.split()[1]) * 1024
                    for line in f
                    if line.endswith(b" kB\n")
                }
        except (OSError, IndexError, ValueError):
            continue
        found.append(
            {
                "start": int(fields[19]) / CLK_TCK,
                "cpu": (int(fields[11]) + int(fields[12])) / CLK_TCK,
                "rss": rollup[b"Rss"],
                "pss": rollup[b"Pss"],
            }
        )
    return found


async def _measure(cfg: dict[str, Any]) -> dict[str, Any]:
    import anyio

    import corral

    n, workers, hold = cfg["n"], cfg["workers"], cfg["hold"]
    hosts = cfg["addresses"][:n]
    ssh = corral.SSH(user=cfg["user"], identity_file=cfg["identity_file"], options=cfg["options"])
    total = n * workers
    stamps: list[float] = []
    conns: list[anyio.abc.SocketStream] = []
    all_up = anyio.Event()
    release = anyio.Event()
    sample: dict[str, Any] = {}

    async with corral.open_runner(name="scale", console=False) as r:
        await r.launch(noop, hosts=hosts[:1], workers_per_host=1, ssh=ssh)  # warm-up
        path = os.path.join(cfg["dir"], f"up-{os.getpid()}.sock")
        listener = await anyio.create_unix_listener(path)

        async def serve(stream: anyio.abc.SocketStream) -> None:
            data = b""
            while len(data) < 8:
                data += await stream.receive(8 - len(data))
            stamps.append(struct.unpack("!d", data)[0])
            conns.append(stream)
            if len(stamps) == total:
                all_up.set()
            await release.wait()
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(b"g")
            await stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            await anyio.sleep(0)
            gc.collect()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            fds0, threads0, rss0 = _fds(), _status("Threads"), _status("VmRSS")
            kinds0 = _fd_kinds()
            cpu0, children0 = _cpu()
            boot0 = time.clock_gettime(time.CLOCK_BOOTTIME)
            t0 = time.time()
            done = anyio.Event()
            result: list[Any] = []

            async def run() -> None:
                result.append(
                    await r.launch(
                        up,
                        path,
                        hosts=hosts,
                        workers_per_host=workers,
                        ssh=ssh,
                        start_timeout=cfg["start_timeout"],
                    )
                )
                done.set()

            tg.start_soon(run)
            with anyio.fail_after(cfg["start_timeout"] + 30):
                await all_up.wait()
            cpu_up = _cpu()[0] - cpu0
            ssh_up = _ssh_children()
            kinds = _fd_kinds()
            kinds["socket"] -= len(conns)
            sample = {
                "fds": _fds() - fds0 - len(conns),
                **{f"fd_{k}": v - kinds0[k] for k, v in kinds.items()},
                "threads": _status("Threads") - threads0,
                "rss": (_status("VmRSS") - rss0) * 1024,
                "ssh_clients": len(ssh_up),
                "ssh_rss": sum(p["rss"] for p in ssh_up),
                "ssh_pss": sum(p["pss"] for p in ssh_up),
                "ssh_first": min(p["start"] for p in ssh_up) - boot0 if ssh_up else None,
                "ssh_last": max(p["start"] for p in ssh_up) - boot0 if ssh_up else None,
            }
            if hold > 0:
                cpu_a = _cpu()[0]
                ssh_a = sum(p["cpu"] for p in ssh_up)
                await anyio.sleep(hold)  # a window to measure, not a synchronisation
                sample["idle_cpu"] = (_cpu()[0] - cpu_a) / hold
                sample["idle_ssh_cpu"] = (sum(p["cpu"] for p in _ssh_children()) - ssh_a) / hold
            t_release = time.time()
            release.set()
            with anyio.fail_after(60):
                await done.wait()
            t_done = time.time()
            cpu1, children1 = _cpu()
            tg.cancel_scope.cancel()
        await listener.aclose()
        os.unlink(path)
    assert result and sorted(result[0]) == sorted(stamps)
    return {
        "n": n,
        "workers": workers,
        "first_up": min(stamps) - t0,
        "all_up": max(stamps) - t0,
        "end": t_done - t_release,
        "cpu_up": cpu_up,
        "cpu": cpu1 - cpu0,
        "children_cpu": children1 - children0,
        "hwm": (_status("VmHWM") - rss0) * 1024,
        "load": os.getloadavg()[0],
        **sample,
    }


def _baseline(cfg: dict[str, Any]) -> dict[str, float]:
    """Raw fan-out: one ``ssh`` per host at once, each starting W + 1 interpreters there.

    Each interpreter imports ``corral`` (about what an agent or a worker loads before it
    runs anything): the irreducible part of a launch on this machine, with ssh's own cost.
    """
    n, workers = cfg["n"], cfg["workers"]
    one = shlex.join([sys.executable, "-c", "import corral"])
    remote = f"cd {shlex.quote(os.getcwd())} && " + " & ".join([one] * (workers + 1)) + " & wait"
    argv = [
        "ssh",
        *cfg["options"],
        "-o",
        "BatchMode=yes",
        "-T",
        "-i",
        cfg["identity_file"],
        "-l",
        cfg["user"],
    ]
    children0 = _cpu()[1]
    t0 = time.time()
    procs = [
        subprocess.Popen([*argv, "--", host, remote], stdin=subprocess.DEVNULL)
        for host in cfg["addresses"][:n]
    ]
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise RuntimeError(f"the raw ssh fan-out failed: {codes}")
    return {"raw_up": time.time() - t0, "raw_children_cpu": _cpu()[1] - children0}


def worker(cfg: dict[str, Any]) -> None:
    import anyio

    measured = anyio.run(_measure, cfg, backend=cfg["backend"])
    print(json.dumps({**measured, **_baseline(cfg)}))


# --------------------------------------------------------------------------------------------
# The driver: hosts up, one launcher per measurement, the table
# --------------------------------------------------------------------------------------------


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ``ys`` over ``xs``."""
    if len(set(xs)) < 2:
        return float("nan"), float("nan")
    slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept


def drive(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.helpers import hosts as _hosts
    from tests.helpers import reaper as _reaper

    counts = sorted({int(x) for x in args.hosts.split(",")})
    print_header("corral launch over ssh: cost per agent", "scale.py", ["anyio", "trio"])
    print(
        f"# {max(counts)} hosts (network namespaces, one sshd each), {args.workers} worker(s) "
        f"per host, backend {args.backend}, {args.reps} launcher(s) per host count, "
        f"hold {args.hold:g} s",
        flush=True,
    )
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    try:
        with contextlib.ExitStack() as undo:
            started = time.monotonic()
            try:
                hosts = _hosts.start_ssh_hosts(
                    undo,
                    max(counts),
                    netns_prefix=f"corral{SLOT_TAG}-s",
                    first_subnet=FIRST_SUBNET,
                    dir_prefix=f"corral{SLOT_TAG}-scalehosts-",
                )
            except BaseException as exc:  # pytest's Failed, with the daemons' output
                if type(exc).__name__ != "Failed":
                    raise
                sys.exit(f"setting the hosts up failed: {exc}")
            print(f"# hosts up in {time.monotonic() - started:.2f} s", flush=True)
            # The launchers' Unix sockets; removed by the reaper too if this process is killed.
            scratch = tempfile.mkdtemp(prefix=f"corral{SLOT_TAG}-scale-")
            key = _reaper.session().directory(Path(scratch))
            undo.callback(_reaper.session().forget, key)
            undo.callback(shutil.rmtree, scratch, True)
            cfg = {
                "addresses": hosts.addresses,
                "user": hosts.user,
                "identity_file": str(hosts.identity_file),
                "options": hosts.ssh_options,
                "workers": args.workers,
                "hold": args.hold,
                "backend": args.backend,
                "start_timeout": args.start_timeout,
                "dir": scratch,
            }
            for rep in range(args.reps):
                for n in counts if rep % 2 == 0 else counts[::-1]:
                    cmd = [sys.executable, __file__, "--worker", json.dumps({**cfg, "n": n})]
                    out = subprocess.run(
                        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
                    )
                    if out.returncode != 0:
                        sys.exit(f"the launcher for {n} hosts failed ({out.returncode})")
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    runs[n].append(got)
                    print(
                        f"  rep {rep + 1} N={n}: all up {got['all_up']:.2f} s, "
                        f"cpu {got['cpu'] * 1e3:.0f} ms, fds {got['fds']}, "
                        f"rss +{got['rss'] / 2**20:.1f} MiB, load {got['load']:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        _reaper.end_session()
    report(runs, args)


def _med(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def report(runs: dict[int, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    counts = sorted(runs)
    mib = 2**20
    w = args.workers
    columns = [
        ("first ssh (s)", "ssh_first", 1, ".2f"),
        ("last ssh (s)", "ssh_last", 1, ".2f"),
        ("first up (s)", "first_up", 1, ".2f"),
        ("all up (s)", "all_up", 1, ".2f"),
        ("raw ssh (s)", "raw_up", 1, ".2f"),
        ("end (s)", "end", 1, ".2f"),
    ]
    costs = [
        ("CPU to up (ms)", "cpu_up", 1e3, ".0f"),
        ("CPU (ms)", "cpu", 1e3, ".0f"),
        ("children CPU (ms)", "children_cpu", 1e3, ".0f"),
        ("raw ssh CPU (ms)", "raw_children_cpu", 1e3, ".0f"),
        ("fds", "fds", 1, ".0f"),
        ("sockets", "fd_socket", 1, ".0f"),
        ("pipes", "fd_pipe", 1, ".0f"),
        ("pidfds", "fd_pidfd", 1, ".0f"),
        ("threads", "threads", 1, ".0f"),
        ("RSS (MiB)", "rss", 1 / mib, ".1f"),
        ("peak (MiB)", "hwm", 1 / mib, ".1f"),
        ("ssh clients", "ssh_clients", 1, ".0f"),
        ("ssh RSS (MiB)", "ssh_rss", 1 / mib, ".1f"),
        ("ssh PSS (MiB)", "ssh_pss", 1 / mib, ".1f"),
    ]
    if args.hold > 0:
        costs += [
            ("idle CPU (ms/s)", "idle_cpu", 1e3, ".2f"),
            ("idle ssh CPU (ms/s)", "idle_ssh_cpu", 1e3, ".2f"),
        ]
    print()
    print(f"Medians of {args.reps} launcher(s) per row ({w} worker(s) per host), times from")
    print("the launch() call (end: from the workers' release to launch() returning):")
    for table in (columns, costs):
        print()
        print_table(
            ["hosts", "workers", *(c[0] for c in table)],
            [
                [str(n), str(n * w), *(format(_med(runs[n], k) * f, fmt) for _, k, f, fmt in table)]
                for n in counts
            ],
            args.markdown,
        )

    fits = [
        ("first ssh client started", "ssh_first", 1e3, "ms"),
        ("all workers up", "all_up", 1e3, "ms"),
        ("raw ssh fan-out done (baseline)", "raw_up", 1e3, "ms"),
        ("last ssh client started", "ssh_last", 1e3, "ms"),
        ("from the workers' release to launch() returning", "end", 1e3, "ms"),
        ("launcher CPU, call to all up", "cpu_up", 1e3, "ms"),
        ("launcher CPU, whole call", "cpu", 1e3, "ms"),
        ("reaped children's CPU (ssh clients, ssh -G)", "children_cpu", 1e3, "ms"),
        ("raw fan-out's ssh clients' CPU (baseline)", "raw_children_cpu", 1e3, "ms"),
        ("launcher descriptors", "fds", 1, ""),
        ("  of them sockets", "fd_socket", 1, ""),
        ("  pipes", "fd_pipe", 1, ""),
        ("  pidfds", "fd_pidfd", 1, ""),
        ("launcher threads", "threads", 1, ""),
        ("launcher RSS", "rss", 1 / 2**10, "KiB"),
        ("launcher peak RSS", "hwm", 1 / 2**10, "KiB"),
        ("local ssh clients", "ssh_clients", 1, ""),
        ("their RSS", "ssh_rss", 1 / 2**10, "KiB"),
        ("their PSS", "ssh_pss", 1 / 2**10, "KiB"),
    ]
    if args.hold > 0:
        fits += [
            ("launcher CPU while idle", "idle_cpu", 1e3, "ms/s"),
            ("ssh clients' CPU while idle", "idle_ssh_cpu", 1e3, "ms/s"),
        ]
    xs = [float(n) for n in counts]
    loads = [r["load"] for rs in runs.values() for r in rs]
    if len(xs) < 2:
        print(f"\n# no per-agent fit from one host count; load average {max(loads):.2f}")
        return
    fit_rows = []
    for label, key, scale, unit in fits:
        slope, intercept = _fit(xs, [_med(runs[n], key) for n in counts])
        fit_rows.append(
            [
                label,
                f"{slope * scale:.3g} {unit}".strip(),
                f"{slope * scale / w:.3g} {unit}".strip(),
                f"{intercept * scale:.3g} {unit}".strip(),
            ]
        )
    print()
    print(f"Least-squares fit over hosts = {', '.join(map(str, counts))} (medians):")
    print()
    print_table(["figure", "per agent (host)", "per worker", "fixed"], fit_rows, args.markdown)
    print()
    print(f"# load average (1 min) during the runs: {min(loads):.2f} to {max(loads):.2f}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,4,8,16", help="host counts (2,4,8,16)")
    parser.add_argument("--workers", type=int, default=4, help="workers per host (4)")
    parser.add_argument("--reps", type=int, default=3, help="launchers per host count (3)")
    parser.add_argument("--hold", type=float, default=2.0, help="idle seconds measured (2)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("--markdown", action="store_true")
    add_smoke(parser, hosts="2", workers=1, reps=1, hold=0.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/scale.py needs root (network namespaces, sshd)")
    try:
        drive(args)
    except KeyboardInterrupt:
        sys.exit("interrupted: every host, sshd and namespace it set up is removed")


if __name__ == "__main__":
    main()
