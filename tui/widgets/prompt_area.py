"""The prompt: multi-line input where enter sends and ctrl+j (or shift/alt+enter, where the
terminal reports them) starts a new line. Pasted text keeps its newlines."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")  # most terminals send only ctrl+j


class PromptArea(TextArea):
    class Submitted(Message):
        """Enter was pressed: value is the whole prompt, already taken out of the area (the
        app gives it back with `restore` when it cannot use it now)."""

        def __init__(self, area: PromptArea, value: str) -> None:
            super().__init__()
            self.area, self.value = area, value

        @property
        def control(self) -> PromptArea:
            return self.area

    def __init__(self, *, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(
            id=id,
            placeholder=placeholder,
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            compact=True,
            highlight_cursor_line=False,
        )

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def restore(self, text: str) -> None:
        """Give back a submitted prompt, ahead of anything typed since (on a line of its own:
        the two are never run together)."""
        self.value = text + ("\n" + self.text if self.text else "")

    async def on_key(self, event: events.Key) -> None:
        """Enter and the newline keys, in the widget's own queue: a binding would run when the
        key arrives, ahead of characters typed just before it that are still queued (a fast
        typist, a terminal multiplexer, a pasted line ending in a return)."""
        if event.key == "enter":
            text = self.text
            self.clear()  # now: what is typed next belongs to the next prompt
            self.post_message(self.Submitted(self, text))
        elif event.key in NEWLINE_KEYS:
            self.insert("\n")
        else:
            return
        event.stop()
        event.prevent_default()  # not the text area's own handling (enter inserts a newline)
