"""The code blocks of a reply (fenced or indented), as Markdown renders them."""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt


@dataclass(frozen=True)
class CodeBlock:
    language: str  # the fence's info word ("" when none)
    code: str


def code_blocks(markdown: str) -> list[CodeBlock]:
    """In order of appearance. A fence left open (a reply stopped mid-block) runs to the end,
    as the Markdown view shows it."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [
        CodeBlock(t.info.split()[0] if t.info.strip() else "", t.content)
        for t in tokens
        if t.type in ("fence", "code_block")
    ]
