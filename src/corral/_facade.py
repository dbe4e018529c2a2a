"""The lazy facade of :mod:`corral`: each public name is loaded from its home on first use.

``corral/__init__.py`` lists each public name once, under the private module
that defines it (its *home*); :func:`homes` turns that list into the table the
package's hooks (PEP 562's module ``__getattr__`` and ``__dir__``, made by
:func:`hooks`) load from, and :func:`stub` into the text of
``corral/__init__.pyi``, the package as type checkers see it (explicit
re-exports of each name from its home).  The stub is generated: a test fails
when it is not what :func:`stub` makes of the list, and running
``python tests/project/test_facade.py`` writes it again.
"""

from __future__ import annotations

import importlib
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["homes", "hooks", "stub"]


def homes(public: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each public name -> its home, from ``{home: names}``; a name listed twice is an error."""
    table: dict[str, str] = {}
    for home, names in public.items():
        for name in names:
            if name in table:
                raise ValueError(f"{name} is listed twice: in {table[name]} and in {home}")
            table[name] = home
    return table


def hooks(
    package: str, table: Mapping[str, str], submodules: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names ``table`` homes.

    ``__dir__`` shows the public names, ``__version__`` and the public
    ``submodules`` already imported: not the modules the package uses.
    """

    def __getattr__(name: str) -> Any:
        home = table.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        _claim_loaded(package, table)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        here = vars(sys.modules[package])
        loaded = [name for name in submodules if name in here]
        return sorted({*table, "__version__", *loaded})

    return __getattr__, __dir__


def _claim_loaded(package: str, table: Mapping[str, str]) -> None:
    """Make each public class and function that is loaded say it is ``package``'s.

    As Trio and AnyIO do: tracebacks print ``corral.ProcessFailed``, reprs and
    pickles name ``corral.X`` (which the lazy loading resolves), whatever
    private module defines it.  String annotations are resolved first, in
    their own module, so that :func:`typing.get_type_hints` still works.
    """
    for name, home in table.items():
        module = sys.modules.get(f"{package}.{home}")
        value = getattr(module, name, None)
        if not isinstance(value, type) and not callable(value):
            continue
        if getattr(value, "__module__", None) != f"{package}.{home}":
            continue  # claimed already, or not corral's own
        if isinstance(value, type) and "__annotations__" in vars(value):
            try:
                hints = typing.get_type_hints(value, include_extras=True)
                value.__annotations__ = {k: hints[k] for k in vars(value)["__annotations__"]}
            except Exception:  # a name only a type checker sees: leave it as it is
                pass
        value.__module__ = package


def stub(table: Mapping[str, str]) -> str:
    """The text of the package's ``__init__.pyi``: an explicit re-export of each public name."""
    by_home: dict[str, list[str]] = {}
    for name, home in table.items():
        by_home.setdefault(home, []).append(name)
    lines = [
        "# Generated from the list of public names in __init__.py (corral._facade.stub):",
        "# do not edit; `python tests/project/test_facade.py` writes it again.",
        "",
    ]
    for home in sorted(by_home):
        names = sorted(by_home[home], key=_isort_key)
        lines += [f"from .{home} import {name} as {name}" for name in names]
    lines += ["", "__version__: str", ""]
    return "\n".join(lines)


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions, as isort (and ruff's ``I``) order names."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)
