"""Choosing each step's drafts: plain decoding, a fixed chain or tree, or auto's choice among
the sources (costmodel.CostModel prices EAGLE shapes, sourcechoice.SourceChoice weighs them
against n-gram drafts and merged trees). A pure policy: it decides from what it is told (the
limits left, the n-gram offer, measured costs and outcomes) and never touches a model; the
generation loop carries out its plans on the SpecState."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..speculation.drafttree import EAGLE, NGRAM
from ..speculation.mode import Mode
from ..speculation.plan import StepPlan
from ..speculation.probe import StepCosts
from ..speculation.tree import MAX_TOP_K, MAX_TREE_NODES, TreeShape
from .calibration import Calibration, OtherLoad
from .costmodel import MAX_DEPTH, TOP_KS, CostModel, Plan
from .estimators import WINDOW, Recent
from .sourcechoice import MAX_NGRAM_DEPTH, NGramOffer, SourceChoice
from .verdict import Verdict

if TYPE_CHECKING:
    from ..options import RuntimeOptions
    from ..speculation.specstate import SpecState

WAKE_AFTER = 256  # tokens a dormant drafter sleeps at least before a probe may wake it
SLEEP_AFTER = 64  # steps without an EAGLE draft after which a fed drafter sleeps at the latest
SLEEP_MIN = 4  # ... and before which it never does (its history is lost when it sleeps)
# why auto's drafter sleeps: no drafting pays even on optimistic acceptance; other sources win;
# the call's options leave it out (no EAGLE source or no drafter)
HOPELESS, IDLE, OPTIONS = "hopeless", "idle", "options"
EXPLORE_SHARE = 0.005  # of auto's plain decoding time, what probing a useless drafter may cost
# a drafter asleep because nothing paid wakes at once when its mean estimates, over at least
# this many first-position drafts (faded), expect this much more than plain decoding
WAKE_EVIDENCE, WAKE_MARGIN = 16.0, 1.1
# ... once some plain steps were measured since it fell asleep (plain decoding's estimate, a
# low quantile of recent ones, follows them once they outnumber the old ones three to one),
# and not within a few tokens of the call's end (waking pays two switches of the taps)
WAKE_REMEASURED, WAKE_MIN_BUDGET = 4, 8
QUIET_STEPS = 16  # plain steps a sleeping drafter's plan is reused for, unplanned
QUIET_SAMPLE = 4  # ... of which every this many teaches plain decoding's cost
# the n-gram index rests too (no lookup, no planning) once auto's steps went this many in a row
# without an accepted draft, where looking up and planning cost at least this share of a plain
# step (a fast target: a tiny model, a GPU); each rest that ends with nothing paid doubles the
# next, up to the longest, and one accepted draft makes rests short again
NGRAM_REST_AFTER, NGRAM_REST_SHARE, NGRAM_REST_LONGEST = 32, 0.02, 64
# while nothing pays, looking up and planning take at most this share of the decoding time: a
# rest lasts at least planning's share of a plain step over it (up to NGRAM_REST_CAP steps;
# 60-85 on the tiny test hybrids, whose planning costs 0.6-0.85 of a plain step)
NGRAM_PLAN_BUDGET, NGRAM_REST_CAP = 0.01, 256
REST_SAMPLE = 16  # a rest's steps of which every this many teaches plain decoding's cost
RETIME_AFTER_S = 60.0  # a calibration timed on a busy machine: how often to look for quiet
RETIME_LATEST_S = 3600.0  # ... at the least (the interval doubles after each noisy one)


class Scheduler:
    """Per step, the drafts to run within the limits left (tokens, context, batch capacity)."""

    def __init__(
        self, *, has_drafter: bool, max_tree: int, max_top_k: int, branches: int = 0
    ) -> None:
        """max_tree: the most nodes a tree may verify (0: chains only); max_top_k: the widest
        frontier the drafter's batch holds; branches: a recurrent target's branch sequences
        (0: the target's tree leaves share their common rows)."""
        self.has_drafter = has_drafter
        self.max_tree = max_tree
        self.branches = branches
        # no tree can be verified (a recurrent target without room for a branch's state, or
        # no model drafter): chains only
        self.max_top_k = max_top_k if max_tree else 1
        self.cost: CostModel | None = None  # from calibration, on the first auto call
        # time the machine again at the first auto call instead of using the stored
        # calibration (the engine's recalibrate option, per drafter: each has its own)
        self.recalibrate = False
        self.choice: SourceChoice | None = None
        self.mode = Mode("plain")
        # auto's wish for the drafter: asleep (unfed) and why (HOPELESS, IDLE or OPTIONS), or
        # None (fed). Plans and feeds_drafter say it; the SpecState applies it and owns "fed".
        # Kept from call to call: fixed-shape calls in between feed the drafter but leave
        # auto's judgement alone.
        self.asleep: str | None = None
        self._since_sleep = WAKE_AFTER  # auto's tokens since the drafter was put to sleep
        self._eagle_idle = 0  # auto's steps in a row without an EAGLE draft while it was fed
        self._idle_tax = 0.0  # what staying fed cost over those steps (the ready tax each)
        # a probe's round trip, from waking the drafter to putting it to sleep again: its cost
        # beyond plain decoding so far (None: not in one), and the last one's in full
        self._cycle: float | None = None
        self._cycle_steps = 0
        self._last_cycle = 0.0
        # auto with nothing to draft from: plain steps left before the next plan, and the plan
        self._quiet = 0
        self._quiet_plans = (StepPlan(), StepPlan())  # (learning from its costs, not)
        self._sample = QUIET_SAMPLE  # every this many quiet steps learns
        self._plain_at_sleep = 0  # unfed plain steps measured when the drafter fell asleep
        # auto's planned steps in a row without an accepted draft, the n-gram index's next
        # rest, and what looking up and planning a step costs (cost clock)
        self._unpaid = 0
        self._rest = QUIET_STEPS
        self._last_rest = 0  # the last rest's length (0: none since a draft was accepted)
        self.planning = Recent(0.0, WINDOW)
        self._unfaded = 0  # tokens of quiet steps whose fading the evidence still owes
        # quiet steps' learning, kept until something reads what auto learnt (_settle)
        self._deferred: list[tuple[Any, ...]] = []
        # the calibration in use was timed on a busy machine: other programs' CPU use since,
        # to time it again when the machine is quiet (None: it was quiet)
        self._noisy: OtherLoad | None = None
        self._noisy_at = 0.0
        self._retime_after = RETIME_AFTER_S  # doubled after each timing that was noisy too
        self.retime = False  # the next calibration times the machine again (it is quiet now)

    # --- calling ----------------------------------------------------------------------------

    def calibration_needed(self, mode: Mode, recalibrate: bool, *, look: bool = True) -> bool:
        """Whether an auto call must time the machine first: no calibration yet, one asked
        for, or the one in use was timed on a busy machine and the machine is quiet now
        (look: check that, at most every RETIME_AFTER_S)."""
        if mode.kind != "auto":
            return False
        if self.cost is None or recalibrate or self.retime:
            return True
        if not look or self._noisy is None:
            return False
        if time.monotonic() - self._noisy_at < self._retime_after:
            return False
        self._noisy_at = time.monotonic()
        # quiet since the last look: time it again (if that one is noisy too, look less often)
        if self._noisy.busy() is False:
            self._retime_after = min(2 * self._retime_after, RETIME_LATEST_S)
            self.retime = True  # measured anew, not read back from the disk
            return True
        return False

    def calibration_request(self, n_batch: int) -> tuple[int, tuple[int, ...]]:
        """(the largest verify batch to time, the drafter's frontier widths to time)."""
        rows = max(self.max_tree, MAX_DEPTH, MAX_NGRAM_DEPTH) + 1
        widths = tuple(k for k in TOP_KS if k == 1 or k <= self.max_top_k)
        return min(n_batch, rows), widths if self.has_drafter else ()

    def calibrate(
        self,
        state: SpecState,
        rt: RuntimeOptions,
        n_batch: int,
        *,
        recalibrate: bool,
        progress: Callable[[float], None] | None = None,
    ) -> Calibration:
        """Time this machine for what auto plans (or read the stored timing), then price
        steps from it: the one way a generation's start and Engine.calibrate take it."""
        rows, widths = self.calibration_request(n_batch)
        cal = state.calibrate(
            rt,
            max_rows=rows,
            top_ks=widths,
            recalibrate=recalibrate or self.retime,
            progress=progress,
        )
        self.calibrated(cal)
        return cal

    def calibrated(self, cal: Calibration) -> None:
        """Price steps from this calibration. What was learnt of acceptance is kept when the
        machine is timed again; one timed on a busy machine is timed again once it is quiet
        (where the kernel tells other programs' CPU use)."""
        self._fade()
        old, old_choice = self.cost, self.choice
        self.retime = False
        # chains are verified in one sequence, as deep as a measured verify: no tree room
        # needed (a recurrent target, which verifies no trees, still drafts chains)
        self.cost = cal.cost_model(self.max_tree or MAX_DEPTH)
        self.cost.branches = self.branches
        self.choice = SourceChoice(self.cost, max_nodes=max(self.max_tree, 1))
        if old is not None and old_choice is not None:
            self.cost.acceptance = old.acceptance
            self.cost.hopeless = old.hopeless
            self.choice.ngram = old_choice.ngram
            self._plain_at_sleep = self.cost.plain[False].n  # counts restart with the model
        self._noisy = None if cal.quiet else OtherLoad(cal.threads)
        self._noisy_at = time.monotonic()
        if cal.quiet:
            self._retime_after = RETIME_AFTER_S
        if old is None:
            # the first search now: where no draft can pay on this machine even on optimistic
            # acceptance, the first call starts with the drafter asleep (unfed: no prompt fed
            # to it, no switch of the taps after its first step)
            self.cost.plan(MAX_DEPTH)

    def start(self, mode: Mode) -> None:
        """Begin a call. Auto starts with the drafter unfed where no EAGLE drafting can pay,
        and a drafter auto put to sleep stays asleep from call to call until a probe is due
        (waking it at every call would pay two switches of the taps and a probe per call).
        Fixed modes leave auto's state alone."""
        self._settle()  # the last call's quiet steps, learnt from before anything reads them
        self.mode = mode
        self._quiet = 0
        # a new prompt may hold what the reply copies: the index rests shortly at first (its
        # first lookups find a copy that starts after a few words of the reply's own)
        self._rest = QUIET_STEPS
        if self.cost is not None:
            self.cost.new_call()
        if mode.kind != "auto":
            return
        if EAGLE not in mode.sources or not self.has_drafter:
            self.asleep = OPTIONS
        elif self.asleep not in (None, OPTIONS):
            pass  # asleep by auto's own judgement: it sleeps on until a draft is due
        elif self.cost is not None and self.cost.hopeless:
            # asleep from the call's start: a probe is due WAKE_AFTER tokens from now at
            # the earliest, as for a drafter put to sleep by a step
            self.asleep = HOPELESS
            self._since_sleep = 0
            self._plain_at_sleep = self.cost.plain[False].n
        else:
            self.asleep = None

    @property
    def dormant(self) -> bool:
        """auto wants the drafter unfed."""
        return self.asleep is not None

    @property
    def feeds_drafter(self) -> bool:
        """Whether the call starts with the drafter fed."""
        if not (self.has_drafter and self.mode.feeds_drafter):
            return False
        return self.mode.kind != "auto" or not self.dormant

    @property
    def wants_ngram(self) -> bool:
        return self.mode.drafts and NGRAM in self.mode.sources

    @property
    def looks_up(self) -> bool:
        """Whether this step consults the n-gram index (not while auto's plan rests)."""
        return self.wants_ngram and not (self.mode.kind == "auto" and self._quiet > 0)

    @property
    def ngram_resting(self) -> bool:
        """Whether auto's n-gram lookups rest, nothing having paid for a while."""
        return (
            self.mode.kind == "auto"
            and self.wants_ngram
            and self._last_rest > 0
            and self._unpaid >= NGRAM_REST_AFTER
        )

    @property
    def ngram_max(self) -> int:
        """The longest n-gram continuation worth looking up."""
        if self.mode.kind == "auto" or self.mode.shape is None:
            return MAX_NGRAM_DEPTH
        return self.mode.shape.depth

    # --- planning ----------------------------------------------------------------------------

    def plan(self, budget: int, free_cells: int, offer: NGramOffer | None) -> StepPlan:
        """budget: draft depth allowed (tokens and positions left); free_cells: KV cells a tree
        may still occupy; offer: what the n-gram index proposes (None: nothing)."""
        mode = self.mode
        if not mode.drafts or budget < 1:
            return StepPlan()
        if mode.kind == "auto":
            if self._quiet > 0:
                self._quiet -= 1
                assert self.cost is not None
                self.cost.skip()
                return self._quiet_plans[bool(self._quiet % self._sample)]
            plan = self._auto(budget, free_cells, offer)
            rest = self._may_rest(plan)
            if rest:
                self._quiet = rest - 1
                # a rest of the n-gram index follows a fast target: plain decoding's cost is
                # learnt from fewer of its steps (each learning step costs a share of one)
                self._sample = REST_SAMPLE if NGRAM in self.mode.sources else QUIET_SAMPLE
                self._quiet_plans = (
                    replace(plan, quiet=True),
                    replace(plan, quiet=True, learn=False),
                )
            return plan
        assert mode.shape is not None
        if NGRAM in mode.sources:  # a fixed n-gram chain, when the index has a match
            n = min(mode.shape.depth, budget, offer.length if offer else 0)
            return StepPlan(ngram=n)
        if not self.has_drafter:
            return StepPlan()
        return StepPlan(self._fit(mode.shape.clipped(budget), budget, free_cells))

    def _fade(self) -> None:
        """The fading the quiet steps since the last reading owe the evidence, applied at
        once (~3 us a step less), after the quiet steps' learning still deferred. No evidence
        was added meanwhile, so the fade is the same in all; FadingCounts applies it in steps
        of FADE_EVERY tokens, so at a reading the counts may be up to one such step further
        faded than step by step (a factor of 0.5 ** (FADE_EVERY / HALF_LIFE) at most)."""
        self._settle()
        if self._unfaded and self.cost is not None and self.choice is not None:
            self.cost.acceptance.advance(self._unfaded)
            self.choice.ngram.advance(self._unfaded)
        self._unfaded = 0

    def _settle(self) -> None:
        """Learn from the quiet steps that were kept for later, in their order: each as
        observe would have at its step, the fading owed before it included, so what auto
        knows at a reading is what learning step by step gives. A quiet step's learning run
        between two decodes cost ~70 us here, most of it the CPU's caches filled anew after
        the decode; run together at the next plan or reason, a fraction of that."""
        if not self._deferred:
            return
        deferred, self._deferred = self._deferred, []
        later = self._unfaded  # owed by the quiet steps after the last one kept
        for unfaded, *step in deferred:
            self._unfaded = unfaded
            self._learn(*step)
        self._unfaded = later

    def _auto(self, budget: int, free_cells: int, offer: NGramOffer | None) -> StepPlan:
        assert self.cost is not None and self.choice is not None
        self._fade()
        eagle = Plan(None, 1.0, self.cost.step_time(None))
        if self.has_drafter and EAGLE in self.mode.sources:
            eagle = self.cost.plan(budget, fed=not self.dormant)
            room = min(budget, max(free_cells - 1, 0))
            if self.dormant and eagle.shape is not None and self._wakes(eagle, offer, room):
                self.asleep = None  # taps on: this step's first pair
                self._cycle, self._cycle_steps = 0.0, 0
                return self._ngram_only(budget, free_cells, offer, wake=True)
            if not self.dormant and eagle.shape is None and self.cost.hopeless:
                self.asleep = HOPELESS
                self._since_sleep = 0
                self._plain_at_sleep = self.cost.plain[False].n
                return self._ngram_only(budget, free_cells, offer, sleep=True)
            if self.dormant:
                eagle = Plan(None, 1.0, self.cost.step_time(None))
        if NGRAM not in self.mode.sources:
            offer = None
        c = self.choice.choose(eagle, offer, min(budget, max(free_cells - 1, 0)))
        shape = self._fit(c.eagle.shape, budget, free_cells - c.ngram) if c.eagle.shape else None
        # a drafter kept fed while other sources win costs the ready tax every step: once
        # that adds up to what sleeping and waking again costs (rent, then buy), or after
        # SLEEP_AFTER steps at the latest, it sleeps (the cost model's probes wake it later)
        if shape is not None or self.dormant:
            self._eagle_idle, self._idle_tax = 0, 0.0
        else:
            self._eagle_idle += 1
            self._idle_tax += self.cost.ready_tax
        paid = self._idle_tax > 0 and self._idle_tax >= self.cost.rewake_cost()
        tired = (paid and self._eagle_idle >= SLEEP_MIN) or self._eagle_idle >= SLEEP_AFTER
        if tired and self.has_drafter and not self.dormant:
            self.asleep = IDLE
            self._since_sleep = 0
            self._plain_at_sleep = self.cost.plain[False].n
            self._eagle_idle, self._idle_tax = 0, 0.0
            return StepPlan(None, c.ngram, c.ngram_alts, c, sleep=True)
        return StepPlan(shape, c.ngram, c.ngram_alts, c)

    def _may_rest(self, plan: StepPlan) -> int:
        """How many steps, from this one, may repeat this plain plan unplanned (0: none). The
        drafter sleeps because nothing paid (or is left out), so only a probe coming due,
        re-measured plain costs or an n-gram match can change the plan, and none minds a few
        steps' delay (a probe waits WAKE_AFTER tokens at least). Planning and learning cost
        tens of microseconds a step, a share of a GPU's plain step that auto with a useless
        drafter must not pay. With no n-gram source that is QUIET_STEPS; with one, the index
        rests only where nothing paid for NGRAM_REST_AFTER steps and looking up and planning
        cost NGRAM_REST_SHARE of a plain step or more (on a slow target its lookups cost
        nothing worth saving, and a copy that starts during a rest would wait for its end).
        Rests double while nothing pays (a copy is still found within NGRAM_REST_LONGEST
        tokens of its start), and last at least as long as keeps planning within
        NGRAM_PLAN_BUDGET of the decoding time (a target whose steps cost little more than
        planning them: a copy may then wait up to NGRAM_REST_CAP tokens)."""
        if not (
            self.asleep in (HOPELESS, OPTIONS)
            and plan.eagle is None
            and not (plan.ngram or plan.wake or plan.sleep)
        ):
            return 0
        if NGRAM not in self.mode.sources:
            return QUIET_STEPS
        assert self.cost is not None
        if self._unpaid < NGRAM_REST_AFTER:
            return 0
        share = self.planning.value / max(self.cost.step_time(None), 1e-9)
        if share < NGRAM_REST_SHARE:
            return 0
        # at least as long as keeps planning within NGRAM_PLAN_BUDGET of the decoding time
        floor = min(math.ceil(share / NGRAM_PLAN_BUDGET), NGRAM_REST_CAP)
        rest = max(self._rest, floor)
        self._rest = max(min(2 * self._rest, NGRAM_REST_LONGEST), floor)
        self._last_rest = rest
        return rest

    def _wakes(self, eagle: Plan, offer: NGramOffer | None, budget: int) -> bool:
        """Whether a dormant drafter is woken for this plan. Put to sleep because other
        sources won, it wakes when the EAGLE plan would win this step. Put to sleep because
        nothing paid, it wakes as soon as its mean estimates, backed by evidence of its own
        (not the prior's), say drafting pays by WAKE_MARGIN, once the plain steps it slept
        through re-measured what plain decoding costs (WAKE_REMEASURED) and unless the call
        is about to end: a drafter sent to sleep by a cost estimate hit by noise is not kept
        asleep for hundreds of tokens. Otherwise (a probe on the optimistic bound)
        it waits until the plain steps since it fell asleep cover a probe's round trip
        (_wake_after): asleep, it gathers no evidence, so its estimates only drift back
        towards the prior as the old evidence fades, and a moving cost estimate must not flip
        it on and off (the margin is the hysteresis)."""
        assert self.cost is not None and self.choice is not None
        if self.asleep == IDLE and not eagle.explore:
            if NGRAM not in self.mode.sources:
                offer = None
            return self.choice.choose(eagle, offer, budget).eagle.shape is not None
        plain = Plan(None, 1.0, self.cost.step_time(None))
        if (
            not eagle.explore
            and budget >= WAKE_MIN_BUDGET
            and self.cost.plain[False].n - self._plain_at_sleep >= WAKE_REMEASURED
            and self.cost.acceptance.counts[0].sum() >= WAKE_EVIDENCE
            and eagle.tokens_per_s >= WAKE_MARGIN * plain.tokens_per_s
        ):
            return True
        return self._since_sleep >= self._wake_after(eagle)

    def _wake_after(self, probe: Plan) -> float:
        """Tokens a dormant drafter sleeps before this probe may wake it: WAKE_AFTER, or more
        where waking (two switches, the fed wake step) and the probe's extra time would cost
        more than EXPLORE_SHARE of plain decoding over that many tokens."""
        assert self.cost is not None
        plain = self.cost.step_time(None)
        cycle = self.cost.rewake_cost() + max(probe.seconds - plain, 0.0)
        cycle = max(cycle, self._last_cycle)  # what the last round trip cost, measured
        return max(WAKE_AFTER, cycle / (EXPLORE_SHARE * plain))

    def _ngram_only(
        self,
        budget: int,
        free_cells: int,
        offer: NGramOffer | None,
        *,
        wake: bool = False,
        sleep: bool = False,
    ) -> StepPlan:
        assert self.cost is not None and self.choice is not None
        plain = Plan(None, 1.0, self.cost.step_time(None))
        if NGRAM not in self.mode.sources:
            offer = None
        c = self.choice.choose(plain, offer, min(budget, max(free_cells - 1, 0)))
        return StepPlan(None, c.ngram, c.ngram_alts, c, wake=wake, sleep=sleep)

    def _fit(self, shape: TreeShape | None, budget: int, free_cells: int) -> TreeShape | None:
        """A tree that does not fit the caches' room falls back to the chain of its depth."""
        if shape is None or shape.is_chain:
            return shape
        if (
            shape.budget > min(free_cells - 1, self.max_tree)
            or (shape.depth - 1) * shape.top_k >= free_cells  # the drafter mirrors the target
            or shape.top_k > self.max_top_k
        ):
            d = min(shape.depth, budget)
            return TreeShape(d, 1, d)
        return shape

    def explain(self) -> Verdict | None:
        """Auto's reason for what it runs now (None for fixed modes or before a plan)."""
        if self.mode.kind != "auto" or self.cost is None:
            return None
        self._fade()
        eagle = self.has_drafter and EAGLE in self.mode.sources
        v = self.cost.explain(eagle=eagle)
        if v is None or self.choice is None:
            return v
        ngram = self.choice.describe() if NGRAM in self.mode.sources else ""
        if ngram and self.ngram_resting:
            ngram += (
                f"; nothing accepted over the last {self._unpaid} steps: the index rests, "
                f"looked up once in {self._last_rest} steps"
            )
        return v.with_sources(eagle=eagle, ngram=ngram)

    # --- learning ----------------------------------------------------------------------------

    def observe(
        self,
        plan: StepPlan,
        offer: NGramOffer | None,
        *,
        verify_rows: int,
        ranks: list[tuple[int, int]],
        ngram_accepted: int,
        alt_hit: bool,
        costs: StepCosts,
        emitted: int,
        t_plan: float | None = None,
    ) -> None:
        """Teach auto what the step cost and what was accepted; t_plan: what looking up and
        planning it cost (cost clock; None for an unplanned step)."""
        if plan.choice is None or self.cost is None or self.choice is None:
            return
        self._since_sleep += emitted  # auto's own tokens: its probes cost a share of them
        if not plan.quiet:  # a step that could draft: did any source pay?
            if emitted > 1:
                self._unpaid, self._rest, self._last_rest = 0, QUIET_STEPS, 0
            else:
                self._unpaid += 1
            if t_plan is not None:
                self.planning.update(t_plan)
        if not plan.learn:  # most quiet steps: only the evidence fades with the tokens
            self._unfaded += emitted  # applied before anything reads the evidence (_fade)
            return
        step = (plan, offer, verify_rows, ranks, ngram_accepted, alt_hit, costs, emitted)
        if plan.quiet:  # learnt from at the next reading (_settle), with the fading owed
            self._deferred.append((self._unfaded, *step))
            self._unfaded = 0
            return
        self._learn(*step)

    def _learn(
        self,
        plan: StepPlan,
        offer: NGramOffer | None,
        verify_rows: int,
        ranks: list[tuple[int, int]],
        ngram_accepted: int,
        alt_hit: bool,
        costs: StepCosts,
        emitted: int,
    ) -> None:
        """One step's learning (observe's, now or deferred by _settle)."""
        assert self.cost is not None and self.choice is not None
        self._fade()
        if self._cycle is not None:
            spent = costs.verify + costs.flush + costs.draft + costs.lookup + costs.build
            spent += costs.feed + costs.glue
            self._cycle += spent - emitted * self.cost.step_time(None)
            self._cycle_steps += 1
            if plan.sleep:
                self._last_cycle, self._cycle = max(self._cycle, 0.0), None
            elif self._cycle_steps >= SLEEP_AFTER:
                self._cycle = None  # it stayed awake: drafting pays again, not a round trip
        # EAGLE costs and ranks, and the verify curve (the cost model owns both)
        self.cost.observe(
            plan.eagle,
            fed=not self.dormant,
            switched=plan.wake or plan.sleep,
            verify_rows=verify_rows,
            t_verify=costs.verify,
            t_flush=costs.flush,
            t_draft=costs.flush + costs.draft,
            # plain steps' glue is the bar drafting must beat: n-gram steps do not set it
            t_glue=None if plan.ngram else costs.glue + costs.feed,
            ranks=ranks,
            emitted=emitted,
        )
        self.choice.observe(
            offer if plan.ngram else None,
            plan.ngram,
            ngram_accepted,
            plan.ngram_alts,
            alt_hit,
            t_build=costs.build if plan.ngram else None,
            t_glue=costs.glue + costs.feed if plan.ngram else None,
            emitted=emitted,
        )

    @staticmethod
    def capacity(n_batch: int, draft_batch: int) -> tuple[int, int]:
        """(the most tree nodes one verify batch holds, the widest frontier the drafter's batch
        holds: two banks of top_k sequences plus the committed prefix's)."""
        max_tree = max(0, min(MAX_TREE_NODES, n_batch - 2))
        max_top_k = min(MAX_TOP_K, (min(draft_batch, n_batch) - 1) // 2)
        return max_tree, max_top_k
