"""`localspec chat`: a Textual terminal chat that makes speculation visible.

Attributes flow down, messages flow up: generation runs in a thread worker that streams into a
ReplyBuffer, which the UI drains on a frame timer (a bounded rate, whatever the engine's speed);
the worker posts one ReplyEnded message, and the UI changes only on the UI thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import LoadingIndicator
from textual.worker import get_current_worker

from localspec import LocalspecError, context_use, fit_messages, resolve_target

from . import turn_actions
from .app_messages import (
    Calibrating,
    EngineReady,
    ModelSwitched,
    ReplyEnded,
    ReplyPlan,
    TargetResolved,
    TurnsDropped,
)
from .chat_options import ChatOptions, default_engine_factory
from .commands import run_command
from .frame_budget import FrameBudget
from .generation import ReplyOutcome, ReplyRequest, stream_reply
from .reply_buffer import ReplyBuffer
from .reply_settings import ReplySettings
from .saved_states import SavedStates
from .screens.chat import PANEL_MIN, ChatScreen
from .screens.conversations import ConversationsScreen, OpenRequest
from .screens.help import HelpScreen
from .session import ChatSession
from .settings import ChatSettings
from .store import ChatStore, HistoryError, Turn
from .summaries import reply_footer
from .tint import legend_markup

if TYPE_CHECKING:  # the engine module loads libllama: imported only where it is used
    from localspec import Engine
from .thread_gate import ThreadGate
from .widgets.history_chart import HistoryChart
from .widgets.message import MessageView
from .widgets.prompt_area import PromptArea
from .widgets.stats_panel import StatsPanel

FRAME_S = 1 / 20  # the streaming reply is redrawn at most this often,
UI_SHARE = 0.08  # ...with at most this share of a core for the UI thread,
MAX_GAP_S = 1.0  # ...but at least this often, however costly a redraw
PANEL_S = 0.25  # the side panel is refreshed at most this often while streaming


class LocalspecApp(App[None]):
    CSS_PATH = "localspec.tcss"
    TITLE = "localspec"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+r", "retry", "Retry"),
        Binding("f2", "version(-1)", "◀ Version"),
        Binding("f3", "version(1)", "Version ▶"),
        Binding("ctrl+t", "toggle_tint", "Tint"),
        Binding("ctrl+b", "toggle_speculation", "A/B"),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+o", "open_conversations", "History"),
        Binding("ctrl+y", "copy_last", "Copy", priority=True),  # the prompt's redo otherwise
        Binding("ctrl+g", "copy_code", "Copy code"),
        Binding("f4", "toggle_panel", "Panel"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit"),
    ]
    KEY_HELP = [
        (
            "enter",
            "send the prompt (or run a /command); while a reply streams, the prompt is queued "
            "and sent when the reply ends",
        ),  # fmt: skip
        (
            "ctrl+j",
            "new line in the prompt (shift+enter too, where the terminal reports it); "
            "pasted text keeps its lines",
        ),  # fmt: skip
        (
            "escape",
            "stop the reply in progress, keeping what was produced; queued prompts go back to "
            "the input (or cancel /edit)",
        ),  # fmt: skip
        ("ctrl+r", "retry: regenerate the last reply (the old one stays as a version)"),
        ("f2 / f3", "previous / next version of the last reply"),
        ("ctrl+t", "tint tokens that came from accepted drafts, by source (on/off)"),
        (
            "ctrl+b",
            "speculation off/on for the next reply (live A/B; with ctrl+r, the same "
            "prompt both ways)",
        ),  # fmt: skip
        ("ctrl+n", "new conversation"),
        ("ctrl+o", "saved conversations: open, search (/), rename, delete, export"),
        ("ctrl+y", "copy the last reply"),
        ("ctrl+g", "copy the last code block of the last reply"),
        (
            "f4",
            f"statistics panel on/off (remembered; hidden anyway below {PANEL_MIN} columns)",
        ),  # fmt: skip
        ("f1", "this help"),
        ("ctrl+q", "quit"),
    ]

    # how the next replies are made; commands and ctrl+b replace it, the watcher shows it
    next_reply: reactive[ReplySettings] = reactive(ReplySettings(), init=False)

    def __init__(
        self,
        options: ChatOptions,
        *,
        engine_factory: Callable[[ChatOptions], Engine] = default_engine_factory,
        store: ChatStore | None = None,
        settings: ChatSettings | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.engine_factory = engine_factory
        self.store = store or ChatStore()
        # remembered choices (the panel shown or not), beside the history by default
        self.settings = settings or ChatSettings.beside(self.store.filename)
        self.states = SavedStates(self.store.filename, options.session_cache_bytes)
        self.engine: Engine | None = None
        first = ReplySettings(
            k=options.config.n_draft,
            tree=options.config.tree,
            source=options.config.draft_source,
            speculation=options.config.draft_source != "none",
            temperature=options.temperature,
        )
        self.set_reactive(LocalspecApp.next_reply, first)  # no watcher: nothing is shown yet
        self.session = ChatSession(self.store, system=options.system)
        self.tint = False  # Markdown by default; ctrl+t shows where drafts were accepted
        self.generating = False
        self.switching = False  # another model is loading (/model)
        self.editing: int | None = None  # /edit N: the next prompt replaces turn N-1
        self.queued: list[str] = []  # prompts sent while a reply streams, sent after it
        self.outside = 0  # oldest turns the rolling window left out of the last prompt
        self.last_plain_tps: float | None = None
        self.load_error: str | None = None
        self.exit_notes: list[str] = []  # for stderr once the app has left the terminal
        self._stop = False
        self._gate = ThreadGate()  # the engine is closed only once no worker is inside
        self._loaded: Engine | None = None  # loaded, even if its message never arrives
        self._restore: int | None = None  # a reopened conversation whose KV state is on disk
        self._cached: int | None = None  # the conversation whose history the caches hold
        self._holds = ""  # ...and the prompt text they hold (the branch last replied to)
        self._reply: MessageView | None = None
        self._plan: ReplyPlan | None = None  # the reply in progress
        self._replaced: list[Widget] = []  # views a retry or an edit hides until it is kept
        self._buffer: ReplyBuffer | None = None
        self._outcome: ReplyOutcome | None = None  # set by the worker as it ends
        self._frame_timer: Timer | None = None
        self._budget = FrameBudget(UI_SHARE, FRAME_S, MAX_GAP_S)
        self._panel_shown = 0.0  # monotonic time of the last panel refresh
        self._snapshot_due: dict[str, Any] | None = None  # drained, not yet shown

    # --- start-up and models -----------------------------------------------------------------

    async def on_mount(self) -> None:
        self._chat = ChatScreen(panel=bool(self.settings.get("stats_panel", True)))
        await self.push_screen(self._chat)
        self.chat.set_status(f"loading {self.options.config.target or 'the default model'}...")
        self.chat.conversation.anchor()  # follow the stream until the user scrolls up
        self._frame_timer = self.set_interval(FRAME_S, self._frame, pause=True)
        self.load_engine()

    @property
    def chat(self) -> ChatScreen:
        return self._chat

    @property
    def last_reply(self) -> str:
        """The last turn's reply as shown (the version browsed to)."""
        turns = self.session.turns
        return turns[-1].reply if turns else ""

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
        prompt = self.chat.prompt
        if msg.error or msg.engine is None:
            self.load_error = msg.error or "no engine"
            self.chat.set_status("no model loaded")
            self.notify(self.load_error, title="Model load failed", severity="error", timeout=30)
            prompt.placeholder = "no model loaded: /model PATH|REPO loads one; ctrl+o opens history"
            prompt.disabled = False
            prompt.focus()
            return
        self._use_engine(msg.engine)
        prompt.disabled = False
        prompt.focus()

    def _use_engine(self, eng: Engine) -> None:
        """Make eng the model replies come from: the status line, the panel, the gauge."""
        self.engine = eng
        self.set_reactive(LocalspecApp.next_reply, self.next_reply.for_engine(self._has_drafter))
        self.session.target, self.session.draft = eng.target_path, eng.draft_path or ""
        if eng.draft_path:
            note = f"{eng.draft_variant} drafter {os.path.basename(eng.draft_path)}"
        else:
            drafts = "n-gram drafts only" if self.next_reply.speculation else "plain decoding"
            found = " found next to the target" if self.options.config.draft is None else ""
            note = f"no drafter{found}: {drafts}"
        status = [os.path.basename(eng.target_path), note]
        if eng.chat_template_note:  # e.g. a model without a chat template gets ChatML
            status.append(eng.chat_template_note.replace(eng.target_path, status[0]))
            self.exit_notes.append(eng.chat_template_note)
        self.chat.set_status("  |  ".join(status))
        self.chat.prompt.placeholder = (
            "Message (enter sends, ctrl+j new line; F1: keys and /commands)"
        )
        self.watch_next_reply()
        self.show_gauge()

    def watch_next_reply(self) -> None:
        """Show the settings for the next reply: the subtitle and the idle panel."""
        self.sub_title = "speculation on" if self.next_reply.speculation else "speculation off"
        self._show_idle_stats()

    @property
    def _has_drafter(self) -> bool:
        return self.engine is not None and self.engine.draft_path is not None

    def switch_model(self, spec: str) -> None:
        """/model PATH|REPO: load another target (with the drafter found for it) in the
        background; the current model stays until the new one is ready, and on any error."""
        if self.generating or self.switching:
            self.notify("wait for the reply or the model load in progress", severity="warning")
            return
        self.switching = True
        self.chat.prompt.disabled = True
        self.chat.set_status(f"loading {spec}...")
        config = dataclasses.replace(self.options.config, target=spec, draft=None)
        opts = dataclasses.replace(self.options, config=config)
        # a daemon thread, not a worker: the app waits for its workers when it quits, and a
        # repo id may mean minutes of download
        threading.Thread(target=self._resolve, args=(opts,), daemon=True).start()

    def _resolve(self, opts: ChatOptions) -> None:
        """The target's local path (downloaded when a repo id is not cached), then the load."""
        assert opts.config.target is not None
        try:  # no progress bars: they would draw over the app
            path = resolve_target(opts.config.target, log=lambda line: None, progress=False)
            opts.config = dataclasses.replace(opts.config, target=path)
        except LocalspecError as exc:
            self.post_message(ModelSwitched(None, opts, str(exc)))
            return
        self.post_message(TargetResolved(opts))

    def on_target_resolved(self, msg: TargetResolved) -> None:
        self._load_other(msg.options)

    @work(thread=True, exclusive=True, group="load")
    def _load_other(self, opts: ChatOptions) -> None:
        if not self._gate.enter():
            return
        try:
            engine = self.engine_factory(opts)
        except LocalspecError as exc:
            self.post_message(ModelSwitched(None, opts, str(exc)))
        else:
            self._loaded = engine  # closed on quit even if the message never arrives
            self.post_message(ModelSwitched(engine, opts, None))
        finally:
            self._gate.leave()

    def on_model_switched(self, msg: ModelSwitched) -> None:
        self.switching = False
        self.chat.prompt.disabled = False  # commands work without a model (/model, /search)
        if msg.engine is None:
            self.notify(
                f"{msg.error}. The current model stays.",
                title="Model switch failed",
                severity="error",
                timeout=20,
            )
            if self.engine is not None:
                self._use_engine(self.engine)  # its status line again
            else:
                self.chat.set_status("no model loaded")
            self.chat.prompt.focus()
            return
        old = self.engine
        if old is not None:
            self._save_state(old)
            old.close()
        self.options = msg.options
        self.load_error = None
        self.last_plain_tps = None  # "vs plain" compares replies of the same model
        # the new engine's caches are empty; a reopened conversation's pending restore stays
        # (the saved state is checked against the model files, and a miss is harmless)
        self._cached, self.outside = None, 0
        self._use_engine(msg.engine)
        self.chat.prompt.disabled = False
        self.chat.prompt.focus()
        self.notify(f"model: {os.path.basename(msg.engine.target_path)}")

    # --- prompts and commands ----------------------------------------------------------------

    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        # leading spaces stay: a pasted block of code keeps its first line's indent
        text = event.value.rstrip().lstrip("\n")
        if not text.strip():
            return
        if text.strip().startswith("/") and "\n" not in text:
            self.run_command(text.strip())
            return
        if self.generating and not self.switching:
            self.queue(text)
            return
        if self.engine is None or self.switching:
            event.area.restore(event.value)  # kept for when a model is loaded
            why = (
                "no model loaded: /model PATH|REPO loads one"
                if self.engine is None and not self.switching
                else "a model load is in progress"
            )
            self.notify(why, severity="warning")
            return
        self.send(text)

    def queue(self, text: str) -> None:
        """A prompt sent while a reply streams waits for it, shown under the conversation (as
        Ollama does): never joined to the reply's prompt or to another one."""
        self.queued.append(text)
        self.chat.show_queued(self.queued)

    def unqueue(self, why: str) -> None:
        """Give the queued prompts back to the input (ahead of anything typed since)."""
        if not self.queued:
            return
        texts, self.queued = self.queued, []
        self.chat.show_queued([])
        self.chat.prompt.restore("\n\n".join(texts))
        self.chat.prompt.focus()
        n = len(texts)
        self.notify(f"{why}: {'the queued prompt is' if n == 1 else f'{n} queued prompts are'} "
                    "back in the input")  # fmt: skip

    def send(self, text: str) -> None:
        """Start a reply. The prompt joins the history (and the store) only with its reply."""
        index = self.editing
        self.end_edit()
        if index is not None and index < len(self.session.turns):
            self.start_reply(ReplyPlan("edit", text, index))
            return
        if index is not None:  # the turn went (another branch is shown): nothing to replace
            self.notify("the edited turn is no longer shown: sent as a new turn")
        self.start_reply(ReplyPlan("new", text, len(self.session.turns)))

    def end_edit(self) -> None:
        """No turn is being edited any more (sent, cancelled, or the conversation changed)."""
        self.editing = None
        self.chat.prompt.border_title = None

    def retry(self) -> None:
        """Regenerate the last reply: the old one stays as a version (f2/f3 browse them)."""
        if self.engine is None or self.generating or self.switching:
            self.notify("nothing to retry now", severity="warning")
            return
        turns = self.session.turns
        if not turns:
            self.notify("no reply to retry yet", severity="warning")
            return
        self.start_reply(ReplyPlan("retry", turns[-1].prompt, len(turns) - 1))

    def start_reply(self, plan: ReplyPlan) -> None:
        """Show the prompt and an empty reply (hiding what a retry or an edit replaces), then
        start the engine."""
        if plan.kind == "retry":
            self._replaced = list(self.chat.messages_from(plan.index, "assistant"))
        elif plan.kind == "edit":
            self._replaced = self.chat.views_from(plan.index)
        for view in self._replaced:
            view.display = False
        if plan.kind != "retry":
            self.chat.add_message("user", plan.prompt).turn = plan.index
        self._reply = self.chat.add_message("assistant", tint=self.tint)
        self._reply.turn = plan.index
        self.chat.conversation.anchor()
        self._plan, self._buffer, self._outcome = plan, ReplyBuffer(), None
        self.generating, self._stop = True, False
        settings = self.next_reply  # this reply's, whatever a command changes meanwhile
        cid, self._restore = self._restore, None
        request = ReplyRequest(
            messages=self.session.messages_for(plan.prompt, upto=plan.index),
            k=settings.n_draft,
            tree=settings.tree,
            draft_source=settings.draft_source,
            max_tokens=self.options.max_tokens,
            temperature=settings.temperature,
            top_k=self.options.top_k,
            top_p=self.options.top_p,
            seed=self.options.seed,
            overflow=self.options.context_overflow,
            restore=self._restorer(cid),
        )
        # the engine starts once the new messages are on screen: laying them out costs the UI
        # thread tens of milliseconds, which would otherwise compete with the first decodes
        self.call_after_refresh(self._start_reply, request, settings, self._buffer)

    def _restorer(self, conversation_id: int | None) -> Callable[[str], int] | None:
        """Restores the reopened conversation's saved state when it pays for the prompt."""
        if conversation_id is None or self.engine is None:
            return None
        engine, states = self.engine, self.states
        return lambda prompt: states.restore(engine, conversation_id, prompt)

    def _start_reply(
        self, request: ReplyRequest, settings: ReplySettings, buffer: ReplyBuffer
    ) -> None:
        assert self._frame_timer is not None
        self._budget.start()
        self._frame_timer.resume()
        self.generate(request, settings, buffer)

    def run_command(self, line: str) -> None:
        run_command(self, line)
        self._show_idle_stats()
        self.show_gauge()  # /system changes its share

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

    def forget_conversation(self, conversation_id: int) -> None:
        """A deleted conversation: its saved KV state goes too."""
        self.states.drop(conversation_id)
        if conversation_id == self.session.conversation_id:
            self._conversation_changed()
            self.session.reset()
            self.chat.clear_messages()
            self.show_gauge()

    # --- generation: a thread worker feeding a buffer, drained by a frame timer --------------

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, request: ReplyRequest, settings: ReplySettings, buffer: ReplyBuffer) -> None:
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
                lambda: self._snapshot(settings),
                lambda n: self.post_message(TurnsDropped(n)),
                lambda fraction: self.post_message(Calibrating(fraction)),
            )
            self._outcome = outcome  # read by on_unmount when quitting mid-reply
            self.post_message(ReplyEnded(outcome))
        finally:
            self._gate.leave()

    def can_draft(self, source: str | None = None) -> bool:
        """Whether the loaded engine has something to draft from for source (default: the
        current one): the n-gram index always, the EAGLE drafter when one is loaded."""
        return self.next_reply.can_draft(self._has_drafter, source)

    def _snapshot(self, settings: ReplySettings) -> dict[str, Any]:
        """Statistics for the panel; called by the worker between steps, where they are whole."""
        eng = self.engine
        assert eng is not None
        stats = eng.last_stats
        snap = stats.as_dict()
        k = snap["k"] = settings.n_draft
        snap["mode"] = settings.mode_text()
        snap["draft_source"] = settings.draft_source
        snap["source"] = settings.source_text(eng.draft_path is not None)
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

    def on_calibrating(self, msg: Calibrating) -> None:
        """The first auto reply times the machine first (tens of seconds on a CPU): the empty
        reply says so, with the progress, instead of waiting silently."""
        if self._reply is None:
            return
        if msg.fraction is None:
            self._reply.set_footer("")
        else:
            self._reply.set_footer(f"timing this machine (once)… {100 * msg.fraction:.0f}%")

    def on_turns_dropped(self, msg: TurnsDropped) -> None:
        """One line where turns left the window; later prompts that leave out the same turns
        (the window moves in steps) say nothing more."""
        new, self.outside = msg.n - self.outside, msg.n
        if new <= 0:
            return
        s = "s" if new > 1 else ""
        total = f" ({msg.n} in all)" if new != msg.n else ""
        first = self.chat.messages_from(self._plan.index, "user")[-1:] if self._plan else []
        self.chat.add_notice(
            f"{new} oldest turn{s} left the context window{total} (rolling): the model no "
            "longer sees them; they stay here and in history",
            before=first[0] if first else None,
        )

    async def on_reply_ended(self, msg: ReplyEnded) -> None:
        out = msg.outcome
        assert self._frame_timer is not None
        self._frame_timer.pause()
        self._frame(last=True)  # the last pieces
        self._buffer = None
        reply, self._reply = self._reply, None
        plan, self._plan = self._plan, None
        if reply is not None:
            await reply.finish()
        if out.error is not None:
            self._reply_failed(plan, reply, out.error)
        else:
            self._reply_done(plan, reply, out)
        self.generating = False
        if not self.queued:
            return
        if out.error is not None:  # the user reads the error first
            self.unqueue("the reply failed")
            return
        text = self.queued.pop(0)  # the rest wait for this one's reply
        self.chat.show_queued(self.queued)
        self.send(text)

    def _keep(self, plan: ReplyPlan | None, text: str, s: dict[str, Any]) -> HistoryError | None:
        """Record a finished (or stopped) reply as its plan says; a reply is never dropped:
        when what it would replace is gone, it becomes a new turn."""
        if plan is None:
            return None
        turn = Turn(plan.prompt, text, s)
        try:
            if plan.kind == "retry":
                return self.session.add_version(text, s)
            if plan.kind == "edit":
                return self.session.replace_turn(plan.index, turn)
        except HistoryError as exc:
            self.notify(f"{exc}: the reply is kept as a new turn", severity="warning")
            for view in self._replaced:  # they still show turns of the conversation
                view.display = True
            self._replaced = []
            error = self.session.add_turn(turn)
            self.chat.show_turns(self.session.turns)
            return error
        return self.session.add_turn(turn)

    def _reply_done(self, plan: ReplyPlan | None, reply: MessageView | None,
                    out: ReplyOutcome) -> None:  # fmt: skip
        s = dict(out.snapshot, stopped=out.stopped, finish_reason=out.finish_reason)
        text = reply.text if reply else ""
        if s["k"] == 0 and s["generated"] > 0:
            self.last_plain_tps = s["tokens_per_s"]
        if out.finish_reason == "context_full":
            hint = (
                "the next prompt drops the oldest turns (rolling window)"
                if self.options.context_overflow == "rolling"
                else "start a new conversation (ctrl+n)"
            )
            self.notify(f"the context window is full: {hint}", severity="warning")
        self._report_unsaved(self._keep(plan, text, s))
        self._cached = self.session.conversation_id  # the caches hold this conversation now
        self._holds = out.prompt + text
        self.outside = s.get("dropped_turns", 0)
        for view in self._replaced:
            view.remove()
        self._replaced = []
        if plan is not None:
            for i in (plan.index - 1, plan.index):  # the turn before is no longer the last
                self.chat.set_footers(self.session.turns, i)
        elif reply is not None:
            reply.set_footer(reply_footer(s))
        self.show_gauge()
        self.chat.query_one(StatsPanel).show(s)
        if s["generated"]:
            self.chat.query_one(HistoryChart).add(s["tau"], s["tokens_per_s"])

    def _reply_failed(self, plan: ReplyPlan | None, reply: MessageView | None,
                      error: str) -> None:  # fmt: skip
        if plan is not None and plan.kind != "new":  # what it would replace comes back
            for view in self.chat.views_from(plan.index):
                if view not in self._replaced:
                    view.remove()
            for view in self._replaced:
                view.display = True
            self._replaced = []
            self._cached, self._holds = None, ""  # a failed step empties the caches
            self.notify(f"{error}. Nothing was replaced.", title=f"{plan.kind.title()} failed",
                        severity="error", timeout=15)  # fmt: skip
            return
        self._cached, self._holds = None, ""  # a failed step empties the caches
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
            # stopping means "not this": what waited is the user's to send again, or not
            self.unqueue("stopped")
        elif self.editing is not None:
            turn_actions.cancel_edit(self)

    def action_retry(self) -> None:
        self.retry()

    def action_version(self, step: int) -> None:
        turn_actions.step_version(self, step)

    def action_toggle_tint(self) -> None:
        self.tint = not self.tint
        for view in self.chat.query(MessageView):
            view.set_tint(self.tint)
        self.notify(f"tinted drafts: {legend_markup()}" if self.tint else "tinting off")

    def action_toggle_speculation(self) -> None:
        if self.engine is None:
            return
        if self.next_reply.source == "none":
            self.notify("draft source none: /source auto|eagle|ngram drafts", severity="warning")
            return
        if not self.can_draft():
            self.notify(
                "no drafter loaded: speculation is off (/source ngram drafts from the context)",
                severity="warning",
            )
            return
        self.next_reply = self.next_reply.toggled()  # the watcher shows it
        on = self.next_reply.speculation
        self.notify(f"next reply: {'speculation' if on else 'plain decoding'}")

    def _save_state(self, engine: Engine | None = None) -> None:
        """Keep the current conversation's KV state on disk for when it reopens: the state of
        the branch on screen (the caches may hold another one, after /branch or f2/f3)."""
        engine = engine or self.engine
        cid = self.session.conversation_id
        # only what the caches hold: a conversation opened but not replied to yet still has
        # its saved state on disk, and the caches another conversation's history
        if engine is not None and cid is not None and self._cached == cid and not self._restore:
            why = self.states.save(engine, cid, self._holds, self._branch_text(engine))
            if why:  # the conversation is safe; only its next reopening will be slower
                self.exit_notes.append(why)
                self.notify(why, severity="warning")

    def _branch_text(self, engine: Engine) -> str:
        """The branch on screen as the next prompt would send it (the prompt text up to the
        new message); empty when the chat template cannot format it."""
        system = [{"role": "system", "content": self.session.system}] if self.session.system else []
        messages = [*system, *self.session.history, {"role": "user", "content": ""}]
        with contextlib.suppress(LocalspecError):  # not even the last turn fits: compared whole
            messages = fit_messages(engine, messages, max_tokens=self.options.max_tokens,
                                    policy=self.options.context_overflow).messages  # fmt: skip
        try:
            return engine.format_chat(messages)[0]
        except LocalspecError:
            return ""

    def _leave_conversation(self) -> bool:
        """Before another conversation replaces this one: False while a reply streams."""
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return False
        if not self._report_unsaved(self.session.save()):
            n = len(self.session.unsaved)
            self.notify(f"{n} unsaved turn{'s' if n > 1 else ''} left behind", severity="warning")
        self._save_state()
        self._conversation_changed()
        return True

    def _conversation_changed(self) -> None:
        """What belonged to the conversation shown: its edit, its window, its restore."""
        self.outside, self._restore = 0, None
        self.end_edit()

    def action_new_conversation(self) -> None:
        if not self._leave_conversation():
            return
        self.session.reset()
        self.chat.clear_messages()
        self.show_gauge()

    def action_open_conversations(self) -> None:
        self.open_history()

    def open_history(self, query: str = "") -> None:
        """The saved conversations (ctrl+o), or the search hits for query (/search)."""
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return
        self.push_screen(ConversationsScreen(self.store, query), self.open_conversation)

    def open_conversation(self, req: OpenRequest | None) -> None:
        if req is None or not self._leave_conversation():
            return
        try:
            title, turns, at = self.session.open(req.conversation_id, req.message_id)
        except HistoryError as exc:
            self.notify(str(exc), title="Chat history", severity="error", timeout=15)
            return
        self.chat.show_turns(turns)
        # its KV state is restored before the next reply, unless the caches hold it already
        self._restore = None if self._cached == req.conversation_id else req.conversation_id
        if at is not None:
            self.chat.reveal(at)
        self.notify(f"opened: {title}")
        self.show_gauge()

    def action_toggle_panel(self) -> None:
        """f4: the statistics panel on or off, remembered for the next runs."""
        chat = self.chat
        chat.panel_wanted = not chat.panel_wanted
        chat.fit_panel()
        if not chat.panel_wanted:
            self.notify("statistics panel off (f4 shows it)")
        elif chat.panel_shown:
            self.notify("statistics panel on")
        else:
            self.notify(f"statistics panel on, but hidden while the terminal is narrower than "
                        f"{PANEL_MIN} columns")  # fmt: skip
        why = self.settings.set("stats_panel", chat.panel_wanted)
        if why is not None:
            self.notify(why, severity="warning")

    def action_copy_last(self) -> None:
        if self.last_reply:
            turn_actions.copy(self, self.last_reply, "last reply")

    def action_copy_code(self) -> None:
        turn_actions.copy_code(self)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.KEY_HELP))

    def _show_idle_stats(self) -> None:
        if self.engine is None:
            return
        settings = self.next_reply
        panel = self.chat.query_one(StatsPanel)
        snap = dict(panel.snapshot) if panel.snapshot else {}
        snap.update(
            k=settings.n_draft,
            mode=settings.mode_text(),
            draft_source=settings.draft_source,
            source=settings.source_text(self._has_drafter),
            drafter=os.path.basename(self.engine.draft_path or "") or "none",
        )
        panel.show(snap)

    def show_gauge(self) -> None:
        """The gauge for the conversation as the next prompt would send it: under the rolling
        policy, without the turns that would leave the window."""
        eng = self.engine
        if eng is None:
            return
        system = [{"role": "system", "content": self.session.system}] if self.session.system else []
        messages = system + self.session.history
        if not messages:
            self.chat.gauge.show(0, eng.n_ctx, 0)
            return
        try:
            fitted = fit_messages(eng, messages, max_tokens=self.options.max_tokens,
                                  policy=self.options.context_overflow)  # fmt: skip
            use, outside = fitted.use, fitted.dropped_turns
        except LocalspecError:
            try:  # not even the last turn fits: count it all
                use, outside = context_use(eng, messages), 0
            except LocalspecError:  # a template that cannot format this yet (no user turn)
                self.chat.gauge.show(0, eng.n_ctx, 0)
                return
        self.chat.gauge.show(use.used, use.n_ctx, use.system, outside=outside)

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
            self._keep(self._plan, self._reply.text, s)
            self._cached = self.session.conversation_id
            self._holds = out.prompt + self._reply.text
        exc = self.session.save()
        if exc is not None:
            n = len(self.session.unsaved)
            self.exit_notes.append(f"{n} chat turn{'s' if n > 1 else ''} not saved: {exc}")
        self._save_state()  # a stopped reply leaves a cache the next call can use too
        for engine in {id(e): e for e in (self.engine, self._loaded) if e is not None}.values():
            engine.close()
        self.store.close()
