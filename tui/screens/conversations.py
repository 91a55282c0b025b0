"""Saved conversations: open, rename, delete, export, and full-text search across them."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from ..store import ChatStore, HistoryError


@dataclass(frozen=True)
class OpenRequest:
    conversation_id: int
    message_id: int | None = None  # a search hit: open the branch holding it, scrolled to it


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


class ConversationsScreen(ModalScreen[OpenRequest | None]):
    """Lists conversations, or the search hits while the search box holds text. Dismisses with
    what to open, or None."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export"),
        Binding("slash", "search", "Search"),
    ]

    def __init__(self, store: ChatStore, query: str = "") -> None:
        super().__init__()
        self.store = store
        self.query_text = query

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-box"):
            yield Label(
                "Conversations: enter opens, r renames, d deletes, e exports, / searches, "
                "esc closes",
                id="conversations-help",
            )
            yield Input(
                self.query_text,
                placeholder="/ search every conversation (full text)",
                id="history-search",
            )
            yield OptionList(id="conversation-list")
            yield Input(placeholder="new title, then enter", id="rename-input")

    def on_mount(self) -> None:
        self.query_one("#rename-input", Input).display = False
        self.refresh_list()

    @property
    def searching(self) -> bool:
        return bool(self.query_text.strip())

    def refresh_list(self) -> None:
        ol = self.query_one(OptionList)
        ol.clear_options()
        try:
            if self.searching:
                self._list_hits(ol)
            else:
                self._list_conversations(ol)
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error", timeout=15)
        if ol.option_count:
            ol.highlighted = 0
        if not self.searching:
            ol.focus()

    def _list_conversations(self, ol: OptionList) -> None:
        for c in self.store.conversations():
            label = f"{c.title}  ({c.n_messages} messages, {_when(c.updated)})"
            ol.add_option(Option(label, id=f"c:{c.id}"))

    def _list_hits(self, ol: OptionList) -> None:
        hits = self.store.search(self.query_text)
        if not hits:
            ol.add_option(Option(Text("no match", style="dim"), id="none", disabled=True))
        for h in hits:
            snippet = Text(h.snippet, style="italic")
            for start, end in h.marks:  # the words that matched
                snippet.stylize("bold reverse", start, end)
            label = Text.assemble((h.title, "bold"), f"  {h.role}, {_when(h.updated)}\n  ", snippet)
            ol.add_option(Option(label, id=f"m:{h.conversation_id}:{h.message_id}"))

    def _request(self, option_id: str | None) -> OpenRequest | None:
        kind, *ids = (option_id or "none").split(":")
        if kind == "c":
            return OpenRequest(int(ids[0]))
        if kind == "m":
            return OpenRequest(int(ids[0]), int(ids[1]))
        return None

    def _selected(self) -> int | None:
        """The highlighted conversation's id (a hit's conversation while searching)."""
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            return None
        req = self._request(ol.get_option_at_index(ol.highlighted).id)
        return req.conversation_id if req else None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        req = self._request(event.option.id)
        if req is not None:
            self.dismiss(req)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "history-search":
            self.query_text = event.value
            self.refresh_list()

    def action_close(self) -> None:
        if self.focused is self.query_one("#history-search") and self.searching:
            self.query_one("#history-search", Input).value = ""  # first esc clears the search
            self.query_one(OptionList).focus()
            return
        self.dismiss(None)

    def action_search(self) -> None:
        self.query_one("#history-search", Input).focus()

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is not None and self._write(self.store.delete, cid):
            self.app.forget_conversation(cid)  # type: ignore[attr-defined]  # its saved KV state
            self.notify("conversation deleted")
            self.refresh_list()

    def action_rename(self) -> None:
        if self._selected() is not None:
            box = self.query_one("#rename-input", Input)
            box.display = True
            box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "history-search":
            ol = self.query_one(OptionList)
            ol.focus()
            if ol.highlighted is not None:
                req = self._request(ol.get_option_at_index(ol.highlighted).id)
                if req is not None:
                    self.dismiss(req)
            return
        cid = self._selected()
        title = event.value.strip()
        event.input.display = False
        event.input.value = ""
        if cid is not None and title and self._write(self.store.rename, cid, title):
            self.refresh_list()

    def action_export(self) -> None:
        cid = self._selected()
        if cid is not None:
            self.app.export_conversation(cid)  # type: ignore[attr-defined]  # it reports

    def _write(self, change: Callable[..., None], *args: object) -> bool:
        """Apply a change to the store; False (and the reason shown) if it refuses."""
        try:
            change(*args)
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error", timeout=15)
            return False
        return True
