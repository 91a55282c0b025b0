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
    ("/temp T", "sampling temperature (0 = greedy; model: the model's recommendation)"),
    ("/system TEXT", "system prompt for this conversation (empty: none)"),
    ("/retry", "regenerate the last reply (ctrl+r); the old one stays as a version"),
    ("/version N", "show version N of the last reply (f2 / f3 step through them)"),
    (
        "/edit N",
        "put user turn N (1 = first) in the prompt; sending it replaces that turn and the "
        "turns after it leave the conversation (kept in history as a branch)",
    ),
    ("/branch N [K]", "show edit K of user turn N (default: the next), with what followed it"),
    ("/copy [N]", "copy code block N of the last reply (default: the last one; ctrl+g)"),
    ("/search TEXT", "full-text search of every saved conversation; enter opens a hit"),
    ("/model PATH|REPO", "load another target (path, org/name, org/name:QUANT) and its drafter"),
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
            yield Static(
                "The line under the prompt is the context gauge: tokens used / the context "
                "size, with the system prompt's share and the history's. When the next prompt "
                "would not fit, the oldest turns leave the window (--context-overflow rolling, "
                "the default; a note says how many) and the chat goes on; 'stop' ends there "
                "instead. A reopened conversation restores its saved KV state instead of "
                "reading its history again (--session-cache-size bounds the disk it takes).",
                classes="hint",
            )
