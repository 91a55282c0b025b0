"""The cost model behind n_draft="auto": what it picks for given costs and acceptance, and what
the engine does when verification is made artificially expensive or cheap."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import localspec
from localspec.auto import costmodel as cm
from localspec.auto import estimators as est
from localspec.auto.calibration import SIZES
from localspec.auto.scheduler import QUIET_STEPS
from localspec.lowlevel import parts
from localspec.runtime.clocks import cost_clock

from conftest import EXACT
from helpers.costs import CPU_RATIO, feed, inject_costs, model, price_target_decodes
from helpers.greedy import assert_greedy_lossless


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


# t(n)/t(1) measured on the H200, Qwen2.5-1.5B's shape, taps on (docs/bench, run 2)
H200_15B = {1: 1.0, 2: 1.22, 4: 1.16, 6: 1.24, 8: 1.36, 12: 1.79, 16: 1.79, 24: 1.91, 32: 2.04}


def test_an_agreeing_drafter_on_the_h200s_curve_drafts_as_deep_as_was_measured() -> None:
    """There a fixed chain of 16 ran 3.36x plain against chain 10's 2.66x: on a curve this
    flat every further position a perfect drafter drafts pays (0.22 ms against a 1.7 ms
    plain step), so auto plans as deep as the curve was measured (32 rows: 31 drafts and the
    root), which only a MAX_DEPTH past 16 allows."""
    times = {n: 1.7e-3 * r for n, r in H200_15B.items()}
    m = cm.CostModel(cm.VerifyCurve(times), {k: 0.22e-3 * k for k in cm.TOP_KS}, flush=0.3e-3)
    feed(m, [1.0, 0, 0, 0])
    plan = m.plan(budget=100)
    assert plan.shape == cm.TreeShape(31, 1, 31), plan
    assert plan.tokens > 30
    assert m.plan(budget=12).shape == cm.TreeShape(12, 1, 12)  # the budget still caps it


def test_asleep_a_hopeless_plan_is_searched_again_only_when_a_probe_would_pay() -> None:
    """A drafter asleep learns nothing new: its old evidence fades until the optimistic bound
    says a probe might pay. Searching for that every 64 steps cost auto 1.3% of plain
    decoding's speed on the H200 (a search is about a plain step there); the bound is checked
    against the threshold instead, and the probe comes when searching at every step finds it
    (within the 16 tokens by which evidence fades at once), after a handful of searches in
    thousands of steps."""
    times = {n: 1.7e-3 * r for n, r in H200_15B.items()}
    m = cm.CostModel(cm.VerifyCurve(times), {k: 0.22e-3 * k for k in cm.TOP_KS}, flush=0.3e-3)
    for _ in range(200):  # its drafts were never accepted
        m.acceptance.observe(0, cm.N_RANKS)
    assert m.plan(budget=100, fed=False).shape is None and m.hopeless
    bar, bound = m._probe_bar, m.acceptance.first_rank0_bound()

    def probe_pays(b: float) -> bool:
        return m._search(m.acceptance.probabilities(b), cm.MAX_DEPTH, (1,)).shape is not None

    assert bound < bar < 1 and probe_pays(bar) and not probe_pays(bar - 0.011)
    searched = m.searches
    found: dict[str, int] = {}  # the first step each way finds a probe
    for step in range(5000):
        m.acceptance.advance(1)
        if m.plan(budget=100, fed=False).explore:
            found.setdefault("gated", step)
        bound = m.acceptance.first_rank0_bound()
        if m._search(m.acceptance.probabilities(bound), cm.MAX_DEPTH, (1,)).shape is not None:
            found.setdefault("every step", step)
        if "gated" in found:
            break
    assert 1000 < found["every step"] <= found["gated"] <= found["every step"] + 16, found
    assert m.searches - searched <= 8, m.searches - searched


def test_asleep_a_cost_that_moved_since_the_search_brings_a_new_one() -> None:
    """Asleep, plain decoding's cost is compared with the one the last search used: a slow
    drift past 10% (a context growing) is searched again, a median flipping by less is not;
    a verify curve that moved (n-gram steps teach it while the drafter sleeps) is too."""
    m = model({n: 12e-3 * r for n, r in CPU_RATIO.items()})
    feed(m, [0.3, 0.1, 0.05, 0.55], n=40)
    m.plan(budget=100, fed=False)
    searched = m.searches

    def plain(seconds: float) -> None:
        m.observe(None, verify_rows=1, t_verify=seconds, t_flush=0.0, t_draft=0.0,
                  t_glue=30e-6, ranks=[], emitted=1)  # fmt: skip
        m.plan(budget=100, fed=False)

    for i in range(40):  # to and fro by 8%: no search
        plain(12e-3 * (1.08 if i % 2 else 1.0))
    assert m.searches == searched
    t, used, before = 12e-3, m._plan_plain, m.step_time(None)
    while m.searches == searched and t < 20e-3:  # 0.5% a step: no one step moves it 10%
        before = m.step_time(None)
        t *= 1.005
        plain(t)
    # (priced at a low quantile of recent steps, the estimate lags the drift by the window)
    assert m.searches == searched + 1 and t < 16e-3, t
    # searched at the first step whose estimate was more than 10% off the search's
    assert before <= 1.1 * used < m.step_time(None), (before, used)
    for n in (8, 16):  # the verify curve moved by half (the first decode of a size is unsettled)
        for _ in range(1 + moves_after(est.WINDOW)):
            m.observe(None, verify_rows=n, t_verify=1.5 * m.verify(n), t_flush=0.0,
                      t_draft=0.0, t_glue=None, ranks=[], emitted=1)  # fmt: skip
    m.plan(budget=100, fed=False)
    assert m.searches == searched + 2


def test_a_shape_met_after_another_size_or_dearer_than_a_bigger_one_is_not_priced_by_it(
    monkeypatch,
) -> None:
    """On the H200 (1.5B shape) auto's chain-16 verifies came mostly right after other sizes,
    when llama.cpp builds its graph again: t(17) was learnt at 7.65 ms against 5.4 ms repeated,
    above the interpolated t(20), and auto drafted 20-row trees at 2.3x plain where the fixed
    chain ran 3.1x. Such decodes do not teach a size already measured, and a size priced above
    a bigger one is priced as the bigger one. (Auto planned at most 16 deep then.)"""
    monkeypatch.setattr(cm, "MAX_DEPTH", 16)
    ratios = H200_15B | {17: 1.8, 20: 1.85}  # calibration times sizes 17 and 20 too
    times = {n: 1.7e-3 * r for n, r in ratios.items()}
    m = cm.CostModel(cm.VerifyCurve(times), {k: 0.25e-3 * (1 + 0.1 * k) for k in cm.TOP_KS},
                     flush=1.2e-3)  # fmt: skip
    feed(m, [0.97, 0.01, 0.0, 0.02], n=30)
    chain, tree = cm.TreeShape(16, 1, 16), cm.TreeShape(16, 2, 19)
    assert m.plan(budget=100).shape == chain
    t17 = m.verify(17)
    steps = ((tree, 20, m.verify(20), 7.8e-3), (chain, 17, 7.65e-3, 4.8e-3))
    for _ in range(8):  # a tree, then the chain right after it (drafting costs as measured)
        for shape, rows, t, draft in steps:
            m.observe(shape, verify_rows=rows, t_verify=t, t_flush=1.2e-3, t_draft=draft,
                      t_glue=0.4e-3, ranks=[], emitted=10)  # fmt: skip
    assert m.verify(17) == pytest.approx(t17)
    m._plan = None
    assert m.plan(budget=100).shape == chain
    for _ in range(8):  # repeated chains as dear: noise that outlasts the median
        m.observe(chain, verify_rows=17, t_verify=7.65e-3, t_flush=1.2e-3, t_draft=4.8e-3,
                  t_glue=0.4e-3, ranks=[], emitted=10)  # fmt: skip
    assert m.verify(17) <= m.verify(20) <= m.verify(24)
    m._plan = None
    plan = m.plan(budget=100).shape
    assert plan is not None and plan.is_chain and plan.depth >= 15, plan


@pytest.mark.parametrize("seed", range(8))
def test_expected_gains_is_expected_lengths_for_every_depth_and_budget(seed: int) -> None:
    """Cell by cell (pruned candidates included): the best n nodes of a tree drafted D deep,
    ties, certain and impossible ranks among the distributions."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(cm.N_RANKS + 1, rng.uniform(0.2, 3.0)), size=cm.MAX_DEPTH)
    p[rng.integers(cm.MAX_DEPTH)] = np.r_[1.0, np.zeros(cm.N_RANKS)]  # a certain depth
    p[rng.integers(cm.MAX_DEPTH), 1:4] = p[0, 1]  # tied ranks
    for k in cm.TOP_KS:
        for max_nodes in (1, 7, 30, 69):
            max_depth = min(cm.MAX_DEPTH, max_nodes)
            gains = cm.expected_gains(p, k, max_depth, max_nodes)
            for depth, vals in enumerate(cm.expected_lengths(p, k, max_depth), start=1):
                for n in range(1, max_nodes + 1):
                    ok = n == depth if k == 1 else depth <= n <= vals.size
                    want = 1.0 + vals[:n].sum() if ok else np.nan
                    assert gains[depth - 1, n - 1] == pytest.approx(want, rel=1e-12, nan_ok=True)


@pytest.mark.parametrize("seed", range(16))
def test_the_search_finds_what_pricing_every_shape_finds(seed: int) -> None:
    """The search prices every width, depth and node count in one pass per width; a brute
    force over the same shapes, each priced by step_time and valued by expected_lengths,
    finds the same best rate."""
    rng = np.random.default_rng(seed)  # GPU-like curves, drafters from poor to agreeing
    slope = rng.uniform(0.005, 0.15)
    curve = {n: 10e-3 * (1 + slope * (n - 1)) for n in (1, 2, 4, 8, 16, 24, 33)}
    widths = {k: float(rng.uniform(0.2e-3, 1e-3)) * (1 + 0.3 * k) for k in cm.TOP_KS}
    m = cm.CostModel(cm.VerifyCurve(curve), widths, flush=float(rng.uniform(0.2e-3, 1e-3)),
                     max_nodes=int(rng.choice([8, 30])))  # fmt: skip
    alpha = np.r_[10 ** rng.uniform(0.3, 2.5), rng.uniform(0.3, 3.0, size=cm.N_RANKS)]
    p = rng.dirichlet(alpha, size=cm.MAX_DEPTH)
    budget = int(rng.integers(1, cm.MAX_DEPTH + 4))
    found = m._search(p, budget, cm.TOP_KS)
    max_nodes = min(m.max_nodes, m.verify.max_measured - 1)
    rates = [1.0 / m.step_time(None)]
    for k in cm.TOP_KS:
        deepest = cm.MAX_DEPTH if k == 1 else cm.MAX_TREE_DEPTH
        for depth in range(1, min(deepest, budget, max_nodes) + 1):
            vals = cm.expected_lengths(p, k, depth)[depth - 1]
            sizes = [depth] if k == 1 else range(depth, min(vals.size, max_nodes) + 1)
            for n in sizes:
                shape = cm.TreeShape(depth, k, n)
                rates.append((1.0 + vals[:n].sum()) / m.step_time(shape))
    assert found.tokens_per_s == pytest.approx(max(rates), rel=1e-9)
    if found.shape is not None:
        assert found.tokens == pytest.approx(m.predict(found.shape, p).tokens, rel=1e-9)


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
    m.acceptance.advance(20 * int(est.HALF_LIFE))  # the evidence fades with generated tokens
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


def moves_after(window: int) -> int:
    """Observations of a lasting change before a cost priced over `window` follows it."""
    return window - int(est.LOW_Q * (window - 1))


def test_sporadic_slow_one_token_decodes_do_not_move_t1_and_a_lasting_change_does() -> None:
    c = cm.VerifyCurve({1: 10e-3, 2: 18e-3, 4: 30e-3})
    for i in range(60):  # every other one-token decode stalls tenfold, in runs of three
        c.observe(1, 100e-3 if i % 6 >= 3 else 10e-3)
    assert c(1) == pytest.approx(10e-3)
    assert c(4) == pytest.approx(30e-3)
    for _ in range(est.WINDOW_T1):
        c.observe(1, 10e-3)
    n = moves_after(est.WINDOW_T1)
    for _ in range(n - 1):  # twice as slow from now on: not yet
        c.observe(1, 20e-3)
    assert c(1) == pytest.approx(10e-3)
    c.observe(1, 20e-3)
    assert c(1) == pytest.approx(20e-3)  # corrected once it outlasts the window's low quarter
    for _ in range(moves_after(est.WINDOW)):
        c.observe(4, 60e-3)
    assert c(4) == pytest.approx(60e-3)  # and a size by its own


def test_it_never_plans_a_verify_batch_larger_than_one_measured() -> None:
    m = model({n: 10e-3 for n in (1, 2, 3, 4)})  # calibration stopped after size 4
    feed(m, [0.97, 0.01, 0.0, 0.02])
    plan = m.plan(budget=100)
    assert plan.shape is not None and plan.shape.depth == 3  # flat, but 4 rows were measured
    m.verify.observe(12, 10e-3)  # a bigger size, once measured, can be planned for
    m._plan = None
    assert m.plan(budget=100).shape.depth > 3


def test_a_shape_predicted_slower_than_plain_is_never_chosen() -> None:
    # a long chain pays; clipped to one draft near the end of max_tokens, it would not
    m = model({1: 10e-3, 2: 19.9e-3, 4: 24e-3, 8: 30e-3, 16: 50e-3}, expand=2e-3)
    feed(m, [0.9, 0.0, 0.0, 0.1])
    long = m.plan(budget=100)
    assert long.shape is not None and long.shape.depth > 1
    assert long.tokens_per_s > m.predict(None).tokens_per_s
    near_end = m.plan(budget=1)
    assert near_end.shape is None
    assert m.predict(cm.TreeShape(1, 1, 1)).tokens_per_s < m.predict(None).tokens_per_s


def test_plain_decodings_cost_is_measured_again_while_drafting() -> None:
    m = model({n: 10e-3 * (1 + 0.01 * n) for n in (1, 2, 4, 8, 16, 32, 64)})
    feed(m, [0.97, 0.01, 0.0, 0.02])
    shapes = []
    for _ in range(70):
        p = m.plan(budget=100)
        shapes.append(p.shape)
        rows = 1 if p.shape is None else p.shape.budget + 1
        m.observe(p.shape, verify_rows=rows, t_verify=m.verify(rows), t_flush=0.3e-3,
                  t_draft=1e-3, t_glue=50e-6, ranks=[], emitted=2)  # fmt: skip
    plain = [i for i, s in enumerate(shapes) if s is None]
    # two in every REFRESH_T1 + 2: the first one-token decode after a verify batch rebuilds
    # llama.cpp's graph, so t(1) is learnt from the second
    r = cm.REFRESH_T1
    assert plain == [r, r + 1, 2 * r + 2, 2 * r + 3]


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


def test_engine_turns_speculation_off_when_verification_is_expensive(agree, monkeypatch) -> None:
    with localspec.load(agree[0], draft=agree[1], **EXACT, draft_source="eagle") as eng:
        inject_costs(monkeypatch, eng, lambda n: 10e-3 * n + 10e-3 * (n - 1))
        auto = eng.complete("abcdefgh", max_tokens=120)
        assert_greedy_lossless(eng, "abcdefgh", auto)
    st = auto.stats
    assert st.shapes.get("plain", 0) >= 0.9 * st.steps, st.shapes


def test_engine_drafts_deep_when_verification_is_flat_and_the_drafter_agrees(
    agree, monkeypatch
) -> None:
    with localspec.load(agree[0], draft=agree[1], **EXACT, draft_source="eagle") as eng:
        clock = inject_costs(monkeypatch, eng, lambda n: 15e-3)  # a GPU-like flat curve
        eng.complete("abcdefgh", max_tokens=8)  # calibrates
        t0 = clock.t
        auto = eng.complete("abcdefgh", max_tokens=600)
        spent = clock.t - t0
        assert_greedy_lossless(eng, "abcdefgh", auto)
    st = auto.stats
    assert st.tau > 4, st.summary()
    depth = {s: int(re.match(r"\d+", s.split()[1]).group()) for s in st.shapes if s != "plain"}
    deep = sum(n for s, n in st.shapes.items() if depth.get(s, 0) >= 4)
    assert deep >= 0.7 * st.steps, st.shapes
    # the model's prediction is what the (injected) costs delivered
    assert st.predicted_tokens_per_s / (st.generated / spent) == pytest.approx(1.0, rel=0.35)


def test_the_deepest_chain_is_priced_by_its_own_calibrated_decode(agree, monkeypatch) -> None:
    """A GPU's t(n) moves in steps as its kernels change with the batch size. Here verifying
    costs the same up to 17 rows (a chain of 16 and the root, a shape auto runs often) and
    three times as much past them: a calibration that skipped 17 rows and interpolated it
    from 16 and 20 would price chain 16 far dearer and never run it to learn otherwise. (The
    deepest chain, 32 and the root, is timed in any case: n-gram drafts are that long.)"""
    assert {17, cm.MAX_DEPTH + 1} <= set(SIZES)
    with localspec.load(agree[0], draft=agree[1], **EXACT, draft_source="eagle") as eng:
        inject_costs(monkeypatch, eng, lambda n: 15e-3 if n <= 17 else 45e-3)
        eng.complete("abcdefgh", max_tokens=8)  # calibrates
        auto = eng.complete("abcdefgh", max_tokens=200)
        assert_greedy_lossless(eng, "abcdefgh", auto)
    st = auto.stats
    nodes = {s: int(re.search(r"(\d+)$", s).group()) for s in st.shapes if s != "plain"}
    sixteen = sum(n for s, n in st.shapes.items() if nodes.get(s) == 16)
    assert sixteen >= 0.5 * st.steps, st.shapes


def burn_costs(monkeypatch, verify, stall) -> None:
    """Target decodes cost verify(n) seconds of this thread's CPU (spun in Python), then wait
    stall(n) seconds without the CPU (as waiting for the interpreter lock does). The engine
    keeps its own clock: unlike `inject_costs`, what it learns depends on which clock it is."""

    def costly(n: int, out):
        t0 = time.thread_time()
        while time.thread_time() - t0 < verify(n):
            pass
        time.sleep(stall(n))
        return out

    price_target_decodes(monkeypatch, costly)


def test_a_host_thread_holding_the_interpreter_does_not_fool_auto(agree, monkeypatch) -> None:
    """The chat app's UI thread holding the interpreter lock made every native call return
    late; on a wall clock that wait looks the same for one token and for a big batch, so big
    batches looked cheap per token and auto drafted trees where plain decoding was best.
    Here a decode of n rows costs (2n - 1) x 2 ms of CPU, so plain decoding is best even for a
    drafter that always agrees, and every decode is followed by a 20 ms wait while a Python
    thread spins: on a wall clock a chain of 4 would look 3x faster than plain. Auto's CPU
    clock, the calling thread's CPU time, sees only the costs and stays plain.

    llama.cpp decodes on one thread here. With two, the spinning thread would take one of this
    machine's two cores from llama.cpp's pair of threads: the calling thread then spins at the
    graph's barriers waiting for its worker, which its CPU clock rightly counts as cost (it is
    real: the decode takes that long). Measured while the test flaked: a tiny model's decode
    took 18-130 ms of the calling thread's CPU (median per size, up to 300 ms) instead of
    1.2-2 ms, at random per size, so the calibrated curve was noise (t(1) 204 ms, t(2) 16 ms)
    and auto drafted. That is oversubscription, not the interpreter lock, which this test is
    about; on one thread the decode's CPU time is its own work and no core is missing."""
    assert cost_clock(False) is time.thread_time
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    hog = threading.Thread(target=spin, daemon=True)
    burn_costs(monkeypatch, lambda n: 2e-3 * (2 * n - 1), stall=lambda n: 20e-3)
    with localspec.load(
        agree[0], draft=agree[1], **{**EXACT, "n_threads": 1}, draft_source="eagle"
    ) as eng:
        assert parts(eng).probe.clock is time.thread_time
        hog.start()
        try:
            auto = eng.complete("abcdefgh", max_tokens=60)
        finally:
            stop.set()
            hog.join()
    st = auto.stats
    assert st.shapes.get("plain", 0) >= 0.9 * st.steps, st.shapes


def test_a_calibration_hit_by_stalls_is_the_cost_clocks(agree, monkeypatch) -> None:
    """Stalls during calibration (here 60 ms after every decode, as a busy UI thread would add)
    neither change the calibrated curve (exactly the costs the cost clock saw) nor cut it
    short (the time budget is on the cost clock too)."""

    def cost(n: int) -> float:
        return {1: 4e-3, 2: 7e-3, 3: 9e-3}.get(n, 9e-3 + n * 0.5e-3)

    with localspec.load(agree[0], draft=agree[1], **EXACT, draft_source="eagle") as eng:
        inject_costs(monkeypatch, eng, cost, stall=lambda n: 60e-3)
        eng.complete("abc", max_tokens=4, n_draft=0)
        eng.complete("abc", max_tokens=2)  # auto's first call calibrates
        curve = parts(eng).scheduler.cost.verify
        assert curve.max_measured >= 16
        for n in curve.ratio:
            assert curve(n) == pytest.approx(cost(n))


def test_a_curve_with_one_measured_size_still_plans() -> None:
    c = cm.VerifyCurve({1: 2.0})
    assert c(0) == 0.0 and c(1) == 2.0 and c(5) == pytest.approx(10.0)
    m = cm.CostModel(c, {1: 1e-4}, flush=1e-4)
    assert m.plan(budget=10).tokens >= 1.0


def test_auto_sleeps_where_nothing_pays_and_wakes_to_probe_again(models, monkeypatch) -> None:
    """A CPU-like verify curve and a drafter that never agrees: auto probes, gives up, then
    decodes with the drafter unfed (taps off); once the evidence has faded it feeds the
    drafter again and probes. The text is plain decoding's throughout."""
    with localspec.load(
        models["target"], draft=models["draft"], **EXACT, draft_source="eagle"
    ) as eng:
        # a CPU-like curve, the drafter's cost far above its real one: where probing stops
        # paying depends on these costs only
        inject_costs(monkeypatch, eng, lambda n: 12e-3 * (1 + 0.5 * (n - 1)), drafter=1.5e-3)
        first = eng.complete("the quick brown fox", max_tokens=100)
        assert_greedy_lossless(eng, "the quick brown fox", first)
        assert any(s.startswith("chain") for s in first.stats.shapes)  # it probed
        assert parts(eng).scheduler.cost.hopeless
        # It gave up right where the optimistic bound fell below the threshold. Record many
        # more misses so that the sleep is clear-cut.
        for _ in range(40):
            parts(eng).scheduler.cost.acceptance.observe(0, cm.N_RANKS)
        parts(eng).scheduler.cost._plan = None
        asleep = eng.complete("the quick brown fox", max_tokens=100)
        assert_greedy_lossless(eng, "the quick brown fox", asleep)
        assert asleep.stats.shapes == {"plain": asleep.stats.steps}
        assert not parts(eng).target.taps_active
        parts(eng).scheduler.cost.acceptance.advance(20 * int(est.HALF_LIFE))  # evidence fades
        parts(eng).scheduler.cost._plan = None
        # (a sleeping drafter's plan is looked at every scheduler.QUIET_STEPS plain steps, so
        # the probe comes up to that many tokens after it is due)
        again = eng.complete("the quick brown fox", max_tokens=100 + QUIET_STEPS)
        assert_greedy_lossless(eng, "the quick brown fox", again)
        assert any(s.startswith("chain") for s in again.stats.shapes)


def test_a_calibrated_time_above_a_larger_sizes_is_noise() -> None:
    """Calibration on a machine whose cores were all busy once measured t(1) at 204 ms and t(2)
    at 16 ms: taken as they were, a 1-token draft looked 13 times cheaper per token than plain
    decoding. A decode of more rows never costs less than one of fewer, so the curve is made
    monotone: a draft is then never priced below what it adds."""
    c = cm.VerifyCurve({1: 204e-3, 2: 16e-3, 3: 20e-3, 4: 19e-3, 5: 30e-3})
    assert [c(n) for n in (1, 2, 3, 4, 5)] == pytest.approx([16e-3, 16e-3, 19e-3, 19e-3, 30e-3])


def test_rank_distributions_past_the_deepest_evidence_are_the_full_recurrences() -> None:
    """Past the deepest depth with counts the recurrence is not run (each depth equals the
    one above there); every depth must equal the recurrence run over all MAX_DEPTH depths."""

    def full(a: cm.Acceptance, first: float | None) -> np.ndarray:
        out, prior = np.empty_like(a.counts), cm._PRIOR0
        for d in range(cm.MAX_DEPTH):
            c = a.counts[d]
            p = (c + cm.PRIOR_WEIGHT * prior) / (c.sum() + cm.PRIOR_WEIGHT)
            if d == 0 and first is not None:
                p = np.r_[first, p[1:] * (1 - first) / p[1:].sum()]
            out[d] = prior = p
        return out

    rng = np.random.default_rng(3)
    for _ in range(100):
        a = cm.Acceptance()
        deepest = int(rng.integers(0, cm.MAX_DEPTH + 1))
        for _ in range(int(rng.integers(0, 60)) if deepest else 0):
            a.observe(int(rng.integers(0, deepest)), int(rng.integers(0, cm.N_RANKS + 1)))
        a.advance(int(rng.integers(0, 600)))  # faded counts
        for first in (None, 0.3):
            np.testing.assert_array_equal(a.probabilities(first), full(a, first))
