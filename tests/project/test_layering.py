"""The package's architecture, checked on its source tree (see each folder's ``__init__.py``).

* Every module belongs to a *unit* of :data:`LAYERS`: a folder (``corral._logs``) or a root
  module (``corral._errors``).  A folder's ``__init__.py`` is a docstring and nothing else: it
  says what the folder holds and, on its ``Public face:`` line, which of its modules the rest
  of the package may import.
* Units form a DAG: a module imports its own unit, or a unit on a strictly lower layer.  Every
  import counts: top-level, inside a function, under ``TYPE_CHECKING``, relative or absolute.
* No import cycle among modules either, inside a folder included.
* Another folder is entered through its public face only.
* No module imports another module's underscored name, and none reaches into an underscored
  member that its own module does not define (``x._name`` with ``x`` not ``self``/``cls``),
  but for the few foreign privates of :data:`FOREIGN_PRIVATE_OK`, each with its reason.
* Every module has at most :data:`MAX_LINES` lines, every folder at most
  :data:`MAX_MODULES` modules.
* ``import corral.child`` (in every child that reports its start or sends its records) and
  ``python -m corral._worker`` (every worker of a launch) load no event loop library.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"
TESTS = Path(__file__).resolve().parents[1]
MAX_LINES = 600
MAX_MODULES = 14

#: unit -> layer.  A module may import its own unit and units of lower layers only.
LAYERS: dict[str, int] = {
    "corral._errors": 0,  # every error a user may catch
    "corral._checks": 1,  # checks of arguments every layer takes
    "corral._results": 1,  # what a run and a launch return
    "corral._sys": 2,  # Linux and the event loops
    "corral._logs": 3,  # the log path
    "corral.child": 4,  # the child side (public)
    "corral._launch": 5,  # scale-out, below the core: it gets a LaunchContext, not a Runner
    "corral._monitor": 5,  # the monitor, below the core: it sees processes as ProcessView
    "corral._core": 6,  # the runner and its processes
    "corral._sync": 7,  # the blocking facade, on the public names from their homes
    "corral": 8,  # the facade: lazy, with TYPE_CHECKING imports of the homes only
    "corral._cli": 9,  # the corral command
    "corral.testing": 9,  # the pytest plugin (public), on the facade
    "corral._agent": 9,  # python -m corral._agent: a stable entry point
    "corral._worker": 9,  # python -m corral._worker: a stable entry point
}

#: Reaches into underscored members of other libraries, allowed: (module, name) -> why.
FOREIGN_PRIVATE_OK: dict[tuple[str, str], str] = {
    ("corral._sys._backend", "_run_until_complete_cb"): (
        "asyncio has no public way to tell asyncio.run's main task (is_asyncio_main_task); "
        "tests/core/test_backend.py fails loudly if it stops working"
    ),
    ("corral._sys._backend", "_callbacks"): "the same: the task's done callbacks",
    ("corral._cli._io", "_exit"): "os._exit is the documented way out of a forked child",
    ("corral._core._lifeline", "_exit"): "os._exit is the documented way out of a forked child",
    ("corral.testing", "_exit"): (
        "the one way out of a process whose leaked non-daemon thread (reported already) "
        "would hold its end up for good"
    ),
}
#: Methods of named tuples: public API despite the underscore.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
#: Bound to stdlib modules whose underscored names stand for public API.
STDLIB_PRIVATE_OK = {("sys", "_getframe")}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module
    names: tuple[str, ...]  # names taken from it (``from X import a, b``); () for a module
    line: int
    where: str  # "top", "function" or "TYPE_CHECKING"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


@cache
def tree(module: str) -> ast.Module:
    path = modules()[module]
    return ast.parse(path.read_text(), str(path))


def unit_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} belongs to no unit of LAYERS")


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(module: str) -> Iterator[Import]:
    known = set(modules())
    is_package = modules()[module].name == "__init__.py"

    def walk(node: ast.AST, where: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    yield from visit(sub, "TYPE_CHECKING")
                for sub in child.orelse:
                    yield from visit(sub, where)
                continue
            here = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = "function" if where == "top" else where
            yield from visit(child, here)

    def visit(node: ast.AST, where: str) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "corral" or alias.name.startswith("corral."):
                    yield Import(module, alias.name, (), node.lineno, where)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "corral" or target.startswith("corral."):
                names = tuple(a.name for a in node.names)
                submodules = tuple(n for n in names if f"{target}.{n}" in known)
                for name in submodules:  # ``from . import _x``: the module _x
                    yield Import(module, f"{target}.{name}", (), node.lineno, where)
                rest = tuple(n for n in names if n not in submodules)
                if rest:
                    yield Import(module, target, rest, node.lineno, where)
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and module != "corral._facade"
        ):
            yield Import(module, "<import_module>", (), node.lineno, where)
        yield from walk(node, where)

    yield from walk(tree(module), "top")


@cache
def all_imports() -> tuple[Import, ...]:
    return tuple(imp for module in modules() for imp in imports_of(module))


def _face_of(folder: str) -> set[str]:
    doc = ast.get_docstring(tree(folder)) or ""
    match = re.search(r"^Public face:(.*?)(?:\n\s*\n|\Z)", doc, re.MULTILINE | re.DOTALL)
    assert match, f"{folder}/__init__.py: its docstring has no 'Public face:' line"
    return {f"{folder}.{name}" for name in re.findall(r"_?\w+", match.group(1))}


def _folders() -> list[str]:
    return [m for m, p in modules().items() if p.name == "__init__.py" and m != "corral"]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# -- units ------------------------------------------------------------------------------------


def test_every_module_belongs_to_a_unit_and_folders_say_what_they_are() -> None:
    for module in modules():
        unit_of(module)
    for folder in _folders():
        body = tree(folder).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{folder}: a docstring only"
        assert isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
        for module in _face_of(folder):
            assert module in modules(), f"{folder}'s public face names {module}, which is none"


def test_units_form_a_dag() -> None:
    wrong = []
    for imp in all_imports():
        if imp.target == "<import_module>":
            wrong.append(f"{imp.source}:{imp.line}: importlib.import_module outside the facade")
            continue
        a, b = unit_of(imp.source), unit_of(imp.target)
        if a != b and LAYERS[b] >= LAYERS[a]:
            wrong.append(
                f"{imp.source}:{imp.line} ({imp.where}) imports {imp.target}: {a} (layer "
                f"{LAYERS[a]}) may not import {b} (layer {LAYERS[b]})"
            )
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_among_modules() -> None:
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for imp in all_imports():
        if imp.target in graph and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    state: dict[str, int] = {}
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                cycles.append([*path[path.index(other) :], other])
            elif other not in state:
                visit(other)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_other_folders_are_entered_through_their_public_face() -> None:
    faces = {folder: _face_of(folder) for folder in _folders()}
    wrong = []
    for imp in all_imports():
        if imp.target == "<import_module>":
            continue
        a, b = unit_of(imp.source), unit_of(imp.target)
        if a != b and b in faces and imp.target not in faces[b]:
            wrong.append(f"{imp.source}:{imp.line} imports {imp.target}, not on {b}'s face")
    assert not wrong, "\n".join(wrong)


# -- underscores ------------------------------------------------------------------------------


def test_no_module_imports_another_modules_underscored_names() -> None:
    wrong = [
        f"{imp.source}:{imp.line} imports {name} from {imp.target}"
        for imp in all_imports()
        if imp.target != imp.source
        for name in imp.names
        if _private(name)
    ]
    assert not wrong, "\n".join(wrong)


def _defined_in(module: str) -> set[str]:
    """The underscored names a module defines: functions, classes, attributes it sets."""
    names: set[str] = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            names.update(
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return {name for name in names if _private(name)}


def _foreign_modules(module: str) -> set[str]:
    """The names bound to modules that are not corral's (``import os``, ``import trio``)."""
    names = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("corral"):
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def test_no_reach_into_another_modules_underscored_members() -> None:
    wrong = []
    for module in modules():
        mine = _defined_in(module)
        foreign = _foreign_modules(module)
        for node in ast.walk(tree(module)):
            name: str | None = None
            base = ""
            if isinstance(node, ast.Attribute) and _private(node.attr):
                name, base = node.attr, ast.unparse(node.value)
                if base in ("self", "cls") or base.startswith("super("):
                    continue
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
            ):
                name, base = node.args[1].value, ast.unparse(node.args[0])
            if name is None or name in NAMEDTUPLE_API:
                continue
            root = base.split(".")[0]
            if root in foreign:
                if (module, name) not in FOREIGN_PRIVATE_OK and (root, name) not in (
                    STDLIB_PRIVATE_OK
                ):
                    wrong.append(f"{module}:{node.lineno}: {base}.{name} (another library's)")
            elif (module, name) in FOREIGN_PRIVATE_OK:
                continue
            elif name not in mine:
                wrong.append(f"{module}:{node.lineno}: {base}.{name}")
    assert not wrong, "\n".join(wrong)


# -- sizes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(modules()))
def test_module_size(module: str) -> None:
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (at most {MAX_LINES})"


def test_folder_size() -> None:
    for folder in _folders():
        count = sum(1 for m in modules() if m.startswith(folder + ".") and m != folder)
        assert count <= MAX_MODULES, f"{folder} has {count} modules (at most {MAX_MODULES})"


def test_test_modules_have_unique_names() -> None:
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


# -- what children load -----------------------------------------------------------------------

#: Modules of the event loops and the launcher's heavy dependencies.
_HEAVY = ("anyio", "trio", "asyncio", "rich", "click", "cloudpickle", "websockets", "sniffio")


def _loaded_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    report = (
        f"{code}\nimport sys\nprint(' '.join(sorted(m for m in sys.modules "
        f"if m.split('.')[0] in {_HEAVY!r} + ('msgspec',) or m.startswith('corral'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", report], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_import_corral_child_loads_no_event_loop() -> None:
    loaded = _loaded_after("import corral.child")
    assert loaded <= {
        "corral",
        "corral._facade",
        "corral.child",
        "corral._sys",
        "corral._sys._childenv",
    }, loaded


def test_corral_child_connect_loads_no_event_loop(tmp_path: Path) -> None:
    """``connect()`` loads the child's handler and the wire format: msgspec, no more."""
    import os

    env = {**os.environ, "CORRAL_LOG_SOCKET": str(tmp_path / "no-such-socket")}
    env["CORRAL_LOG_SECRET"] = "0" * 32
    code = "import warnings, corral.child\nwarnings.simplefilter('ignore')\ncorral.child.connect()"
    loaded = _loaded_after(code, env)
    heavy = {m for m in loaded if m.split(".")[0] in _HEAVY}
    assert not heavy, heavy
    corral_modules = {m for m in loaded if m.startswith("corral")}
    assert "corral._logs._child_logging" in corral_modules, corral_modules
    assert corral_modules <= {
        "corral",
        "corral._facade",
        "corral.child",
        "corral._sys",
        "corral._sys._childenv",
        "corral._logs",
        "corral._logs._child_logging",
        "corral._logs._wire",
    }, corral_modules


def test_the_worker_entry_point_loads_no_event_loop() -> None:
    """What ``python -m corral._worker`` imports before it runs the function."""
    code = "import corral._worker, corral._launch._worker, corral._launch._link, corral.child"
    loaded = _loaded_after(code)
    heavy = {m for m in loaded if m.split(".")[0] in _HEAVY}
    assert not heavy, heavy
