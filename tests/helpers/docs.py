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

# A directive at any indentation (in a list item too); its options and body one level deeper.
_DIRECTIVE = re.compile(
    r"^(?P<indent> *)\.\. code-block:: *(?P<language>\S+)\n"
    r"(?P<options>(?:(?P=indent)   :[\w-]+:.*\n)*)"
    r"\n"
    r"(?P<body>(?:(?:(?P=indent)   .*)?\n)+)",
    re.MULTILINE,
)
_OPTION = re.compile(r"^ *:([\w-]+):(.*)$", re.MULTILINE)
_FENCE = re.compile(r"^```(?P<language>\w*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
#: A literal block: a paragraph ending in ``::``, then an indented body.
_LITERAL = re.compile(r"(?:^|[^:\n]):: *\n\n(?P<body>(?:(?: {3,}.*)?\n)+)", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    where: str  # "docs/page.rst:LINE"
    language: str
    code: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def caption(self) -> str:
        return self.options.get("caption", "")

    @property
    def name(self) -> str:
        return self.options.get("name", "")


def pages() -> list[Path]:
    found = sorted(DOCS.rglob("*.rst"))
    assert found, f"no pages under {DOCS}"
    return [p for p in found if "_build" not in p.parts]


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


def literal_blocks(page: Path) -> list[Block]:
    """The ``::`` literal blocks of one page (no language: text, or a mistake)."""
    text = page.read_text()
    return [
        Block(
            f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}",
            "",
            textwrap.dedent(m.group("body")).strip("\n") + "\n",
        )
        for m in _LITERAL.finditer(text)
    ]


def readme_blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(f"README.md:{text.count(chr(10), 0, m.start()) + 1}", m["language"], m["body"])
        for m in _FENCE.finditer(text)
    ]


def named(page: str, name: str) -> str:
    """The code of the block with ``:name: name`` on ``docs/page``."""
    (block,) = [b for b in page_blocks(DOCS / page) if b.name == name]
    assert block.language == "python", block.where
    return block.code
