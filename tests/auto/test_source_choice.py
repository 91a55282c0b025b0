"""Auto's choice among draft sources (sourcechoice.SourceChoice): plain decoding, the EAGLE
plan, an n-gram chain or tree, or both merged, from injected costs and learned acceptance; and
what the engine runs when verification is made artificially cheap or expensive."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import localspec
from localspec.auto import costmodel as cm
from localspec.auto import estimators as est
from localspec.auto.costmodel import Plan
from localspec.auto.scheduler import Scheduler
from localspec.auto.sourcechoice import MATCH_BUCKETS, Choice, SourceChoice, bucket
from localspec.speculation.drafttree import NGRAM
from localspec.speculation.mode import Mode
from localspec.speculation.sources.ngram import ALT_LEN, NGramOffer
from localspec.speculation.tree import TreeShape

from conftest import EXACT
from helpers.costs import CPU_RATIO, inject_costs
from helpers.greedy import assert_greedy_lossless

SIZES = (1, 2, 4, 8, 16, 32, 64)
FLAT = {n: 10e-3 * (1 + 0.01 * n) for n in SIZES}  # GPU-like: a draft costs almost nothing
CPU = {n: 12e-3 * r for n, r in CPU_RATIO.items()}  # verify n rows ~ n x one (measured)
STEEP = {n: 10e-3 * (1 + 0.15 * (n - 1)) for n in SIZES}  # drafting pays only when accepted


def chooser(times: dict[int, float], *, drafter: bool = False) -> SourceChoice:
    """A SourceChoice over a verify curve (and, with drafter, an EAGLE drafter's costs)."""
    widths = {k: 0.2e-3 * (1 + 0.1 * k) for k in cm.TOP_KS} if drafter else {}
    cost = cm.CostModel(cm.VerifyCurve(times), widths, 0.3e-3 if drafter else 0.0)
    return SourceChoice(cost)


def plain(sc: SourceChoice) -> Plan:
    return Plan(None, 1.0, sc.cost.step_time(None))


def learn(sc: SourceChoice, match_len: int, drafted: int, accepted: int, n: int = 50) -> None:
    """n steps whose main continuation (of a match of match_len) had its first `accepted` of
    `drafted` tokens accepted."""
    offer = NGramOffer(match_len, drafted, 0)
    for _ in range(n):
        sc.observe(offer, drafted, accepted, 0, False, t_build=None, t_glue=None, emitted=1)


def plain_tps(sc: SourceChoice) -> float:
    return 1.0 / sc.cost.step_time(None)


# --- what it picks ---------------------------------------------------------------------------


def test_flat_verification_and_a_long_match_always_accepted_pick_a_long_chain() -> None:
    sc = chooser(FLAT)
    learn(sc, 32, 24, 24)
    c = sc.choose(plain(sc), NGramOffer(32, 32, 0), budget=100)
    assert c.eagle.shape is None and c.ngram >= 16 and c.ngram_alts == 0, c
    assert c.tokens > 10 and c.tokens_per_s > 5 * plain_tps(sc), c


def test_cpu_verification_and_short_matches_rarely_accepted_pick_plain() -> None:
    sc = chooser(CPU)
    for m in (1, 2, 3):
        learn(sc, m, 4, 0, n=45)
        learn(sc, m, 4, 1, n=5)
    for m, alts in itertools.product((1, 2, 3), (0, 2)):
        c = sc.choose(plain(sc), NGramOffer(m, 16, alts), budget=100)
        assert not c.drafts and c.label == "plain", (m, c)


def test_a_short_unmeasured_match_on_the_cpu_is_not_drafted_and_a_long_accepted_one_is() -> None:
    """On a CPU-like curve the prior alone (first-position acceptance 15% for a 1-token match)
    cannot pay, while a long match that was always accepted does."""
    sc = chooser(CPU)
    assert not sc.choose(plain(sc), NGramOffer(1, 16, 0), budget=100).drafts
    learn(sc, 32, 8, 8)
    c = sc.choose(plain(sc), NGramOffer(32, 16, 0), budget=100)
    assert c.ngram >= 2 and c.tokens_per_s > plain_tps(sc), c


def sweep() -> list[tuple[str, SourceChoice]]:
    """Choosers on several curves and learned states."""
    out = []
    for name, times in (("flat", FLAT), ("cpu", CPU), ("steep", STEEP)):
        for state in ("prior", "good", "bad"):
            sc = chooser(times)
            for m in MATCH_BUCKETS:
                if state == "good":
                    learn(sc, m, 12, 12, n=10)
                elif state == "bad":
                    learn(sc, m, 4, 0, n=10)
                    for _ in range(10):  # alternatives hit: they become worth drafting
                        sc.observe(NGramOffer(m, 4, 2), 4, 0, 2, True,
                                   t_build=None, t_glue=None, emitted=1)  # fmt: skip
            out.append((f"{name}/{state}", sc))
    return out


def test_no_choice_is_predicted_slower_than_plain_and_every_limit_holds() -> None:
    """Over curves, learned states, offers and budgets: never predicted slower than plain,
    never more nodes than the largest measured verify batch minus the root, never more nodes
    (so never deeper) than the budget, never more than the offer holds."""
    seen_alts = seen_long = 0
    for name, sc in sweep():
        p = plain(sc)
        for m, length, alts, budget in itertools.product(
            (1, 3, 8, 32), (1, 5, 40), (0, 1, 2), (1, 2, 5, 9, 100)
        ):
            offer = NGramOffer(m, length, alts)
            c = sc.choose(p, offer, budget)
            what = (name, offer, budget, c)
            assert c.tokens_per_s >= plain_tps(sc) - 1e-12, what
            if c.drafts:
                assert c.tokens_per_s > plain_tps(sc), what
            assert c.nodes <= sc.cost.verify.max_measured - 1, what
            assert c.nodes <= budget, what
            assert c.ngram <= length and c.ngram_alts <= alts, what
            seen_alts += c.ngram_alts > 0
            seen_long += c.ngram >= 16
    assert seen_alts and seen_long  # the limits were tested on choices that reach them


def test_it_never_plans_more_nodes_than_a_measured_verify_batch() -> None:
    sc = chooser({n: 10e-3 for n in (1, 2, 3, 4)})  # calibration stopped after 4 rows
    learn(sc, 32, 24, 24)
    c = sc.choose(plain(sc), NGramOffer(32, 32, 2), budget=100)
    assert c.ngram == 3 and c.nodes == 3, c
    sc.cost.verify.observe(12, 10e-3)  # a bigger size, once measured, can be planned for
    assert sc.choose(plain(sc), NGramOffer(32, 32, 2), budget=100).nodes == 11


def test_alternative_branches_fit_the_cells_left() -> None:
    """Near the end of the context (free cells 2: the root and one node) a tree of a 1-token
    continuation and two 4-token alternatives (9 nodes) was planned: its verify found no room
    in the cache and the call failed. The scheduler's plan now fits."""
    s = Scheduler(has_drafter=False, max_tree=62, max_top_k=8)
    s.cost = cm.CostModel(cm.VerifyCurve(FLAT), {}, 0.0, max_nodes=62)
    s.choice = SourceChoice(s.cost, max_nodes=62)
    s.start(Mode("auto", None, frozenset({NGRAM})))
    for budget, free in ((1, 2), (3, 4), (5, 6), (30, 12), (100, 200)):
        plan = s.plan(budget, free, NGramOffer(2, 32, 2))
        nodes = plan.ngram + plan.ngram_alts * ALT_LEN
        assert plan.ngram > 0 and nodes <= min(budget, free - 1), (budget, free, plan)
    assert s.plan(100, 200, NGramOffer(2, 32, 2)).ngram_alts > 0  # room: alternatives come


# --- learning ----------------------------------------------------------------------------------


def test_a_bucket_whose_drafts_are_rejected_stops_drafting_and_long_matches_go_on() -> None:
    sc = chooser(STEEP)
    short, long_ = NGramOffer(2, 16, 0), NGramOffer(32, 16, 0)
    assert sc.choose(plain(sc), short, 100).drafts  # the prior alone drafts a 2-token match
    assert sc.choose(plain(sc), long_, 100).drafts
    steps = 0
    for _ in range(60):
        c = sc.choose(plain(sc), short, 100)
        if not c.drafts:
            break
        steps += 1
        sc.observe(short, c.ngram, 0, 0, False, t_build=None, t_glue=None, emitted=1)
        learn(sc, 32, 8, 8, n=1)  # meanwhile long matches are accepted
    assert not sc.choose(plain(sc), short, 100).drafts, steps
    assert 1 <= steps <= 20, steps
    assert bucket(2) != bucket(32)
    c = sc.choose(plain(sc), long_, 100)
    assert c.ngram >= 4, c
    # an untouched bucket keeps its prior: a 4-token match still drafts
    assert sc.choose(plain(sc), NGramOffer(4, 16, 0), 100).drafts


def test_rejections_fade_and_the_bucket_drafts_again() -> None:
    sc = chooser(STEEP)
    learn(sc, 2, 4, 0, n=40)
    assert not sc.choose(plain(sc), NGramOffer(2, 16, 0), 100).drafts
    sc.ngram.advance(20 * int(est.HALF_LIFE))  # the evidence fades with generated tokens
    assert sc.choose(plain(sc), NGramOffer(2, 16, 0), 100).drafts


def test_deep_positions_follow_their_own_acceptance() -> None:
    """A continuation accepted for exactly 3 tokens and then rejected: chains stop near 3."""
    sc = chooser(STEEP)
    learn(sc, 32, 16, 3, n=100)
    c = sc.choose(plain(sc), NGramOffer(32, 16, 0), 100)
    assert 2 <= c.ngram <= 4, c


# --- merged trees ------------------------------------------------------------------------------


def test_a_merged_tree_is_chosen_when_both_sources_pay() -> None:
    """EAGLE drafts that pay alone and n-gram drafts that pay alone, on a flat curve: the tree
    holding both (the EAGLE part counts when the n-gram's first token is rejected) beats
    either."""
    sc = chooser(FLAT, drafter=True)
    # the n-gram source: a continuation either copied whole or wrong from its first token
    learn(sc, 4, 8, 8, n=20)
    learn(sc, 4, 8, 0, n=20)
    eagle_shape = TreeShape(3, 2, 6)
    eagle = Plan(eagle_shape, 3.0, sc.cost.step_time(eagle_shape))
    assert eagle.tokens_per_s > plain_tps(sc)
    offer = NGramOffer(4, 8, 0)
    alone = sc.choose(plain(sc), offer, 100)
    assert alone.ngram > 0 and alone.tokens_per_s > plain_tps(sc)
    c = sc.choose(eagle, offer, 100)
    assert c.eagle.shape == eagle_shape and c.ngram > 0, c
    assert " + " in c.label, c.label
    assert c.tokens_per_s > max(alone.tokens_per_s, eagle.tokens_per_s), c
    assert c.nodes == c.ngram + eagle_shape.budget
    # the merged tree is never chosen past the budget
    small = sc.choose(eagle, offer, 5)
    assert small.nodes <= 5, small


def test_a_merged_choice_is_priced_from_its_parts() -> None:
    """Merged: tokens = the n-gram chain's + (1 - a0) x the EAGLE plan's extra tokens;
    seconds = a verify of both's rows with the step's bookkeeping (never less than a plain
    step) + the n-gram's build + the EAGLE drafting."""
    sc = chooser(FLAT, drafter=True)
    eagle_shape = TreeShape(3, 2, 6)
    eagle = Plan(eagle_shape, 3.0, sc.cost.step_time(eagle_shape))
    c = sc.choose(eagle, NGramOffer(4, 8, 0), 100)
    assert c.eagle.shape is not None and c.ngram > 0, c
    a = sc.ngram.rates(bucket(4))
    tokens = 1.0 + np.cumprod(a)[: c.ngram].sum() + (1 - a[0]) * (eagle.tokens - 1.0)
    v = sc.cost.verify
    verify = max(v(c.nodes + 1) + sc.glue.value, sc.cost.step_time(None))
    seconds = verify + sc.build.value + sc.cost.drafting(eagle_shape)
    assert c.tokens == pytest.approx(tokens)
    assert c.seconds == pytest.approx(seconds)
    assert isinstance(c, Choice)


# --- the engine ------------------------------------------------------------------------------


def test_engine_drafts_ngrams_where_verification_is_flat(agree, monkeypatch) -> None:
    prompt = "abcdefghijklmnopqrstuvwxyzabc"
    with localspec.load(agree[0], draft=False, **EXACT, draft_source="auto") as eng:
        inject_costs(monkeypatch, eng, lambda n: 15e-3)  # a GPU-like flat curve
        c = eng.complete(prompt, max_tokens=150)
        assert_greedy_lossless(eng, prompt, c)
    st = c.stats
    ngram = sum(n for s, n in st.shapes.items() if s.startswith("ngram"))
    assert ngram >= 0.8 * st.steps, st.shapes
    assert st.sources[NGRAM].accepted >= 100, st.sources
    assert st.steps <= 30  # long chains: about 5 or more tokens per step


def test_engine_decodes_plainly_where_verification_is_expensive(agree, monkeypatch) -> None:
    """n rows cost (2n - 1) one-row decodes: even drafts that are always accepted cannot pay."""
    prompt = "abcdefghijklmnopqrstuvwxyzabc"
    with localspec.load(agree[0], draft=False, **EXACT, draft_source="auto") as eng:
        inject_costs(monkeypatch, eng, lambda n: 10e-3 * n + 10e-3 * (n - 1))
        c = eng.complete(prompt, max_tokens=120)
        assert_greedy_lossless(eng, prompt, c)
    st = c.stats
    assert st.shapes.get("plain", 0) >= 0.9 * st.steps, st.shapes
