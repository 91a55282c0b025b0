"""`localspec chat`: a Textual terminal chat that makes speculation visible.

Attributes flow down, messages flow up: generation runs in a thread worker that streams into a
ReplyBuffer, which the UI drains on a frame timer (a bounded rate, whatever the engine's speed);
the worker posts one ReplyEnded message, and the UI changes only on the UI thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, LoadingIndicator
from textual.worker import get_current_worker

from localspec import LocalspecError, TreeShape

from .commands import run_command
from .frame_budget import FrameBudget
from .generation import ReplyOutcome, ReplyRequest, stream_reply
from .reply_buffer import ReplyBuffer
from .screens.chat import ChatScreen
from .screens.conversations import ConversationsScreen
from .screens.help import HelpScreen
from .session import ChatSession
from .store import ChatStore, HistoryError, Turn
from .summaries import reply_footer
from .tint import legend_markup

if TYPE_CHECKING:  # the engine module loads libllama: imported only where it is used
    from localspec import Engine
from .thread_gate import ThreadGate
from .widgets.history_chart import HistoryChart
from .widgets.message import MessageView
from .widgets.stats_panel import StatsPanel

FRAME_S = 1 / 20  # the streaming reply is redrawn at most this often,
UI_SHARE = 0.08  # ...with at most this share of a core for the UI thread,
MAX_GAP_S = 1.0  # ...but at least this often, however costly a redraw
PANEL_S = 0.25  # the side panel is refreshed at most this often while streaming


@dataclass
class ChatOptions:
    target: str | None = None
    draft: str | Literal[False] | None = None  # None: find one; False: none
    n_draft: int | str = "auto"  # "auto": the cost model picks plain, a chain or a tree
    tree: TreeShape | None = None  # a fixed draft tree instead
    draft_source: str = "auto"  # "auto", "eagle", "ngram" or "none" (plain decoding)
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


def default_engine_factory(o: ChatOptions) -> Engine:
    from localspec import load

    kw: dict[str, Any] = dict(
        n_draft=o.n_draft,
        tree=o.tree,
        draft_source=o.draft_source,
        n_gpu_layers=o.n_gpu_layers,
        n_threads=o.n_threads,
        n_ctx=o.n_ctx,
    )
    kw.update(o.engine_kwargs)  # engine options beyond the common ones (tests: exact numerics)
    return load(o.target, draft=o.draft, **kw)


class EngineReady(Message):
    def __init__(self, engine: Engine | None, error: str | None) -> None:
        super().__init__()
        self.engine, self.error = engine, error


class ReplyEnded(Message):
    def __init__(self, outcome: ReplyOutcome) -> None:
        super().__init__()
        self.outcome = outcome


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
        ("ctrl+t", "tint tokens that came from accepted drafts, by source (on/off)"),
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
        engine_factory: Callable[[ChatOptions], Engine] = default_engine_factory,
        store: ChatStore | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.engine_factory = engine_factory
        self.store = store or ChatStore()
        self.engine: Engine | None = None
        self.k: int | str = options.n_draft  # "auto" or a fixed chain length
        self.draft_tree: TreeShape | None = options.tree  # a fixed tree overrides k
        # where drafts come from while speculation is on: auto, eagle, ngram (none: off)
        self.draft_source = options.draft_source
        self.temperature = options.temperature
        self.session = ChatSession(self.store, system=options.system)
        self.speculation = options.draft_source != "none"
        self.tint = False  # Markdown by default; ctrl+t shows where drafts were accepted
        self.generating = False
        self.last_plain_tps: float | None = None
        self.last_reply = ""
        self.load_error: str | None = None
        self.exit_notes: list[str] = []  # for stderr once the app has left the terminal
        self._stop = False
        self._gate = ThreadGate()  # the engine is closed only once no worker is inside
        self._loaded: Engine | None = (
            None  # the engine as loaded, even if EngineReady never arrives
        )
        self._reply: MessageView | None = None
        self._prompt = ""  # the prompt of the reply in progress
        self._buffer: ReplyBuffer | None = None
        self._outcome: ReplyOutcome | None = None  # set by the worker as it ends
        self._frame_timer: Timer | None = None
        self._budget = FrameBudget(UI_SHARE, FRAME_S, MAX_GAP_S)
        self._panel_shown = 0.0  # monotonic time of the last panel refresh
        self._snapshot_due: dict[str, Any] | None = None  # drained, not yet shown

    # --- start-up ----------------------------------------------------------------------------

    async def on_mount(self) -> None:
        self._chat = ChatScreen()
        await self.push_screen(self._chat)
        self.chat.set_status(f"loading {self.options.target or 'the default model'}...")
        self.chat.conversation.anchor()  # follow the stream until the user scrolls up
        self._frame_timer = self.set_interval(FRAME_S, self._frame, pause=True)
        self.load_engine()

    @property
    def chat(self) -> ChatScreen:
        return self._chat

    @work(thread=True, exclusive=True, group="load")
    def load_engine(self) -> None:
        if not self._gate.enter():
            return
        try:
            engine = self.engine_factory(self.options)
        except LocalspecError as exc:
            self.post_message(EngineReady(None, str(exc)))
        else:
            self._loaded = engine
            self.post_message(EngineReady(engine, None))
        finally:
            self._gate.leave()

    def on_engine_ready(self, msg: EngineReady) -> None:
        self.chat.query_one("#loading", LoadingIndicator).display = False
        prompt = self.chat.query_one("#prompt", Input)
        if msg.error or msg.engine is None:
            self.load_error = msg.error or "no engine"
            self.chat.set_status("no model loaded")
            self.notify(self.load_error, title="Model load failed", severity="error", timeout=30)
            prompt.placeholder = "no model loaded (see the error); ctrl+o still opens history"
            return
        eng = self.engine = msg.engine
        self.speculation = self.speculation and self.can_draft()
        self.session.target, self.session.draft = eng.target_path, eng.draft_path or ""
        if eng.draft_path:
            note = f"{eng.draft_variant} drafter {os.path.basename(eng.draft_path)}"
        else:
            drafts = "n-gram drafts only" if self.speculation else "plain decoding"
            found = " found next to the target" if self.options.draft is None else ""
            note = f"no drafter{found}: {drafts}"
        status = [os.path.basename(eng.target_path), note]
        if eng.chat_template_note:  # e.g. a model without a chat template gets ChatML
            status.append(eng.chat_template_note.replace(eng.target_path, status[0]))
            self.exit_notes.append(eng.chat_template_note)
        self.chat.set_status("  |  ".join(status))
        self.sub_title = "speculation on" if self.speculation else "speculation off"
        prompt.disabled = False
        prompt.placeholder = (
            "Message (F1: help, /k auto|N, /tree D,K,B, /source S, /temp T, /system ...)"
        )
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
        """Start a reply. The prompt joins the history (and the store) only with its reply."""
        self.chat.add_message("user", text)
        self._reply = self.chat.add_message("assistant", tint=self.tint)
        self.chat.conversation.anchor()
        self._prompt, self._buffer, self._outcome = text, ReplyBuffer(), None
        self.generating, self._stop = True, False
        k = self.k if self.speculation else 0
        request = ReplyRequest(
            messages=self.session.messages_for(text),
            k=k,
            tree=self.draft_tree,
            draft_source=self.draft_source if k != 0 else "none",
            max_tokens=self.options.max_tokens,
            temperature=self.temperature,
            top_k=self.options.top_k,
            top_p=self.options.top_p,
            seed=self.options.seed,
        )
        # the engine starts once the new messages are on screen: laying them out costs the UI
        # thread tens of milliseconds, which would otherwise compete with the first decodes
        self.call_after_refresh(self._start_reply, request, self._buffer)

    def _start_reply(self, request: ReplyRequest, buffer: ReplyBuffer) -> None:
        assert self._frame_timer is not None
        self._budget.start()
        self._frame_timer.resume()
        self.generate(request, buffer)

    def run_command(self, line: str) -> None:
        run_command(self, line)
        self._show_idle_stats()

    def export_conversation(self, conversation_id: int, path: str = "") -> str | None:
        """Write a conversation as Markdown and say where; None (and an error) on failure."""
        try:
            out = self.store.export(
                conversation_id, path or f"localspec-conversation-{conversation_id}.md"
            )
        except HistoryError as exc:
            self.notify(str(exc), title="Export failed", severity="error", timeout=15)
            return None
        self.notify(f"exported to {out}")
        return out

    # --- generation: a thread worker feeding a buffer, drained by a frame timer --------------

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, request: ReplyRequest, buffer: ReplyBuffer) -> None:
        if not self._gate.enter():
            return
        try:
            worker = get_current_worker()
            assert self.engine is not None  # replies start only once a model is loaded
            outcome = stream_reply(
                self.engine,
                request,
                buffer,
                lambda: self._stop or worker.is_cancelled or self._gate.closed,
                lambda: self._snapshot(request.k, request.draft_source),
            )
            self._outcome = outcome  # read by on_unmount when quitting mid-reply
            self.post_message(ReplyEnded(outcome))
        finally:
            self._gate.leave()

    def _mode(self, k: int | str) -> str:
        if k == 0:
            return "plain decoding"
        if self.draft_tree is not None:
            return f"fixed {self.draft_tree}"
        return "auto (cost model)" if k == "auto" else f"fixed chain k={k}"

    def can_draft(self, source: str | None = None) -> bool:
        """Whether the loaded engine has something to draft from for source (default: the
        current one): the n-gram index always, the EAGLE drafter when one is loaded."""
        source = source or self.draft_source
        has_drafter = self.engine is not None and self.engine.draft_path is not None
        return source in ("auto", "ngram") or (source == "eagle" and has_drafter)

    def _source_text(self, k: int | str, source: str) -> str:
        """The draft source as the panel shows it: auto with what it drafts from."""
        if k == 0 or source == "none":
            return "none (plain decoding)"
        if source != "auto":
            return source
        has_drafter = self.engine is not None and self.engine.draft_path is not None
        if k != "auto" or self.draft_tree is not None:  # fixed shapes are the drafter's
            return "auto (eagle: fixed shape)" if has_drafter else "auto (no drafter: plain)"
        return "auto (eagle + ngram)" if has_drafter else "auto (ngram: no drafter)"

    def _snapshot(self, k: int | str, source: str) -> dict[str, Any]:
        """Statistics for the panel; called by the worker between steps, where they are whole."""
        eng = self.engine
        assert eng is not None
        stats = eng.last_stats
        snap = stats.as_dict()
        snap["k"] = k
        snap["mode"] = self._mode(k)
        snap["draft_source"] = source
        snap["source"] = self._source_text(k, source)
        snap["shape"] = stats.shape_summary()
        snap["drafter"] = os.path.basename(eng.draft_path or "") or "none"
        if k and self.last_plain_tps:
            snap["speedup"] = stats.tokens_per_s / self.last_plain_tps
        return snap

    def _frame(self, *, last: bool = False) -> None:
        """Show what the worker produced since the last frame, when the budget allows."""
        if self._buffer is None or not (last or self._budget.ready()):
            return
        self._budget.start()
        pieces, snap = self._buffer.drain()
        if self._reply is not None:
            for text, spans in pieces:
                self._reply.append(text, spans)
            self._reply.flush()
        snap = self._snapshot_due = snap or self._snapshot_due
        now = time.monotonic()
        if snap is not None and (last or now - self._panel_shown >= PANEL_S):
            self._panel_shown, self._snapshot_due = now, None
            self.chat.query_one(StatsPanel).show(snap)

    async def on_reply_ended(self, msg: ReplyEnded) -> None:
        out = msg.outcome
        assert self._frame_timer is not None
        self._frame_timer.pause()
        self._frame(last=True)  # the last pieces
        self._buffer = None
        reply, self._reply = self._reply, None
        if reply is not None:
            await reply.finish()
        if out.error is not None:
            self._reply_failed(reply, out.error)
        else:
            self._reply_done(reply, out)
        self.generating = False

    def _reply_done(self, reply: MessageView | None, out: ReplyOutcome) -> None:
        s = dict(out.snapshot, stopped=out.stopped, finish_reason=out.finish_reason)
        text = reply.text if reply else ""
        self.last_reply = text
        if s["k"] == 0 and s["generated"] > 0:
            self.last_plain_tps = s["tokens_per_s"]
        if reply is not None:
            reply.set_footer(reply_footer(s))
        if out.finish_reason == "context_full":
            self.notify(
                "the context window is full: start a new conversation (ctrl+n)", severity="warning"
            )
        self._report_unsaved(self.session.add_turn(Turn(self._prompt, text, s)))
        self.chat.query_one(StatsPanel).show(s)
        if s["generated"]:
            self.chat.query_one(HistoryChart).add(s["tau"], s["tokens_per_s"])

    def _reply_failed(self, reply: MessageView | None, error: str) -> None:
        if reply is not None:
            reply.show_error(f"generation failed: {error}")
            reply.set_footer("not kept: the next prompt continues from the turn before")
        self.notify(error, title="Generation failed", severity="error", timeout=15)

    def _report_unsaved(self, exc: HistoryError | None) -> bool:
        """Tell the user when the store refused turns (kept in memory; later saves retry)."""
        if exc is not None:
            n = len(self.session.unsaved)
            self.notify(
                f"{exc}. {n} turn{'s' if n > 1 else ''} kept in memory only; saving is retried "
                "with the next reply.",
                title="Chat history",
                severity="error",
                timeout=15,
            )
        return exc is None

    # --- actions -----------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generating:
            self._stop = True

    def action_toggle_tint(self) -> None:
        self.tint = not self.tint
        for view in self.chat.query(MessageView):
            view.set_tint(self.tint)
        self.notify(f"tinted drafts: {legend_markup()}" if self.tint else "tinting off")

    def action_toggle_speculation(self) -> None:
        if self.engine is None:
            return
        if self.draft_source == "none":
            self.notify("draft source none: /source auto|eagle|ngram drafts", severity="warning")
            return
        if not self.can_draft():
            self.notify(
                "no drafter loaded: speculation is off (/source ngram drafts from the context)",
                severity="warning",
            )
            return
        self.speculation = not self.speculation
        self.sub_title = "speculation on" if self.speculation else "speculation off"
        self.notify(f"next reply: {'speculation' if self.speculation else 'plain decoding'}")
        self._show_idle_stats()

    def _leave_conversation(self) -> bool:
        """Before another conversation replaces this one: False while a reply streams."""
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return False
        if not self._report_unsaved(self.session.save()):
            n = len(self.session.unsaved)
            self.notify(f"{n} unsaved turn{'s' if n > 1 else ''} left behind", severity="warning")
        return True

    def action_new_conversation(self) -> None:
        if not self._leave_conversation():
            return
        self.session.reset()
        self.chat.clear_messages()

    def action_open_conversations(self) -> None:
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return
        self.push_screen(ConversationsScreen(self.store), self.open_conversation)

    def open_conversation(self, conversation_id: int | None) -> None:
        if conversation_id is None or not self._leave_conversation():
            return
        try:
            title, messages = self.session.open(conversation_id)
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error", timeout=15)
            return
        self.chat.clear_messages()
        for m in messages:
            view = self.chat.add_message(m.role, m.content, tint=False)
            if m.stats:
                view.footer_text = reply_footer(m.stats)
        self.notify(f"opened: {title}")

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
        source = self.draft_source if k != 0 else "none"
        panel = self.chat.query_one(StatsPanel)
        snap = dict(panel.snapshot) if panel.snapshot else {}
        snap.update(
            k=k,
            mode=self._mode(k),
            draft_source=source,
            source=self._source_text(k, source),
            drafter=os.path.basename(self.engine.draft_path or "") or "none",
        )
        panel.show(snap)

    # --- shutdown ----------------------------------------------------------------------------

    def on_unmount(self) -> None:
        """Quit, even mid-reply: stop the worker and wait for it before the engine closes."""
        self._stop = True
        self._gate.close()  # returns once no worker is inside the engine
        out = self._outcome
        if self.generating and self._reply is not None and out and out.error is None:
            if self._buffer is not None:  # the reply so far is kept, as esc keeps it
                for text, spans in self._buffer.drain()[0]:
                    self._reply.append(text, spans)
            s = dict(out.snapshot, stopped=True, finish_reason=out.finish_reason)
            self.session.add_turn(Turn(self._prompt, self._reply.text, s))
        exc = self.session.save()
        if exc is not None:
            n = len(self.session.unsaved)
            self.exit_notes.append(f"{n} chat turn{'s' if n > 1 else ''} not saved: {exc}")
        engine = self.engine or self._loaded
        if engine is not None:
            engine.close()
        self.store.close()
