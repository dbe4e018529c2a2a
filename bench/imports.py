"""What a child pays to import corral's child side, against ``import logging.handlers``.

Every Python child that reports its start-up (``corral.child.started()``) or
sends its log records (``corral.child.connect()``) imports ``corral.child``
first, so its import time is paid once per child.  The target (issue 8,
section 4) is at most 1.5x ``import logging.handlers``, the standard
library's own answer to "send my records somewhere".

Each variant is a fresh interpreter, ``python -c "import X"``, timed from
``fork`` to exit with :func:`time.perf_counter`; the variants alternate
(ABBA) so that drift on a shared machine hits them alike.  The bare
interpreter (``python -c pass``) is measured the same way, and the table
shows each import both whole and less that floor: the floor is what any
Python child costs, whatever it imports.

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
    "import corral.child": "import corral.child",
    "import corral": "import corral",
    "import corral; corral.open_runner": "import corral; corral.open_runner",
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
    base = median["import logging.handlers"] - floor

    print()
    rows = []
    for name in names:
        whole = median[name] * 1000
        net = (median[name] - floor) * 1000
        ratio = "" if name == "bare interpreter" else f"{(median[name] - floor) / base:.2f}"
        target = "<= 1.5x" if name == "import corral.child" else ""
        met = ""
        if target:
            met = "yes" if (median[name] - floor) <= 1.5 * base else "**NO**"
        rows.append((name, f"{whole:.1f} ms", f"{net:.1f} ms", ratio, target, met))
    header = (
        "variant",
        f"wall, median of {args.rounds}",
        "less the bare interpreter",
        "ratio to logging.handlers",
        "target",
        "met",
    )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
