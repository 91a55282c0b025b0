"""The cost model behind n_draft="auto": what it picks for given costs and acceptance, and what
the engine does when verification is made artificially expensive or cheap."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import localspec
from localspec import costmodel as cm
from localspec.drafter import Drafter
from localspec.target import Target

from conftest import EXACT
from greedy import assert_greedy_lossless

# measured on the project's 2-core CPU: SmolLM2 Q4_1, one decode of n tokens, t(n)/t(1)
CPU_RATIO = {1: 1.0, 2: 1.64, 3: 2.23, 4: 2.89, 5: 3.63, 6: 3.18, 8: 4.0, 12: 6.7, 16: 8.5}


def model(times: dict[int, float], expand: float = 0.2e-3) -> cm.CostModel:
    widths = {k: expand * (1 + 0.1 * k) for k in cm.TOP_KS}
    return cm.CostModel(cm.VerifyCurve(times), widths, flush=0.3e-3)


def feed(m: cm.CostModel, rank_probs: list[float], n: int = 400, seed: int = 0) -> None:
    """n observations per depth with the given rank distribution (last entry: miss)."""
    rng = np.random.default_rng(seed)
    p = np.array(rank_probs) / sum(rank_probs)
    for _ in range(n):
        for d in range(cm.MAX_DEPTH):
            m.acceptance.observe(d, int(rng.choice(len(p), p=p)))


def test_expensive_verification_picks_plain_decoding() -> None:
    m = model({n: 12e-3 * r for n, r in CPU_RATIO.items()})
    feed(m, [0.3, 0.1, 0.05, 0.55])  # the shipped drafter's first-position agreement
    plan = m.plan(budget=100)
    assert plan.shape is None and not plan.explore
    # even a perfect drafter cannot pay when n tokens cost more than n single decodes
    m2 = model({n: 12e-3 * n * 1.3 for n in (1, 2, 4, 8, 16, 32, 64)})
    feed(m2, [1.0, 0, 0, 0])
    assert m2.plan(budget=100).shape is None


def test_flat_verification_and_an_agreeing_drafter_pick_a_long_chain() -> None:
    m = model({n: 10e-3 * (1 + 0.01 * n) for n in (1, 2, 4, 8, 16, 32, 64)})
    feed(m, [0.97, 0.01, 0.0, 0.02])
    plan = m.plan(budget=100)
    assert plan.shape is not None and plan.shape.depth >= 8, plan
    assert plan.tokens > 6  # expected tokens per step


def test_flat_verification_and_an_unsure_drafter_grow_a_tree() -> None:
    m = model({n: 10e-3 * (1 + 0.005 * n) for n in (1, 2, 4, 8, 16, 32, 64)})
    feed(m, [0.45, 0.2, 0.1, 0.05, 0.2])  # right answer often 2nd or 3rd choice
    plan = m.plan(budget=100)
    assert plan.shape is not None and plan.shape.top_k > 1 and plan.shape.budget > 8, plan


def test_budget_caps_the_depth() -> None:
    m = model({n: 10e-3 for n in (1, 2, 4, 8, 16, 32, 64)})
    feed(m, [0.97, 0.01, 0.0, 0.02])
    assert m.plan(budget=3).shape.depth <= 3
    assert m.plan(budget=0).shape is None


def test_without_evidence_it_probes_then_stops_then_probes_again() -> None:
    m = model({n: 12e-3 * r for n, r in CPU_RATIO.items()})
    first = m.plan(budget=100)
    assert first.shape is not None and first.explore and first.shape.is_chain
    for _ in range(12):  # the probes all fail
        m.acceptance.observe(0, cm.N_RANKS)
    m._plan = None
    assert m.plan(budget=100).shape is None
    m.acceptance.advance(20 * int(cm.HALF_LIFE))  # the evidence fades with generated tokens
    m._plan = None
    assert m.plan(budget=100).explore


def test_verify_curve_interpolates_extrapolates_and_follows_measurements() -> None:
    c = cm.VerifyCurve({1: 1.0, 2: 2.0, 4: 3.0})
    assert c(3) == pytest.approx(2.5)
    # past the last size: the steeper of the last slope (0.5) and the mean slope (2/3)
    assert c(8) == pytest.approx(3.0 + 4 * 2 / 3)
    assert cm.VerifyCurve({1: 1.0, 2: 1.2, 4: 4.0})(6) == pytest.approx(6.8)  # last: 1.4
    for _ in range(200):  # the context grew: everything costs twice as much
        c.observe(1, 2.0)
        c.observe(4, 6.0)
    assert c(1) == pytest.approx(2.0, rel=0.02)
    assert c(4) == pytest.approx(6.0, rel=0.05)
    assert c(2) == pytest.approx(4.0, rel=0.05)  # never measured again: scaled with t(1)


def test_a_size_first_met_while_generating_replaces_its_guess_without_moving_t1() -> None:
    # calibration caught noise at size 3: the extrapolated t(11) is far too cheap
    c = cm.VerifyCurve({1: 10e-3, 2: 30e-3, 3: 20e-3})
    assert c(11) < 0.1
    c.observe(11, 0.21)
    assert c(11) == pytest.approx(0.21)  # the first measurement replaces the guess at once
    assert c(1) == pytest.approx(10e-3)  # and did not drag t(1) along with the guess's error
    for _ in range(10):
        c.observe(11, 0.21)
        c.observe(1, 10e-3)
    assert c(11) == pytest.approx(0.21, rel=0.02) and c(1) == pytest.approx(10e-3, rel=0.02)


def _slow_target(monkeypatch, cost) -> None:
    """Make every target decode of n rows take at least cost(n) seconds."""
    decode, verify_tree = Target.decode, Target.verify_tree

    def slow(self, tokens, *, all_logits):
        t0 = time.perf_counter()
        out = decode(self, tokens, all_logits=all_logits)
        time.sleep(max(0.0, cost(len(tokens)) - (time.perf_counter() - t0)))
        return out

    def slow_tree(self, root, tokens, depths, parents):
        t0 = time.perf_counter()
        out = verify_tree(self, root, tokens, depths, parents)
        time.sleep(max(0.0, cost(len(tokens) + 1) - (time.perf_counter() - t0)))
        return out

    monkeypatch.setattr(Target, "decode", slow)
    monkeypatch.setattr(Target, "verify_tree", slow_tree)


def test_engine_turns_speculation_off_when_verification_is_expensive(agree, monkeypatch) -> None:
    _slow_target(monkeypatch, lambda n: 10e-3 * n + 10e-3 * (n - 1))
    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        auto = eng.complete("abcdefgh", max_tokens=120)
        assert_greedy_lossless(eng, "abcdefgh", auto)
    st = auto.stats
    assert st.shapes.get("plain", 0) >= 0.9 * st.steps, st.shapes


def test_engine_drafts_deep_when_verification_is_flat_and_the_drafter_agrees(
    agree, monkeypatch
) -> None:
    _slow_target(monkeypatch, lambda n: 15e-3)  # a GPU-like flat curve
    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        auto = eng.complete("abcdefgh", max_tokens=150)
        assert_greedy_lossless(eng, "abcdefgh", auto)
    st = auto.stats
    assert st.tau > 4, st.summary()
    depth = {s: int(re.match(r"\d+", s.split()[1]).group()) for s in st.shapes if s != "plain"}
    deep = sum(n for s, n in st.shapes.items() if depth.get(s, 0) >= 4)
    assert deep >= 0.7 * st.steps, st.shapes
    # the stats carry the model's prediction next to the measured speed
    assert st.predicted_tokens_per_s > 0
    assert 0.3 < st.predicted_tokens_per_s / st.tokens_per_s < 3, st.summary()


def test_a_curve_with_one_measured_size_still_plans() -> None:
    c = cm.VerifyCurve({1: 2.0})
    assert c(0) == 0.0 and c(1) == 2.0 and c(5) == pytest.approx(10.0)
    m = cm.CostModel(c, {1: 1e-4}, flush=1e-4)
    assert m.plan(budget=10).tokens >= 1.0


def test_auto_sleeps_where_nothing_pays_and_wakes_to_probe_again(models, monkeypatch) -> None:
    """A CPU-like verify curve and a drafter that never agrees: auto probes, gives up, then
    decodes with the drafter unfed (taps off); once the evidence has faded it feeds the
    drafter again and probes. The text is plain decoding's throughout."""
    _slow_target(monkeypatch, lambda n: 12e-3 * (1 + 0.5 * (n - 1)))
    # Fix the drafter's cost too (far above its real one): the point where probing stops
    # paying then depends on these costs only, not on how busy the machine is.
    drafter_decode = Drafter.decode

    def slow_drafter(self, tokens, embd, pos0):
        t0 = time.perf_counter()
        out = drafter_decode(self, tokens, embd, pos0)
        time.sleep(max(0.0, 1.5e-3 - (time.perf_counter() - t0)))
        return out

    monkeypatch.setattr(Drafter, "decode", slow_drafter)
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        first = eng.complete("the quick brown fox", max_tokens=100)
        assert_greedy_lossless(eng, "the quick brown fox", first)
        assert any(s.startswith("chain") for s in first.stats.shapes)  # it probed
        assert eng.scheduler.cost.hopeless
        # It gave up right where the optimistic bound fell below the threshold, so timing
        # noise alone could wake it again. Record many more misses so that the sleep is
        # clear-cut on any machine.
        for _ in range(40):
            eng.scheduler.cost.acceptance.observe(0, cm.N_RANKS)
        eng.scheduler.cost._plan = None
        asleep = eng.complete("the quick brown fox", max_tokens=100)
        assert_greedy_lossless(eng, "the quick brown fox", asleep)
        assert asleep.stats.shapes == {"plain": asleep.stats.steps}
        assert not eng.target.taps_active
        eng.scheduler.cost.acceptance.advance(20 * int(cm.HALF_LIFE))  # evidence fades
        eng.scheduler.cost._plan = None
        again = eng.complete("the quick brown fox", max_tokens=100)
        assert_greedy_lossless(eng, "the quick brown fox", again)
        assert any(s.startswith("chain") for s in again.stats.shapes)
