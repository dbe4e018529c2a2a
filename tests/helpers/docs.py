"""The code blocks of the docs (``docs/**/*.rst``) and of ``README.md``, as tests read them.

A block of the docs is a ``.. code-block:: LANGUAGE`` directive with its
options (``:caption:``, ``:name:``) and its indented body; one of the README
is a fenced block.  See ``tests/project/test_examples.py`` for what each kind
of block must be.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_DIRECTIVE = re.compile(
    r"^\.\. code-block:: *(?P<language>\S+)\n"
    r"(?P<options>(?:   :[\w-]+:.*\n)*)"
    r"\n"
    r"(?P<body>(?:(?:   .*)?\n)+)",
    re.MULTILINE,
)
_OPTION = re.compile(r"^   :([\w-]+):(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    where: str  # "docs/page.rst:LINE"
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.options.get("name", "")


def page_blocks(page: Path) -> list[Block]:
    """The ``code-block`` directives of one page, in order."""
    text = page.read_text()
    result = []
    for m in _DIRECTIVE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        options = {k: v.strip() for k, v in _OPTION.findall(m.group("options"))}
        code = textwrap.dedent(m.group("body")).strip("\n") + "\n"
        where = f"{page.relative_to(ROOT)}:{line}"
        result.append(Block(where, m.group("language"), code, options))
    return result


def named(page: str, name: str) -> str:
    """The code of the block with ``:name: name`` on ``docs/page``."""
    (block,) = [b for b in page_blocks(DOCS / page) if b.name == name]
    assert block.language == "python", block.where
    return block.code
