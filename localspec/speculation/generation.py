"""One generation: process the prompt (reusing what the caches already hold), then emit the
step's tokens, check for the end, and take the next speculative step, until done."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from ..errors import GenerationError
from ..stats import Stats
from ..text.textstream import TextStream
from .drafttree import EAGLE, DraftTree
from .mode import Mode
from .plan import StepPlan
from .probe import StepCosts
from .sampling import Draws, DryBreakers, Sampler, SamplingParams
from .step import speculative_step
from .verify import Outcome

if TYPE_CHECKING:
    from ..runtime.parts import Parts

# planned steps between refreshes of auto's reason in the running statistics (a refresh costs
# a few hundred microseconds; steps auto did not plan change no reason)
EXPLAIN_EVERY = 32

FinishReason = Literal["eos", "stop", "length", "context_full"]


@dataclass
class Event:
    """One step of generation: the text that became visible and the tokens emitted."""

    text: str
    tokens: list[int]
    accepted: list[bool]  # per token: True where a draft source proposed it and it was accepted
    finish_reason: FinishReason | None = None
    # per token: who proposed it ("eagle", "ngram", "eagle+ngram"; "" for the target's own)
    sources: list[str] = field(default_factory=list)


class Generation:
    """A call's state: the prompt, its limits, its randomness, the text so far, its stats."""

    def __init__(
        self,
        parts: Parts,
        tokens: list[int],
        *,
        lock: Callable[[Generation], AbstractContextManager[None]],
        totals: Stats,
        max_tokens: int,
        sampling: SamplingParams,
        seed: int | None,
        stops: list[str],
        mode: Mode,
        recalibrate: bool = False,
        breakers: Callable[[tuple[str, ...]], DryBreakers] | None = None,
    ) -> None:
        self.parts = parts
        self.lock = lock  # held for each step; raises once a newer call superseded this one
        self.totals = totals  # the engine's running statistics, fed when this call ends
        self.prompt = tokens
        self.max_tokens = max_tokens
        self.sp = sampling
        # the chain with this call's history (the prompt first); refused here, before any
        # work, where the call's settings do not fit the model (a bias outside its vocabulary)
        self.sampler = Sampler(
            sampling,
            n_vocab=parts.target.model.n_vocab,
            n_ctx=parts.target.n_ctx,
            history=tokens,
            breakers=breakers,
        )
        self.draws = Draws(seed, len(tokens))
        self.text = TextStream(stops)
        self.mode = mode
        self.recalibrate = recalibrate
        # the model drafter's source name: "eagle", or "mtp" for a target's own head
        self.model_source = parts.state.eagle.name if parts.state.eagle is not None else EAGLE
        self.stats = Stats(
            prompt_tokens=len(tokens), generations=1, mode=mode.label(self.model_source)
        )
        self.last = -1  # the chosen token not yet decoded by the target
        self._unexplained = 0  # planned steps since auto's reason was refreshed (the end: always)

    def run(self) -> Generator[Event, None, None]:
        stats = self.stats
        try:
            with self.lock(self):
                self.prefill()
            if self.max_tokens == 0:
                yield Event("", [], [], "length")
                return
            tokens, sources = [self.last], [""]
            while True:
                event = self._emit(tokens, sources)
                if event is not None:
                    if event.finish_reason is not None:
                        self._remember()
                    yield event
                    if event.finish_reason is not None:
                        return
                with self.lock(self):
                    tokens, sources = self._step()
        finally:
            if self.mode.kind == "auto":  # not a superseded call's scheduler state
                stats.auto = self.parts.scheduler.explain()
            self.totals.add(stats)

    # --- the prompt --------------------------------------------------------------------------

    def prefill(self) -> None:
        """Keep the cached prefix of the prompt, decode the rest, choose the first token."""
        parts = self.parts
        state, sched = parts.state, parts.scheduler
        if sched.calibration_needed(self.mode, self.recalibrate):
            wall = parts.probe.now()[0]
            cal = sched.calibrate(
                state, parts.rt, parts.target.n_batch, recalibrate=self.recalibrate
            )
            if cal.measured:  # not when read from the disk cache
                self.stats.t_calibrate = parts.probe.now()[0] - wall
        sched.start(self.mode)
        parts.probe.take()
        keep, logits = state.begin(
            self.prompt,
            feed=sched.feeds_drafter,
            index=sched.wants_ngram,
            whole_history=self.mode.kind != "auto",
        )
        self.stats.cached_tokens = keep
        self.last = self.sampler.choose(logits, (), self.draws.rng, self.draws.at(len(self.prompt)))
        self.sampler.push((self.last,))
        state.chosen(self.last)
        self.stats.t_prefill += sum(parts.probe.take()[0].values())  # prompt, index

    # --- emitting ----------------------------------------------------------------------------

    def _emit(self, tokens: list[int], sources: list[str]) -> Event | None:
        """The step's tokens as an event, cut at EOS, a stop string or the token budget; the
        context's end finishes generation too. None when nothing became visible."""
        parts, stats = self.parts, self.stats
        out_t: list[int] = []
        out_s: list[str] = []
        reason: FinishReason | None = None
        for t, s in zip(tokens, sources, strict=True):
            if parts.eog[t]:
                reason = "eos"
                break
            out_t.append(t)
            out_s.append(s)
            stats.generated += 1
            if self.text.feed(parts.target.model.piece(t)):
                reason = "stop"
                break
            if stats.generated >= self.max_tokens:
                reason = "length"
                break
        if len(out_t) < len(tokens):  # cut at a stop string or EOS: what follows was not emitted
            stats.retract(len(out_t), sources[len(out_t) :])
        if reason is None and parts.target.n >= parts.target.n_ctx:
            reason = "context_full"
        accepted = [bool(s) for s in out_s]
        if reason is not None:
            text = self.text.take(final=reason != "stop")
            return Event(text, out_t, accepted, reason, out_s)
        return Event(self.text.take(final=False), out_t, accepted, None, out_s) if out_t else None

    # --- one step ----------------------------------------------------------------------------

    def _step(self) -> tuple[list[int], list[str]]:
        """Plan, step, learn: ask the scheduler for a plan, run it, learn from what it cost and
        yielded; the emitted tokens and who proposed each."""
        parts, stats = self.parts, self.stats
        state, sched, probe = parts.state, parts.scheduler, parts.probe
        tgt = parts.target
        # never draft past max_tokens or the context's end
        budget = min(self.max_tokens - stats.generated, tgt.n_ctx - tgt.n, tgt.n_batch) - 1
        if tgt.max_draft is not None:  # a recurrent state is cut back at most this far
            budget = min(budget, tgt.max_draft)
        w0, c0 = probe.now()
        proposal = state.lookup(sched.ngram_max, 3) if sched.looks_up and budget > 0 else None
        offer = proposal.offer if proposal is not None else None
        # plan: what to draft, then the lookup's proposal and how an EAGLE chain draws
        planned = sched.plan(budget, state.free_cells(), offer)
        t_plan = probe.clock() - c0  # looking up and planning, on the cost clock
        # a fixed EAGLE chain that samples draws its drafts from the drafter's q
        q = planned.eagle is not None and self.mode.rejection_sampling and not self.sp.greedy
        ranks = planned.choice is not None
        plan = planned
        if proposal is not None or q or planned.ranks != ranks:  # (a plain step: as planned)
            plan = replace(planned, proposal=proposal, sampled=self.sp if q else None, ranks=ranks)
        # step
        tree, out = speculative_step(state, self.last, plan, self.sampler, self.draws)
        w1, c1 = probe.now()
        wall, cost = probe.take()
        # learn
        self._record(plan, tree, out, wall, w1 - w0)
        sched.observe(
            plan,
            offer,
            verify_rows=state.verified_rows,
            ranks=out.ranks,
            ngram_accepted=_run_length(tree.spine.get("ngram", []), out.path),
            alt_hit=bool(out.path) and out.path[0] in tree.alternatives,
            costs=StepCosts.of(cost, c1 - c0),
            emitted=len(out.path) + 1,
            t_plan=None if plan.quiet else t_plan,
        )
        self.last = out.y
        emitted = out.emitted(tree)
        self.sampler.push(emitted)
        sources = ["+".join(sorted(tree.sources[i])) for i in out.path]
        return emitted, [*sources, ""]

    def _record(
        self,
        plan: StepPlan,
        tree: DraftTree,
        out: Outcome,
        wall: dict[str, float],
        total: float,
    ) -> None:
        stats = self.stats
        t_target = wall.get("verify", 0.0)
        t_draft = sum(wall.get(k, 0.0) for k in ("flush", "draft", "feed", "lookup", "build"))
        stats.t_target += t_target
        stats.t_draft += t_draft
        stats.t_glue += max(0.0, total - t_target - t_draft)
        if plan.eagle is not None:
            stats.t_eagle += wall.get("flush", 0.0) + wall.get("draft", 0.0)
            stats.t_eagle_native += wall.get("eagle_native", 0.0)
            stats.eagle_positions += sum(self.model_source in s for s in tree.sources)
        stats.record_step(len(tree), len(out.path), plan.label, tree.depth)
        stats.record_sources(tree.sources, out.path)
        if plan.choice is not None:
            cost = self.parts.scheduler.cost
            if cost is None:
                plain = 0.0
            elif plan.quiet:  # a plain plan reused: one plain step at the price it was planned
                plain = plan.choice.seconds
            else:
                plain = cost.step_time(None)
            stats.record_prediction(plan.choice.tokens, plan.choice.seconds, plain)
            # for readers while it streams; unplanned (quiet) steps change no reason
            if not plan.quiet:
                self._unexplained += 1
                if self._unexplained >= EXPLAIN_EVERY:
                    stats.auto = self.parts.scheduler.explain()
                    self._unexplained = 0

    def _remember(self) -> None:
        """The call's text joins the session's n-gram memory (not a superseded call's)."""
        try:
            with self.lock(self):
                self.parts.state.finish()
        except GenerationError:
            pass


def _run_length(spine: list[int], path: list[int]) -> int:
    """How many of a source's chain nodes, from the root, the accepted path went through."""
    n = 0
    for a, b in zip(spine, path, strict=False):
        if a != b:
            break
        n += 1
    return n
