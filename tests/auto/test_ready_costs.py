"""What keeping the drafter ready costs, and how auto weighs it: plain steps priced with the taps
on (the drafter fed) and off, the cost of switching them, a fed drafter that stops being fed
once that tax has paid for waking it again, and auto at plain decoding's speed with a useless
drafter where verifying is flat (an H100-like curve, taps-on steps 8% dearer)."""

from __future__ import annotations

import os

import pytest

import localspec
from localspec.auto import costmodel as cm
from localspec.auto import estimators as est
from localspec.auto.calibration import Calibration
from localspec.auto.scheduler import (
    QUIET_STEPS,
    SLEEP_AFTER,
    WAKE_AFTER,
    Mode,
    Scheduler,
)
from localspec.lowlevel import parts
from localspec.speculation.drafttree import EAGLE, NGRAM
from localspec.speculation.probe import StepCosts
from localspec.speculation.sources.ngram import NGramOffer
from localspec.speculation.tree import TreeShape

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.costs import CostClock, price_target_decodes
from helpers.greedy import assert_greedy_lossless

# t(n)/t(1) measured on the H100 with the taps on, Llama 3.1 8B's shape (docs/benchmarks.md)
H100_8B = {1: 1.0, 2: 1.11, 4: 1.31, 8: 1.83, 16: 2.01, 32: 2.27}
T1 = 3.64e-3  # its one-token decode, seconds
TAPS_ON = 1.08  # a decode with the taps on costs this much more (the graph is rebuilt)
REBUILD = 3e-3  # a decode of another size than the one before builds llama.cpp's graph anew
SWITCH = 7.9e-3  # the decode after the taps were switched rebuilds the scheduler (H200)


def h100_ratio(n: int) -> float:
    sizes = sorted(H100_8B)
    for a, b in zip(sizes, sizes[1:], strict=False):
        if a <= n <= b:
            return H100_8B[a] + (H100_8B[b] - H100_8B[a]) * (n - a) / (b - a)
    return H100_8B[32] + 0.02 * (n - 32)


def test_plain_steps_are_priced_fed_and_unfed() -> None:
    curve = cm.VerifyCurve({1: 10.8e-3, 2: 12e-3, 4: 14e-3})
    m = cm.CostModel(curve, {1: 0.3e-3}, 0.4e-3, ready=cm.ReadyCosts(10.8e-3, 10e-3, 2e-3))
    # the bar every draft must beat is plain decoding with the drafter unfed
    assert m.step_time(None) == pytest.approx(10e-3 + cm.PLAIN_GLUE)
    assert m.ready_tax == pytest.approx(0.8e-3)
    assert m.rewake_cost() == pytest.approx(2 * 2e-3 + 0.8e-3)
    for _ in range(10):  # the context grew: fed steps cost 12 ms, unfed ones 11 ms
        m.observe(None, verify_rows=1, t_verify=12e-3, t_flush=0.0, t_draft=0.2e-3,
                  t_glue=50e-6, ranks=[], emitted=1, fed=True)  # fmt: skip
        m.observe(None, verify_rows=1, t_verify=11e-3, t_flush=0.0, t_draft=0.0,
                  t_glue=50e-6, ranks=[], emitted=1, fed=False)  # fmt: skip
    assert m.plain[True].value == pytest.approx(12.25e-3)  # the decode, the feed, the glue
    assert m.plain[False].value == pytest.approx(11.05e-3)
    assert m.step_time(None) == pytest.approx(11.05e-3)
    assert m.ready_tax == pytest.approx(1.2e-3)
    assert m.verify(1) == pytest.approx(12e-3)  # the curve learns from fed decodes alone
    # while fed for a long time the unfed cost follows t(1): the context keeps growing
    for _ in range(est.WINDOW_T1):  # (a low quantile of the recent ones: all of a window)
        m.observe(None, verify_rows=1, t_verify=13.2e-3, t_flush=0.0, t_draft=0.2e-3,
                  t_glue=50e-6, ranks=[], emitted=1, fed=True)  # fmt: skip
    assert m.step_time(None) == pytest.approx(11.05e-3 * 1.1)
    # the decode right after a switch costs the switch on top of its size's decode
    for _ in range(est.WINDOW):
        m.observe(None, verify_rows=1, t_verify=13.2e-3 + 5e-3, t_flush=0.0, t_draft=0.0,
                  t_glue=50e-6, ranks=[], emitted=1, fed=True, switched=True)  # fmt: skip
    assert m.switch.value == pytest.approx(5e-3)
    assert m.verify(1) == pytest.approx(13.2e-3)  # and teaches nothing else


def test_an_untapped_model_has_one_plain_cost() -> None:
    m = cm.CostModel(cm.VerifyCurve({1: 10e-3, 2: 12e-3}), {}, 0.0)  # no drafter, no taps
    for _ in range(10):
        m.observe(None, verify_rows=1, t_verify=11e-3, t_flush=0.0, t_draft=0.0,
                  t_glue=0.0, ranks=[], emitted=1, fed=False)  # fmt: skip
    assert m.ready_tax == 0.0
    assert m.verify(1) == pytest.approx(11e-3) and m.step_time(None) == pytest.approx(11e-3)


def idle_steps_until_sleep(ready: cm.ReadyCosts, sched: Scheduler | None = None) -> int:
    """Steps a fed drafter stays fed while long n-gram drafts win every step."""
    curve = {n: 10e-3 * (1 + 0.02 * n) for n in (1, 2, 4, 8, 16, 24, 33)}
    sched = sched or Scheduler(has_drafter=True, max_tree=30, max_top_k=4)
    sched.calibrated(Calibration(curve, {1: 0.3e-3, 2: 0.35e-3, 4: 0.4e-3}, 0.4e-3, ready))
    assert sched.choice is not None
    for _ in range(50):  # a context the n-gram index matches well: 24-token drafts accepted
        sched.choice.ngram.observe(9, 24, 24)
    sched.start(Mode("auto", sources=frozenset({EAGLE, NGRAM})))
    assert sched.feeds_drafter
    offer = NGramOffer(match_len=32, length=24, alternatives=0)
    for step in range(1, 2 * SLEEP_AFTER):
        plan = sched.plan(100, 1000, offer)
        assert plan.ngram > 0 and plan.eagle is None, plan
        if plan.sleep:
            return step
        costs = StepCosts(verify=curve[24], flush=0.0, draft=0.0, lookup=20e-6, build=20e-6,
                          feed=0.1e-3, glue=80e-6)  # fmt: skip
        sched.observe(plan, offer, verify_rows=25, ranks=[], ngram_accepted=24, alt_hit=False,
                      costs=costs, emitted=25)  # fmt: skip
    raise AssertionError("the drafter stayed fed")


def test_a_fed_drafter_that_does_not_draft_sleeps_once_its_tax_pays_for_waking() -> None:
    """Ski rental: staying fed costs the ready tax each step, sleeping and waking again costs
    two switches and a fed step; once the taxes paid add up to that, it sleeps. Taps that
    cost nothing extra keep it fed until SLEEP_AFTER. (The fed one-token decode is the
    curve's t(1), 10.2 ms: calibration times both, and the cost model takes the lower.)"""
    taxed = idle_steps_until_sleep(cm.ReadyCosts(10.2e-3, 9.4e-3, 2e-3))
    assert taxed == 6  # 0.8 ms a step against 2 x 2 ms + 0.8 ms
    dear_switch = idle_steps_until_sleep(cm.ReadyCosts(10.2e-3, 9.4e-3, 8e-3))
    assert dear_switch == 21  # 16.8 ms of switching is worth 21 taxed steps
    assert idle_steps_until_sleep(cm.ReadyCosts(10e-3, 10e-3, 2e-3)) == SLEEP_AFTER


def test_a_drafter_put_to_sleep_stays_asleep_from_call_to_call() -> None:
    """Waking it at every call would pay two switches of the taps and a probe per reply: it
    sleeps on (fixed modes in between feed it for their own call) until a probe is due."""
    sched = Scheduler(has_drafter=True, max_tree=30, max_top_k=4)
    idle_steps_until_sleep(cm.ReadyCosts(10.2e-3, 9.4e-3, 2e-3), sched)
    assert sched.cost is not None and not sched.cost.hopeless  # drafting might still pay
    auto = Mode("auto", sources=frozenset({EAGLE, NGRAM}))
    sched.start(auto)
    assert not sched.feeds_drafter
    sched.start(Mode("chain", TreeShape(3, 1, 3)))
    assert sched.feeds_drafter
    sched.start(auto)
    assert not sched.feeds_drafter


def test_a_drafter_asleep_because_other_sources_won_wakes_when_it_would_win() -> None:
    """The n-gram index stops matching: the EAGLE plan wins the very next step, so the drafter
    is woken then (no waiting for a probe's due time, which is for a drafter that did not
    pay); a drafter left out by a call's options is fed again by the next call that drafts
    with it."""
    sched = Scheduler(has_drafter=True, max_tree=30, max_top_k=4)
    idle_steps_until_sleep(cm.ReadyCosts(10.2e-3, 9.4e-3, 2e-3), sched)
    assert sched.dormant
    plan = sched.plan(100, 1000, None)  # nothing to copy from the context
    assert plan.wake and not sched.dormant
    sched.start(Mode("auto", sources=frozenset({NGRAM})))
    assert sched.dormant and not sched.feeds_drafter
    sched.start(Mode("auto", sources=frozenset({EAGLE, NGRAM})))
    assert sched.feeds_drafter


def steps_until_woken(agreeing: bool, n: int = 300, drafts: int = 60) -> tuple[int | None, int]:
    """A drafter sent to sleep because calibration caught plain decoding at 0.5 ms of its 10
    (a noisy reading: no draft could beat it), then plain steps at the true cost. Its
    acceptance so far: always right (agreeing) or never. (The step it was woken at, or None
    within n steps; the searches and reuses of the cost model's plan meanwhile.)"""
    curve = {n: 10e-3 * (1 + 0.02 * n) for n in (1, 2, 4, 8, 16, 24, 33)}  # GPU-like
    sched = Scheduler(has_drafter=True, max_tree=30, max_top_k=4)
    ready = cm.ReadyCosts(10.2e-3, 0.5e-3, 2e-3)
    sched.calibrated(Calibration(curve, {1: 0.3e-3, 2: 0.35e-3, 4: 0.4e-3}, 0.4e-3, ready))
    cost = sched.cost
    assert cost is not None
    for _ in range(drafts):
        for d in range(cm.MAX_DEPTH):
            cost.acceptance.observe(d, 0 if agreeing else cm.N_RANKS)
    planned = [0]
    search = cost.plan

    def counted(*a, **kw):
        planned[0] += 1
        return search(*a, **kw)

    cost.plan = counted  # type: ignore[method-assign]
    sched.start(Mode("auto"))
    plan = sched.plan(100, 1000, None)
    # nothing beats a 0.5 ms plain step: asleep from the start (the first search ran when
    # it was calibrated) or sent to sleep now
    assert (plan.sleep or sched.dormant) and cost.hopeless
    for step in range(1, n + 1):
        costs = StepCosts(verify=10e-3, flush=0.0, draft=0.0, lookup=0.0, build=0.0,
                          feed=0.0, glue=30e-6)  # fmt: skip
        sched.observe(plan, None, verify_rows=1, ranks=[], ngram_accepted=0, alt_hit=False,
                      costs=costs, emitted=1)  # fmt: skip
        plan = sched.plan(100, 1000, None)
        if plan.wake:
            return step, planned[0]
        assert plan.eagle is None and not plan.ngram
    return None, planned[0]


def test_a_drafter_sent_to_sleep_by_a_noisy_cost_wakes_once_plain_steps_measure_it() -> None:
    """The plain steps it sleeps through measure plain decoding's true cost (10 ms); the mean
    estimates, backed by 60 drafts of its own, then expect drafting to pay, so it wakes within
    a few dozen steps instead of waiting hundreds of tokens for a probe's due time (before:
    a drafter that always agreed ran plain for a whole 2,000-token call on this CPU). One
    that never agreed, or whose few drafts are mostly prior, sleeps on until its probe is
    due, and then is probed on time although quiet steps do not plan."""
    woken, _ = steps_until_woken(agreeing=True)
    assert woken is not None and woken <= 3 * QUIET_STEPS, woken
    woken, _ = steps_until_woken(agreeing=True, drafts=4, n=WAKE_AFTER - 1)
    assert woken is None  # 4 drafts: below WAKE_EVIDENCE
    woken, planned = steps_until_woken(agreeing=False, n=WAKE_AFTER - 1)
    assert woken is None
    # asleep, it plans once per QUIET_STEPS plain steps: planning costs a GPU's plain step
    # a few per cent, which auto with a useless drafter must not pay
    assert planned <= WAKE_AFTER / QUIET_STEPS + 1, planned
    woken, _ = steps_until_woken(agreeing=False, n=2 * WAKE_AFTER)
    assert woken is not None and WAKE_AFTER <= woken <= WAKE_AFTER + cm.REPLAN_LATEST, woken


@pytest.fixture(scope="module")
def useless(tmp_path_factory) -> tuple[str, str]:
    """The agreeing pair's target with a random drafter (never accepted)."""
    d = tmp_path_factory.mktemp("useless")
    target, _ = tm.write_agreeing_pair(str(d))
    return target, tm.random_drafter_for(target, os.path.join(str(d), "random.eagle3.gguf"))


def test_auto_with_a_useless_drafter_runs_at_plains_speed_where_verifying_is_flat(
    useless, monkeypatch
) -> None:
    """Costs priced like the H100's 8B-shaped target (t(k)/t(1) 1.11 at 2 tokens, 2.27 at 32;
    a decode with the taps on 8% dearer; a decode of another size than the last rebuilds the
    graph; one after the taps were switched rebuilds the scheduler) and a drafter that never
    agrees: once its first probes failed, auto's time per token, on the injected cost clock,
    stays within 1% of plain decoding's, with the taps off on almost every step. Calibration
    saw the taps' cost and the switch's; the rebuilt graphs did not pass for t(1) (on the H200
    they did, and auto kept drafting at 0.54x plain)."""
    target, draft = useless
    with localspec.load(target, draft=draft, **EXACT, draft_source="eagle") as eng:
        clock = CostClock()
        parts(eng).probe.clock = clock
        tgt = parts(eng).target
        ones = {True: 0, False: 0}
        last = {"n": 1, "taps": tgt.taps_active}

        def costly(n: int, out):
            t = T1 * h100_ratio(n) * (TAPS_ON if tgt.taps_active else 1.0)
            t += (REBUILD if n != last["n"] else 0.0) + (
                SWITCH if tgt.taps_active != last["taps"] else 0.0
            )
            clock.t += t
            last.update(n=n, taps=tgt.taps_active)
            if n == 1:
                ones[tgt.taps_active] += 1
            return out

        price_target_decodes(monkeypatch, costly)
        eng.complete("abcdefgh", max_tokens=2)  # calibrates
        sched = parts(eng).scheduler
        cost = sched.cost
        assert cost is not None and not sched.dormant
        assert cost.plain[True].value / cost.plain[False].value == pytest.approx(1.08, abs=0.01)
        assert cost.switch.value == pytest.approx(SWITCH, rel=0.3)
        # the drafter was right a moment ago (say, on another topic): auto drafts until its
        # evidence says otherwise, meeting the rebuilt graphs of plain steps among drafts
        for _ in range(60):
            cost.acceptance.observe(0, 0)
        cost._plan = None
        eng.complete("abcdefgh", max_tokens=600)
        assert sched.dormant  # it was put to sleep
        assert cost.verify(1) == pytest.approx(T1 * TAPS_ON, rel=0.02)
        per_token = {}
        for mode, kw in (("plain", {"n_draft": 0}), ("auto", {})):
            eng.reset()
            ones[True] = ones[False] = 0
            t0, searched = clock.t, cost.searches
            c = eng.complete("abcdefgh", max_tokens=600, **kw)
            if mode == "auto":
                # asleep, the plan is searched again only as old evidence fades or plain
                # decoding's cost moves: a search costs about a GPU's plain step in host time
                # (which this clock does not count), and one every 64 steps cost auto 1.3% of
                # plain's speed on the H200
                assert cost.searches - searched <= 3, cost.searches - searched
            per_token[mode] = (clock.t - t0) / c.stats.generated
            assert_greedy_lossless(eng, "abcdefgh", c)
        assert per_token["auto"] <= 1.01 * per_token["plain"], per_token
        assert ones[True] <= 0.05 * (ones[True] + ones[False]), ones
