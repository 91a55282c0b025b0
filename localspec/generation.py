"""One generation: process the prompt (reusing what the caches already hold), then emit the
step's tokens, check for the end, and take the next speculative step, until done."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Literal

from .sampling import Draws, SamplingParams
from .scheduler import Mode, StepPlan, shape_label
from .speculative import StepResult, pick, speculative_step
from .stats import Stats
from .textstream import TextStream
from .tree import tree_step

if TYPE_CHECKING:
    from .drafter import Drafter
    from .parts import Parts

EXPLAIN_EVERY = 32  # steps between refreshes of auto's reason in the running statistics

FinishReason = Literal["eos", "stop", "length", "context_full"]


@dataclass
class Event:
    """One step of generation: the text that became visible and the tokens emitted."""

    text: str
    tokens: list[int]
    accepted: list[bool]  # per token: True where the drafter proposed it and it was accepted
    finish_reason: FinishReason | None = None


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
    ) -> None:
        self.parts = parts
        self.lock = lock  # held for each step; raises once a newer call superseded this one
        self.totals = totals  # the engine's running statistics, fed when this call ends
        self.prompt = tokens
        self.max_tokens = max_tokens
        self.sp = sampling
        self.draws = Draws(seed, len(tokens))
        self.text = TextStream(stops)
        self.mode = mode
        self.recalibrate = recalibrate
        self.stats = Stats(prompt_tokens=len(tokens), generations=1, mode=str(mode))
        self.last = -1  # the chosen token not yet decoded by the target

    def run(self) -> Generator[Event, None, None]:
        stats = self.stats
        try:
            with self.lock(self):
                self.prefill()
            if self.max_tokens == 0:
                yield Event("", [], [], "length")
                return
            tokens, accepted = [self.last], [False]
            while True:
                event = self._emit(tokens, accepted)
                if event is not None:
                    yield event
                    if event.finish_reason is not None:
                        return
                with self.lock(self):
                    res = self._step()
                tokens, accepted = res.tokens, [True] * res.n_accepted + [False]
        finally:
            if self.mode.kind == "auto":  # not a superseded call's scheduler state
                stats.auto = self.parts.scheduler.explain()
            self.totals.add(stats)

    # --- the prompt --------------------------------------------------------------------------

    def prefill(self) -> None:
        """Keep the cached prefix of the prompt, decode the rest, choose the first token."""
        parts, tgt = self.parts, self.parts.target
        sched = parts.scheduler
        sched.start(self.mode, recalibrate=self.recalibrate)  # may calibrate (clears caches)
        self.stats.t_calibrate = sched.t_calibrate
        t0 = perf_counter()
        dft = parts.drafter if self.mode.drafts and not sched.dormant else None
        tgt.set_taps_active(dft is not None)
        tokens = self.prompt
        keep = tgt.reusable(tokens)
        if parts.drafter is not None:
            # the drafter's pairs may end earlier (after plain or dormant calls, or an edit):
            # when it drafts in this call, the target decodes those positions again for their
            # taps, so the drafter sees the whole history as a fresh engine's would
            have = parts.drafter.reusable(tokens, keep)
            if dft is not None:
                keep = have
            parts.drafter.keep(min(have, keep))
        tgt.keep(keep)
        self.stats.cached_tokens = keep
        logits, taps = tgt.prefill(tokens[keep:])
        self.last, _ = pick(logits, self.sp, self.draws.rng, self.draws.at(len(tokens)))
        if dft is not None:
            assert taps is not None and dft.next_pos == keep
            # pairs (token[P+1], g[P]) for P = keep..; the last one's token is the first pick
            dft.queue([*tokens[keep + 1 :], self.last], taps)
        self.stats.t_prefill += perf_counter() - t0

    # --- emitting ----------------------------------------------------------------------------

    def _emit(self, tokens: list[int], accepted: list[bool]) -> Event | None:
        """The step's tokens as an event, cut at EOS, a stop string or the token budget; the
        context's end finishes generation too. None when nothing became visible."""
        parts, stats = self.parts, self.stats
        out_t: list[int] = []
        out_a: list[bool] = []
        reason: FinishReason | None = None
        for t, a in zip(tokens, accepted, strict=True):
            if parts.eog[t]:
                reason = "eos"
                break
            out_t.append(t)
            out_a.append(a)
            stats.generated += 1
            if self.text.feed(parts.target.model.piece(t)):
                reason = "stop"
                break
            if stats.generated >= self.max_tokens:
                reason = "length"
                break
        if len(out_t) < len(tokens):  # cut at a stop string or EOS: what follows was not emitted
            stats.retract(len(out_t), sum(accepted[len(out_t) :]))
        if reason is None and parts.target.n >= parts.target.n_ctx:
            reason = "context_full"
        if reason is not None:
            return Event(self.text.take(final=reason != "stop"), out_t, out_a, reason)
        return Event(self.text.take(final=False), out_t, out_a) if out_t else None

    # --- one step ----------------------------------------------------------------------------

    def _step(self) -> StepResult:
        """Ask the scheduler for a shape, run it, and let it learn from what it cost."""
        parts, tgt, stats = self.parts, self.parts.target, self.stats
        sched = parts.scheduler
        # never draft past max_tokens or the context's end
        budget = min(self.max_tokens - stats.generated, tgt.n_ctx - tgt.n, tgt.n_batch) - 1
        plan = sched.plan(budget, tgt.room(parts.max_tree + 2) - 1)
        if plan.wake:
            self._wake()
        if plan.sleep:
            tgt.set_taps_active(False)
        dft = parts.drafter if self.mode.drafts and not sched.dormant else None
        t0, c0 = perf_counter(), sched.clock()
        res = self._run(plan, dft)
        glue = perf_counter() - t0 - res.t_target - res.t_draft
        c_glue = sched.clock() - c0 - res.c_target - res.c_draft
        stats.t_target += res.t_target
        stats.t_draft += res.t_draft
        stats.t_glue += glue
        shape = plan.shape
        stats.record_step(
            res.n_drafted, res.n_accepted, shape_label(shape), shape.depth if shape else 0
        )
        if plan.prediction is not None:
            stats.record_prediction(plan.prediction.tokens, plan.prediction.seconds)
            if stats.steps % EXPLAIN_EVERY == 1:  # for readers while it streams
                stats.auto = sched.explain()
        sched.observe(plan, res, c_glue)
        self.last = res.tokens[-1]
        return res

    def _run(self, plan: StepPlan, dft: Drafter | None) -> StepResult:
        parts, shape = self.parts, plan.shape
        if shape is not None and not shape.is_chain:
            assert dft is not None
            clock = parts.scheduler.clock
            return tree_step(parts.target, dft, self.last, shape, self.sp, self.draws, clock=clock)
        k = shape.depth if shape is not None else 0
        return speculative_step(
            parts.target,
            dft,
            self.last,
            k,
            self.sp,
            self.draws,
            ranks=plan.prediction is not None,
            own_draws=k == 0 or not self.mode.rejection_sampling,
            clock=parts.scheduler.clock,
        )

    def _wake(self) -> None:
        """Feed the drafter again after dormant steps: its cache restarts at the current
        position (it has no taps for the steps in between)."""
        assert self.parts.drafter is not None
        self.parts.target.set_taps_active(True)
        self.parts.drafter.restart(self.parts.target.n)
