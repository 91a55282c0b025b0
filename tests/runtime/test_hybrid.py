"""Hybrid targets (recurrent layers beside attention) get speculation where llama.cpp keeps
snapshots of the recurrent state (runtime/rollback.py): the state is cut back after rejected
drafts as the attention cache is, or rebuilt where its rules do not allow a cut, never left
wrong. Tiny qwen35 (gated delta nets) and lfm2 (short convolutions) targets, written here."""

from __future__ import annotations

import collections
import os
import re

import numpy as np
import pytest

import localspec
from localspec.errors import GenerationError, InvalidParameterError
from localspec.lowlevel import parts
from localspec.native import library
from localspec.native.gguf_header import GGUFHeader
from localspec.native.model import NativeContext, NativeModel
from localspec.options import RuntimeOptions
from localspec.runtime.rollback import (
    CHECKPOINT_DRAFT,
    DEFAULT_RS_SEQ,
    SNAPSHOT_TAX,
    TAX_AGREE,
    TAX_ROUNDS,
    Rollback,
    RollbackGuard,
    SnapshotTax,
    measure_snapshot_tax,
    plan_rollback,
    recurrent_row_bytes,
    with_checkpoints,
)
from localspec.runtime.target import Target

from helpers import tinymodels as tm
from helpers.chisquare import chi2_critical, chi2_of_samples, exact_distribution, repeating_prompt
from helpers.greedy import assert_greedy_lossless

EXACT = {"kv_type": "f32", "flash_attn": False, "n_threads": 2, "n_ctx": 512}
# the snapshot path these tests are about (auto may choose checkpoints by what they cost here)
SNAPSHOTS = {**EXACT, "rollback": "snapshots"}
WRITERS = {
    "qwen35": tm.write_qwen35_target,
    "lfm2": tm.write_lfm2_target,
    "nemotron_h": tm.write_nemotron_h_target,
}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def hybrid(request, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf"
    return WRITERS[request.param](str(path), cycle=8)


def test_snapshot_rows_are_sized_as_llama_cpp_sizes_them(tmp_path) -> None:
    """One snapshot of every recurrent layer: conv state (d_conv-1)(d_inner+2 n_group d_state)
    plus the delta-net state d_state d_inner (qwen35: 3 of 4 layers recurrent), or the short
    convolution's n_embd (l_cache-1) (lfm2: 3 of 4), f32."""
    q = GGUFHeader(tm.write_qwen35_target(str(tmp_path / "q.gguf")))
    assert (
        recurrent_row_bytes("qwen35", q.arch_key, 64) == 3 * (3 * (64 + 2 * 2 * 16) + 16 * 64) * 4
    )
    m = GGUFHeader(tm.write_qwen35_target(str(tmp_path / "m.gguf"), mtp=True))
    assert recurrent_row_bytes("qwen35", m.arch_key, 64) == 3 * (3 * 128 + 16 * 64) * 4  # no MTP
    lf = GGUFHeader(tm.write_lfm2_target(str(tmp_path / "l.gguf")))
    assert recurrent_row_bytes("lfm2", lf.arch_key, 64) == 3 * 64 * 2 * 4
    assert recurrent_row_bytes("mamba", lf.arch_key, 64) is None


@pytest.mark.parametrize("arch", sorted(WRITERS))
def test_snapshot_memory_is_what_llama_cpp_allocates(arch, tmp_path, monkeypatch) -> None:
    """llama.cpp logs the recurrent memory it allocates: (1 + n_rs_seq) rows of R and S."""
    log: collections.deque[str] = collections.deque(maxlen=100_000)
    monkeypatch.setattr(library, "_recent_log", log)  # the log callback appends to it
    path = WRITERS[arch](str(tmp_path / f"{arch}.gguf"))
    row = recurrent_row_bytes(arch, GGUFHeader(path).arch_key, 64)
    assert row is not None and row > 0
    model = NativeModel(path, n_gpu_layers=0)
    try:
        ctx = NativeContext(model, n_ctx=256, n_batch=64, n_threads=1, n_rs_seq=40)
        ctx.close()
        logged = re.search(r"llama_memory_recurrent: size = +([0-9.]+) MiB", "".join(log))
    finally:
        model.close()
    assert logged is not None
    assert abs(float(logged.group(1)) - 41 * row / 2**20) <= 0.006, (logged.group(0), row)


def test_a_qwen35_27b_like_shape_and_the_memory_share() -> None:
    """48 gated delta-net layers of 64 (16 k-heads, 48 v-heads of 128, conv 4): about 150 MiB
    a snapshot, so 16 GiB of weights hold 10 (1.6 GiB), not DEFAULT_RS_SEQ."""
    keys = {
        "block_count": 64, "full_attention_interval": 4, "ssm.conv_kernel": 4,
        "ssm.inner_size": 48 * 128, "ssm.state_size": 128, "ssm.group_count": 16,
    }  # fmt: skip
    row = recurrent_row_bytes("qwen35", keys.get, 5120)
    assert row is not None and 145 < row / 2**20 < 155
    plan = plan_rollback("qwen35", keys.get, n_embd=5120, n_batch=512, weights_bytes=16 << 30)
    assert plan.n_rs_seq == int(0.1 * (16 << 30) // row) < DEFAULT_RS_SEQ
    assert "fit in 10% of the weights" in plan.lowered
    small = plan_rollback("qwen35", keys.get, n_embd=5120, n_batch=8, weights_bytes=1 << 40)
    assert small.n_rs_seq == 6 and "n_batch 8" in small.lowered  # n_ubatch > n_rs_seq + 1
    none = plan_rollback("qwen35", keys.get, n_embd=5120, n_batch=2, weights_bytes=1 << 40)
    assert none.n_rs_seq == 0 and none.checkpoint and "no snapshot fits" in none.lowered
    mamba = plan_rollback("mamba", keys.get, n_embd=64, n_batch=512, weights_bytes=1 << 30)
    assert mamba.n_rs_seq == 0 and mamba.checkpoint and mamba.max_draft == CHECKPOINT_DRAFT


def test_the_guard_allows_one_cut_after_a_decode_within_its_rule() -> None:
    g = RollbackGuard(4)
    assert not g.can_cut(1)  # nothing decoded yet
    g.decoded(5)
    assert g.can_cut(4) and not g.can_cut(5)  # at most n_rs_seq
    g.decoded(3)
    assert g.can_cut(2) and not g.can_cut(3)  # at most the batch's tokens - 1
    g.cut()
    assert not g.can_cut(1)  # a second cut waits for the next decode


def test_a_context_that_would_abort_is_refused(hybrid) -> None:
    model = NativeModel(hybrid, n_gpu_layers=0)
    try:
        with pytest.raises(GenerationError, match=r"n_rs_seq=8 .* need n_batch > 9"):
            NativeContext(model, n_ctx=256, n_batch=9, n_threads=1, n_rs_seq=8)
        ctx = NativeContext(model, n_ctx=256, n_batch=10, n_threads=1, n_rs_seq=8)
        assert ctx.n_rs_seq == 8
        ctx.close()
    finally:
        model.close()


def _fresh_logits(path: str, tokens: list[int]) -> np.ndarray:
    """The next-token logits after tokens, fed one at a time to a new target."""
    t = Target(path, RuntimeOptions(**EXACT))
    try:
        logits = None
        for tok in tokens:
            logits = np.array(t.decode([tok], all_logits=False)[0])
        assert logits is not None
        return logits
    finally:
        t.close()


def test_cut_back_and_rebuilt_states_equal_a_fresh_one(hybrid) -> None:
    """A cut by the snapshots, a second cut before the next decode (rebuilt) and a cut longer
    than the snapshots (rebuilt): the next logits equal a fresh context's; a cut the guard let
    through to llama.cpp wrongly would differ by whole logits (the state holds the cut tokens)."""
    t = Target(hybrid, RuntimeOptions(**EXACT))
    try:
        assert t.recurrent and t.max_draft == t.rollback.n_rs_seq > 0
        rs = t.rollback.n_rs_seq
        prompt = [int(x) for x in np.random.default_rng(1).integers(0, 250, 12)]
        t.prefill(prompt)
        tail = [7, 8, 9, 10, 11]
        t.decode(tail, all_logits=True)
        t.keep(len(prompt) + 2)  # a cut of 3 (the snapshots)
        t.keep(len(prompt) + 1)  # a second cut before a decode: rebuilt
        want = _fresh_logits(hybrid, [*prompt, 7, 42])
        got = np.array(t.decode([42], all_logits=False)[0])
        assert np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max()))
        long = list(range(20, 20 + rs + 2))
        t.decode(long, all_logits=True)
        t.keep(t.n - rs - 1)  # longer than the snapshots: rebuilt
        want = _fresh_logits(hybrid, [*prompt, 7, 42, 20, 43])
        got = np.array(t.decode([43], all_logits=False)[0])
        assert np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max()))
        stale = _fresh_logits(hybrid, [*prompt, 7, 42, *long, 43])
        assert np.abs(stale - want).max() > 0.1  # the check can tell a wrong state
    finally:
        t.close()


@pytest.mark.parametrize("rollback", ["snapshots", "checkpoint"])
@pytest.mark.parametrize(("source", "k"), [("ngram", 4), ("ngram", "auto"), ("auto", "auto")])
def test_ngram_drafts_on_a_hybrid_are_lossless_and_accepted(hybrid, source, k, rollback) -> None:
    """Greedy output equals plain decoding replayed one token at a time (near-tie rule), with
    drafts accepted and rejected on the way: rollbacks of every length up to the snapshots, or
    (rollback="checkpoint", auto's choice where snapshots cost a plain step too much) the
    state put back from a checkpoint and the accepted tokens decoded again."""
    eng = localspec.load(hybrid, draft=False, rollback=rollback, **EXACT)
    try:
        assert eng.drafting.can_draft and not eng.drafting.has_drafter
        r = parts(eng).target.rollback
        assert r.checkpoint == (rollback == "checkpoint") and (r.n_rs_seq > 0) != r.checkpoint
        prompt = "the cat sat on the mat; the cat sat on the hat; the dog"
        # the session's n-gram memory: the reply seen once (lfm2's text does not repeat itself)
        eng.complete(prompt, max_tokens=48, n_draft=2, draft_source="ngram")
        c = eng.complete(prompt, max_tokens=96, n_draft=k, draft_source=source)
        s = eng.last_stats
        assert s.drafted > 0 and s.accepted > 0, s.as_dict()
        assert 0 < len(s.drafted_at) <= parts(eng).target.max_draft  # no draft past the snapshots
        assert_greedy_lossless(eng, prompt, c)
    finally:
        eng.close()


def test_a_fixed_chain_longer_than_the_snapshots_is_cut_to_them(hybrid) -> None:
    eng = localspec.load(hybrid, draft=False, **SNAPSHOTS)
    try:
        rs = parts(eng).target.max_draft
        assert rs is not None and 0 < rs <= DEFAULT_RS_SEQ
        prompt = "the cat sat on the mat; the cat sat on the mat; the cat"
        eng.complete(prompt, max_tokens=48, n_draft=2, draft_source="ngram")
        c = eng.complete(prompt, max_tokens=64, n_draft=32, draft_source="ngram")
        assert eng.last_stats.drafted > 0 and len(eng.last_stats.drafted_at) <= rs
        assert_greedy_lossless(eng, prompt, c)
    finally:
        eng.close()


def test_info_says_how_a_hybrid_is_speculated_on(tmp_path) -> None:
    from localspec.files.fileinfo import describe, format_info

    q = describe(tm.write_qwen35_target(str(tmp_path / "q.gguf")))
    r = q["recurrent"]
    assert r["rollback"] and r["snapshots"] == 4 and r["snapshot_bytes"] == 4 * r["row_bytes"]
    text = format_info(q)
    assert "cut back after rejected drafts by 4 snapshots (66.0 KiB, 16.5 KiB each)" in text
    assert "fit in 10% of the weights" in text
    m = format_info(describe(tm.write_mamba_target(str(tmp_path / "m.gguf"))))
    assert "no snapshots: each draft is verified from a checkpoint" in m


def test_what_runs_plain_says_why(tmp_path) -> None:
    """A hybrid loaded for plain decoding keeps no snapshots (they cost every decode); a call
    asking it for drafts runs plain and says why."""
    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    with localspec.load(q, draft=False, draft_source="none", **EXACT) as eng:
        assert parts(eng).target.max_draft == 0 and not eng.drafting.can_draft
        c = eng.complete("the cat sat", max_tokens=8, n_draft=4, draft_source="ngram")
        assert c.stats.drafted == 0
        assert c.stats.notes == [
            "qwen35: loaded for plain decoding (draft_source none), so no snapshots of its "
            "recurrent state are kept: plain decoding"
        ]
    parallel = Target(q, RuntimeOptions(**EXACT), n_seq=2)  # training data: no drafts
    try:
        assert parallel.ctx.n_rs_seq == 0 and parallel.max_draft == 0
    finally:
        parallel.close()
    m = tm.write_mamba_target(str(tmp_path / "m.gguf"))
    with localspec.load(m, draft=False, draft_source="none", **EXACT) as eng:
        c = eng.complete("the cat sat", max_tokens=8, n_draft=4, draft_source="ngram")
        assert c.stats.drafted == 0 and c.stats.notes == [
            "mamba: loaded for plain decoding (draft_source none), so no checkpoints of its "
            "recurrent state are taken: plain decoding"
        ]


# --- no snapshots: a checkpoint before each verify, a replay after rejections ------------------


@pytest.fixture(scope="module")
def mamba(tmp_path_factory) -> str:
    return tm.write_mamba_target(str(tmp_path_factory.mktemp("mamba") / "m.gguf"), cycle=8)


def test_a_checkpoint_and_replay_equal_a_fresh_state(mamba) -> None:
    """mamba keeps no snapshots: a verify's rejected tail is undone by putting back the state
    copied before it and decoding the kept tokens again; a second cut (no checkpoint left)
    rebuilds. The next logits equal a fresh context's either way."""
    t = Target(mamba, RuntimeOptions(**EXACT))
    try:
        assert t.recurrent and t.rollback.checkpoint and t.max_draft == CHECKPOINT_DRAFT
        assert t.ctx.n_rs_seq == 0
        prompt = [int(x) for x in np.random.default_rng(1).integers(0, 250, 12)]
        t.prefill(prompt)
        t.decode([7, 8, 9, 10, 11], all_logits=True)  # a verify: checkpoint first
        t.keep(len(prompt) + 2)  # 7, 8 kept: back to the checkpoint, replay
        assert t.tokens == [*prompt, 7, 8]
        want = _fresh_logits(mamba, [*prompt, 7, 8, 42])
        got = np.array(t.decode([42], all_logits=False)[0])
        assert np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max()))
        t.decode([5, 6, 7], all_logits=True)
        t.keep(t.n - 3)  # nothing kept of the verify: the checkpoint alone
        t.keep(t.n - 1)  # a second cut: no checkpoint left, rebuilt
        want = _fresh_logits(mamba, [*prompt, 7, 8, 43])
        got = np.array(t.decode([43], all_logits=False)[0])
        assert np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max()))
        stale = _fresh_logits(mamba, [*prompt, 7, 8, 42, 43])
        assert np.abs(stale - want).max() > 0.1  # the check can tell a wrong state
    finally:
        t.close()


@pytest.mark.parametrize(("source", "k"), [("ngram", 4), ("ngram", 16), ("auto", "auto")])
def test_ngram_drafts_on_mamba_are_lossless_and_accepted(mamba, source, k) -> None:
    """A fixed -k forces the checkpoint-and-replay path (auto takes it only where it pays)."""
    with localspec.load(mamba, draft=False, **EXACT) as eng:
        assert eng.drafting.can_draft
        prompt = "the cat sat on the mat; the cat sat on the hat; the dog"
        c = eng.complete(prompt, max_tokens=96, n_draft=k, draft_source=source)
        s = eng.last_stats
        if k != "auto":
            assert s.drafted > 0 and s.accepted > 0, s.as_dict()
        assert_greedy_lossless(eng, prompt, c)


def test_a_random_mamba_rejects_and_replays_losslessly(tmp_path) -> None:
    m = tm.write_mamba_target(str(tmp_path / "r.gguf"))
    with localspec.load(m, draft=False, **EXACT) as eng:
        prompt = "the cat sat on the mat; the cat sat on the mat; the cat sat on the"
        eng.complete(prompt, max_tokens=40, n_draft=2, draft_source="ngram")  # session memory
        c = eng.complete(prompt, max_tokens=80, n_draft=4, draft_source="ngram")
        s = eng.last_stats
        assert s.drafted > s.accepted > 0, s.as_dict()  # partial acceptance: replays of 2..4
        assert_greedy_lossless(eng, prompt, c)


# --- EAGLE drafters on recurrent targets: taps through the graph callback ----------------------


@pytest.mark.parametrize(
    ("arch", "rollback"),
    [("qwen35", "snapshots"), ("qwen35", "checkpoint"), ("lfm2", "snapshots"), ("mamba", "auto")],
)
def test_an_eagle_drafter_on_a_recurrent_target_is_lossless(arch, rollback, tmp_path) -> None:
    """Chains cut back by snapshots (qwen35, lfm2) or a checkpoint (qwen35 asked to, mamba); a
    random drafter, so every draft is rejected. Trees need a state per branch: where the tiny
    files' memory share holds fewer than two (beside the snapshots, or a mamba state's size)
    a tree is one clear error (test_hybrid_trees.py runs them where it holds more)."""
    writer = {**WRITERS, "mamba": tm.write_mamba_target}[arch]
    t = writer(str(tmp_path / f"{arch}.gguf"))
    d = tm.random_drafter_for(t, str(tmp_path / f"{arch}.eagle3.gguf"), taps=(1, 2, 3))
    with localspec.load(t, draft=d, rollback=rollback, **EXACT) as eng:
        assert parts(eng).target.rollback.checkpoint == (rollback != "snapshots")
        assert eng.drafting.has_drafter
        branches = parts(eng).target.branches
        assert (eng.drafting.max_tree == 0) == (branches == 0)
        assert branches or parts(eng).target.tree_note
        assert parts(eng).target.tap_route == "graph callback"
        prompt = "the cat sat on the mat"
        for k in (3, "auto"):
            c = eng.complete(prompt, max_tokens=40, n_draft=k, draft_source="eagle")
            if k == 3:
                assert eng.last_stats.sources["eagle"].drafted > 0
            assert_greedy_lossless(eng, prompt, c)
        if not branches:
            with pytest.raises(InvalidParameterError, match="verifies chains only here"):
                eng.complete(prompt, max_tokens=4, tree=(3, 2, 5))


# --- snapshots or checkpoints: auto's choice from what the snapshots cost here -----------------


def test_the_snapshots_cost_is_measured_with_and_without_them(tmp_path) -> None:
    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    model = NativeModel(q, n_gpu_layers=0)
    try:
        tax = measure_snapshot_tax(model, 4, n_threads=2, kv_type="f32", flash_attn=False)
    finally:
        model.close()
    assert tax.n_rs_seq == 4 and TAX_ROUNDS[0] <= tax.rounds <= TAX_ROUNDS[1]
    # ratios of two positive times, minus one: finite, above -1
    assert -1.0 < tax.step < 10.0 and -1.0 < tax.verify < 10.0
    assert "4 snapshots cost a plain step" in tax.text()


def test_auto_keeps_snapshots_only_where_they_cost_a_plain_step_little() -> None:
    plan = Rollback(8, 1000)
    assert with_checkpoints(plan, SnapshotTax(8, SNAPSHOT_TAX, 0.3, 5)) == plan
    swapped = with_checkpoints(plan, SnapshotTax(8, 0.08, 0.01, 5))
    assert swapped.checkpoint and swapped.n_rs_seq == 0 and swapped.row_bytes == 1000
    assert swapped.max_draft == CHECKPOINT_DRAFT
    assert "8 snapshots cost a plain step +8.0%" in swapped.lowered
    assert "verified from a checkpoint" in swapped.lowered
    none = Rollback(0, 0, why_not="x")
    assert with_checkpoints(none, SnapshotTax(0, 1.0, 1.0, 3)) == none


def test_auto_times_the_snapshots_once_per_file_and_machine(tmp_path, monkeypatch) -> None:
    """The first auto load times them and stores the result beside the calibrations; a later
    load reads it (no timing), and its choice follows the stored figure. A fixed chain (it
    drafts every step) and an explicit rollback keep the snapshots without timing."""
    from localspec.auto import calibration

    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    timed = []
    real = calibration.measure_snapshot_tax

    def counting(*a, **k):
        timed.append(1)
        return real(*a, **k)

    monkeypatch.setattr(calibration, "measure_snapshot_tax", counting)
    monkeypatch.setattr(calibration.OtherLoad, "busy", lambda self: False)  # a quiet machine
    with localspec.load(q, draft=False, **EXACT) as eng:
        first = parts(eng).target.rollback
    assert len(timed) == 1
    stored = [f for f in os.listdir(calibration.cache_dir()) if f.endswith(".json")]
    assert len(stored) == 1
    with localspec.load(q, draft=False, **EXACT) as eng:
        assert parts(eng).target.rollback == first
    assert len(timed) == 1  # read back
    for opts in ({"n_draft": 4}, {"rollback": "snapshots"}):  # a fixed chain drafts always
        with localspec.load(q, draft=False, **{**EXACT, **opts}) as eng:
            r = parts(eng).target.rollback
            assert r.n_rs_seq == 4 and not r.checkpoint
    assert len(timed) == 1
    with localspec.load(q, draft=False, recalibrate=True, **EXACT) as eng:
        pass
    assert len(timed) == 2


def _fixed_tax(monkeypatch, calibration, step: float, spread: float = 0.0) -> list[int]:
    """measure_snapshot_tax replaced by a figure (the one timing what the choice is made
    from); returns the list its calls are counted in."""
    timed: list[int] = []

    def fixed(model, n, **_):
        timed.append(n)
        return SnapshotTax(n, step, 0.0, 5, spread)

    monkeypatch.setattr(calibration, "measure_snapshot_tax", fixed)
    return timed


def test_the_stored_figure_decides_until_timed_again(tmp_path, monkeypatch) -> None:
    from localspec.auto import calibration

    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    monkeypatch.setattr(calibration.OtherLoad, "busy", lambda self: False)
    timed = _fixed_tax(monkeypatch, calibration, step=0.5)
    with localspec.load(q, draft=False, **EXACT) as eng:
        r = parts(eng).target.rollback
        assert r.checkpoint and "+50.0%" in r.lowered
    timed = _fixed_tax(monkeypatch, calibration, step=0.0)  # not asked: the stored one serves
    with localspec.load(q, draft=False, **EXACT) as eng:
        assert parts(eng).target.rollback.checkpoint
    assert timed == []
    with localspec.load(q, draft=False, recalibrate=True, **EXACT) as eng:
        r = parts(eng).target.rollback
        assert r.n_rs_seq == 4 and not r.checkpoint
    assert timed == [4]


@pytest.mark.parametrize(
    ("busy", "spread", "stored"),
    [
        (True, 0.0, False),
        (None, 2 * TAX_AGREE, False),
        (None, TAX_AGREE / 5, True),
        (False, 2 * TAX_AGREE, True),
    ],
)
def test_a_timing_is_stored_only_from_a_quiet_machine(
    tmp_path, monkeypatch, busy, spread, stored
) -> None:
    """Other programs took the cores while it was timed, or that cannot be told and the rounds
    disagree: the choice stands for this load only, and the next load times again."""
    from localspec.auto import calibration

    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    monkeypatch.setattr(calibration.OtherLoad, "busy", lambda self: busy)
    timed = _fixed_tax(monkeypatch, calibration, step=0.5, spread=spread)
    for _ in range(2):
        with localspec.load(q, draft=False, **EXACT) as eng:
            assert parts(eng).target.rollback.checkpoint
    assert len(timed) == (1 if stored else 2)


def test_a_timing_that_fails_keeps_the_snapshots(tmp_path, monkeypatch) -> None:
    from localspec.auto import calibration

    def failing(*a, **k):
        raise GenerationError("cannot create a llama.cpp context (n_ctx=256): out of memory")

    monkeypatch.setattr(calibration, "measure_snapshot_tax", failing)
    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    with localspec.load(q, draft=False, **EXACT) as eng:
        r = parts(eng).target.rollback
        assert r.n_rs_seq == 4 and not r.checkpoint and "not timed" in r.lowered
        c = eng.complete("the cat sat on the mat", max_tokens=8)
        assert len(c.tokens) == 8


def test_a_rollback_mode_that_does_not_exist_is_refused(tmp_path) -> None:
    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    with pytest.raises(InvalidParameterError, match="rollback must be one of auto, snapshots"):
        localspec.load(q, draft=False, rollback="sometimes", **EXACT)


@pytest.mark.parametrize("rollback", ["snapshots", "checkpoint"])
def test_ngram_chain_sampling_on_a_hybrid_matches_target_distribution(tmp_path, rollback) -> None:
    """Sampled n-gram drafts on a hybrid, rejected and cut back by snapshots or put back from a
    checkpoint: the completions' distribution is the target's own (chi-square at p ~ 0.001)."""
    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    with localspec.load(q, draft=False, rollback=rollback, **EXACT) as eng:
        prompt = repeating_prompt(eng, 4)
        expected = exact_distribution(eng, prompt, length=4)
        stat, df, acc = chi2_of_samples(
            eng, prompt, expected, length=4, n_samples=2000, draft_source="ngram", n_draft=2
        )
        assert parts(eng).target.rollback.checkpoint == (rollback == "checkpoint")
        ng = eng.stats.sources["ngram"]
    assert ng.drafted > 1000 and 0.05 < ng.acceptance_rate < 0.95, ng  # both ways, often
    assert df >= 20
    assert stat < chi2_critical(df), (stat, df)
