"""Speculation explains itself: auto's reason in its cost model's own numbers, notes for what a
call asked and did not get, and statistics that count only what was emitted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import localspec
from localspec.auto import costmodel as cm
from localspec.auto.verdict import break_even
from localspec.lowlevel import parts

from conftest import EXACT
from helpers.costs import CPU_RATIO, feed, inject_costs, model


@pytest.mark.parametrize("k", [1, 2, 5, 10])
@pytest.mark.parametrize("ratio", [0.9, 1.0, 1.3, 1.9, 2.7, 5.5, 11.5])
def test_break_even_solves_the_expected_length(k: int, ratio: float) -> None:
    a = break_even(ratio, k)
    if ratio > k + 1:  # even a drafter that is always right cannot pay
        assert a is None
        return
    assert a is not None and 0.0 <= a <= 1.0
    if ratio <= 1.0:
        assert a == 0.0
    else:  # 1 + a + ... + a^k tokens per step at ratio x a plain step's time: break-even
        assert sum(a**i for i in range(k + 1)) == pytest.approx(ratio, rel=1e-6)


def test_plain_on_a_cpu_curve_is_explained_by_its_numbers() -> None:
    m = model({n: 12e-3 * r for n, r in CPU_RATIO.items()})
    feed(m, [0.3, 0.1, 0.05, 0.55])  # the shipped drafter's first-position agreement
    plan = m.plan(budget=100)
    assert plan.shape is None
    v = m.explain()
    assert v is not None and v.shape is None and v.expected_speedup == pytest.approx(1.0)
    # the quoted chain is the one needing the least acceptance, from the model's own costs
    plain = m.step_time(None)
    needs = {}
    for k in range(1, min(cm.MAX_DEPTH, m.verify.max_measured - 1) + 1):
        r = m.step_time(cm.TreeShape(k, 1, k)) / plain
        needs[k] = break_even(r, k)
    feasible = {k: a for k, a in needs.items() if a is not None}
    assert v.chain == min(feasible, key=feasible.__getitem__)
    assert v.needed == pytest.approx(feasible[v.chain])
    assert v.cost_ratio == pytest.approx(m.step_time(cm.TreeShape(v.chain, 1, v.chain)) / plain)
    chain = cm.TreeShape(v.chain, 1, v.chain)
    # both in plain steps: the verify alone, then with the drafting (never the cheaper)
    assert v.verify_ratio == pytest.approx(m.verify_step(chain) / plain)
    assert 1.0 <= v.verify_ratio <= v.cost_ratio
    assert v.reached == pytest.approx(m.acceptance.probabilities()[0, 0])
    assert v.reached < v.needed  # why it is plain
    assert v.drafts_seen == pytest.approx(400)
    assert f"{v.needed:.0%} acceptance" in v.reason and f"{v.reached:.0%}" in v.reason
    assert v.reason.startswith("auto runs plain decoding")
    assert json.dumps(v.as_dict())  # JSON-ready for --json and the server


@pytest.mark.parametrize("seed", range(6))
def test_the_quoted_chain_is_the_cheapest_of_all_lengths_on_any_curve(seed: int) -> None:
    """The reason solves break-even only for lengths whose lower bound can beat the best so
    far: on random curves (steep, flat, bumpy) its chain and acceptance are those of solving
    every length, the shorter chain on a tie; where none can pay, the least hopeless."""
    rng = np.random.default_rng(seed)
    for trial in range(40):
        sizes = (1, 2, 4, 8, 16, 32, 64)
        kind = trial % 3
        if kind == 0:  # steep (a CPU): often nothing pays
            r = np.cumsum([1.0, *rng.uniform(0.05, 1.0, len(sizes) - 1)])
        elif kind == 1:  # flat (a GPU)
            r = 1.0 + np.cumsum([0.0, *rng.uniform(0.0, 0.05, len(sizes) - 1)])
        else:  # bumpy
            r = np.maximum.accumulate(np.array(sizes) ** rng.uniform(0.1, 1.2))
        m = model({n: 10e-3 * x for n, x in zip(sizes, r, strict=True)})
        feed(m, [0.5, 0.1, 0.05, 0.35], n=50, seed=trial)
        m.plan(budget=100)
        v = m.explain(eagle=bool(trial % 2))
        assert v is not None
        plain = m.step_time(None)
        ratios = {}
        for k in range(1, min(cm.MAX_DEPTH, m.verify.max_measured - 1) + 1):
            chain = cm.TreeShape(k, 1, k)
            cost = m.verify_step(chain) + (m.drafting(chain) if trial % 2 else 0.0)
            ratios[k] = cost / plain
        needs = {k: break_even(x, k) for k, x in ratios.items()}
        feasible = {k: a for k, a in needs.items() if a is not None}
        if feasible:
            least = min(feasible.values())
            assert v.needed == pytest.approx(least, abs=1e-9)
            assert v.chain == min(k for k, a in feasible.items() if a <= least + 1e-9)
        else:
            assert v.needed is None
            assert v.chain == min(ratios, key=lambda k: ratios[k] / (k + 1))


def test_a_curve_where_nothing_can_pay_says_so() -> None:
    m = model({n: 12e-3 * n * 1.3 for n in (1, 2, 4, 8, 16)})
    feed(m, [1.0, 0, 0, 0])
    assert m.plan(budget=100).shape is None
    v = m.explain()
    assert v is not None and v.needed is None and "no acceptance can pay" in v.reason


def test_drafting_on_a_flat_curve_gives_its_expected_gain() -> None:
    m = model({n: 10e-3 * (1 + 0.01 * n) for n in (1, 2, 4, 8, 16, 32, 64)})
    feed(m, [0.97, 0.01, 0.0, 0.02])
    plan = m.plan(budget=100)
    v = m.explain()
    assert v is not None and v.shape == plan.shape and not v.explore
    assert v.expected_speedup == pytest.approx(plan.tokens_per_s / m.predict(None).tokens_per_s)
    assert v.expected_speedup > 3
    assert v.reason.startswith(f"auto drafts {plan.shape}: expected {v.expected_speedup:.2f}x")


def test_engine_reports_why_auto_ran_plain(agree, monkeypatch) -> None:
    # EAGLE's cost logic (with n-gram drafts too the reason says "no EAGLE drafts": below)
    with localspec.load(agree[0], draft=agree[1], **EXACT, draft_source="eagle") as eng:
        inject_costs(monkeypatch, eng, lambda n: 10e-3 * n + 10e-3 * (n - 1))
        out = eng.complete("abcdefgh", max_tokens=80)
        cost = parts(eng).scheduler.cost
    v = out.stats.auto
    assert v is not None and v.shape is None
    assert v.cost_ratio == pytest.approx(
        cost.step_time(cm.TreeShape(v.chain, 1, v.chain)) / cost.step_time(None)
    )
    d = out.stats.as_dict()
    assert d["auto"]["choice"] == "plain" and d["auto"]["reason"] == v.reason
    assert out.stats.auto.reason.startswith("auto runs plain decoding")


def test_engine_reports_why_auto_ran_neither_source(agree, monkeypatch) -> None:
    """Both sources (draft_source auto): a plain run's reason names both."""
    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        inject_costs(monkeypatch, eng, lambda n: 10e-3 * n + 10e-3 * (n - 1))
        out = eng.complete("abcdefgh", max_tokens=80)
    v = out.stats.auto
    assert out.stats.shapes == {"plain": out.stats.steps}
    assert v is not None and v.shape is None and v.eagle and v.ngram
    assert v.reason.startswith("auto runs no EAGLE drafts") and "n-gram drafts" in v.reason


def test_engine_reports_the_expected_gain_when_drafting(agree, monkeypatch) -> None:
    # EAGLE's cost logic: with n-gram drafts too, the alphabet's repeats are drafted by them
    with localspec.load(agree[0], draft=agree[1], **EXACT, draft_source="eagle") as eng:
        inject_costs(monkeypatch, eng, lambda n: 15e-3)  # a GPU-like flat curve
        eng.complete("abcdefgh", max_tokens=8)
        out = eng.complete("abcdefgh", max_tokens=100)
    v = out.stats.auto
    assert v is not None and v.shape is not None and v.expected_speedup > 2, v
    assert v.drafts_seen >= 5 and v.reached > 0.8  # the prior (0.5, weight 4) still counts
    assert eng.stats.auto is v  # the engine's running totals keep the latest reason


def test_fixed_modes_have_no_auto_reason(agree) -> None:
    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        assert eng.complete("abc", max_tokens=10, n_draft=3).stats.auto is None
        assert eng.complete("abc", max_tokens=10, n_draft=0).stats.auto is None


def test_what_cannot_be_honoured_is_noted(agree) -> None:
    with localspec.load(agree[0], draft=False, **EXACT) as eng:
        assert eng.complete("abc", max_tokens=4).stats.notes == []
        st = eng.complete("abc", max_tokens=4, n_draft=3).stats
        assert st.mode == "plain" and st.notes == [
            "n_draft=3 runs plain decoding: no EAGLE drafter (draft=False)"
        ]
        st = eng.complete("abc", max_tokens=4, tree=(2, 2, 4)).stats
        assert st.notes and st.notes[0].startswith("tree 2x2/4 runs plain decoding")
    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        st = eng.complete("abc", max_tokens=4, n_draft=3, tree=(2, 2, 4)).stats
        assert st.mode == "tree 2x2/4"
        assert st.notes == ["both n_draft=3 and tree 2x2/4 were given: the tree runs"]


def test_drafts_accepted_past_a_stop_string_are_not_counted(agree) -> None:
    """A chain accepted whole can run past the stop string; what was never emitted does not
    count as accepted (it did not with max_tokens either)."""
    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        whole = eng.complete("abcdefgh", max_tokens=40, n_draft=8)
        text = whole.text
        stop = text[len(text) // 3 : len(text) // 3 + 2]
        out = eng.complete("abcdefgh", max_tokens=40, n_draft=8, stop=[stop])
    st = out.stats
    assert out.finish_reason == "stop"
    assert st.accepted == sum(out.accepted), (st.accepted, out.accepted)
    assert st.accepted < st.drafted  # the last chain was accepted past the stop
    assert sum(st.accepted_at) == st.accepted
    assert st.tau == pytest.approx((st.accepted + st.steps) / st.steps)


def test_ngram_drafts_accepted_past_a_stop_string_are_not_counted_for_their_source(agree) -> None:
    """The same for n-gram drafts: the source's own count is cut back with the total, so the
    per-source figures add up to what was emitted."""
    with localspec.load(agree[0], draft=False, **EXACT) as eng:
        whole = eng.complete("abcdefghijklmnopqrstuvwxyz", max_tokens=40, n_draft=8,
                             draft_source="ngram")  # fmt: skip
        text = whole.text
        stop = text[len(text) // 2 : len(text) // 2 + 2]
        out = eng.complete("abcdefghijklmnopqrstuvwxyz", max_tokens=40, n_draft=8,
                           draft_source="ngram", stop=[stop])  # fmt: skip
    st = out.stats
    assert out.finish_reason == "stop"
    ngram = st.sources["ngram"]
    assert ngram.accepted == st.accepted == sum(out.accepted) > 0, (st.sources, out.accepted)
    assert st.accepted < st.drafted  # the last chain was accepted past the stop
    assert ngram.tau == pytest.approx((ngram.accepted + ngram.steps) / ngram.steps)


def test_cli_says_why_and_warns(agree, tmp_path) -> None:
    cmd = [sys.executable, "-m", "localspec.cli", "generate", agree[0], "-p", "abc", "-n", "6"]
    lonely = str(tmp_path / "lonely.gguf")  # the target with no drafter beside it
    shutil.copy(agree[0], lonely)
    run = subprocess.run(
        [*cmd, "--draft", agree[1], "--stats", "--kv-type", "f32"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "auto " in run.stderr.splitlines()[-1]  # the reason follows the summary
    # --no-draft is draft source none: plain decoding asked for, nothing to warn about
    run = subprocess.run(
        [*cmd[:4], lonely, *cmd[5:], "-k", "3"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0
    assert "warning: -k 3 runs plain decoding: no drafter found" in run.stderr
    run = subprocess.run(
        [*cmd, "-k", "3", "--tree", "2,2,4"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "localspec: error: --tree 2,2,4 and -k/--n-draft 3 both ask for a draft shape: "
        "give one of them"
    ]
    js = subprocess.run(
        [*cmd, "--draft", agree[1], "--json"], capture_output=True, text=True, timeout=300
    )
    stats = json.loads(js.stdout)["stats"]
    assert stats["auto"]["reason"].startswith("auto ") and stats["notes"] == []
    assert np.isfinite(stats["auto"]["chain_cost_ratio"])
