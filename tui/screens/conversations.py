"""Saved conversations: open, rename, delete, export."""

from __future__ import annotations

import datetime
from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from ..store import ChatStore, HistoryError


class ConversationsScreen(ModalScreen[int | None]):
    """Dismisses with the id of the conversation to open, or None."""

    BINDINGS = [
        Binding("escape", "dismiss_none", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export"),
    ]

    def __init__(self, store: ChatStore) -> None:
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-box"):
            yield Label("Conversations: enter opens, r renames, d deletes, e exports, esc closes")
            yield OptionList(id="conversation-list")
            yield Input(placeholder="new title, then enter", id="rename-input")

    def on_mount(self) -> None:
        self.query_one("#rename-input", Input).display = False
        self.refresh_list()

    def refresh_list(self) -> None:
        ol = self.query_one(OptionList)
        ol.clear_options()
        try:
            conversations = self.store.conversations()
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error", timeout=15)
            conversations = []
        for c in conversations:
            when = datetime.datetime.fromtimestamp(c.updated).strftime("%Y-%m-%d %H:%M")
            ol.add_option(Option(f"{c.title}  ({c.n_messages} messages, {when})", id=str(c.id)))
        if ol.option_count:
            ol.highlighted = 0
        ol.focus()

    def _selected(self) -> int | None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            return None
        opt = ol.get_option_at_index(ol.highlighted)
        return int(opt.id) if opt.id else None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id) if event.option.id else None)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is not None and self._write(self.store.delete, cid):
            self.notify("conversation deleted")
            self.refresh_list()

    def action_rename(self) -> None:
        if self._selected() is not None:
            box = self.query_one("#rename-input", Input)
            box.display = True
            box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
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
