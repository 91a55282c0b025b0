"""One chat message: Markdown when plain, or tinted text showing where drafts were accepted."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static


class MessageView(Vertical):
    """A message. Assistant replies keep (text, accepted) segments so that the tokens that
    came from accepted drafts can be tinted; untinted, the reply renders as Markdown."""

    DEFAULT_CLASSES = "message"

    def __init__(self, role: str, text: str = "", *, tint: bool = False) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.segments: list[tuple[str, bool]] = [(text, False)] if text else []
        self.tint = tint
        self.footer_text = ""

    def compose(self) -> ComposeResult:
        yield Static(self.role, classes="role")
        yield Markdown(self.text, classes="body-md")
        yield Static("", classes="body-tinted")
        yield Static(self.footer_text, classes="reply-footer")

    def on_mount(self) -> None:
        self._render_body()

    @property
    def text(self) -> str:
        return "".join(s for s, _ in self.segments)

    def append(self, text: str, accepted_chars: int) -> None:
        """Add streamed text whose first accepted_chars characters came from accepted drafts."""
        if accepted_chars > 0:
            self.segments.append((text[:accepted_chars], True))
        if text[accepted_chars:]:
            self.segments.append((text[accepted_chars:], False))
        self._render_body()

    def set_tint(self, tint: bool) -> None:
        self.tint = tint
        self._render_body()

    def set_footer(self, text: str) -> None:
        self.footer_text = text
        footer = self.query_one(".reply-footer", Static)
        footer.update(text)
        footer.display = bool(text)

    def tinted_text(self) -> Text:
        style = f"bold {self.app.current_theme.success}" if self.is_mounted else "bold green"
        out = Text()
        for s, accepted in self.segments:
            out.append(s, style=style if accepted else "")
        return out

    def _render_body(self) -> None:
        if not self.is_mounted:
            return
        md = self.query_one(".body-md", Markdown)
        tinted = self.query_one(".body-tinted", Static)
        show_tint = self.tint and self.role == "assistant"
        md.display = not show_tint
        tinted.display = show_tint
        if show_tint:
            tinted.update(self.tinted_text())
        else:
            md.update(self.text)
        footer = self.query_one(".reply-footer", Static)
        footer.display = bool(self.footer_text)
