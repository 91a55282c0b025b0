"""The main screen: the conversation, the prompt, and the speculation panel beside them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, LoadingIndicator, Static

from ..widgets.history_chart import HistoryChart
from ..widgets.message import MessageView
from ..widgets.stats_panel import StatsPanel


class ChatScreen(Screen[None]):
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield Static("", id="status")
                yield LoadingIndicator(id="loading")
                yield VerticalScroll(id="conversation")
                yield Input(placeholder="Loading the model...", id="prompt", disabled=True)
            with Vertical(id="side"):
                yield Static("Speculation", classes="side-title")
                yield StatsPanel(id="stats")
                yield HistoryChart(id="history")
        yield Footer()

    @property
    def conversation(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    def add_message(self, role: str, text: str = "", *, tint: bool = False) -> MessageView:
        view = MessageView(role, text, tint=tint)
        self.conversation.mount(view)
        self.conversation.scroll_end(animate=False)
        return view

    def clear_messages(self) -> None:
        self.conversation.remove_children()

    def set_status(self, text: str) -> None:
        """One line: what does not fit ends in an ellipsis (the stylesheet says so)."""
        self.query_one("#status", Static).update(Text(text))
