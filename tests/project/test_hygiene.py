"""Project rules that a reader cannot see at a glance, checked on the source tree.

* No bare tasks and no daemon threads in ``src/``: every concurrent activity
  lives in a task group owned by a runner, so nothing can fail silently or
  outlive its scope.  Checked on the syntax tree, so docstrings and comments
  may still talk about what is forbidden.
* Every example is shown in the documentation, and every public name is in
  the API reference.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

import corral
import corral.child

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOCS = ROOT / "docs"

#: Names that spawn an unowned task, and what to use instead.
_BARE_TASK_NAMES = {"create_task", "ensure_future"}
_ADVICE = "start it in a task group owned by the runner (tg.start_soon) or use anyio.to_thread"

#: The exceptions, by the qualified name of the function they are in, each with its reason.
#: Keep this short: each entry is a place where a reader must convince themselves by hand.
_EXEMPT = {
    "HostHold.__init__": (
        "a Trio guest run's one task on its asyncio host: asyncio.run's final cancel-all "
        "sees only asyncio tasks, so only a task can hold the host loop open until the "
        "guest's children are stopped; it catches its cancellation and raises nothing else"
    ),
    "pytest_unconfigure": (
        "corral.testing's one thread, started at the end of the outermost session only when "
        "a leaked non-daemon thread it reported still runs: a daemon on purpose, it waits "
        "for the interpreter's end and exits the process that thread would hold up"
    ),
}


def violations(
    source: str, filename: str = "<src>", exempt_names: Collection[str] = _EXEMPT
) -> Iterator[str]:
    """Every bare task, new thread or daemon flag in ``source``, as ``file:line: what``.

    Mentioning ``threading.Thread`` (in a type annotation, say) is fine; calling
    or subclassing it is not.  What is inside a function named in ``exempt_names``
    (:data:`_EXEMPT`) is not reported.
    """
    tree = ast.parse(source, filename)
    exempt = {
        id(inner)
        for function in _functions(tree)
        if function[0] in exempt_names
        for inner in ast.walk(function[1])
    }
    thread_aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "threading"
        for alias in node.names
        if alias.name == "Thread"
    }

    def is_thread_class(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in thread_aliases
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "Thread"
            and isinstance(node.value, ast.Name)
            and node.value.id == "threading"
        )

    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in _BARE_TASK_NAMES:
                    yield f"{where}: imports {alias.name} from {node.module}"
        elif isinstance(node, ast.Attribute) and node.attr in _BARE_TASK_NAMES:
            yield f"{where}: uses .{node.attr} (a bare task)"
        elif isinstance(node, ast.Name) and node.id in _BARE_TASK_NAMES:
            yield f"{where}: uses {node.id} (a bare task)"
        elif isinstance(node, ast.Call):
            if is_thread_class(node.func):
                yield f"{where}: starts a thread with threading.Thread(...)"
            if isinstance(node.func, ast.Attribute) and node.func.attr == "setDaemon":
                yield f"{where}: calls setDaemon"
            for keyword in node.keywords:
                if keyword.arg == "daemon" and not _is_false(keyword.value):
                    yield f"{where}: passes daemon={ast.unparse(keyword.value)}"
        elif isinstance(node, ast.ClassDef) and any(is_thread_class(b) for b in node.bases):
            yield f"{where}: subclasses threading.Thread"
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "daemon":
                    yield f"{where}: sets .daemon"


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every function and method in ``tree`` with its qualified name (``Class.method``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from _functions(node, f"{name}.")


def test_every_exemption_is_still_needed() -> None:
    """An exemption whose function no longer exists, or no longer needs it, goes."""
    needed = set()
    for path in src_files():
        source = path.read_text()
        for name, function in _functions(ast.parse(source)):
            if name not in _EXEMPT:
                continue
            # The function's own violations, in its module (whose imports name them).
            lines = range(function.lineno, (function.end_lineno or function.lineno) + 1)
            others = set(_EXEMPT) - {name}
            for problem in violations(source, "f", others):
                if int(problem.split(":")[1]) in lines:
                    needed.add(name)
    assert needed == set(_EXEMPT), f"exemptions no longer needed: {set(_EXEMPT) - needed}"


def _is_false(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, None)


def src_files() -> list[Path]:
    files = sorted(SRC.rglob("*.py"))
    assert files, f"no Python files under {SRC}"
    return files


def test_no_bare_tasks_or_daemon_threads_in_src() -> None:
    found = [
        problem
        for path in src_files()
        for problem in violations(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, f"{_ADVICE}:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "import asyncio\nasyncio.create_task(main())",
        "import asyncio\nasyncio.ensure_future(main())",
        "loop = get_loop()\nloop.create_task(main())",
        "from asyncio import create_task\ncreate_task(main())",
        "import threading\nthreading.Thread(target=f).start()",
        "from threading import Thread as T\nT(target=f)",
        "import threading\nclass Worker(threading.Thread): pass",
        "from threading import Thread\nclass Worker(Thread): pass",
        "t = make_thread()\nt.daemon = True",
        "Timer(1, f, daemon=True)",
        "spawn = asyncio.create_task",
    ],
)
def test_the_check_catches(snippet: str) -> None:
    assert list(violations(snippet)), f"not caught:\n{snippet}"


@pytest.mark.parametrize(
    "snippet",
    [
        '"""Never call asyncio.create_task or start a threading.Thread(daemon=True)."""',
        "# loop.create_task(x) would be a bare task",
        "import anyio\nasync def f():\n    async with anyio.create_task_group() as tg:\n"
        "        tg.start_soon(g)",
        "import threading\nthreading.current_thread().name",
        "import threading\ndef f(thread: threading.Thread) -> None: ...",
        "from threading import Thread\nx: Thread | None = None",
        "import anyio.to_thread\nanyio.to_thread.run_sync(f)",
    ],
)
def test_the_check_allows(snippet: str) -> None:
    assert not list(violations(snippet))


def docs_text() -> str:
    pages = sorted(DOCS.rglob("*.rst"))
    assert pages, f"no .rst pages under {DOCS}"
    return "\n".join(page.read_text() for page in pages)


def test_every_example_is_in_the_docs() -> None:
    text = docs_text()
    examples = sorted((ROOT / "examples").glob("*.py"))
    assert examples
    missing = [p.name for p in examples if f"examples/{p.name}" not in text]
    assert not missing, f"examples not mentioned in any docs/**/*.rst page: {missing}"


_DIRECTIVE = re.compile(
    r"^\.\. (?:auto)?(?:function|class|exception|data|attribute|module)::\s+(?:corral\.)?(\w+)",
    re.MULTILINE,
)


def test_every_public_name_is_in_the_api_reference() -> None:
    api = (DOCS / "api.rst").read_text()
    documented = set(_DIRECTIVE.findall(api))
    missing = sorted(set(corral.__all__) - documented)
    assert not missing, f"names in corral.__all__ without an entry in docs/api.rst: {missing}"
    assert ".. automodule:: corral.child" in api
    assert corral.child.__all__, "corral.child exports nothing"


# -- what the package is made of -----------------------------------------------------------


def test_nothing_under_src_imports_trio() -> None:
    """Trio is an optional extra: corral must import and run without it."""
    found = []
    for path in src_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: imports {name}"
                for name in names
                if name == "trio" or name.startswith("trio.")
            ]
    assert not found, "\n".join(found)


def test_corral_runs_without_trio_installed() -> None:
    """With trio hidden, the package imports and a runner works on asyncio."""
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'trio' or name.startswith('trio.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import asyncio, corral\n"
        "async def main():\n"
        "    async with corral.open_runner(console=False) as r:\n"
        "        print((await r.run(['echo', 'ok'], stdout=corral.PIPE)).stdout.decode().strip())\n"
        "asyncio.run(main())\n"
        "assert 'trio' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_child_side_imports_nothing_of_the_launcher() -> None:
    code = (
        "import sys, corral.child\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('anyio', 'trio', 'asyncio', 'msgspec', 'rich') or m.startswith('corral.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert loaded <= {"corral._facade", "corral.child", "corral._sys", "corral._sys._childenv"}, (
        loaded
    )


def test_import_corral_is_lazy() -> None:
    code = "import sys, corral\nprint(' '.join(sorted(m for m in sys.modules if 'anyio' in m)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_wheel_holds_the_package_and_nothing_stray(tmp_path: Path) -> None:
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("corral-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    package = sorted(n for n in names if n.startswith("corral/"))
    expected = sorted(
        f"corral/{p.relative_to(SRC / 'corral').as_posix()}"
        for p in (SRC / "corral").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert package == expected
    stray = [n for n in package if n.endswith((".orig", ".rej", ".pyc", "~"))]
    assert not stray
    assert "corral/py.typed" in package
