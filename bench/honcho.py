"""``corral up`` against ``honcho start``: how soon the first line shows, and the process's;
and ``corral --help`` against ``honcho --help``.

Target (issue 25, item 5): ``corral up`` shows its first line no later than
``honcho start`` does, with the same Procfile (``web: echo ready; exec sleep
1000``) on a pipe.  Both print ``system | web.1 started (pid=...)`` first,
then the process's ``web.1 | ready``; measured from the launcher's start to
each, then the launcher gets SIGTERM and the bench waits for it and the
process to be gone (pidfds, no polling).

Targets (issue 26, item 6): ``corral --help`` exits no later than ``honcho
--help`` does.

The two alternate repetition by repetition (ABBA), so that drift on a shared
machine hits them alike.  Each runs from its own console script beside this
Python (not through a shell shim such as pyenv's, which would add its own start).
Without honcho installed (``pip install honcho``) only corral is measured, and
the table says so.

Usage::

    python bench/honcho.py                # 21 repetitions
    python bench/honcho.py --markdown     # the table in Markdown (for bench/RESULTS.md)
    python bench/honcho.py --smoke        # tiny sizes: only checks that it runs (CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_smoke, format_table, print_header, wait_all
from _private import CLI_MODULE

PROCFILE = "web: echo ready; exec sleep 1000\n"


def corral_argv() -> list[str]:
    script = Path(sys.executable).with_name("corral")
    return [str(script)] if script.exists() else [sys.executable, "-m", CLI_MODULE]


def honcho_argv() -> list[str] | None:
    script = Path(sys.executable).with_name("honcho")
    found = str(script) if script.exists() else shutil.which("honcho")
    return [found] if found else None


def measure_help(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from the start of ``argv --help`` to its exit."""
    started = time.perf_counter()
    subprocess.run([*argv, "--help"], stdout=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - started


def measure(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from the start to the first line, and to the process's ``ready``."""
    started = time.perf_counter()
    launcher = subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    assert launcher.stdout is not None
    first = ready = None
    seen = []
    try:
        while ready is None:
            line = launcher.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[0]} ended before its process was ready: {seen}")
            now = time.perf_counter() - started
            seen.append(line)
            first = now if first is None else first
            if line.rstrip().endswith("| ready"):
                ready = now
        fd = os.pidfd_open(launcher.pid)
        try:
            os.killpg(launcher.pid, signal.SIGTERM)
            wait_all([fd], 30.0)
        finally:
            os.close(fd)
        launcher.communicate(timeout=30)
        return first, ready
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--markdown", action="store_true")
    add_smoke(parser, reps=1)
    args = parser.parse_args()
    honcho = honcho_argv()
    packages = ("click", "anyio") + (("honcho",) if honcho else ())
    print_header("corral up against honcho start", "honcho.py", packages)
    variants = {"corral up": [*corral_argv(), "up", "--no-status"]}
    if honcho is not None:
        variants["honcho start"] = [*honcho, "start"]
    else:
        print("# honcho is not installed (pip install honcho): corral up alone")
    first: dict[str, list[float]] = {key: [] for key in variants}
    ready: dict[str, list[float]] = {key: [] for key in variants}
    helps = {"corral --help": corral_argv()}
    if honcho is not None:
        helps["honcho --help"] = honcho
    helped: dict[str, list[float]] = {key: [] for key in helps}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Procfile").write_text(PROCFILE)
        # As installed programs start: their modules compiled once, into a cache of the
        # run's own (whatever PYTHONDONTWRITEBYTECODE says here).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"NO_COLOR": "1", "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}
        for argv in variants.values():
            measure(argv, tmp, env)  # the warm-up: compiles, fills the page cache
            measure_help(argv, env)
        keys = list(variants)
        for rep in range(args.reps):
            for key in keys if rep % 2 == 0 else keys[::-1]:  # ABBA
                f, r = measure(variants[key], tmp, env)
                first[key].append(f)
                ready[key].append(r)
            for key in list(helps) if rep % 2 == 0 else list(helps)[::-1]:
                helped[key].append(measure_help(helps[key], env))
            print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    header = ["launcher", "first line (median)", "process's line (median)", "first line (max)"]
    rows = [
        [
            key,
            _ms(statistics.median(first[key])),
            _ms(statistics.median(ready[key])),
            _ms(max(first[key])),
        ]
        for key in variants
    ]
    print()
    print(
        f"## From the launcher's start to its first line, and to `web.1 | ready` "
        f"(medians of {args.reps})"
    )
    print()
    print(format_table(header, rows, args.markdown))
    if honcho is not None:
        ratio = statistics.median(first["corral up"]) / statistics.median(first["honcho start"])
        print()
        met = ratio <= 1.0
        print(
            f"- first line, corral up / honcho start: {ratio:.2f} (target <= 1): "
            f"{'met' if met else 'NOT met'}"
        )
    print()
    print(f"## From the start of `--help` to its exit (medians of {args.reps})")
    print()
    rows = [[key, _ms(statistics.median(v)), _ms(max(v))] for key, v in helped.items()]
    print(format_table(["command", "median", "max"], rows, args.markdown))
    if honcho is not None:
        ratio = statistics.median(helped["corral --help"]) / statistics.median(
            helped["honcho --help"]
        )
        print()
        print(
            f"- corral --help / honcho --help: {ratio:.2f} (target <= 1): "
            f"{'met' if ratio <= 1.0 else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
