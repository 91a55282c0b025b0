"""Who proposed a reply's tokens, as tints: the model drafter (an EAGLE drafter, or the target's
own MTP head: one colour, since an engine drafts with one of them), the n-gram index, or both.

A span is (characters, source) with source as ``Event.sources`` names it: "eagle" or "mtp",
"ngram", "eagle+ngram" or "mtp+ngram" for accepted drafts, "" for the target's own tokens
(never tinted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.text import Text

if TYPE_CHECKING:
    from textual.theme import Theme

Span = tuple[int, str]

# the tinted sources in legend order: what the legend calls them, and their theme colour
LEGEND = (
    ("eagle", "EAGLE drafter / MTP head", "success"),
    ("ngram", "n-gram index", "accent"),
    ("eagle+ngram", "both", "primary"),
)
# a target's own MTP head drafts in the EAGLE drafter's place: the same tints
ALIASES = {"mtp": "eagle", "mtp+ngram": "eagle+ngram"}
FALLBACK = {"success": "green", "accent": "dark_orange", "primary": "blue"}  # before a theme


def tint_styles(theme: Theme | None = None) -> dict[str, str]:
    """The style of each source's accepted tokens in this theme (theme colours, so light and
    dark themes both work)."""
    styles = {
        source: "bold " + (getattr(theme, colour) if theme is not None else FALLBACK[colour])
        for source, _, colour in LEGEND
    }
    return styles | {alias: styles[source] for alias, source in ALIASES.items()}


def legend(theme: Theme | None = None) -> Text:
    """Each source's name in its own tint: 'EAGLE drafter  n-gram index  both'."""
    styles = tint_styles(theme)
    out = Text()
    for source, name, _ in LEGEND:
        if out:
            out.append("  ")
        out.append(name, style=styles[source])
    return out


def legend_markup() -> str:
    """The legend as Textual markup (notifications), in the current theme's variables."""
    return "  ".join(f"[bold ${colour}]{name}[/]" for _, name, colour in LEGEND)


def split(text: str, spans: Sequence[Span]) -> list[tuple[str, str]]:
    """text as (piece, source) segments: the spans' characters first, the rest the target's."""
    out: list[tuple[str, str]] = []
    at = 0
    for chars, source in spans:
        piece = text[at : at + chars]
        if piece:
            out.append((piece, source))
        at += chars
    if text[at:]:
        out.append((text[at:], ""))
    return out
