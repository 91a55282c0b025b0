"""One chat message: Markdown streamed in by appending, or tinted text showing accepted drafts
(a tint per draft source: the EAGLE drafter, the n-gram index, both).

Streaming costs stay proportional to what is new: the app feeds pieces with `append` and
renders them with `flush` at its frame rate. Markdown gets only the new text (Textual's
`Markdown.append` re-parses from the last top-level block, one append in flight at a time);
tinted text lives in chunks split at line breaks, so a frame re-renders only the last chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from markdown_it import MarkdownIt
from rich.text import Text
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from ..tint import Span, split, tint_styles

TINT_CHUNK = 2000  # characters of tinted text before a new chunk starts at a line break

_parsers = threading.local()  # Markdown.update parses in a thread pool: a parser per thread


def _parser() -> MarkdownIt:
    parser = getattr(_parsers, "parser", None)
    if parser is None:
        parser = _parsers.parser = MarkdownIt("gfm-like")  # what Markdown builds per call
    return parser


class MessageView(Vertical):
    """A message. Assistant replies keep (text, source) segments so that the tokens that came
    from accepted drafts can be tinted by who proposed them ("eagle", "ngram",
    "eagle+ngram"; "" for the target's own tokens); untinted, the reply renders as Markdown."""

    DEFAULT_CLASSES = "message"

    def __init__(self, role: str, text: str = "", *, tint: bool = False) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.turn = -1  # the turn it belongs to (0-based; -1: not a turn yet)
        self.segments: list[tuple[str, str]] = [(text, "")] if text else []
        self.tint = tint
        self.footer_text = ""
        self.error_text = ""
        self._new: list[tuple[str, str]] = []  # appended, not yet rendered
        self._md_pending = ""  # text not yet handed to the Markdown widget
        self._md_busy: AwaitComplete | None = None  # the Markdown append in flight
        self._md_reset = False  # the Markdown widget must be rebuilt from the whole text
        self._tint_text = Text()  # the last tinted chunk
        self._tint_chunk: Static | None = None
        self._ready = False  # children mounted: until then, changes are only recorded

    def compose(self) -> ComposeResult:
        self._new = []  # the Markdown widget starts with everything appended so far
        yield Static(self.role, classes="role")
        yield Markdown(self.markdown, classes="body-md", parser_factory=_parser)
        yield Vertical(classes="body-tinted")
        yield Static(self.error_text, classes="reply-error")
        yield Static(self.footer_text, classes="reply-footer")

    def on_mount(self) -> None:
        self._ready = True
        error = self.query_one(".reply-error", Static)
        error.update(self.error_text)
        error.display = bool(self.error_text)
        self.set_footer(self.footer_text)
        self._show_mode(rebuild=self.tinted)
        self.flush()

    @property
    def text(self) -> str:
        return "".join(s for s, _ in self.segments)

    @property
    def markdown(self) -> str:
        """What the Markdown view shows: a prompt keeps the lines it was typed in (Markdown
        would join them), a reply is Markdown as written."""
        if self.role == "user":
            return self.text.replace("\n", "  \n")  # a hard line break per newline
        return self.text

    @property
    def tinted(self) -> bool:
        return self.tint and self.role == "assistant"

    def append(self, text: str, spans: Sequence[Span] = ()) -> None:
        """Add streamed text whose leading characters came from accepted drafts: spans are
        (characters, source) in order; the rest is the target's own (shown at the next
        flush)."""
        for piece, source in split(text, spans):
            self._new.append((piece, source))
            if self.segments and self.segments[-1][1] == source:
                self.segments[-1] = (self.segments[-1][0] + piece, source)
            else:
                self.segments.append((piece, source))

    def flush(self) -> None:
        """Render what was appended since the last flush."""
        if not self._ready:
            return
        new, self._new = self._new, []
        if self.tinted:
            styles = self._styles
            for piece, source in new:
                self._tint_text.append(piece, style=styles.get(source, ""))
            if new:
                self._render_tint_chunk()
            return
        self._md_pending += "".join(piece for piece, _ in new)
        if self._md_busy is not None and not self._md_busy.is_done:
            return  # one append at a time: the next flush takes what accumulates meanwhile
        md = self.query_one(".body-md", Markdown)
        if self._md_reset:
            self._md_reset, self._md_pending = False, ""
            self._md_busy = md.update(self.markdown)
        elif self._md_pending:
            self._md_busy, self._md_pending = md.append(self._md_pending), ""

    async def finish(self) -> None:
        """Flush everything and wait until the Markdown widget shows it."""
        for _ in range(2):  # the second round hands over what waited for the first
            self.flush()
            if self._md_busy is not None:
                await self._md_busy

    def set_tint(self, tint: bool) -> None:
        if tint == self.tint:
            return
        self.tint = tint
        if self._ready:
            self._show_mode(rebuild=True)

    def set_footer(self, text: str) -> None:
        self.footer_text = text
        if self._ready:
            footer = self.query_one(".reply-footer", Static)
            footer.update(text)
            footer.display = bool(text)

    def show_error(self, text: str) -> None:
        """Show why the reply failed in the reply itself."""
        self.error_text = text
        self.add_class("failed")
        if self._ready:
            error = self.query_one(".reply-error", Static)
            error.update(text)
            error.display = True

    def tinted_text(self) -> Text:
        out = Text()
        styles = self._styles
        for s, source in self.segments:
            out.append(s, style=styles.get(source, ""))
        return out

    @property
    def _styles(self) -> dict[str, str]:
        return tint_styles(self.app.current_theme if self._ready else None)

    def _show_mode(self, *, rebuild: bool) -> None:
        md = self.query_one(".body-md", Markdown)
        box = self.query_one(".body-tinted", Vertical)
        md.display, box.display = not self.tinted, self.tinted
        if not rebuild:
            return
        self._new = []
        if self.tinted:
            box.remove_children()
            self._tint_chunk, self._tint_text = None, self.tinted_text()
            self._render_tint_chunk()
        else:
            self._md_reset = True
            self.flush()

    def _render_tint_chunk(self) -> None:
        box = self.query_one(".body-tinted", Vertical)
        text = self._tint_text
        while len(text) > TINT_CHUNK and (cut := text.plain.rfind("\n", 0, len(text))) > 0:
            self._set_tint_chunk(box, text[:cut])
            self._tint_chunk = None  # the rest starts a new chunk after the line break
            text = text[cut + 1 :]
        self._tint_text = text
        self._set_tint_chunk(box, text)

    def _set_tint_chunk(self, box: Vertical, text: Text) -> None:
        if self._tint_chunk is None:
            self._tint_chunk = Static(text.copy(), classes="tint-chunk")
            box.mount(self._tint_chunk)
        else:
            self._tint_chunk.update(text.copy())
