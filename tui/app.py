"""`localspec chat`: a Textual terminal chat that makes speculation visible.

Attributes flow down, messages flow up: generation runs in a thread worker that posts
ReplyChunk / ReplyDone / ReplyFailed messages, and the UI changes only in their handlers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input, LoadingIndicator
from textual.worker import get_current_worker

from localspec.engine import MAX_DRAFT
from localspec.errors import LocalspecError
from localspec.sampling import SamplingParams
from localspec.tree import TreeShape

from .screens.chat import ChatScreen
from .screens.conversations import ConversationsScreen
from .screens.help import HelpScreen
from .store import ChatStore
from .widgets.history_chart import HistoryChart
from .widgets.message import MessageView
from .widgets.stats_panel import StatsPanel


@dataclass
class ChatOptions:
    target: str | None = None
    draft: str | Literal[False] | None = None  # None: find one; False: none
    n_draft: int | str = "auto"  # "auto": the cost model picks plain, a chain or a tree
    tree: TreeShape | None = None  # a fixed draft tree instead
    n_gpu_layers: int = 0
    n_threads: int | None = None
    n_ctx: int = 4096
    system: str = ""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


def default_engine_factory(o: ChatOptions) -> Any:
    from localspec.engine import load

    kw: dict[str, Any] = dict(
        n_draft=o.n_draft,
        tree=o.tree,
        n_gpu_layers=o.n_gpu_layers,
        n_threads=o.n_threads,
        n_ctx=o.n_ctx,
    )
    kw.update(o.engine_kwargs)  # engine options beyond the common ones (tests: exact numerics)
    return load(o.target, draft=o.draft, **kw)


class EngineReady(Message):
    def __init__(self, engine: Any, error: str | None) -> None:
        super().__init__()
        self.engine, self.error = engine, error


class ReplyChunk(Message):
    def __init__(self, text: str, accepted_chars: int, snapshot: dict[str, Any]) -> None:
        super().__init__()
        self.text, self.accepted_chars, self.snapshot = text, accepted_chars, snapshot


class ReplyDone(Message):
    def __init__(self, snapshot: dict[str, Any], finish_reason: str, stopped: bool) -> None:
        super().__init__()
        self.snapshot, self.finish_reason, self.stopped = snapshot, finish_reason, stopped


class ReplyFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class LocalspecApp(App[None]):
    CSS_PATH = "localspec.tcss"
    TITLE = "localspec"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+t", "toggle_tint", "Tint"),
        Binding("ctrl+b", "toggle_speculation", "A/B"),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+o", "open_conversations", "History"),
        Binding("ctrl+y", "copy_last", "Copy"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit"),
    ]
    KEY_HELP = [
        ("enter", "send the prompt (or run a /command)"),
        ("escape", "stop the reply in progress, keeping what was produced"),
        ("ctrl+t", "tint tokens that came from accepted drafts (on/off)"),
        ("ctrl+b", "speculation off/on for the next reply (live A/B)"),
        ("ctrl+n", "new conversation"),
        ("ctrl+o", "saved conversations: open, rename, delete, export"),
        ("ctrl+y", "copy the last reply to the clipboard"),
        ("f1", "this help"),
        ("ctrl+q", "quit"),
    ]

    def __init__(
        self,
        options: ChatOptions,
        *,
        engine_factory: Callable[[ChatOptions], Any] = default_engine_factory,
        store: ChatStore | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.engine_factory = engine_factory
        self.store = store or ChatStore()
        self.engine: Any = None
        self.k: int | str = options.n_draft  # "auto" or a fixed chain length
        self.draft_tree: TreeShape | None = options.tree  # a fixed tree overrides k
        self.temperature = options.temperature
        self.system = options.system
        self.speculation = options.draft is not False
        self.tint = False  # Markdown by default; ctrl+t shows where drafts were accepted
        self.conversation_id: int | None = None
        self.history: list[dict[str, str]] = []
        self.generating = False
        self._stop = False
        self._reply: MessageView | None = None
        self.last_plain_tps: float | None = None
        self.last_reply = ""

    # --- start-up ----------------------------------------------------------------------------

    async def on_mount(self) -> None:
        self._chat = ChatScreen()
        await self.push_screen(self._chat)
        self.chat.set_status(f"loading {self.options.target or 'the default model'}...")
        self.load_engine()

    @property
    def chat(self) -> ChatScreen:
        return self._chat

    @work(thread=True, exclusive=True, group="load")
    def load_engine(self) -> None:
        try:
            engine = self.engine_factory(self.options)
        except LocalspecError as exc:
            self.post_message(EngineReady(None, str(exc)))
            return
        self.post_message(EngineReady(engine, None))

    def on_engine_ready(self, msg: EngineReady) -> None:
        self.chat.query_one("#loading", LoadingIndicator).display = False
        prompt = self.chat.query_one("#prompt", Input)
        if msg.error:
            self.chat.set_status("no model loaded")
            self.notify(msg.error, title="Model load failed", severity="error", timeout=30)
            prompt.placeholder = "no model loaded (see the error); ctrl+o still opens history"
            return
        self.engine = msg.engine
        self.speculation = self.speculation and self.engine.drafter is not None
        d = self.engine.drafter
        note = f"{d.spec.variant} drafter {os.path.basename(d.spec.path)}" if d else "no drafter"
        if d is None and self.options.draft is None:
            note = "no drafter found next to the target: plain decoding"
        self.chat.set_status(f"{os.path.basename(self.engine.target_path)}  |  {note}")
        self.sub_title = "speculation on" if self.speculation else "speculation off"
        prompt.disabled = False
        prompt.placeholder = "Message (F1: help, /k auto|N, /tree D,K,B, /temp T, /system ...)"
        prompt.focus()
        self._show_idle_stats()

    # --- prompts and commands ----------------------------------------------------------------

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        text = event.value.strip()
        if not text:
            return
        if text.startswith("/"):
            event.input.value = ""
            self.run_command(text)
            return
        if self.generating or self.engine is None:
            self.notify("a reply is in progress (esc stops it)", severity="warning")
            return
        event.input.value = ""
        self.send(text)

    def send(self, text: str) -> None:
        if self.conversation_id is None:
            self.conversation_id = self.store.new_conversation(
                text[:60],
                target=self.engine.target_path,
                draft=self.engine.draft_path or "",
                system=self.system,
            )
        self.chat.add_message("user", text)
        self.history.append({"role": "user", "content": text})
        self.store.add_message(self.conversation_id, "user", text)
        self._reply = self.chat.add_message("assistant", tint=self.tint)
        self.generating = True
        self._stop = False
        k = self.k if self.speculation else 0
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + self.history
        self.generate(msgs, k)

    def run_command(self, line: str) -> None:
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if cmd == "/k":
                k: int | str = "auto" if arg == "auto" else int(arg)
                if k != "auto" and not 0 <= int(k) <= MAX_DRAFT:
                    raise ValueError
                self.k, self.draft_tree = k, None
                self.notify("draft: auto (cost model)" if k == "auto" else f"draft: chain k = {k}")
            elif cmd == "/tree":
                self.draft_tree = TreeShape.parse(arg)
                self.notify(f"draft: fixed {self.draft_tree}")
            elif cmd == "/temp":
                t = float(arg)
                SamplingParams(t, self.options.top_k, self.options.top_p)  # the engine's rule
                self.temperature = t
                self.notify(f"temperature = {t}")
            elif cmd == "/system":
                self.system = arg
                if self.conversation_id is not None:
                    self.store.set_system(self.conversation_id, arg)
                self.notify("system prompt set" if arg else "system prompt cleared")
            elif cmd == "/rename" and arg and self.conversation_id is not None:
                self.store.rename(self.conversation_id, arg)
                self.notify(f"renamed to {arg}")
            elif cmd == "/export" and self.conversation_id is not None:
                self.notify(f"exported to {self.export_conversation(self.conversation_id, arg)}")
            elif cmd in ("/new", "/clear"):
                self.action_new_conversation()
            else:
                self.notify(
                    f"unknown or incomplete command: {line} (F1 lists them)", severity="warning"
                )
            self._show_idle_stats()
        except (ValueError, LocalspecError) as exc:
            why = f" ({exc})" if isinstance(exc, LocalspecError) else ""
            self.notify(f"bad value for {cmd}: {arg!r}{why}", severity="error")

    def export_conversation(self, conversation_id: int, path: str = "") -> str:
        path = path or f"localspec-conversation-{conversation_id}.md"
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(self.store.export_markdown(conversation_id))
        except OSError as exc:
            self.notify(f"cannot write {path}: {exc}", severity="error")
        return os.path.abspath(path)

    # --- generation (thread worker) ----------------------------------------------------------

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, messages: list[dict[str, str]], k: int | str) -> None:
        worker = get_current_worker()
        eng = self.engine
        reason, stopped = "length", False
        try:
            events = eng.chat(
                messages,
                max_tokens=self.options.max_tokens,
                n_draft=k,
                tree=self.draft_tree if k != 0 else None,
                temperature=self.temperature,
                top_k=self.options.top_k,
                top_p=self.options.top_p,
                seed=self.options.seed,
            )
            try:
                for ev in events:
                    if self._stop or worker.is_cancelled:
                        stopped = True
                        break
                    n_acc = sum(ev.accepted)
                    acc_chars = len(eng.detokenize(ev.tokens[:n_acc])) if n_acc else 0
                    self.post_message(ReplyChunk(ev.text, acc_chars, self._snapshot(k)))
                    reason = ev.finish_reason or reason
            finally:
                events.close()  # ends the generator: its statistics are final
        except LocalspecError as exc:
            self.post_message(ReplyFailed(str(exc)))
            return
        self.post_message(ReplyDone(self._snapshot(k), reason, stopped))

    def _mode(self, k: int | str) -> str:
        if k == 0:
            return "plain decoding"
        if self.draft_tree is not None:
            return f"fixed {self.draft_tree}"
        return "auto (cost model)" if k == "auto" else f"fixed chain k={k}"

    def _snapshot(self, k: int | str) -> dict[str, Any]:
        stats = self.engine.last_stats
        snap = stats.as_dict()
        snap["k"] = k
        snap["mode"] = self._mode(k)
        snap["shape"] = stats.shape_summary()
        snap["drafter"] = os.path.basename(self.engine.draft_path or "") or "none"
        if k and self.last_plain_tps:
            snap["speedup"] = snap["tokens_per_s"] / self.last_plain_tps
        return snap

    def on_reply_chunk(self, msg: ReplyChunk) -> None:
        if self._reply is not None and msg.text:
            self._reply.append(msg.text, msg.accepted_chars)
            self.chat.conversation.scroll_end(animate=False)
        self.chat.query_one(StatsPanel).show(msg.snapshot)

    def on_reply_done(self, msg: ReplyDone) -> None:
        s = msg.snapshot
        self.generating = False
        reply = self._reply
        text = reply.text if reply else ""
        self.last_reply = text
        if s["k"] == 0 and s["generated"] > 0:
            self.last_plain_tps = s["tokens_per_s"]
        footer = (
            f"{s['generated']} tokens · {s['tokens_per_s']:.1f} tok/s · tau {s['tau']:.2f}"
            f" · {100 * s['acceptance_rate']:.0f}% accepted · {s['mode']}"
        )
        if msg.stopped:
            footer += " · stopped"
        elif msg.finish_reason == "context_full":
            footer += " · context full"
            self.notify(
                "the context window is full: start a new conversation (ctrl+n)", severity="warning"
            )
        if reply is not None:
            reply.set_footer(footer)
        self.history.append({"role": "assistant", "content": text})
        if self.conversation_id is not None:
            self.store.add_message(self.conversation_id, "assistant", text, stats=s)
        self.chat.query_one(StatsPanel).show(s)
        if s["generated"]:
            self.chat.query_one(HistoryChart).add(s["tau"], s["tokens_per_s"])
        self._reply = None

    def on_reply_failed(self, msg: ReplyFailed) -> None:
        self.generating = False
        if self._reply is not None:
            self._reply.set_footer("generation failed")
        self._reply = None
        if self.history and self.history[-1]["role"] == "user":
            self.history.pop()  # the next prompt should not stack on a failed turn
        self.notify(msg.error, title="Generation failed", severity="error", timeout=15)

    # --- actions -----------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generating:
            self._stop = True

    def action_toggle_tint(self) -> None:
        self.tint = not self.tint
        for view in self.chat.query(MessageView):
            view.set_tint(self.tint)
        self.notify("tinting accepted drafts" if self.tint else "tinting off")

    def action_toggle_speculation(self) -> None:
        if self.engine is None or self.engine.drafter is None:
            self.notify("no drafter loaded: speculation is off", severity="warning")
            return
        self.speculation = not self.speculation
        self.sub_title = "speculation on" if self.speculation else "speculation off"
        self.notify(f"next reply: {'speculation' if self.speculation else 'plain decoding'}")
        self._show_idle_stats()

    def action_new_conversation(self) -> None:
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return
        self.conversation_id = None
        self.history = []
        self.chat.clear_messages()

    def action_open_conversations(self) -> None:
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return
        self.push_screen(ConversationsScreen(self.store), self.open_conversation)

    def open_conversation(self, conversation_id: int | None) -> None:
        if conversation_id is None:
            return
        conv = self.store.conversation(conversation_id)
        self.conversation_id = conversation_id
        self.system = conv.system
        self.chat.clear_messages()
        self.history = []
        for m in self.store.messages(conversation_id):
            view = self.chat.add_message(m.role, m.content, tint=False)
            if m.stats:
                s = m.stats
                view.footer_text = (
                    f"{s.get('generated', 0)} tokens · "
                    f"{s.get('tokens_per_s', 0.0):.1f} tok/s · tau "
                    f"{s.get('tau', 0.0):.2f} · {s.get('mode', '')}"
                )
            if m.role in ("user", "assistant"):
                self.history.append({"role": m.role, "content": m.content})
        self.notify(f"opened: {conv.title}")

    def action_copy_last(self) -> None:
        if self.last_reply:
            self.copy_to_clipboard(self.last_reply)
            self.notify("last reply copied")

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.KEY_HELP))

    def _show_idle_stats(self) -> None:
        if self.engine is None:
            return
        k = self.k if self.speculation else 0
        panel = self.chat.query_one(StatsPanel)
        snap = dict(panel.snapshot) if panel.snapshot else {}
        snap.update(
            k=k,
            mode=self._mode(k),
            drafter=os.path.basename(self.engine.draft_path or "") or "none",
        )
        panel.show(snap)

    def on_unmount(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.store.close()
