"""The slash commands typed in the prompt: speculation (/k, /tree, /source), sampling (/temp),
the conversation (/system, /retry, /edit, /version, /branch, /copy, /rename, /export, /new,
/search) and the model (/model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localspec import DRAFT_SOURCES, MAX_DRAFT, LocalspecError, SamplingParams, TreeShape
from localspec.speculation.mode import Spelling, check_source_shape

from . import turn_actions
from .store import HistoryError

if TYPE_CHECKING:
    from .host import ChatHost


# the engine's rules (localspec.options) name what was asked for the way it was typed here
COMMAND_SPELLING = Spelling(
    n_draft="/k {}",
    tree="/tree {0.depth},{0.top_k},{0.budget}",
    draft_source="/source {}",
    n_draft_name="/k",
    no_drafts="/source none",
)
SOURCE_NOTES = {
    "auto": "the EAGLE drafter when loaded and the n-gram index, as the cost model picks",
    "eagle": "the EAGLE drafter only",
    "ngram": "the n-gram index of the context only (no drafter needed)",
    "none": "plain decoding",
}


def set_source(app: ChatHost, source: str) -> None:
    """/source auto|eagle|ngram|none: where the next replies' drafts come from; none turns
    speculation off, the others on (ctrl+b still toggles it for an A/B)."""
    if source not in DRAFT_SOURCES:
        raise LocalspecError(f"one of {', '.join(DRAFT_SOURCES)}")
    check_source_shape(source, app.draft_tree, COMMAND_SPELLING)
    app.draft_source = source
    app.speculation = source != "none"
    app.sub_title = "speculation on" if app.speculation else "speculation off"
    if not app.can_draft(source):
        app.notify(
            f"draft source {source}: no drafter loaded, so replies decode plainly",
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
            k: int | str = "auto" if arg == "auto" else int(arg)
            if k != "auto" and not 0 <= int(k) <= MAX_DRAFT:
                raise ValueError
            app.k, app.draft_tree = k, None
            app.notify("draft: auto (cost model)" if k == "auto" else f"draft: chain k = {k}")
        elif cmd == "/tree":
            tree = TreeShape.parse(arg)
            check_source_shape(app.draft_source, tree, COMMAND_SPELLING)
            app.draft_tree = tree
            app.notify(f"draft: fixed {app.draft_tree}")
        elif cmd == "/source":
            set_source(app, arg)
        elif cmd == "/temp":
            t = float(arg)
            SamplingParams(t, app.options.top_k, app.options.top_p)  # the engine's rule
            app.temperature = t
            app.notify(f"temperature = {t}")
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
