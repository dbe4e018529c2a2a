"""The facade's public names are listed once, in ``corral/__init__.py``; all else is made from it.

``__all__``, the lazy loading and ``corral/__init__.pyi`` (the package as
type checkers see it) come from that one list (:mod:`corral._facade`).  Run
this file (``python tests/project/test_facade.py``) to write the stub again
after the list changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import corral
from corral import _facade

STUB = Path(corral.__file__).with_suffix(".pyi")


def test_the_stub_is_made_from_the_list() -> None:
    assert STUB.read_text() == _facade.stub(corral._HOMES), (
        f"{STUB} is not what the list of public names makes: run "
        "`python tests/project/test_facade.py` to write it again"
    )


def test_every_listed_name_is_exported_and_loads_from_its_home() -> None:
    assert corral.__all__ == list(corral._HOMES)
    for name, home in corral._HOMES.items():
        assert getattr(corral, name) is getattr(sys.modules[f"corral.{home}"], name)


def test_a_name_listed_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="Runner is listed twice: in _a and in _b"):
        _facade.homes({"_a": ("Runner",), "_b": ("x", "Runner")})


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'corral' has no attribute 'Runnr'"):
        corral.Runnr  # type: ignore[attr-defined]  # noqa: B018


if __name__ == "__main__":
    STUB.write_text(_facade.stub(corral._HOMES))
    print(f"wrote {STUB}")
