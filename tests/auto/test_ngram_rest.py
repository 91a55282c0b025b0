"""Auto's n-gram index rests where nothing pays: on a fast target (a tiny model, a GPU) looking
up and planning every step cost a large share of a plain step, so once no draft was accepted
for NGRAM_REST_AFTER steps the scheduler reuses its plain plan for a while without looking
up; rests double while nothing pays and end for good at the first accepted draft. On a slow
target (planning a small share of the step) it never rests."""

from __future__ import annotations

import math

import numpy as np
import pytest

import localspec
from localspec.auto import costmodel as cm
from localspec.auto.scheduler import (
    NGRAM_PLAN_BUDGET,
    NGRAM_REST_AFTER,
    NGRAM_REST_CAP,
    NGRAM_REST_LONGEST,
    NGRAM_REST_SHARE,
    QUIET_STEPS,
    Scheduler,
)
from localspec.auto.sourcechoice import SourceChoice
from localspec.lowlevel import parts
from localspec.speculation.drafttree import NGRAM
from localspec.speculation.mode import Mode
from localspec.speculation.probe import StepCosts
from localspec.speculation.sources.ngram import NGramOffer

from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless

T1 = 300e-6  # a tiny model's one-token decode on a CPU
# verifying n rows: steep, so a one-token match's n-gram draft does not pay on its prior
STEEP = {n: T1 * (1 + 0.5 * (n - 1)) for n in (1, 2, 4, 8, 16, 32, 64)}
SHORT = NGramOffer(1, 4, 0)  # a one-token match: what a random model's text offers
LONG = NGramOffer(24, 16, 0)  # a long match: a copy has started
EXACT = {"kv_type": "f32", "flash_attn": False, "n_threads": 2, "n_ctx": 1024}


def scheduler() -> Scheduler:
    s = Scheduler(has_drafter=False, max_tree=62, max_top_k=8)
    s.cost = cm.CostModel(cm.VerifyCurve(STEEP), {}, 0.0, max_nodes=62)
    s.choice = SourceChoice(s.cost, max_nodes=62)
    s.start(Mode("auto", None, frozenset({NGRAM})))
    return s


def drive(s: Scheduler, steps: int, *, t_plan: float, offer=SHORT, accepted: int = 0) -> list[int]:
    """Run steps whose n-gram drafts have their first `accepted` tokens accepted; the steps
    (0-based) that looked the index up."""
    looked = []
    for i in range(steps):
        looks = s.looks_up
        if looks:
            looked.append(i)
        plan = s.plan(100, 1000, offer if looks else None)
        acc = min(accepted, plan.ngram)
        t_verify = T1 * (1 + 0.5 * plan.ngram)
        costs = StepCosts(verify=t_verify, flush=0.0, draft=0.0, lookup=10e-6, build=0.0,
                          feed=0.0, glue=20e-6)  # fmt: skip
        s.observe(plan, offer if looks else None, verify_rows=1 + plan.ngram, ranks=[],
                  ngram_accepted=acc, alt_hit=False, costs=costs, emitted=1 + acc,
                  t_plan=None if plan.quiet else t_plan)  # fmt: skip
    return looked


def gaps(looked: list[int]) -> list[int]:
    return [b - a for a, b in zip(looked, looked[1:], strict=False)]


def test_a_fast_target_rests_its_lookups_once_nothing_pays_and_rests_double() -> None:
    s = scheduler()
    t_plan = 0.2 * T1  # looking up and planning: a fifth of a plain step (a tiny model)
    looked = drive(s, 400, t_plan=t_plan)
    # every step looks up until NGRAM_REST_AFTER went by without an accepted draft; the
    # next one looks up and rests
    assert looked[: NGRAM_REST_AFTER + 1] == list(range(NGRAM_REST_AFTER + 1))
    rests = gaps(looked)[NGRAM_REST_AFTER:]
    # each rest at least keeps planning within the budget: planning's share of a plain step
    # (a fifth, less what the glue adds to a plain step) over NGRAM_PLAN_BUDGET
    floor = math.ceil(s.planning.value / s.cost.step_time(None) / NGRAM_PLAN_BUDGET)
    assert 10 < floor < QUIET_STEPS + 8
    base = [QUIET_STEPS]  # doubling while nothing pays
    while len(base) < len(rests):
        base.append(min(2 * base[-1], NGRAM_REST_LONGEST))
    assert rests == [max(b, floor) for b in base]
    assert s.ngram_resting
    assert len(looked) < NGRAM_REST_AFTER + 400 // QUIET_STEPS


@pytest.mark.parametrize(("share", "shortest"), [(0.8, 70), (5.0, NGRAM_REST_CAP)])
def test_planning_that_costs_most_of_a_step_rests_long_enough_to_stay_in_budget(
    share: float, shortest: int
) -> None:
    """A tiny hybrid's planning costs 0.6-0.85 of its plain step: rests last share / budget
    steps from the first (at most NGRAM_REST_CAP), so planning stays near 1% of decoding."""
    s = scheduler()
    looked = drive(s, 2000, t_plan=share * T1)
    rests = gaps(looked)[NGRAM_REST_AFTER:]
    assert rests and min(rests) >= shortest and max(rests) <= NGRAM_REST_CAP
    planned_after = len(looked) - NGRAM_REST_AFTER
    assert planned_after * share < (2000 - NGRAM_REST_AFTER) * 2 * NGRAM_PLAN_BUDGET + share


def test_a_slow_target_never_rests() -> None:
    """Planning at a tenth of NGRAM_REST_SHARE of a plain step: resting would save nothing
    worth a copy found late."""
    s = scheduler()
    looked = drive(s, 300, t_plan=0.1 * NGRAM_REST_SHARE * T1)
    assert looked == list(range(300))
    assert not s.ngram_resting


def test_an_accepted_draft_ends_the_rests_and_a_copy_is_found_within_one() -> None:
    s = scheduler()
    t_plan = 0.1 * T1  # its rests' floor (about 10 steps) below QUIET_STEPS
    drive(s, NGRAM_REST_AFTER + 3 * 64, t_plan=t_plan)
    assert s.ngram_resting
    # a copy starts: it is looked up within the longest rest and its drafts are accepted
    looked = drive(s, NGRAM_REST_LONGEST + 40, t_plan=t_plan, offer=LONG, accepted=16)
    assert looked[0] < NGRAM_REST_LONGEST
    after = [i for i in looked if i > looked[0]]
    assert after == list(range(looked[0] + 1, NGRAM_REST_LONGEST + 40))  # every step again
    assert not s.ngram_resting
    # nothing pays again: rests start over from the shortest
    looked = drive(s, NGRAM_REST_AFTER + 3 * QUIET_STEPS, t_plan=t_plan)
    assert looked[: NGRAM_REST_AFTER + 1] == list(range(NGRAM_REST_AFTER + 1))
    assert [g for g in gaps(looked) if g > 1][0] == QUIET_STEPS


def test_without_an_ngram_source_auto_rests_as_before() -> None:
    s = scheduler()
    s.start(Mode("auto", None, frozenset()))
    planned = 0
    for _ in range(10 * QUIET_STEPS):
        plan = s.plan(100, 1000, None)
        planned += not plan.quiet
        s.observe(plan, None, verify_rows=1, ranks=[], ngram_accepted=0, alt_hit=False,
                  costs=StepCosts(STEEP[1], 0.0, 0.0, 0.0, 0.0, 0.0, 20e-6), emitted=1,
                  t_plan=None if plan.quiet else 0.0)  # fmt: skip
    assert planned == 10


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory) -> str:
    return tm.write_qwen35_target(str(tmp_path_factory.mktemp("rest") / "q.gguf"))


def test_a_tiny_hybrid_rests_its_lookups_and_stays_lossless(tiny_hybrid) -> None:
    """A random qwen35 at thousands of tokens a second: its text rarely repeats, so the n-gram
    index rests after NGRAM_REST_AFTER steps; lookups then come once per rest, and the
    output is plain decoding's."""
    with localspec.load(tiny_hybrid, draft=False, **EXACT) as eng:
        state = parts(eng).state
        lookups = [0]
        lookup = state.lookup

        def counted(*a, **kw):
            lookups[0] += 1
            return lookup(*a, **kw)

        state.lookup = counted  # type: ignore[method-assign]
        prompt = "a b c d e f g h i j k l m n o p q r s t u v w x y z"
        c = eng.complete(prompt, max_tokens=400)
        steps = eng.last_stats.steps
        assert eng.last_stats.accepted <= 2, eng.last_stats.as_dict()  # nothing pays
        assert lookups[0] < NGRAM_REST_AFTER + (steps - NGRAM_REST_AFTER) / 4, (lookups, steps)
        assert "rests" in str(eng.last_stats.auto)
        assert_greedy_lossless(eng, prompt, c)


def test_a_new_call_rests_shortly_at_first() -> None:
    """Rests grown long in one reply start short again at the next call: its prompt is new,
    and a copy of it is found within QUIET_STEPS tokens of the reply's start (where planning
    costs little enough: its rests' floor, about 10 steps here, below QUIET_STEPS)."""
    s = scheduler()
    drive(s, NGRAM_REST_AFTER + 4 * NGRAM_REST_LONGEST, t_plan=0.1 * T1)
    assert s._rest == NGRAM_REST_LONGEST
    s.start(Mode("auto", None, frozenset({NGRAM})))
    looked = drive(s, 2 * QUIET_STEPS + 2, t_plan=0.1 * T1)
    assert looked[:2] == [0, QUIET_STEPS]


def test_quiet_steps_learn_later_exactly_as_step_by_step() -> None:
    """A quiet step's learning is kept until the next plan or reason reads what auto learnt
    (run between two decodes it cost ~70 us of refilled caches a step on a tiny hybrid):
    learning then, in order with the fading owed, leaves the cost model and the evidence
    exactly as learning at every step does."""
    rng = np.random.default_rng(7)
    steps = []
    for i in range(600):  # costs that wander; copies found at first, then rarely
        u = rng.random() * (0.1 if i < 80 else 1.0)
        steps.append((T1 * rng.uniform(0.8, 1.6), 20e-6 * rng.uniform(0.5, 2.0), u))

    class StepByStep(Scheduler):
        """The reference: a quiet step that learns does so at once, as before the change."""

        def observe(self, plan, offer, **kw):  # type: ignore[no-untyped-def]
            if not (plan.quiet and plan.learn):
                return super().observe(plan, offer, **kw)
            self._since_sleep += kw["emitted"]
            kw.pop("t_plan")
            return self._learn(plan, offer, **kw)

    models = []
    for eager in (False, True):
        s = scheduler()
        if eager:
            s.__class__ = StepByStep
        deferred_seen = 0
        for i, (t_verify, glue, u) in enumerate(steps):
            looks = s.looks_up
            offer = LONG if looks and u < 0.05 else (SHORT if looks else None)
            plan = s.plan(100, 1000, offer)
            acc = min(plan.ngram, 3 if u < 0.03 else 0)
            costs = StepCosts(verify=t_verify * (1 + 0.5 * plan.ngram), flush=0.0, draft=0.0,
                              lookup=10e-6, build=0.0, feed=0.0, glue=glue)  # fmt: skip
            s.observe(plan, offer, verify_rows=1 + plan.ngram, ranks=[], ngram_accepted=acc,
                      alt_hit=False, costs=costs, emitted=1 + acc,
                      t_plan=None if plan.quiet else 0.2 * T1)  # fmt: skip
            deferred_seen = max(deferred_seen, len(s._deferred))
            if i == 300:
                s.start(Mode("auto", None, frozenset({NGRAM})))  # a new call on the way
        s.explain()  # a reading: what was kept is learnt
        assert not s._deferred
        models.append((s, deferred_seen))
    (lazy, seen), (eager, _) = models
    assert seen >= 2  # quiet steps' learning was kept for later
    assert lazy.choice.ngram.drafted.sum() > 0  # with evidence to fade
    assert lazy.cost is not None and eager.cost is not None
    assert lazy.choice is not None and eager.choice is not None
    assert lazy.choice.describe() == eager.choice.describe()
    assert lazy.cost.step_time(None) == eager.cost.step_time(None)
    assert [list(r.recent) for r in lazy.cost.plain.values()] == [
        list(r.recent) for r in eager.cost.plain.values()
    ]
    assert list(lazy.cost.verify.base.recent) == list(eager.cost.verify.base.recent)
    assert list(lazy.cost.t1_off.recent) == list(eager.cost.t1_off.recent)
    for name, arr in lazy.choice.ngram.evidence.arrays.items():
        assert np.array_equal(arr, eager.choice.ngram.evidence.arrays[name]), name
    assert np.array_equal(lazy.cost.acceptance.counts, eager.cost.acceptance.counts)
    assert lazy._unfaded == eager._unfaded == 0
