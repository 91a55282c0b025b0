"""The slash commands typed in the prompt (/k, /tree, /temp, /system, /rename, /export, /new)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localspec import MAX_DRAFT, LocalspecError, SamplingParams, TreeShape

from .store import HistoryError

if TYPE_CHECKING:
    from .app import LocalspecApp


def run_command(app: LocalspecApp, line: str) -> None:
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
            app.draft_tree = TreeShape.parse(arg)
            app.notify(f"draft: fixed {app.draft_tree}")
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
        else:
            app.notify(f"unknown or incomplete command: {line} (F1 lists them)", severity="warning")
    except HistoryError as exc:
        app.notify(str(exc), title="Chat history", severity="error", timeout=15)
    except (ValueError, LocalspecError) as exc:
        why = f" ({exc})" if isinstance(exc, LocalspecError) else ""
        app.notify(f"bad value for {cmd}: {arg!r}{why}", severity="error")
