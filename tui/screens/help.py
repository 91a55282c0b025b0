"""Every key binding and slash command, on one screen."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..tint import legend

COMMANDS = [
    ("/k auto", "let the cost model pick plain, a chain or a tree each step (default)"),
    ("/k N", "fixed draft chain of N tokens per step (0 turns speculation off)"),
    ("/tree D,K,B", "fixed EAGLE draft tree: depth, top-k per node, node budget"),
    (
        "/source S",
        "where drafts come from: auto (EAGLE drafter and n-gram index, default), eagle, "
        "ngram (the context, no drafter needed), none (plain decoding)",
    ),
    ("/temp T", "sampling temperature (0 = greedy)"),
    ("/system TEXT", "system prompt for this conversation (empty: none)"),
    ("/rename TITLE", "rename this conversation"),
    ("/export [FILE]", "write this conversation as Markdown"),
    ("/new", "start a new conversation"),
    ("/clear", "clear the screen and start over in a new conversation"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f1", "app.pop_screen", "Close")]

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self.key_rows = bindings

    def compose(self) -> ComposeResult:
        keys = Table(title="Keys", show_header=False, expand=True)
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        for key, desc in self.key_rows:
            keys.add_row(key, desc)
        cmds = Table(title="Commands (type them in the prompt)", show_header=False, expand=True)
        cmds.add_column(style="bold", no_wrap=True)
        cmds.add_column()
        for c, desc in COMMANDS:
            cmds.add_row(c, desc)
        with VerticalScroll(id="help-box"):
            yield Static(keys)
            yield Static(cmds)
            yield Static(
                Text.assemble(
                    "Tinted text (ctrl+t): accepted draft tokens, by who proposed them: ",
                    legend(self.app.current_theme),
                    "; untinted: the target's own.",
                ),
                classes="hint",
            )
