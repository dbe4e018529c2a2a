"""Every example runs as ``python examples/X.py``, exits 0 and prints what it promises.

The examples are found with a glob, so a new ``examples/*.py`` is run here
without touching this file.  List the lines it must print in ``EXPECTED`` to
check its output as well; an example that is not listed must still exit 0,
print something and leave no process behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.helpers.processes import TAG_VAR

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: Seconds an example may take (below pytest-timeout's, so this one reports).
TIMEOUT = 45

_APP_STDOUT = [
    r"web: listening on port \d+ \(pid \d+\)",
    r"web: GET / -> 'hello from the web child'",
    r"build: exited with code 0, said b'compiling\.\.\.\\nlinking\.\.\.\\nbuild ok\\n'",
    r"lint: exited with code 3 \(check=False, so not an error\)",
    r"web: stopped, return code -15",
    r"caught ProcessFailed: step exited with code 2",
    r"  its stderr tail: 'error: out of coffee'",
    r"done: every child has exited",
]
# Child output reaches the console (stderr) with a "HH:MM:SS source |" prefix.
_APP_STDERR = [
    r"\d\d:\d\d:\d\d app\.build \| build ok",
    r"\d\d:\d\d:\d\d pipeline\.step \| error: out of coffee",
]

#: Per example: regular expressions that must match whole lines, in this order
#: (other lines may come between them), on stdout and on stderr.
EXPECTED: dict[str, dict[str, list[str]]] = {
    "trio_app.py": {"stdout": _APP_STDOUT, "stderr": _APP_STDERR},
    "asyncio_app.py": {"stdout": _APP_STDOUT, "stderr": _APP_STDERR},
    "handshake.py": {
        "stdout": [
            r"worker reported run id [0-9a-f]{8} and keeps working",
            r"worker has done 3 steps; stopping it",
            r"worker stopped, return code -15",
            r"shell child reported \{'port': 8080\}",
            r"caught StartupFailed: broken exited with code 1 before reporting that it started",
            r"  its stderr tail: 'no config file'",
            r"done: every child has exited",
        ],
        "stderr": [
            r"\d\d:\d\d:\d\d demo\.worker \| step 1 of run [0-9a-f]{8}",
            r"\d\d:\d\d:\d\d demo\.worker \| step 3 of run [0-9a-f]{8}",
        ],
    },
    "from_thread.py": {
        "stdout": [
            r"calling r\.cancel\(\) from a thread raised WrongLoopError",
            r"r\.token\.run\(r\.run, \.\.\.\) finished 'step' with code 0",
            r"r\.token\.run_sync sees these children running: \['server'\]",
            r"r\.token\.run\(server\.stop\) stopped the server, return code -15",
            r"done: every child has exited",
        ],
        "stderr": [r"\d\d:\d\d:\d\d threads\.step \| step output"],
    },
    "logs.py": {
        # Order is kept per channel only: the child's logging records are in
        # order among themselves, its prints among themselves (checked in
        # test_logs_example_tail_loses_nothing).
        "stdout": [
            r"tail: \[logging\] INFO app\.db: connected to db\.example:5432",
            r"tail: \[logging\] WARNING app\.db: query took 2\.5 s",
            r"tail: \[logging\] ERROR app\.db: query failed "
            r"\(traceback ending in 'ZeroDivisionError: division by zero'\)",
            r"app exited with code 0; its records are all written",
            r"the alerts handler got:",
            r"  WARNING app\.db: query took 2\.5 s",
            r"  ERROR app\.db: query failed",
            r"log folder: logs/\d{8}-\d{6}-logs/",
            r"  combined\.log +\d+ lines",
            r"  logs\.app\.log +\d+ lines",
            r"  logs\.log +4 lines",
            r"  logs\.shell\.log +3 lines",
            r"first lines of combined\.log:",
            r"  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} DEBUG    "
            r"logs started shell \(pid \d+\): sh -c .*",
        ],
        "stderr": [
            r"\d\d:\d\d:\d\d logs\.shell \| compiling",
            r"\d\d:\d\d:\d\d logs\.shell \| warning: flag -O9 is deprecated",
            r"\d\d:\d\d:\d\d logs\.shell \| no newline at the end",
        ],
    },
    "launch.py": {
        "stdout": [
            r"results in rank order: \[0, 1, 4, 9\]",
            r"by host: \{'localhost': \[0, 1, 4, 9\]\}",
            r"partial with keywords: \['rank 0 of 3: hello!', 'rank 1 of 3: hello!', "
            r"'rank 2 of 3: hello!'\]",
            r"caught ValueError from rank 2 on localhost: rank 2 cannot divide by zero",
            r"  remote traceback ends with: ValueError: rank 2 cannot divide by zero",
            r"  the sleeping siblings were stopped: True",
            r"caught WorkerFailed: worker rank 1 on host localhost \(local rank 1\) exited with "
            r"code 3 without an exception; last stderr lines:",
            r"  rank 1, host localhost, exit code 3",
            r"  stderr tail: 'rank 1: allocating 1 TiB'",
            r"done: every worker has exited",
        ],
        "stderr": [
            r"\d\d:\d\d:\d\d example\.agent-0\.worker-2 \| working",
            r"\d\d:\d\d:\d\d example\.agent-0\.worker-1 \| rank 1: allocating 1 TiB",
        ],
    },
    "launch_torch.py": {
        "stdout": [r"rank [0-3] of 4: all_reduce\(sum\) = 10\.0 \(gloo\)"] * 4
        + [r"every rank agrees: 10\.0"],
        "stderr": [r"\d\d:\d\d:\d\d torch\.agent-0\.worker-\d \| rank \d: gloo all_reduce done"],
    },
    "sync_launch.py": {
        "stdout": [
            r"losses in rank order: \[0\.091, 0\.083, 0\.077, 0\.071\]",
            r"from inside asyncio\.run: \[0\.167, 0\.143\]",
            r"caught FloatingPointError: rank 1: the loss is NaN",
            r"  the other workers were stopped: True",
            r"done: every worker has exited",
        ],
        "stderr": [
            r"\d\d:\d\d:\d\d train\.agent-0\.worker-\d \| rank \d of 4: 10 steps",
            r"\d\d:\d\d:\d\d lib\.agent-0\.worker-\d \| rank \d of 2: 5 steps",
        ],
    },
    "sync_runner.py": {
        "stdout": [
            r"build: exited with code 0, said b'compiling\\nbuild ok\\n'",
            r"server said: listening on port 8080",
            r"server said: request 3 served",
            r"server: still running after 0\.1 s, as subprocess\.Popen\.wait would say",
            r"server: poll\(\) is None; stop\(\) returns -15",
            r"another thread got WrongLoopError: the runner is its opener's",
            r"caught ProcessFailed: step exited with code 2",
            r"after the block, the handle says the runner is closed",
            r"done: every child has exited \(server's code: -15\)",
        ],
        "stderr": [
            r"\d\d:\d\d:\d\d script\.server \| listening on port 8080",
            r"\d\d:\d\d:\d\d script\.step \| error: out of coffee",
        ],
    },
    "monitor.py": {
        "stdout": [
            r"monitor page: http://127\.0\.0\.1:\d+/\?token=[\w-]+",
            r"in a terminal: corral tail 'http://127\.0\.0\.1:\d+/\?token=[\w-]+'",
            r"hello: protocol 1, runner shop, web \(running, pid \d+\), "
            r"worker \(running, pid \d+\)",
            r"record: shop\.web INFO listening on port 8080",
            r"record: shop\.worker WARNING app: disk 91% full",
            r"process: worker failed \(exit code 1\)",
            r"process: web exited \(exit code 0\)",
            r"end: the runner has ended",
        ],
        "stderr": [
            r"\d\d:\d\d:\d\d shop \| monitor at http://127\.0\.0\.1:\d+/\?token=[\w-]+",
            r"\d\d:\d\d:\d\d shop\.web \| listening on port 8080",
            r"\d\d:\d\d:\d\d shop\.worker \| app: disk 91% full",
        ],
    },
}

#: Examples that need an optional package (a skip, which is an error in CI).
NEEDS = {"launch_torch.py": "torch"}

#: Examples that need Trio (corral's ``trio`` extra, which the README's set-up installs):
#: without it, each says so, naming the extra.
NEEDS_TRIO = {"trio_app.py", "from_thread.py"}

#: Examples that log a traceback on purpose (it reaches the console, on
#: stderr): how many.  Any other traceback on stderr is a crash.
TRACEBACKS = {"logs.py": 1}


def run_example(path: Path, tag: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", TAG_VAR: tag}
    return subprocess.run(
        [sys.executable, str(path.relative_to(ROOT))],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def assert_lines_in_order(text: str, patterns: list[str], what: str) -> None:
    lines = text.splitlines()
    position = 0
    for pattern in patterns:
        for index in range(position, len(lines)):
            if re.fullmatch(pattern, lines[index]):
                position = index + 1
                break
        else:
            pytest.fail(f"no line of {what} after line {position} matches {pattern!r}:\n{text}")


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "trio_app.py",
        "asyncio_app.py",
        "handshake.py",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example(path: Path, tag: str) -> None:
    # The ``tag`` fixture marks every process the example starts and fails
    # the test if any of them is still alive afterwards.
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name])
    result = run_example(path, tag)
    assert result.returncode == 0, (
        f"{path.name} exited with code {result.returncode}\n{describe(result)}"
    )
    assert result.stdout.strip(), f"{path.name} printed nothing on stdout\n{describe(result)}"
    tracebacks = result.stderr.count("Traceback (most recent call last)")
    assert tracebacks == TRACEBACKS.get(path.name, 0), describe(result)
    for stream, patterns in EXPECTED.get(path.name, {}).items():
        assert_lines_in_order(getattr(result, stream), patterns, f"{path.name}'s {stream}")


def test_the_readme_set_up_installs_what_the_examples_need() -> None:
    from tests.project.test_readme import marked_command

    assert marked_command("run-command").startswith("pip install -e '.[trio]' && ")


def test_the_examples_that_need_trio_are_listed() -> None:
    uses = {
        p.name
        for p in EXAMPLES
        if re.search(r"^\s*import trio\b|backend=\"trio\"\)", p.read_text(), re.MULTILINE)
    }
    assert uses == NEEDS_TRIO


@pytest.mark.parametrize("name", sorted(NEEDS_TRIO))
def test_an_example_that_needs_trio_says_so_without_it(name: str) -> None:
    path = ROOT / "examples" / name
    hide = (
        "import runpy, sys\n"
        "sys.modules['trio'] = None  # as if it were not installed\n"
        f"sys.argv = [{str(path)!r}]\n"
        f"runpy.run_path({str(path)!r}, run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 1, describe(result)
    assert "corral[trio]" in result.stderr and "Traceback" not in result.stderr, describe(result)


def test_trio_and_asyncio_apps_do_the_same_job(tag: str) -> None:
    """Both apps print the same report, up to pids and port numbers."""

    def report(name: str) -> list[str]:
        result = run_example(ROOT / "examples" / name, tag)
        assert result.returncode == 0, describe(result)
        return [re.sub(r"\d+", "N", line) for line in result.stdout.splitlines()]

    assert report("trio_app.py") == report("asyncio_app.py")


def test_logs_example_tail_loses_nothing(tag: str) -> None:
    """The tail sees every record of the Python child, its prints before ``os._exit`` too."""
    result = run_example(ROOT / "examples" / "logs.py", tag)
    assert result.returncode == 0, describe(result)
    tail = [line for line in result.stdout.splitlines() if line.startswith("tail: ")]
    assert sorted(tail) == sorted(
        [
            "tail: [stdout] INFO logs.app: app starting",
            "tail: [logging] INFO app.db: connected to db.example:5432",
            "tail: [logging] WARNING app.db: query took 2.5 s",
            "tail: [logging] ERROR app.db: query failed "
            "(traceback ending in 'ZeroDivisionError: division by zero')",
            "tail: [stdout] INFO logs.app: app done",
        ]
    ), describe(result)
    stdout_lines = [line for line in tail if line.startswith("tail: [stdout]")]
    assert stdout_lines[0].endswith("app starting"), describe(result)
    assert "ZeroDivisionError: division by zero" in result.stderr, describe(result)


# -- complete programs in the documentation ---------------------------------------------

#: Pages whose complete programs (``python`` code blocks that call ``anyio.run``,
#: ``trio.run`` or ``asyncio.run``) must run as they are.
DOC_PAGES = [
    "tutorial.rst",
    "howto/handshake.rst",
    "howto/embedding.rst",
    "howto/limits.rst",
    "howto/logging.rst",
    "howto/subprocess.rst",
    "howto/monitor.rst",
]

_CODE_BLOCK = re.compile(r"^\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", re.MULTILINE)
_MAIN_CALL = re.compile(r"^(anyio|trio|asyncio)\.run\(", re.MULTILINE)


def doc_programs() -> list[tuple[str, str]]:
    programs = []
    for page in DOC_PAGES:
        text = (ROOT / "docs" / page).read_text()
        blocks = [textwrap.dedent(b) for b in _CODE_BLOCK.findall(text)]
        numbered = [b for b in blocks if _MAIN_CALL.search(b)]
        programs += [(f"{page}#{n}", code) for n, code in enumerate(numbered, 1)]
    return programs


def test_docs_have_programs() -> None:
    assert len(doc_programs()) >= 10


@pytest.mark.parametrize(("where", "code"), doc_programs(), ids=[w for w, _ in doc_programs()])
def test_doc_program(where: str, code: str, tag: str, tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(code)
    env = {**os.environ, "NO_COLOR": "1", TAG_VAR: tag}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{where} exited with {result.returncode}\n{describe(result)}"
    assert result.stdout.strip(), f"{where} printed nothing\n{describe(result)}"
