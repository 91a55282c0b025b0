"""The replies, one at a time, from the prompt sent to the turn kept: the reply controller.

A reply starts from a ReplyPlan (a new turn, a retry, an edit): the prompt and an empty reply
show at once (what a retry or an edit replaces is hidden, not removed), then a worker thread
streams the engine's reply into a ReplyBuffer that a frame timer drains at the UI's pace
(FrameBudget). When the worker ends, the reply is kept as the plan says (session.py keeps the
store in agreement), or, when it failed, what it would replace comes back. Prompts sent while a
reply streams wait in a queue, each sent when the one before has its reply.

The app routes its messages here (ReplyEnded, Calibrating, TurnsDropped) and reads
`generating`; nothing here loads models or opens conversations."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from textual.worker import get_current_worker

from .app_messages import Calibrating, ReplyEnded, ReplyPlan, TurnsDropped
from .frame_budget import FrameBudget
from .generation import ReplyOutcome, ReplyRequest, stream_reply
from .reply_buffer import ReplyBuffer
from .store import HistoryError, Turn
from .summaries import reply_footer
from .widgets.history_chart import HistoryChart
from .widgets.stats_panel import StatsPanel

if TYPE_CHECKING:
    from textual.timer import Timer
    from textual.widget import Widget

    from .host import ReplyHost
    from .reply_settings import ReplySettings
    from .thread_gate import ThreadGate
    from .widgets.message import MessageView

FRAME_S = 1 / 20  # the streaming reply is redrawn at most this often,
UI_SHARE = 0.08  # ...with at most this share of a core for the UI thread,
MAX_GAP_S = 1.0  # ...but at least this often, however costly a redraw
PANEL_S = 0.25  # the side panel is refreshed at most this often while streaming


class ReplyController:
    def __init__(self, app: ReplyHost, gate: ThreadGate) -> None:
        self.app = app
        self._gate = gate  # the engine is closed only once no worker is inside
        self.generating = False
        self.queued: list[str] = []  # prompts sent while a reply streams, sent after it
        self.outside = 0  # oldest turns the rolling window left out of the last prompt
        self.last_plain_tps: float | None = None  # "vs plain" on the panel
        self._stop = False
        self._plan: ReplyPlan | None = None  # the reply in progress
        self._view: MessageView | None = None  # ...as shown
        self._replaced: list[Widget] = []  # views a retry or an edit hides until it is kept
        self._buffer: ReplyBuffer | None = None
        self._outcome: ReplyOutcome | None = None  # set by the worker as it ends
        self._frame_timer: Timer | None = None
        self._budget = FrameBudget(UI_SHARE, FRAME_S, MAX_GAP_S)
        self._panel_shown = 0.0  # monotonic time of the last panel refresh
        self._snapshot_due: dict[str, Any] | None = None  # drained, not yet shown

    def mounted(self) -> None:
        """The screen is up: the frame timer exists (paused until a reply streams)."""
        self._frame_timer = self.app.set_interval(FRAME_S, self.frame, pause=True)

    def model_changed(self) -> None:
        """Another model answers from now on: "vs plain" compares replies of the same model,
        and its empty caches hold no window."""
        self.last_plain_tps, self.outside = None, 0

    # --- sending ------------------------------------------------------------------------------

    def send(self, text: str) -> None:
        """Start a reply. The prompt joins the history (and the store) only with its reply."""
        app = self.app
        index = app.editing
        app.end_edit()
        if index is not None and index < len(app.session.turns):
            self.start(ReplyPlan("edit", text, index))
            return
        if index is not None:  # the turn went (another branch is shown): nothing to replace
            app.notify("the edited turn is no longer shown: sent as a new turn")
        self.start(ReplyPlan("new", text, len(app.session.turns)))

    def retry(self) -> None:
        """Regenerate the last reply: the old one stays as a version (f2/f3 browse them)."""
        app = self.app
        if app.engine is None or self.generating or app.switching:
            app.notify("nothing to retry now", severity="warning")
            return
        turns = app.session.turns
        if not turns:
            app.notify("no reply to retry yet", severity="warning")
            return
        self.start(ReplyPlan("retry", turns[-1].prompt, len(turns) - 1))

    def queue(self, text: str) -> None:
        """A prompt sent while a reply streams waits for it, shown under the conversation (as
        Ollama does): never joined to the reply's prompt or to another one."""
        self.queued.append(text)
        self.app.chat.show_queued(self.queued)

    def unqueue(self, why: str) -> None:
        """Give the queued prompts back to the input (ahead of anything typed since)."""
        if not self.queued:
            return
        chat = self.app.chat
        texts, self.queued = self.queued, []
        chat.show_queued([])
        chat.prompt.restore("\n\n".join(texts))
        chat.prompt.focus()
        n = len(texts)
        self.app.notify(f"{why}: {'the queued prompt is' if n == 1 else f'{n} queued prompts are'}"
                        " back in the input")  # fmt: skip

    def stop(self) -> None:
        """esc: the reply stops, keeping what was produced; what waited is the user's to send
        again, or not."""
        self.halt()
        self.unqueue("stopped")

    def halt(self) -> None:
        """The worker stops at its next step (it still reports how the reply ended)."""
        self._stop = True

    # --- streaming ----------------------------------------------------------------------------

    def start(self, plan: ReplyPlan) -> None:
        """Show the prompt and an empty reply (hiding what a retry or an edit replaces), then
        start the engine."""
        app, chat = self.app, self.app.chat
        if plan.kind == "retry":
            self._replaced = list(chat.messages_from(plan.index, "assistant"))
        elif plan.kind == "edit":
            self._replaced = chat.views_from(plan.index)
        for view in self._replaced:
            view.display = False
        if plan.kind != "retry":
            chat.add_message("user", plan.prompt).turn = plan.index
        self._view = chat.add_message("assistant", tint=app.tint)
        self._view.turn = plan.index
        chat.conversation.anchor()
        self._plan, self._buffer, self._outcome = plan, ReplyBuffer(), None
        self.generating, self._stop = True, False
        settings = app.next_reply  # this reply's, whatever a command changes meanwhile
        opts = app.options
        request = ReplyRequest(
            messages=app.session.messages_for(plan.prompt, upto=plan.index),
            k=settings.n_draft,
            tree=settings.tree,
            draft_source=settings.draft_source,
            max_tokens=opts.max_tokens,
            temperature=settings.temperature,
            top_k=opts.top_k,
            top_p=opts.top_p,
            seed=opts.seed,
            overflow=opts.context_overflow,
            restore=app.memory.take_restorer(app.engine),
        )
        # the engine starts once the new messages are on screen: laying them out costs the UI
        # thread tens of milliseconds, which would otherwise compete with the first decodes
        app.call_after_refresh(self._run, request, settings, self._buffer)

    def _run(self, request: ReplyRequest, settings: ReplySettings, buffer: ReplyBuffer) -> None:
        assert self._frame_timer is not None
        self._budget.start()
        self._frame_timer.resume()
        self.app.run_worker(
            lambda: self._work(request, settings, buffer),
            thread=True,
            exclusive=True,
            group="generate",
        )

    def _work(self, request: ReplyRequest, settings: ReplySettings, buffer: ReplyBuffer) -> None:
        """The worker thread: the reply streamed into buffer."""
        if not self._gate.enter():
            return
        app = self.app
        try:
            worker = get_current_worker()
            assert app.engine is not None  # replies start only once a model is loaded
            outcome = stream_reply(
                app.engine,
                request,
                buffer,
                lambda: self._stop or worker.is_cancelled or self._gate.closed,
                lambda: self._snapshot(settings),
                lambda n: app.post_message(TurnsDropped(n)),
                lambda fraction: app.post_message(Calibrating(fraction)),
            )
            self._outcome = outcome  # read by quit() when quitting mid-reply
            app.post_message(ReplyEnded(outcome))
        finally:
            self._gate.leave()

    def _snapshot(self, settings: ReplySettings) -> dict[str, Any]:
        """Statistics for the panel; called by the worker between steps, where they are whole."""
        eng = self.app.engine
        assert eng is not None
        stats = eng.last_stats
        snap = stats.as_dict()
        k = snap["k"] = settings.n_draft
        snap["mode"] = settings.mode_text()
        snap["draft_source"] = settings.draft_source
        kind = eng.drafting.drafter_kind if eng.drafting.has_drafter else ""
        snap["source"] = settings.source_text(kind)
        snap["shape"] = stats.shape_summary()
        snap["drafter"] = (
            "the target's MTP head" if kind == "mtp" else os.path.basename(eng.draft_path or "")
        ) or "none"
        if k and self.last_plain_tps:
            snap["speedup"] = stats.tokens_per_s / self.last_plain_tps
        return snap

    def frame(self, *, last: bool = False) -> None:
        """Show what the worker produced since the last frame, when the budget allows."""
        if self._buffer is None or not (last or self._budget.ready()):
            return
        self._budget.start()
        pieces, snap = self._buffer.drain()
        if self._view is not None:
            for text, spans in pieces:
                self._view.append(text, spans)
            self._view.flush()
        snap = self._snapshot_due = snap or self._snapshot_due
        now = time.monotonic()
        if snap is not None and (last or now - self._panel_shown >= PANEL_S):
            self._panel_shown, self._snapshot_due = now, None
            self.app.chat.query_one(StatsPanel).show(snap)

    def calibrating(self, fraction: float | None) -> None:
        """The first auto reply times the machine first (tens of seconds on a CPU): the empty
        reply says so, with the progress, instead of waiting silently."""
        if self._view is None:
            return
        if fraction is None:
            self._view.set_footer("")
        else:
            self._view.set_footer(f"timing this machine (once)… {100 * fraction:.0f}%")

    def turns_dropped(self, n: int) -> None:
        """One line where turns left the window; later prompts that leave out the same turns
        (the window moves in steps) say nothing more."""
        new, self.outside = n - self.outside, n
        if new <= 0:
            return
        chat = self.app.chat
        s = "s" if new > 1 else ""
        total = f" ({n} in all)" if new != n else ""
        first = chat.messages_from(self._plan.index, "user")[-1:] if self._plan else []
        chat.add_notice(
            f"{new} oldest turn{s} left the context window{total} (rolling): the model no "
            "longer sees them; they stay here and in history",
            before=first[0] if first else None,
        )

    # --- the end of a reply -------------------------------------------------------------------

    async def ended(self, out: ReplyOutcome) -> None:
        assert self._frame_timer is not None
        self._frame_timer.pause()
        self.frame(last=True)  # the last pieces
        self._buffer = None
        view, self._view = self._view, None
        plan, self._plan = self._plan, None
        if view is not None:
            await view.finish()
        if out.error is not None:
            self._failed(plan, view, out.error)
        else:
            self._done(plan, view, out)
        self.generating = False
        if not self.queued:
            return
        if out.error is not None:  # the user reads the error first
            self.unqueue("the reply failed")
            return
        text = self.queued.pop(0)  # the rest wait for this one's reply
        self.app.chat.show_queued(self.queued)
        self.send(text)

    def _keep(self, plan: ReplyPlan | None, text: str, s: dict[str, Any]) -> HistoryError | None:
        """Record a finished (or stopped) reply as its plan says; a reply is never dropped:
        when what it would replace is gone, it becomes a new turn."""
        if plan is None:
            return None
        session = self.app.session
        turn = Turn(plan.prompt, text, s)
        try:
            if plan.kind == "retry":
                return session.add_version(text, s)
            if plan.kind == "edit":
                return session.replace_turn(plan.index, turn)
        except HistoryError as exc:
            self.app.notify(f"{exc}: the reply is kept as a new turn", severity="warning")
            for view in self._replaced:  # they still show turns of the conversation
                view.display = True
            self._replaced = []
            error = session.add_turn(turn)
            self.app.chat.show_turns(session.turns)
            return error
        return session.add_turn(turn)

    def _done(self, plan: ReplyPlan | None, view: MessageView | None, out: ReplyOutcome) -> None:
        app, chat = self.app, self.app.chat
        s = dict(out.snapshot, stopped=out.stopped, finish_reason=out.finish_reason)
        text = view.text if view else ""
        if s["k"] == 0 and s["generated"] > 0:
            self.last_plain_tps = s["tokens_per_s"]
        if out.finish_reason == "context_full":
            hint = (
                "the next prompt drops the oldest turns (rolling window)"
                if app.options.context_overflow == "rolling"
                else "start a new conversation (ctrl+n)"
            )
            app.notify(f"the context window is full: {hint}", severity="warning")
        app.report_unsaved(self._keep(plan, text, s))
        app.memory.replied(out.prompt, text)  # the caches hold this conversation now
        self.outside = s.get("dropped_turns", 0)
        for old in self._replaced:
            old.remove()
        self._replaced = []
        if plan is not None:
            for i in (plan.index - 1, plan.index):  # the turn before is no longer the last
                chat.set_footers(app.session.turns, i)
        elif view is not None:
            view.set_footer(reply_footer(s))
        app.show_gauge()
        chat.query_one(StatsPanel).show(s)
        if s["generated"]:
            chat.query_one(HistoryChart).add(s["tau"], s["tokens_per_s"])

    def _failed(self, plan: ReplyPlan | None, view: MessageView | None, error: str) -> None:
        app, chat = self.app, self.app.chat
        app.memory.caches_lost()  # a failed step empties the caches
        if plan is not None and plan.kind != "new":  # what it would replace comes back
            for shown in chat.views_from(plan.index):
                if shown not in self._replaced:
                    shown.remove()
            for old in self._replaced:
                old.display = True
            self._replaced = []
            app.notify(f"{error}. Nothing was replaced.", title=f"{plan.kind.title()} failed",
                       severity="error", timeout=15)  # fmt: skip
            return
        if view is not None:
            view.show_error(f"generation failed: {error}")
            view.set_footer("not kept: the next prompt continues from the turn before")
        app.notify(error, title="Generation failed", severity="error", timeout=15)

    def quit(self) -> None:
        """The app quits, halted and the worker out of the engine: a reply in progress is kept
        as far as it got, as esc keeps it."""
        out, view = self._outcome, self._view
        if not (self.generating and view is not None and out and out.error is None):
            return
        if self._buffer is not None:
            for text, spans in self._buffer.drain()[0]:
                view.append(text, spans)
        s = dict(out.snapshot, stopped=True, finish_reason=out.finish_reason)
        self._keep(self._plan, view.text, s)
        self.app.memory.replied(out.prompt, view.text)
