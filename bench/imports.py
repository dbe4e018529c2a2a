"""What importing corral costs a fresh interpreter, against the standard library and AnyIO.

Every Python child that reports its start-up (``corral.child.started()``) or
sends its log records (``corral.child.connect()``) imports ``corral.child``
first, so its import time is paid once per child: the target (issue 30,
point 7) is at most ``import logging.handlers``, the standard library's own
answer to "send my records somewhere".  ``import corral; corral.open_runner``
is what every program that runs children pays (the ``corral`` command, a
launch's agents, an application): at most 1.5x ``import anyio``, the event
loop layer it stands on (issue 30, point 7), loading none of the launch or
monitor code.

Each variant is a fresh interpreter, ``python -c "import X"``, timed from
``fork`` to exit with :func:`time.perf_counter`; the variants alternate
(ABBA) so that drift on a shared machine hits them alike.  The bare
interpreter (``python -c pass``) is measured the same way, and the table
shows each import both whole and less that floor: the floor is what any
Python child costs, whatever it imports.  corral is compiled to bytecode
first (``compileall``), as pip compiles a user's install, and the
interpreters run with ``PYTHONDONTWRITEBYTECODE=1`` as on these machines:
each reads the bytecode, none writes any.

Run it::

    python bench/imports.py              # 31 rounds
    python bench/imports.py --markdown   # the table for bench/RESULTS.md
    python bench/imports.py --smoke      # 2 rounds: only checks that it runs (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from _common import add_smoke, print_header, print_table  # bench/ is on sys.path

VARIANTS = {
    "bare interpreter": "pass",
    "import logging.handlers": "import logging.handlers",
    "import anyio": "import anyio",
    "import corral.child": "import corral.child",
    "import corral": "import corral",
    "import corral; corral.open_runner": "import corral; corral.open_runner",
}
#: variant -> (its baseline, the most its cost may be, as a multiple of the baseline's).
TARGETS = {
    "import corral.child": ("import logging.handlers", 1.0),
    "import corral; corral.open_runner": ("import anyio", 1.5),
}


def once(code: str) -> float:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=31, help="fresh interpreters per variant")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    add_smoke(parser, rounds=2)
    args = parser.parse_args()
    print_header("import cost", "imports.py", ("anyio", "msgspec"))
    import corral  # only for its folder

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.dirname(corral.__file__)], check=True
    )

    names = list(VARIANTS)
    for name in names:  # warm the file cache and the bytecode caches once
        once(VARIANTS[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(once(VARIANTS[name]))
    median = {name: statistics.median(values) for name, values in times.items()}
    floor = median["bare interpreter"]

    def net(name: str) -> float:
        return median[name] - floor

    print()
    rows = []
    for name in names:
        ratio = target = met = ""
        if name in TARGETS:
            baseline, most = TARGETS[name]
            ratio = f"{net(name) / net(baseline):.2f} x {baseline}"
            target = f"<= {most:g}x"
            met = "yes" if net(name) <= most * net(baseline) else "**NO**"
        rows.append(
            (
                name,
                f"{median[name] * 1000:.1f} ms",
                f"{net(name) * 1000:.1f} ms",
                ratio,
                target,
                met,
            )
        )
    header = (
        "variant",
        f"wall, median of {args.rounds}",
        "less the bare interpreter",
        "ratio",
        "target",
        "met",
    )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
