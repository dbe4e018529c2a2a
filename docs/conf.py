"""Sphinx configuration for corral's documentation.

Build with ``sphinx-build -W --keep-going -b html docs docs/_build/html``:
warnings are errors, so a broken page or docstring fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer

# Document the work tree's code even if another corral is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import corral

project = "corral"
author = "The corral developers"
copyright = "The corral developers"
release = corral.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "sphinx_click",
]

# No inventories: the build must work without a network, so intersphinx fetches
# nothing.  References to the standard library, AnyIO and Trio render as text.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
intersphinx_disabled_reftypes = ["*"]

exclude_patterns = ["_build"]

# Nitpicky mode is off for the ``-W`` build; ``sphinx-build -n`` turns it on.
# Without intersphinx inventories no reference to another project can resolve,
# so those (and only those) are ignored here: what a ``-n`` build still reports
# is a broken reference in corral's own pages or docstrings.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(asyncio|builtins|collections|collections\.abc|errno|functools|json|logging|os"
        r"|resource|select|signal|subprocess|sys|threading|time|typing|anyio|trio"
        r"|pytest|_pytest)(\..*)?",
    ),
    # Type variables in signatures (``T``, ``Ts``) are not documented objects.
    (r"py:class", r"(corral\.[\w.]+\.)?Ts?"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

html_theme = "alabaster"
html_title = f"corral {release}"
html_theme_options = {
    "description": "Structured-concurrency process runner for Trio and asyncio",
    "fixed_sidebar": True,
}


def _constant_doc(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Document a constant re-exported by ``corral`` with its ``#:`` comment.

    autodoc looks for the comment in the module it documents (``corral``), not
    where the constant is defined, and falls back to the docstring of the
    constant's type (``int``).  Find the comment in corral's own modules instead.
    """
    if what != "data" or getattr(obj, "__doc__", None) != type(obj).__doc__:
        return
    attr = name.rsplit(".", 1)[-1]
    for module in sorted(m for m in sys.modules if m == "corral" or m.startswith("corral.")):
        try:
            docs = ModuleAnalyzer.for_module(module).find_attr_docs()
        except Exception:  # a module without source: nothing to find
            continue
        if ("", attr) in docs:
            lines[:] = list(docs["", attr])
            return
    lines[:] = []


def _claim_sources() -> None:
    """Read each public class's members in the order of its source, where its source is.

    Public names say ``__module__ == "corral"`` (as Trio's and AnyIO's do);
    autodoc reads a class's member order and ``#:`` comments from the module
    its ``__module__`` names, so point it at the private module that holds the
    source (the facade's own table of homes).  Without this hook (another
    Sphinx), members are listed alphabetically: nothing else changes.
    """
    try:
        from sphinx.ext.autodoc._property_types import _ItemProperties
    except ImportError:
        return
    canonical = _ItemProperties.canonical_module_name

    def home(self: Any) -> str:
        parts = self.parts
        if self._obj___module__ == "corral" and len(parts) == 1 and parts[0] in corral.__all__:
            return f"corral.{corral._HOMES[parts[0]]}"
        name: str = canonical.fget(self)  # type: ignore[attr-defined]
        return name

    _ItemProperties.canonical_module_name = property(home)  # type: ignore[assignment,method-assign]


_claim_sources()


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _constant_doc)
