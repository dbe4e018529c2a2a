"""The package's architecture, checked on its source tree (see each folder's ``__init__.py``).

The floors, from the bottom (a unit imports its own floor's code and the floors below only)::

    10  _cli  testing  _agent  _worker   the command, the pytest plugin, ``python -m`` entry points
     9  corral                           the facade: each public name, loaded from its home
     8  _sync                            the blocking runner, built on the public runner
     7  _runner                          the runner: puts every floor below together
     6  _launch  _monitor                scale-out; watching a runner (they take a core Process)
     5  _core                            one child and its supervision: start, watch, stop, reap
     4  child                            the child's side (public): start-up report, records
     3  _logs                            the log path: lines and records, to every handler
     2  _sys  _scaleout                  Linux and the event loops; a launch's light record
     1  _checks  _results                checks every floor makes; what a run and a launch return
     0  _errors                          every error a user may catch

* Every module belongs to a *unit* of :data:`LAYERS`: a folder (``corral._logs``) or a root
  module (``corral._errors``).  A folder's ``__init__.py`` is a docstring and nothing else: it
  says what the folder holds and, on its ``Public face:`` line, which of its modules the rest
  of the package may import.
* Units form a DAG: a module imports its own unit, or a unit on a strictly lower layer.  Every
  import counts: top-level, inside a function, under ``TYPE_CHECKING``, relative or absolute,
  in a module's stub (``.pyi``), and through ``importlib.import_module`` or ``__import__``
  (by any name they are bound to), and a module taken from ``sys.modules`` by its name
  (``sys.modules["x"]``, ``sys.modules.get("x")``).  An import by a computed name cannot be
  checked (``sys.modules[name]``, a walk of ``sys.modules``): only the modules of
  :data:`DYNAMIC_IMPORT_OK` may make one, each with its reason.
* No import cycle among modules either, inside a folder included.
* Another folder is entered through its public face only.
* No module imports another module's underscored name, and none reaches into an underscored
  member of anything but its own object: ``x._name`` (or ``getattr(x, "_name")``) with ``x``
  not ``self``/``cls`` is allowed only inside a class that defines ``_name`` itself (another
  instance of the same class), whatever else of the module is named so; the few exceptions are
  :data:`FOREIGN_PRIVATE_OK` (other libraries' privates) and :data:`FRIEND_REACHES` (classes of
  one module that share their state), each with its reason.
* Every module has at most :data:`MAX_LINES` lines, every folder at most
  :data:`MAX_MODULES` modules.
* ``import corral.child`` (in every child that reports its start or sends its records) and
  ``python -m corral._worker`` (every worker of a launch) load no event loop library.

The checks are functions of a :class:`Package`, so that the tests at the end run each of them
on small packages made for it, and see each fail on what it must catch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"
TESTS = Path(__file__).resolve().parents[1]
#: Lines a module may have.  Not a target: a module grows until it holds one concern, and a
#: module near this size is one to look at for a seam (CONTRIBUTING.md says how to judge).
MAX_LINES = 800
MAX_MODULES = 14

#: unit -> layer.  A module may import its own unit and units of lower layers only.
LAYERS: dict[str, int] = {
    "corral._errors": 0,  # every error a user may catch
    "corral._checks": 1,  # checks of arguments every layer takes
    "corral._results": 1,  # what a run and a launch return
    "corral._sys": 2,  # Linux and the event loops
    "corral._scaleout": 2,  # a launch's keywords: light, named by the runner and the launch
    "corral._logs": 3,  # the log path
    "corral.child": 4,  # the child side (public)
    "corral._core": 5,  # one child and its supervision: the bottom of the process stack
    "corral._launch": 6,  # scale-out, on the core: it gets a LaunchContext, not a Runner
    "corral._monitor": 6,  # the monitor, on the core: it shows each core Process
    "corral._runner": 7,  # the runner: the composition root, on top of them all
    "corral._sync": 8,  # the blocking facade, on the public names from their homes
    "corral": 9,  # the facade: lazy, its names' homes listed once (the stub's imports)
    "corral._cli": 10,  # the corral command
    "corral.testing": 10,  # the pytest plugin (public), on the facade
    "corral._agent": 10,  # python -m corral._agent: a stable entry point
    "corral._worker": 10,  # python -m corral._worker: a stable entry point
}

#: Modules that may import by a computed name: module -> why (and what checks it instead).
DYNAMIC_IMPORT_OK: dict[str, str] = {
    "corral._runner._scope": (
        "it protects the loop-side code from KeyboardInterrupt on Trio: the modules of the "
        "loop-side folders that are loaded (sys.modules.get of each name that one walk of "
        "those folders' files gives; it loads nothing); tests/core/test_backend.py checks "
        "that every module of those folders is covered"
    ),
    "corral._facade": (
        "it loads each public name from its home, as corral/__init__.py lists them; that list "
        "is the stub's imports (corral/__init__.pyi, generated from it), checked here"
    ),
}

#: Reaches into underscored members of other libraries, allowed: (module, name) -> why.
FOREIGN_PRIVATE_OK: dict[tuple[str, str], str] = {
    ("corral._sys._backend", "_run_until_complete_cb"): (
        "asyncio has no public way to tell asyncio.run's main task (is_asyncio_main_task); "
        "tests/core/test_backend.py fails loudly if it stops working"
    ),
    ("corral._sys._backend", "_callbacks"): "the same: the task's done callbacks",
    ("corral._sys._lifeline_helper", "_exit"): (
        "the helper ends at once once it killed what was left: no interpreter clean-up, "
        "nothing of it is needed"
    ),
    ("corral._cli._io", "_exit"): (
        "a Ctrl-C while the command imports and parses, before its event loop runs: nothing "
        "was made, and an exit handler would run half-imported modules' code"
    ),
    ("corral.testing", "_exit"): (
        "the one way out of a process whose leaked non-daemon thread (reported already) "
        "would hold its end up for good"
    ),
    ("corral._startup.sitecustomize", "_exit"): (
        "a child's start-up hook flushes its stdout before os._exit, as the exit at the end "
        "of a program does"
    ),
}

#: Reaches into another class's underscored member, within one module: (module, name) -> why.
FRIEND_REACHES: dict[tuple[str, str], str] = {
    ("corral._core._signals", "_sweep"): (
        "the dispatcher (the one signal handler) drives each runner's Subscription in two "
        "steps, every sweep first, then every loop's wake-up: for the dispatcher alone"
    ),
    ("corral._core._signals", "_schedule"): "the same: the second step",
    ("corral._logs._child_logging", "_after_fork_in_child"): (
        "the module's fork hook (os.register_at_fork takes a function) resets each live handler"
    ),
    ("corral._logs._sources", "_forget"): (
        "Backlogs, the byte budget every Source's backlog shares, drops a Source's oldest block"
    ),
    ("corral._logs._sources", "_holds"): "the same: whether a Source still holds a block",
    ("corral._logs._sources", "_push"): "a Source feeds its LogTails (their buffer is theirs)",
    ("corral._logs._sources", "_end"): "the same: a Source ends its LogTails",
    ("corral._logs._sources", "_closed"): "the same: a Source forgets its closed LogTails",
    ("corral._logs._sources", "_is_full"): "the same: a full LogTail holds its Source back",
    ("corral._logs._sources", "_update_room"): "the same, from the LogTail's side",
    ("corral.testing", "_unreported"): (
        "the report hook (a module function, as pytest wants) takes what its own CorralLog "
        "has not reported yet"
    ),
}

#: Methods of named tuples: public API despite the underscore.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
#: Bound to stdlib modules whose underscored names stand for public API.
STDLIB_PRIVATE_OK = {("sys", "_getframe")}
#: What a computed import is recorded as.
DYNAMIC = "<computed name>"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (DYNAMIC: a name computed at run time)
    names: tuple[str, ...]  # names taken from it (``from X import a, b``); () for a module
    line: int
    where: str  # "top", "function", "TYPE_CHECKING" or "stub"


@dataclass
class Package:
    """A package's source tree, and the rules it is held to."""

    root: Path  # the package's folder
    layers: Mapping[str, int]
    dynamic_ok: Mapping[str, str] = field(default_factory=dict)
    foreign_ok: Mapping[tuple[str, str], str] = field(default_factory=dict)
    friends: Mapping[tuple[str, str], str] = field(default_factory=dict)
    max_lines: int = MAX_LINES
    max_modules: int = MAX_MODULES

    @cached_property
    def modules(self) -> dict[str, Path]:
        return {self._module_name(p): p for p in sorted(self.root.rglob("*.py"))}

    def _module_name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def tree(self, module: str) -> ast.Module:
        return self._trees[module]

    @cached_property
    def _trees(self) -> dict[str, ast.Module]:
        return {m: ast.parse(p.read_text(), str(p)) for m, p in self.modules.items()}

    def stub(self, module: str) -> ast.Module | None:
        """The module's stub (``.pyi`` beside it), whose imports count as the module's."""
        path = self.modules[module].with_suffix(".pyi")
        return ast.parse(path.read_text(), str(path)) if path.exists() else None

    def unit_of(self, module: str) -> str | None:
        parts = module.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.layers:
                return ".".join(parts[:n])
        return None

    @cached_property
    def folders(self) -> list[str]:
        root = self.root.name
        return [m for m, p in self.modules.items() if p.name == "__init__.py" and m != root]

    @cached_property
    def imports(self) -> tuple[Import, ...]:
        return tuple(imp for module in self.modules for imp in imports_of(self, module))

    def face_of(self, folder: str) -> set[str] | None:
        doc = ast.get_docstring(self.tree(folder)) or ""
        match = re.search(r"^Public face:(.*?)(?:\n\s*\n|\Z)", doc, re.MULTILINE | re.DOTALL)
        if not match:
            return None
        return {f"{folder}.{name}" for name in re.findall(r"_?\w+", match.group(1))}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# -- imports ----------------------------------------------------------------------------------


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _importers(module_tree: ast.Module) -> set[str]:
    """The spellings of calls that import: ``importlib.import_module``, ``__import__``, aliases."""
    names = {"__import__", "importlib.import_module", "importlib.__import__", "builtins.__import__"}
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("importlib", "builtins") and alias.asname:
                    names |= {f"{alias.asname}.import_module", f"{alias.asname}.__import__"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("importlib", "builtins"):
            for alias in node.names:
                if alias.name in ("import_module", "__import__"):
                    names.add(alias.asname or alias.name)
    return names


def _module_tables(module_tree: ast.Module) -> set[str]:
    """How a module spells ``sys.modules``: ``sys.modules``, ``from sys import modules``..."""
    names = {"sys.modules"}
    for node in ast.walk(module_tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "sys" and alias.asname:
                    names.add(f"{alias.asname}.modules")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            for alias in node.names:
                if alias.name == "modules":
                    names.add(alias.asname or alias.name)
    return names


def _resolve(package: str, name: str) -> str:
    """``name`` (``"._x"``, ``"..y"``, ``"corral.z"``) relative to ``package``."""
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    rest = name[level:]
    return ".".join(base + ([rest] if rest else []))


def imports_of(pkg: Package, module: str) -> Iterator[Import]:
    finder = _ImportFinder(pkg, module)
    yield from finder.walk(pkg.tree(module), "top")
    stub = pkg.stub(module)
    if stub is not None:
        yield from finder.walk(stub, "stub")


class _ImportFinder:
    """The imports of one module of ``pkg``, statement by statement, call by call."""

    def __init__(self, pkg: Package, module: str) -> None:
        self.module = module
        self.root = pkg.root.name
        self.known = set(pkg.modules)
        is_package = pkg.modules[module].name == "__init__.py"
        self.package = module if is_package else module.rpartition(".")[0]
        self.importers = _importers(pkg.tree(module))
        self.module_tables = _module_tables(pkg.tree(module))

    def ours(self, target: str) -> bool:
        return target == self.root or target.startswith(self.root + ".")

    def walk(self, node: ast.AST, where: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    yield from self.visit(sub, "TYPE_CHECKING")
                for sub in child.orelse:
                    yield from self.visit(sub, where)
                continue
            here = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = "function" if where == "top" else where
            yield from self.visit(child, here)

    def visit(self, node: ast.AST, where: str) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if self.ours(alias.name):
                    yield Import(self.module, alias.name, (), node.lineno, where)
        elif isinstance(node, ast.ImportFrom):
            yield from self.import_from(node, where)
        elif isinstance(node, ast.Call):
            yield from self.call(node, where)
        if isinstance(node, ast.Subscript | ast.Call | ast.Attribute | ast.Name | ast.Compare):
            found = self.table_use(node, where)
            if found is not None:
                if found.target == DYNAMIC or self.ours(found.target):
                    yield found
                return  # its parts are not other uses of the table
        yield from self.walk(node, where)

    def table_use(self, node: ast.AST, where: str) -> Import | None:
        """A module taken from ``sys.modules``: by its name, or (``DYNAMIC``) by a computed one.

        ``sys.modules[NAME]`` and ``sys.modules.get(NAME)`` import ``NAME``;
        any other use of the table but a membership test (``name in
        sys.modules``) may hand out any module: it counts as a computed import.
        """
        tables = self.module_tables
        if isinstance(node, ast.Compare):
            if all(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and all(
                ast.unparse(c) in tables for c in node.comparators
            ):
                return Import(self.module, "", (), node.lineno, where)  # not an import
            return None
        key: ast.AST | None = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) in tables:
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) in tables
            and node.func.attr in ("get", "pop", "setdefault", "__getitem__")
        ):
            key = node.args[0] if node.args else None
        elif not (isinstance(node, ast.Attribute | ast.Name) and ast.unparse(node) in tables):
            return None
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return Import(self.module, key.value, (), node.lineno, where)
        return Import(self.module, DYNAMIC, (), node.lineno, where)

    def import_from(self, node: ast.ImportFrom, where: str) -> Iterator[Import]:
        if node.level:
            target = _resolve(self.package, "." * node.level + (node.module or ""))
        else:
            target = node.module or ""
        if not self.ours(target):
            return
        names = tuple(a.name for a in node.names)
        submodules = tuple(n for n in names if f"{target}.{n}" in self.known)
        for name in submodules:  # ``from . import _x``: the module _x
            yield Import(self.module, f"{target}.{name}", (), node.lineno, where)
        rest = tuple(n for n in names if n not in submodules)
        if rest:
            yield Import(self.module, target, rest, node.lineno, where)

    def call(self, node: ast.Call, where: str) -> Iterator[Import]:
        """``import_module(name)``, ``__import__(name)``: the module, if ``name`` says which."""
        if ast.unparse(node.func) not in self.importers or not node.args:
            return
        target = self.named(node)
        if target is None:
            yield Import(self.module, DYNAMIC, (), node.lineno, where)
        elif self.ours(target):
            yield Import(self.module, target, (), node.lineno, where)

    def named(self, node: ast.Call) -> str | None:
        """The module a call imports; ``None`` if its name is computed."""
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            return None
        if not first.value.startswith("."):
            return first.value
        # import_module("._x", __package__): relative to the package it names.
        anchor = node.args[1] if len(node.args) > 1 else None
        anchor = next((k.value for k in node.keywords if k.arg == "package"), anchor)
        if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
            return _resolve(anchor.value, first.value)
        if anchor is not None and ast.unparse(anchor) in ("__package__", "__spec__.parent"):
            return _resolve(self.package, first.value)
        return None


# -- the checks: each returns what is wrong ---------------------------------------------------


def check_units(pkg: Package) -> list[str]:
    wrong = [f"{m} belongs to no unit of LAYERS" for m in pkg.modules if pkg.unit_of(m) is None]
    for folder in pkg.folders:
        body = pkg.tree(folder).body
        docstring_only = (
            len(body) == 1
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        )
        if not docstring_only:
            wrong.append(f"{folder}/__init__.py: a docstring only")
        face = pkg.face_of(folder)
        if face is None:
            wrong.append(f"{folder}/__init__.py: its docstring has no 'Public face:' line")
        wrong += [
            f"{folder}'s public face names {m}, which is none"
            for m in sorted(face or ())
            if m not in pkg.modules
        ]
    return wrong


def check_dag(pkg: Package) -> list[str]:
    wrong = []
    for imp in pkg.imports:
        if imp.target == DYNAMIC:
            if imp.source not in pkg.dynamic_ok:
                wrong.append(f"{imp.source}:{imp.line}: an import by a computed name")
            continue
        a, b = pkg.unit_of(imp.source), pkg.unit_of(imp.target)
        if a is None or b is None:
            continue  # check_units says so
        if a != b and pkg.layers[b] >= pkg.layers[a]:
            wrong.append(
                f"{imp.source}:{imp.line} ({imp.where}) imports {imp.target}: {a} (layer "
                f"{pkg.layers[a]}) may not import {b} (layer {pkg.layers[b]})"
            )
    return wrong


def check_cycles(pkg: Package) -> list[str]:
    graph: dict[str, set[str]] = {m: set() for m in pkg.modules}
    for imp in pkg.imports:
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
    return ["an import cycle: " + " -> ".join(cycle) for cycle in cycles]


def check_faces(pkg: Package) -> list[str]:
    faces = {folder: pkg.face_of(folder) or set() for folder in pkg.folders}
    wrong = []
    for imp in pkg.imports:
        a, b = pkg.unit_of(imp.source), pkg.unit_of(imp.target)
        if a != b and b in faces and imp.target not in faces[b]:
            wrong.append(f"{imp.source}:{imp.line} imports {imp.target}, not on {b}'s face")
    return wrong


def check_private_imports(pkg: Package) -> list[str]:
    return [
        f"{imp.source}:{imp.line} imports {name} from {imp.target}"
        for imp in pkg.imports
        if imp.target != imp.source
        for name in imp.names
        if _private(name)
    ]


def _members(node: ast.ClassDef) -> set[str]:
    """The names a class defines: in its body, as ``self.x`` in its methods, in ``__slots__``."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__slots__":
                        names |= {
                            e.value
                            for e in ast.walk(item.value)
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        }
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name)
            and sub.value.id in ("self", "cls")
        ):
            names.add(sub.attr)
    return names


def _class_members(tree: ast.Module) -> dict[ast.ClassDef, set[str]]:
    """Each class's names, with those of its base classes defined in the same module."""
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    by_name = {c.name: c for c in classes}
    own = {c: _members(c) for c in classes}

    def members(cls: ast.ClassDef, seen: frozenset[str]) -> set[str]:
        names = set(own[cls])
        for base in cls.bases:
            parent = by_name.get(ast.unparse(base))
            if parent is not None and parent.name not in seen:
                names |= members(parent, seen | {parent.name})
        return names

    return {c: members(c, frozenset({c.name})) for c in classes}


def _foreign_modules(tree: ast.Module, root: str) -> set[str]:
    """The names bound to modules that are not the package's (``import os``, ``import trio``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != root:
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _reaches(tree: ast.Module) -> Iterator[tuple[ast.AST, str, str, ast.ClassDef | None]]:
    """Each ``x._name`` and ``getattr(x, "_name")``: (node, name, x, the class it is in)."""

    def walk(node: ast.AST, cls: ast.ClassDef | None) -> Iterator[Any]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, ast.Attribute) and _private(child.attr):
                yield child, child.attr, ast.unparse(child.value), cls
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(child.args) >= 2
                and isinstance(child.args[1], ast.Constant)
                and isinstance(child.args[1].value, str)
                and _private(child.args[1].value)
            ):
                yield child, child.args[1].value, ast.unparse(child.args[0]), cls
            yield from walk(child, inner)

    yield from walk(tree, None)


def check_reaches(pkg: Package) -> list[str]:
    wrong = []
    for module in pkg.modules:
        tree = pkg.tree(module)
        foreign = _foreign_modules(tree, pkg.root.name)
        members = _class_members(tree)
        for node, name, base, cls in _reaches(tree):
            if base in ("self", "cls") or base.startswith("super(") or name in NAMEDTUPLE_API:
                continue
            line = getattr(node, "lineno", 0)
            root = base.split(".")[0]
            if root in foreign:
                if (module, name) not in pkg.foreign_ok and (root, name) not in STDLIB_PRIVATE_OK:
                    wrong.append(f"{module}:{line}: {base}.{name} (another library's)")
            elif (module, name) in pkg.foreign_ok or (module, name) in pkg.friends:
                continue
            elif cls is None or name not in members[cls]:
                where = f"in {cls.name}, which does not define it" if cls else "outside a class"
                wrong.append(f"{module}:{line}: {base}.{name} ({where})")
    return wrong


def check_sizes(pkg: Package) -> list[str]:
    wrong = []
    for module, path in pkg.modules.items():
        lines = len(path.read_text().splitlines())
        if lines > pkg.max_lines:
            wrong.append(f"{module} has {lines} lines (at most {pkg.max_lines})")
    for folder in pkg.folders:
        count = sum(1 for m in pkg.modules if m.startswith(folder + ".") and m != folder)
        if count > pkg.max_modules:
            wrong.append(f"{folder} has {count} modules (at most {pkg.max_modules})")
    return wrong


CHECKS = [
    check_units,
    check_dag,
    check_cycles,
    check_faces,
    check_private_imports,
    check_reaches,
    check_sizes,
]


def problems(pkg: Package) -> list[str]:
    return [problem for check in CHECKS for problem in check(pkg)]


# -- corral itself ----------------------------------------------------------------------------

CORRAL = Package(SRC, LAYERS, DYNAMIC_IMPORT_OK, FOREIGN_PRIVATE_OK, FRIEND_REACHES)


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_corral_keeps_its_architecture(check: Any) -> None:
    wrong = check(CORRAL)
    assert not wrong, "\n".join(wrong)


def test_the_facade_s_imports_are_seen() -> None:
    """The homes of the public names count as imports of ``corral`` (its stub's)."""
    targets = {imp.target for imp in CORRAL.imports if imp.source == "corral"}
    assert {"corral._runner._runner", "corral._errors", "corral._sync._runner"} <= targets


@pytest.mark.slow
def test_every_exemption_is_still_needed() -> None:
    bare = Package(SRC, LAYERS)
    dag = "\n".join(check_dag(bare))
    reaches = "\n".join(check_reaches(bare))
    for module in DYNAMIC_IMPORT_OK:
        assert f"{module}:" in dag, f"{module} makes no computed import any more"
    for module, name in [*FOREIGN_PRIVATE_OK, *FRIEND_REACHES]:
        assert re.search(rf"^{re.escape(module)}:\d+: .*\.{name} ", reaches, re.M), (
            f"{module} no longer reaches {name}"
        )


def test_test_modules_have_unique_names() -> None:
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


# -- the checks catch what they must: each on a small package made for it ----------------------

#: A package that keeps every rule: ``pkg._low`` (layer 0) under the folder ``pkg._mid``
#: (layer 1, face ``_face``) under ``pkg._high`` (layer 2), under the facade ``pkg``.
GOOD: dict[str, str] = {
    "__init__.py": '"""The facade."""\nfrom . import _high\n',
    "_low.py": """
        _secret = 1


        class Box:
            def __init__(self) -> None:
                self._value = 1

            def same(self, other: "Box") -> bool:
                return self._value == other._value  # another instance of its own class
        """,
    "_mid/__init__.py": '"""A folder.\n\nPublic face: _face\n"""\n',
    "_mid/_face.py": "from . import _inner\nfrom .. import _low\n",
    "_mid/_inner.py": "import os\n\nos.getpid()\n",
    "_high.py": """
        import importlib
        from typing import TYPE_CHECKING

        from . import _low
        from ._mid import _face

        if TYPE_CHECKING:
            from ._low import Box


        def later() -> object:
            return importlib.import_module("._low", __package__)
        """,
}
GOOD_LAYERS = {"pkg": 3, "pkg._low": 0, "pkg._mid": 1, "pkg._high": 2}

#: Each a change to GOOD (file -> text added) and what the checks must then say.
BAD: dict[str, tuple[dict[str, str], str]] = {
    "import-upwards": ({"_low.py": "from . import _high\n"}, "may not import pkg._high"),
    "import-upwards-in-a-function": (
        {"_low.py": "def f() -> None:\n    from ._mid import _face\n"},
        "(function) imports pkg._mid._face",
    ),
    "import-upwards-for-type-checkers": (
        {"_low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg._high\n"},
        "(TYPE_CHECKING) imports pkg._high",
    ),
    "import-upwards-in-a-stub": ({"_low.pyi": "from . import _high\n"}, "(stub) imports pkg._high"),
    "import-module-upwards": (
        {"_low.py": "import importlib\nimportlib.import_module('pkg._high')\n"},
        "may not import pkg._high",
    ),
    "import-module-relative-upwards": (
        {"_mid/_inner.py": "import importlib\nimportlib.import_module('.._high', __package__)\n"},
        "may not import pkg._high",
    ),
    "sys-modules-upwards": (
        {"_low.py": "import sys\nsys.modules['pkg._high'].later()\n"},
        "may not import pkg._high",
    ),
    "sys-modules-get-upwards": (
        {"_mid/_inner.py": "import sys\nsys.modules.get('pkg._high')\n"},
        "may not import pkg._high",
    ),
    "sys-modules-by-another-name": (
        {"_low.py": "from sys import modules as loaded\nloaded['pkg._mid._face']\n"},
        "imports pkg._mid._face: pkg._low (layer 0) may not import",
    ),
    "sys-modules-by-a-computed-name": (
        {"_low.py": "import sys\nname = 'pkg._high'\nsys.modules[name]\n"},
        "an import by a computed name",
    ),
    "a-walk-of-sys-modules": (
        {"_low.py": "import sys\nfound = [m for m in sys.modules.values()]\n"},
        "an import by a computed name",
    ),
    "dunder-import-upwards": ({"_low.py": "__import__('pkg._mid._face')\n"}, "may not import"),
    "import-module-by-another-name": (
        {"_low.py": "from importlib import import_module as load\nload('pkg._high')\n"},
        "may not import pkg._high",
    ),
    "import-by-a-computed-name": (
        {"_high.py": "name = 'pkg._low'\nimportlib.import_module(name)\n"},
        "an import by a computed name",
    ),
    "a-circle": ({"_mid/_inner.py": "from . import _face\n"}, "an import cycle: "),
    "past-the-face": ({"_high.py": "from ._mid import _inner\n"}, "not on pkg._mid's face"),
    "a-private-name": ({"_high.py": "from ._low import _secret\n"}, "imports _secret from"),
    "a-module-s-private": ({"_high.py": "print(_low._secret)\n"}, "_low._secret (outside a class)"),
    "another-class-s-private": (
        {
            "_low.py": """
                class Peeker:
                    def peek(self, box: Box) -> int:
                        return box._value + getattr(box, "_value")
                """,
        },
        "box._value (in Peeker, which does not define it)",
    ),
    "another-class-s-private-by-its-name": (
        {
            "_low.py": """
                class Twin:
                    def __init__(self) -> None:
                        self._value = 2  # the same name as Box's field: no excuse


                def peek(box: Box) -> int:
                    return box._value
                """,
        },
        "box._value (outside a class)",
    ),
    "another-library-s-private": ({"_mid/_inner.py": "os._exit(0)\n"}, "(another library's)"),
    "a-big-module": ({"_high.py": "x = 1\n" * MAX_LINES}, f"(at most {MAX_LINES})"),
    "a-big-folder": (
        {f"_mid/_m{i}.py": "" for i in range(MAX_MODULES)},
        f"pkg._mid has {MAX_MODULES + 2} modules",
    ),
    "code-in-a-folder-s-init": ({"_mid/__init__.py": "x = 1\n"}, "a docstring only"),
    "a-face-that-names-nothing": (
        {"_mid/__init__.py": '"""Public face: _face, _gone\n"""\n'},
        "names pkg._mid._gone, which is none",
    ),
}


def _make(tmp_path: Path, changes: Mapping[str, str]) -> Package:
    root = tmp_path / "pkg"
    for name in {*GOOD, *changes}:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = textwrap.dedent(GOOD.get(name, "")).lstrip()
        if name in changes:
            replaces = name.endswith("__init__.py")  # a folder's docstring, replaced
            added = textwrap.dedent(changes[name]).lstrip()
            text = added if replaces else text + "\n" + added
        path.write_text(text)
    return Package(root, GOOD_LAYERS)


def test_the_checks_pass_a_package_that_keeps_every_rule(tmp_path: Path) -> None:
    assert problems(_make(tmp_path, {})) == []


@pytest.mark.parametrize(("changes", "said"), BAD.values(), ids=BAD.keys())
def test_the_checks_catch(tmp_path: Path, changes: dict[str, str], said: str) -> None:
    found = problems(_make(tmp_path, changes))
    assert any(said in problem for problem in found), found


# -- what children load -----------------------------------------------------------------------

#: Modules of the event loops and the launcher's heavy dependencies.
_HEAVY = ("anyio", "trio", "asyncio", "rich", "click", "cloudpickle", "websockets", "sniffio")


def _loaded_after(
    code: str, env: dict[str, str] | None = None, also: tuple[str, ...] = ()
) -> set[str]:
    """The modules of :data:`_HEAVY`, msgspec, ``also`` and corral loaded after ``code``."""
    tops = (*_HEAVY, "msgspec", *also)
    report = (
        f"{code}\nimport sys\nprint(' '.join(sorted(m for m in sys.modules "
        f"if m.split('.')[0] in {tops!r} or m.startswith('corral'))))"
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


def test_corral_help_loads_no_runner_and_no_event_loop() -> None:
    """``corral --help`` lists the commands from their definitions alone: the runner, the
    console, the status table, the monitor, a launch's record and hosts, and :mod:`logging`
    load only once a command runs (issue 26.6, issue 30.7)."""
    code = (
        "import contextlib, io\n"
        "from corral._cli._main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass"
    )
    loaded = _loaded_after(code, also=("logging",))
    assert "corral._cli._up" in loaded  # the commands were listed
    loops = {m for m in loaded if m.split(".")[0] in ("asyncio", "trio", "websockets")}
    assert not loops, loops
    assert "logging" not in loaded
    runner = (
        "corral._core",
        "corral._runner",
        "corral._monitor",
        "corral._launch",
        "corral._scaleout",
        "corral._logs._console",
        "corral._cli._loop",
        "corral._cli._status",
        "corral._cli._console",
    )
    assert not {m for m in loaded if m.startswith(runner)}, loaded


def test_the_commands_loop_loads_no_monitor_code() -> None:
    """What ``corral run`` and ``corral up`` load before their runner (the loop, the status
    table, the console) loads none of the monitor, which loads with ``--monitor`` only."""
    loaded = _loaded_after("import corral._cli._loop, corral._cli._up, corral._cli._run")
    assert "corral._cli._status" in loaded
    assert not {m for m in loaded if m.startswith("corral._monitor")}, loaded


def test_a_runner_loads_no_launch_and_no_monitor_code() -> None:
    """``import corral; corral.open_runner`` and ``corral.Process`` load the runner's face and
    the core: nothing of a launch (the link, the hosts, torch's environment, the worker) or of
    the monitor, which load when a launch begins or a monitor is asked for."""
    loaded = _loaded_after("import corral\ncorral.open_runner\ncorral.Runner\ncorral.Process")
    assert "corral._runner._runner" in loaded
    assert not {m for m in loaded if m.startswith(("corral._launch", "corral._monitor"))}, loaded
    assert "cloudpickle" not in loaded


#: What a runner loads only once it needs it: asyncio where its loop runs (it is loaded then
#: already), ctypes for the subreaper role; the log wire's msgspec and the secrets' hashlib
#: with the first runner.
_ON_DEMAND = ("asyncio", "ssl", "ctypes", "msgspec", "hashlib")

#: What naming the runner loads of corral (``import corral; corral.open_runner``): its face,
#: the records of its keywords and what its signatures name (``Process``, ``LoopToken``,
#: ``ResourceUsage``: they resolve).  What a runner is made of (the log service, the scope, the
#: children and their supervision, the lifeline) loads with the first runner, before it is
#: entered.
_RUNNER_FACE = {
    "corral",
    "corral._facade",
    "corral._checks",
    "corral._errors",
    "corral._results",
    "corral._scaleout",
    "corral._runner",
    "corral._runner._runner",
    "corral._runner._options",
    "corral._core",
    "corral._core._options",
    "corral._core._process",
    "corral._core._stdio",
    "corral._core._token",
    "corral._logs",
    "corral._logs._route",
    "corral._sys",
    "corral._sys._backend",
    "corral._sys._childenv",
    "corral._sys._platform",
    "corral._sys._cgroup",
    "corral._sys._proc",
}


def test_naming_the_runner_loads_its_face_only() -> None:
    """``import corral; corral.open_runner`` (what ``from corral import open_runner`` costs a
    program, a CLI's ``--help`` or a test collection that never opens one) loads the records of
    the runner's keywords, none of its machinery and none of :data:`_ON_DEMAND`."""
    code = "import corral\ncorral.open_runner\ncorral.Runner\ncorral.RunnerOptions"
    loaded = _loaded_after(code, also=_ON_DEMAND)
    corral_modules = {m for m in loaded if m.startswith("corral")}
    assert "corral._runner._runner" in corral_modules
    assert corral_modules <= _RUNNER_FACE, corral_modules - _RUNNER_FACE
    assert not {m for m in loaded if m.split(".")[0] in _ON_DEMAND}, loaded


def test_a_runner_loads_no_event_loop() -> None:
    """The first runner, made and not entered yet, loads its machinery but no asyncio, ssl or
    ctypes (which its loop and the subreaper role load)."""
    code = "import corral\ncorral.open_runner(usage=True)\ncorral.Process"
    loaded = _loaded_after(code, also=_ON_DEMAND)
    assert {"corral._runner._scope", "corral._core._supervisor", "corral._logs._hub"} <= loaded
    assert not {m for m in loaded if m.split(".")[0] in ("asyncio", "ssl", "ctypes")}, loaded


def test_a_runner_on_trio_loads_no_asyncio() -> None:
    """A runner on Trio, that spawns, supervises and logs, loads no asyncio."""
    code = (
        "import anyio, corral\n"
        "async def main() -> None:\n"
        "    async with corral.open_runner() as r:\n"
        "        await r.run(['sh', '-c', 'echo out; echo err >&2'])\n"
        "anyio.run(main, backend='trio')"
    )
    loaded = _loaded_after(code, also=_ON_DEMAND)
    assert "trio" in loaded and "corral._core._supervisor" in loaded
    assert not {m for m in loaded if m.split(".")[0] == "asyncio"}, loaded
