"""What the user does to the turns of a conversation: edit one (/edit, and esc cancels), show
another version of a reply or an edit (f2/f3, /version, /branch), copy a reply's code block
(/copy, ctrl+g). The app owns the state; these change it as the user asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localspec import LocalspecError

from .clipboard import copy_text
from .code_blocks import code_blocks
from .store import HistoryError

if TYPE_CHECKING:
    from .host import ChatHost


def edit(app: ChatHost, n: int) -> None:
    """/edit N: put user turn N (1-based) in the prompt; sending replaces it."""
    turns = app.session.turns
    if not 1 <= n <= len(turns):
        raise LocalspecError(f"no user turn {n} (this conversation has {len(turns)})")
    app.editing = n - 1
    prompt = app.chat.prompt
    prompt.value = turns[n - 1].prompt
    prompt.border_title = f"editing turn {n} (esc cancels)"
    prompt.focus()
    later = len(turns) - n
    after = f"; the {later} turn{'s' if later > 1 else ''} after it leave" if later else ""
    app.notify(
        f"editing turn {n}: enter resends it{after} (kept in history: /branch {n} switches back)"
    )


def cancel_edit(app: ChatHost) -> None:
    app.end_edit()
    app.chat.prompt.value = ""
    app.notify("edit cancelled")


def switch_version(app: ChatHost, index: int, version: int, *, prompt: bool = False) -> None:
    """Show version `version` (1-based) of turn index's reply, or of its prompt (an edit
    and the turns after it); the conversation from that turn on follows it."""
    if app.generating:
        app.notify("stop the reply first (esc)", severity="warning")
        return
    try:
        if prompt:
            turn = app.session.switch_prompt(index, version)
        else:
            turn = app.session.switch_reply(index, version)
    except HistoryError as exc:
        app.notify(str(exc), title="Versions", severity="warning")
        return
    # an edit of a turn this switch replaces ends (the text typed stays in the prompt);
    # one of an earlier turn goes on
    if app.editing is not None and (app.editing >= index if prompt else app.editing > index):
        app.end_edit()
    app.chat.show_turns(app.session.turns, start=index)
    what = (
        f"turn {index + 1}: prompt {turn.prompt_version}/{turn.prompt_versions}"
        if prompt
        else f"reply {turn.reply_version}/{turn.reply_versions}"
    )
    app.notify(what)
    app.show_gauge()


def copy(app: ChatHost, text: str, what: str) -> None:
    app.notify(copy_text(text, app.copy_to_clipboard, what))


def copy_code(app: ChatHost, n: int | None = None) -> None:
    """/copy N: code block N (1-based) of the last reply; None: its last block."""
    blocks = code_blocks(app.last_reply)
    if not blocks:
        app.notify("the last reply has no code block", severity="warning")
        return
    i = len(blocks) if n is None else n
    if not 1 <= i <= len(blocks):
        raise LocalspecError(f"the last reply has {len(blocks)} code blocks")
    copy(app, blocks[i - 1].code, f"code block {i} of {len(blocks)}")


def step_version(app: ChatHost, step: int) -> None:
    """f2 / f3: the previous or next version of the last reply."""
    turns = app.session.turns
    if not turns:
        return
    last = turns[-1]
    version = last.reply_version + step
    if not 1 <= version <= last.reply_versions:
        app.notify(f"reply {last.reply_version}/{last.reply_versions}: no other version "
                    "that way (ctrl+r makes one)")  # fmt: skip
        return
    switch_version(app, len(turns) - 1, version)


def branch(app: ChatHost, arg: str) -> None:
    """/branch N [K]: user turn N shows its edit K (default: the next one, cycling), with the
    conversation that followed it."""
    n, _, k = arg.partition(" ")
    turns = app.session.turns
    i = int(n) - 1
    if not 0 <= i < len(turns):
        raise LocalspecError(f"no user turn {n}")
    t = turns[i]
    version = int(k) if k.strip() else t.prompt_version % t.prompt_versions + 1
    switch_version(app, i, version, prompt=True)
