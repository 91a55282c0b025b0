"""The slash commands typed in the prompt: speculation (/k, /tree, /source), sampling (/temp),
the conversation (/system, /retry, /edit, /version, /branch, /copy, /rename, /export, /new,
/search) and the model (/model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localspec import LocalspecError

from . import turn_actions
from .store import HistoryError

if TYPE_CHECKING:
    from .host import ChatHost


SOURCE_NOTES = {
    "auto": "the EAGLE drafter (or the target's MTP head) when loaded and the n-gram index, "
    "as the cost model picks",
    "eagle": "the EAGLE drafter only",
    "mtp": "the target's own MTP head only",
    "ngram": "the n-gram index of the context only (no drafter needed)",
    "none": "plain decoding",
}


def set_source(app: ChatHost, source: str) -> None:
    """/source auto|eagle|mtp|ngram|none: where the next replies' drafts come from; none turns
    speculation off, the others on (ctrl+b still toggles it for an A/B)."""
    app.next_reply = app.next_reply.with_source(source)
    if not app.can_draft(source):
        app.notify(
            f"draft source {source}: "
            + ("the target has no MTP head loaded" if source == "mtp" else "no drafter loaded")
            + ", so replies decode plainly",
            severity="warning",
        )
    else:
        app.notify(f"draft source {source}: {SOURCE_NOTES[source]}")


def run_command(app: ChatHost, line: str) -> None:
    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    cid = app.session.conversation_id
    try:
        if cmd == "/k":
            app.next_reply = app.next_reply.with_k(arg)
            k = app.next_reply.k
            app.notify("draft: auto (cost model)" if k == "auto" else f"draft: chain k = {k}")
        elif cmd == "/tree":
            app.next_reply = app.next_reply.with_tree(arg)
            app.notify(f"draft: fixed {app.next_reply.tree}")
        elif cmd == "/source":
            set_source(app, arg)
        elif cmd == "/temp":
            opts = app.options
            app.next_reply = app.next_reply.with_temperature(arg, opts.top_k, opts.top_p)
            t = app.next_reply.temperature
            app.notify("temperature: the model's" if t is None else f"temperature = {t}")
        elif cmd == "/system":
            app.session.set_system(arg)
            app.notify("system prompt set" if arg else "system prompt cleared")
        elif cmd in ("/rename", "/export") and cid is None:
            app.notify(f"{cmd}: nothing saved yet in this conversation", severity="warning")
        elif cmd == "/rename" and arg and cid is not None:
            app.store.rename(cid, arg)
            app.notify(f"renamed to {arg}")
        elif cmd == "/export" and cid is not None:
            app.export_conversation(cid, arg)
        elif cmd in ("/new", "/clear"):
            app.action_new_conversation()
        elif cmd == "/retry":
            app.retry()
        elif cmd == "/edit" and arg:
            turn_actions.edit(app, int(arg))
        elif cmd == "/version" and arg and app.session.turns:
            turn_actions.switch_version(app, len(app.session.turns) - 1, int(arg))
        elif cmd == "/branch" and arg:
            turn_actions.branch(app, arg)
        elif cmd == "/copy":
            turn_actions.copy_code(app, int(arg) if arg else None)
        elif cmd == "/search" and arg:
            app.open_history(arg)
        elif cmd == "/model" and arg:
            app.switch_model(arg)
        else:
            app.notify(f"unknown or incomplete command: {line} (F1 lists them)", severity="warning")
    except HistoryError as exc:
        app.notify(str(exc), title="Chat history", severity="error", timeout=15)
    except (ValueError, LocalspecError) as exc:
        why = f" ({exc})" if isinstance(exc, LocalspecError) else ""
        app.notify(f"bad value for {cmd}: {arg!r}{why}", severity="error")
