"""`localspec chat`: a Textual terminal chat that makes speculation visible.

The app routes: keys, prompts and commands in; models loaded and switched; conversations
opened, left and started. Its jobs live beside it: the settings of the next replies
(reply_settings.py, one reactive value), the replies themselves (replies.py: streamed by a
thread worker into a ReplyBuffer that a frame timer drains, kept when the worker posts
ReplyEnded), and what outlives the run (persistence.py: the store, remembered choices, saved
KV states). Attributes flow down, messages flow up; the UI changes only on the UI thread.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive
from textual.widgets import LoadingIndicator

from localspec import LocalspecError, context_use, fit_messages, resolve_target

from . import turn_actions
from .app_messages import (
    Calibrating,
    EngineReady,
    ModelSwitched,
    ReplyEnded,
    TargetResolved,
    TurnsDropped,
)
from .chat_options import ChatOptions, default_engine_factory
from .commands import run_command
from .persistence import Persistence
from .replies import ReplyController
from .reply_settings import ReplySettings
from .screens.chat import PANEL_MIN, ChatScreen
from .screens.conversations import ConversationsScreen, OpenRequest
from .screens.help import HelpScreen
from .session import ChatSession
from .settings import ChatSettings
from .store import ChatStore, HistoryError
from .tint import legend_markup

if TYPE_CHECKING:  # the engine module loads libllama: imported only where it is used
    from localspec import Engine
from .thread_gate import ThreadGate
from .widgets.message import MessageView
from .widgets.prompt_area import PromptArea
from .widgets.stats_panel import StatsPanel


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
        # the conversations, remembered choices, saved KV states, and what the caches hold
        self.memory = Persistence(
            store or ChatStore(),
            system=options.system,
            settings=settings,
            states_bytes=options.session_cache_bytes,
        )
        self.engine: Engine | None = None
        first = ReplySettings(
            k=options.config.n_draft,
            tree=options.config.tree,
            source=options.config.draft_source,
            speculation=options.config.draft_source != "none",
            temperature=options.temperature,
        )
        self.set_reactive(LocalspecApp.next_reply, first)  # no watcher: nothing is shown yet
        self.tint = False  # Markdown by default; ctrl+t shows where drafts were accepted
        self.switching = False  # another model is loading (/model)
        self.editing: int | None = None  # /edit N: the next prompt replaces turn N-1
        self.load_error: str | None = None
        self.exit_notes: list[str] = []  # for stderr once the app has left the terminal
        self._gate = ThreadGate()  # the engine is closed only once no worker is inside
        self._loaded: Engine | None = None  # loaded, even if its message never arrives
        self.replies = ReplyController(self, self._gate)  # the reply streaming, and its queue

    # --- start-up and models -----------------------------------------------------------------

    async def on_mount(self) -> None:
        self._chat = ChatScreen(panel=bool(self.memory.settings.get("stats_panel", True)))
        await self.push_screen(self._chat)
        self.chat.set_status(f"loading {self.options.config.target or 'the default model'}...")
        self.chat.conversation.anchor()  # follow the stream until the user scrolls up
        self.replies.mounted()
        self.load_engine()

    @property
    def chat(self) -> ChatScreen:
        return self._chat

    @property
    def session(self) -> ChatSession:
        return self.memory.session

    @property
    def store(self) -> ChatStore:
        return self.memory.store

    @property
    def generating(self) -> bool:
        """A reply streams."""
        return self.replies.generating

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
        for sampling_note in eng.sampling_notes.values():  # the model's, left out
            self.notify(sampling_note, severity="warning")
        if eng.chat_template_note:  # e.g. a model without a chat template gets ChatML
            status.append(eng.chat_template_note.replace(eng.target_path, status[0]))
            self.exit_notes.append(eng.chat_template_note)
        self.chat.set_status("  |  ".join(status))
        self.chat.prompt.placeholder = (
            "Message (enter sends, ctrl+j new line; F1: keys and /commands)"
        )
        self._show_settings()
        self.show_gauge()

    def watch_next_reply(self, old: ReplySettings, new: ReplySettings) -> None:
        """Show the settings for the next reply: the subtitle (once a model is loaded, or when
        /source or ctrl+b changed it) and the idle panel."""
        if self.engine is not None or (old.source, old.speculation) != (
            new.source,
            new.speculation,
        ):
            self._show_settings()

    def _show_settings(self) -> None:
        self.sub_title = "speculation on" if self.next_reply.speculation else "speculation off"
        self._show_idle_stats()

    @property
    def _has_drafter(self) -> str:
        """The loaded engine's model drafter: "eagle", "mtp" (the target's own head) or ""."""
        if self.engine is None or not self.engine.drafting.has_drafter:
            return ""
        return self.engine.drafting.drafter_kind

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
        self.replies.model_changed()
        # the new engine's caches are empty; a reopened conversation's pending restore stays
        # (the saved state is checked against the model files, and a miss is harmless)
        self.memory.caches_lost()
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
            self.replies.queue(text)
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
        self.replies.send(text)

    def end_edit(self) -> None:
        """No turn is being edited any more (sent, cancelled, or the conversation changed)."""
        self.editing = None
        self.chat.prompt.border_title = None

    def retry(self) -> None:
        self.replies.retry()

    def run_command(self, line: str) -> None:
        run_command(self, line)
        self._show_idle_stats()
        self.show_gauge()  # /system changes its share

    def export_conversation(self, conversation_id: int, path: str = "") -> str | None:
        """Write a conversation as Markdown and say where; None (and an error) on failure."""
        try:
            out = self.memory.export(conversation_id, path)
        except HistoryError as exc:
            self.notify(str(exc), title="Export failed", severity="error", timeout=15)
            return None
        self.notify(f"exported to {out}")
        return out

    def forget_conversation(self, conversation_id: int) -> None:
        """A deleted conversation: its saved KV state goes too."""
        self.memory.forget(conversation_id)
        if conversation_id == self.session.conversation_id:
            self._conversation_changed()
            self.session.reset()
            self.chat.clear_messages()
            self.show_gauge()

    # --- the reply's messages, for the reply controller -----------------------------------

    async def on_reply_ended(self, msg: ReplyEnded) -> None:
        await self.replies.ended(msg.outcome)

    def on_calibrating(self, msg: Calibrating) -> None:
        self.replies.calibrating(msg.fraction)

    def on_turns_dropped(self, msg: TurnsDropped) -> None:
        self.replies.turns_dropped(msg.n)

    def can_draft(self, source: str | None = None) -> bool:
        """Whether the loaded engine has something to draft from for source (default: the
        current one): the n-gram index always, the EAGLE drafter when one is loaded."""
        return self.next_reply.can_draft(self._has_drafter, source)

    def report_unsaved(self, exc: HistoryError | None) -> bool:
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
            self.replies.stop()
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
        """Keep the current conversation's KV state on disk for when it reopens."""
        opts = self.options
        why = self.memory.save_state(engine or self.engine, opts.max_tokens, opts.context_overflow)
        if why:  # the conversation is safe; only its next reopening will be slower
            self.exit_notes.append(why)
            self.notify(why, severity="warning")

    def _leave_conversation(self) -> bool:
        """Before another conversation replaces this one: False while a reply streams."""
        if self.generating:
            self.notify("stop the reply first (esc)", severity="warning")
            return False
        if not self.report_unsaved(self.session.save()):
            n = len(self.session.unsaved)
            self.notify(f"{n} unsaved turn{'s' if n > 1 else ''} left behind", severity="warning")
        self._save_state()
        self._conversation_changed()
        return True

    def _conversation_changed(self) -> None:
        """What belonged to the conversation shown: its edit, its window, its restore."""
        self.replies.outside, self.memory.restore = 0, None
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
        self.memory.opened(req.conversation_id)
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
        why = self.memory.remember("stats_panel", chat.panel_wanted)
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
        self.replies.halt()
        self._gate.close()  # returns once no worker is inside the engine
        self.replies.quit()  # the reply so far is kept, as esc keeps it
        exc = self.memory.save_turns()  # the last try for turns the store refused
        if exc is not None:
            n = len(self.session.unsaved)
            self.exit_notes.append(f"{n} chat turn{'s' if n > 1 else ''} not saved: {exc}")
        self._save_state()  # a stopped reply leaves a cache the next call can use too
        for engine in {id(e): e for e in (self.engine, self._loaded) if e is not None}.values():
            engine.close()
        self.memory.close()
