"""The main screen: the conversation, the messages queued while a reply streams, the prompt
with the context gauge, and the speculation panel beside them (narrower on a narrow terminal,
hidden on a very narrow one or when the user hides it)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Header, LoadingIndicator, Static

from ..store import Turn
from ..summaries import prompt_footer, reply_footer
from ..widgets.context_gauge import ContextGauge
from ..widgets.history_chart import HistoryChart
from ..widgets.message import MessageView
from ..widgets.prompt_area import PromptArea
from ..widgets.stats_panel import StatsPanel

PANEL_FULL = 100  # from this many columns the panel has its full width (the stylesheet's)...
PANEL_MIN = 70  # ...below, a narrower one; below this, none: the conversation keeps the width


class Notice(Static):
    """A one-line note between messages, tied to the turn it precedes."""

    def __init__(self, text: str, turn: int) -> None:
        super().__init__(Text(text), classes="notice")
        self.turn = turn


class ChatScreen(Screen[None]):
    def __init__(self, *, panel: bool = True) -> None:
        super().__init__()
        self.panel_wanted = panel  # the user's choice (f4); the width may still hide it

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield Static("", id="status")
                yield LoadingIndicator(id="loading")
                yield VerticalScroll(id="conversation")
                yield Static("", id="queued")
                yield PromptArea(placeholder="Loading the model...", id="prompt")
                yield ContextGauge(id="gauge")
            with Vertical(id="side"):
                yield Static("Speculation", classes="side-title")
                yield StatsPanel(id="stats")
                yield HistoryChart(id="history")
        yield Footer()

    @property
    def conversation(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    @property
    def prompt(self) -> PromptArea:
        return self.query_one("#prompt", PromptArea)

    @property
    def gauge(self) -> ContextGauge:
        return self.query_one("#gauge", ContextGauge)

    def on_mount(self) -> None:
        self.prompt.disabled = True  # until a model is loaded
        self.query_one("#queued", Static).display = False
        self.fit_panel()

    def on_resize(self, event: events.Resize) -> None:
        self.fit_panel()

    @property
    def panel_shown(self) -> bool:
        return bool(self.query_one("#side").display)

    def fit_panel(self) -> None:
        """The panel as the user wants it and the terminal's width allows."""
        width = self.size.width or self.app.size.width
        self.set_class(width < PANEL_FULL, "-panel-narrow")
        self.query_one("#side").display = self.panel_wanted and width >= PANEL_MIN

    def show_queued(self, texts: Sequence[str]) -> None:
        """The messages waiting for the reply in progress, one line each, dimmed."""
        line = self.query_one("#queued", Static)
        line.display = bool(texts)
        if len(texts) == 1:
            hint = "sent when the reply ends · esc: stop, back to the input"
        else:
            hint = "sent in order as replies end · esc: stop, back to input"
        rows = [f"queued: {' '.join(t.split())}" for t in texts]
        line.update(Text("\n".join([*rows, hint]) if texts else ""))

    def add_message(self, role: str, text: str = "", *, tint: bool = False) -> MessageView:
        view = MessageView(role, text, tint=tint)
        self.conversation.mount(view)
        self.conversation.scroll_end(animate=False)
        return view

    def add_notice(self, text: str, *, before: MessageView | None = None) -> Notice:
        """A one-line note in the conversation (e.g. turns leaving the context window)."""
        note = Notice(text, before.turn if before is not None else -1)
        self.conversation.mount(note, before=before)
        return note

    def views_from(self, start: int) -> list[Widget]:
        """Every view of turns start.. (their messages and notes)."""
        return [
            w
            for w in self.conversation.children
            if isinstance(w, MessageView | Notice) and w.turn >= start
        ]

    def messages_from(self, start: int, role: str | None = None) -> list[MessageView]:
        """The messages of turns start.. (of one role when given)."""
        return [
            w
            for w in self.conversation.children
            if isinstance(w, MessageView) and w.turn >= start and role in (None, w.role)
        ]

    def show_turns(self, turns: Sequence[Turn], start: int = 0) -> None:
        """Show turns[start:] in place of what the conversation showed from turn start on."""
        for view in self.views_from(start):
            view.remove()
        for i in range(start, len(turns)):
            t = turns[i]
            self.add_message("user", t.prompt).turn = i
            self.add_message("assistant", t.reply).turn = i
            self.set_footers(turns, i)

    def set_footers(self, turns: Sequence[Turn], index: int) -> None:
        """Turn index's footers: its reply's statistics and versions, its prompt's edits."""
        if not 0 <= index < len(turns):
            return
        t = turns[index]
        for view in self.messages_from(index):
            if view.turn != index:
                continue
            if view.role == "user":
                view.set_footer(prompt_footer(t))
            else:
                view.set_footer(reply_footer(t.stats or {}, t, last=index == len(turns) - 1))

    def reveal(self, index: int) -> None:
        """Scroll so that turn index starts at the top, and mark it (a search hit)."""
        views = self.messages_from(index)
        if views:
            views[0].add_class("found")
            self.call_after_refresh(self.conversation.scroll_to_widget, views[0], top=True,
                                    animate=False)  # fmt: skip

    def clear_messages(self) -> None:
        self.conversation.remove_children()

    def set_status(self, text: str) -> None:
        """One line: what does not fit ends in an ellipsis (the stylesheet says so)."""
        self.query_one("#status", Static).update(Text(text))
