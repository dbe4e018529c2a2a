"""Every example runs as ``python examples/X.py``, exits 0 and prints what it promises.

The examples are found with a glob, so a new ``examples/*.py`` is run here
without touching this file.  List the lines it must print in ``EXPECTED`` to
check its output as well; an example that is not listed must still exit 0,
print something and leave no process behind.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import docs
from tests.helpers.processes import TAG_VAR

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: Seconds an example may take (below pytest-timeout's, so this one reports).
TIMEOUT = 90
pytestmark = pytest.mark.timeout(120)

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_trio_and_asyncio_apps_do_the_same_job(tag: str) -> None:
    """Both apps print the same report, up to pids and port numbers."""

    def report(name: str) -> list[str]:
        result = run_example(ROOT / "examples" / name, tag)
        assert result.returncode == 0, describe(result)
        return [re.sub(r"\d+", "N", line) for line in result.stdout.splitlines()]

    assert report("trio_app.py") == report("asyncio_app.py")


@pytest.mark.slow
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


# -- every code block of the documentation and the README ------------------------------

#: What a whole program may call on to run as it is: placeholders, each a file in its folder.
PLACEHOLDERS = {
    "train.py": "import os, sys\nprint('training', os.environ.get('RANK', '0'), *sys.argv[1:])\n",
    "build.py": "print('built')\n",
    "worker.py": "print('working')\n",
}

#: Languages whose blocks are code: each block is a whole program or says it is a fragment.
CODE = {"python", "sh"}

#: Pages' code blocks, and the README's, with what each is.
ALL_BLOCKS = [b for page in docs.pages() for b in docs.page_blocks(page)] + [
    b for b in docs.readme_blocks() if b.language in CODE
]


def kind(block: docs.Block) -> str:
    """``fragment``, ``server`` (tests/core/test_frameworks.py runs it), ``test`` (a test
    module for pytest), ``command`` (the README's, which CI runs), ``text`` or ``program``."""
    if block.language not in CODE:
        return "text"
    if block.caption.startswith("Fragment"):
        return "fragment"
    if block.name.startswith("server-"):
        return "server"
    if block.caption.startswith("test_"):
        return "test"
    if block.where.startswith("README.md") and block.language == "sh":
        return "command"
    return "program"


def runnable(what: str) -> list[docs.Block]:
    return [b for b in ALL_BLOCKS if kind(b) == what]


def test_the_docs_have_programs_of_every_kind() -> None:
    assert len(runnable("program")) >= 40
    assert runnable("test") and runnable("server") and runnable("fragment")


def test_a_fragment_says_where_the_whole_program_is() -> None:
    """Its caption names an example, or a whole program on the same page."""
    wholes = runnable("program") + runnable("test") + runnable("server")
    pages_with_programs = {b.where.split(":")[0] for b in wholes}
    for block in runnable("fragment"):
        named = re.findall(r"examples/\w+\.py", block.caption)
        if named:
            assert all((ROOT / n).is_file() for n in named), block.where
        else:
            assert re.search(r"\b(above|below)\b", block.caption), (
                f"{block.where}: the caption names no whole program: {block.caption!r}"
            )
            assert block.where.split(":")[0] in pages_with_programs, block.where


def test_every_server_block_is_run_by_the_framework_tests() -> None:
    from tests.core.test_frameworks import DOC_SERVERS

    assert sorted(b.name for b in runnable("server")) == sorted(DOC_SERVERS)


_AST = ast.PyCF_ONLY_AST


def test_no_program_hides_in_a_literal_block() -> None:
    """A ``::`` block is for text; Python code goes in a ``code-block`` that the tests see."""
    for page in docs.pages():
        for block in docs.literal_blocks(page):
            if not re.search(r"\b(import|def|async|await)\b", block.code):
                continue
            try:  # top-level ``await`` and ``async with`` count: a reader pastes them
                compile(block.code, block.where, "exec", _AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            except SyntaxError:
                continue
            pytest.fail(f"{block.where}: Python code in a literal block:\n{block.code}")


def _run_block(block: docs.Block, tag: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    for name, text in PLACEHOLDERS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    if block.language == "sh":
        argv = ["sh", "-ec", block.code]
    elif kind(block) == "test":
        (tmp_path / block.caption.split(":")[0]).write_text(block.code)
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."]
    else:
        (tmp_path / "program.py").write_text(block.code)
        argv = [sys.executable, "program.py"]
    return subprocess.run(
        argv,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", TAG_VAR: tag},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable("program") + runnable("test"), ids=lambda b: b.where)
def test_every_whole_block_runs(block: docs.Block, tag: str, tmp_path: Path) -> None:
    result = _run_block(block, tag, tmp_path)
    assert result.returncode == 0, (
        f"{block.where} exited with {result.returncode}\n{describe(result)}"
    )
