"""Draft trees: greedy output identical to plain greedy, per-node logits equal to lone path
decodes, clean KV caches afterwards, and clear errors for shapes that cannot run."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import localspec
from localspec.errors import InvalidParameterError
from localspec.lowlevel import parts
from localspec.speculation.generation import Generation
from localspec.speculation.mode import Mode
from localspec.speculation.plan import StepPlan
from localspec.speculation.sampling import SamplingParams
from localspec.speculation.sources.eagle import _top
from localspec.speculation.tree import TreeShape

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.greedy import F32_MARGIN, assert_greedy_lossless, replay_plain_greedy

PROMPTS = ["the quick brown fox", "Once upon a time, there was", "x", "1 2 3 4 5 6 7 8 9 10"]
SHAPES = [(1, 2, 2), (2, 2, 3), (4, 2, 6), (3, 4, 12), (6, 3, 20), (8, 8, 62)]


@pytest.fixture(scope="module")
def engines(models, agree):
    with (
        localspec.load(models["target"], draft=models["draft"], **EXACT) as e3,
        localspec.load(models["target"], draft=models["draft31"], **EXACT) as e31,
        localspec.load(agree[0], draft=agree[1], **EXACT) as ea,
    ):
        yield {"eagle3": e3, "eagle3.1": e31, "agree": ea}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pair", ["eagle3", "eagle3.1", "agree"])
def test_tree_greedy_is_plain_greedy(engines, pair, shape) -> None:
    eng = engines[pair]
    for prompt in PROMPTS:
        spec = eng.complete(prompt, max_tokens=100, tree=shape)
        assert len(spec.tokens) == 100 and spec.text == eng.detokenize(spec.tokens)
        assert_greedy_lossless(eng, prompt, spec)
        assert spec.stats.mode == str(TreeShape(*shape))
    if pair == "agree":  # the agreeing drafter's trees are accepted deep
        assert spec.stats.tau > min(shape[0], 3), spec.stats.summary()


def test_auto_greedy_equals_plain(engines) -> None:
    for eng in engines.values():
        for prompt in PROMPTS:
            auto = eng.complete(prompt, max_tokens=80)  # n_draft="auto" is the default
            assert_greedy_lossless(eng, prompt, auto)
            assert auto.stats.mode == "auto"
            assert sum(auto.stats.shapes.values()) == auto.stats.steps


def test_tree_leaves_both_caches_clean(engines) -> None:
    eng = engines["agree"]
    c = eng.complete("abcdefgh", max_tokens=50, tree=(5, 4, 24), add_special=False)
    n = len(eng.tokenize("abcdefgh", add_special=False)) + len(c.tokens) - 1
    # the target holds exactly the committed tokens in sequence 0, no tree sequence survives
    assert parts(eng).target.ctx.seq_pos_max(0) == n - 1 == parts(eng).target.n - 1
    assert all(
        parts(eng).target.ctx.seq_pos_max(s) == -1 for s in range(1, parts(eng).target.gap_seq)
    )
    assert all(parts(eng).drafter.ctx.seq_pos_max(s) == -1 for s in range(1, 17))


def test_tree_node_logits_equal_lone_path_decodes(engines) -> None:
    """Independent reference: each node's row of the one-batch tree verify equals the target's
    logits after decoding that node's path alone, one token at a time, in a fresh cache."""
    eng = engines["eagle3.1"]
    tokens = eng.tokenize("Once upon a time")
    shape = TreeShape(4, 3, 14)
    gen = Generation(
        parts(eng), tokens, lock=lambda g: contextlib.nullcontext(), totals=eng.stats,
        max_tokens=8, sampling=SamplingParams(),
        seed=0, stops=[], mode=Mode("tree", shape),
    )  # fmt: skip
    gen.prefill()  # driven by hand, outside the engine's calls
    tree = parts(eng).state.draft(StepPlan(shape), np.random.default_rng(0))
    assert len(tree.tokens) == 14 and max(tree.depths) >= 3
    got = parts(eng).target.verify_tree(gen.last, tree.tokens, tree.depths, tree.parents).copy()

    def path(i: int) -> list[int]:
        out = []
        while i >= 0:
            out.append(tree.tokens[i])
            i = tree.parents[i]
        return out[::-1]

    for row in range(15):
        ctx = [*tokens, gen.last] + (path(row - 1) if row else [])
        parts(eng).target.clear()
        parts(eng).target.decode(tokens, all_logits=False)
        for t in ctx[len(tokens) :]:
            want = parts(eng).target.decode([t], all_logits=False)[0]
        np.testing.assert_allclose(got[row], want, atol=2e-4, rtol=1e-4)
    eng.reset()


def _prefilled(eng, prompt: str, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    """The engine's caches emptied, then prompt prefilled by hand (outside the engine's calls),
    so a step's draft can be driven straight from its parts."""
    eng.reset()
    gen = Generation(
        parts(eng), eng.tokenize(prompt), lock=lambda g: contextlib.nullcontext(),
        totals=eng.stats, max_tokens=8, sampling=SamplingParams(),
        seed=0, stops=[], mode=mode,
    )  # fmt: skip
    gen.prefill()


def _draft(eng, prompt: str, shape: TreeShape, ranks: bool):  # type: ignore[no-untyped-def]
    """One step's draft of shape after prompt, straight from the engine's parts."""
    _prefilled(eng, prompt, Mode("tree", shape))
    return parts(eng).state.draft(StepPlan(shape, ranks=ranks), np.random.default_rng(0))


def test_tree_nodes_rank_their_own_children_first(engines) -> None:
    """Each expanded node's kept logits are its own, unmasked: the children drafted under a
    node rank 0, 1, ... there, in the tree's (better first) order, as a chain's picks do.
    Without ranks (a fixed shape: nothing learns from them) the same tree keeps no rows."""
    eng = engines["eagle3"]
    shape = TreeShape(4, 3, 14)
    tree = _draft(eng, "Once upon a time", shape, True)
    checked = 0
    for node, kids in tree.children().items():
        ranks = [tree.scores[node].rank(t) for t in kids]  # dicts keep the tree's order
        assert ranks == list(range(len(kids))), (node, ranks)
        checked += len(kids)
    assert checked == len(tree) == 14
    plain = _draft(eng, "Once upon a time", shape, False)
    assert plain.tokens == tree.tokens and plain.parents == tree.parents and not plain.scores
    eng.reset()


def test_tree_shapes_that_cannot_run_are_refused(models) -> None:
    with pytest.raises(InvalidParameterError, match="depth"):
        TreeShape(0, 2, 4)
    with pytest.raises(InvalidParameterError, match="budget"):
        TreeShape(4, 2, 64)
    with pytest.raises(InvalidParameterError, match="DEPTH,TOP_K,BUDGET"):
        TreeShape.parse("4,2")
    small = {**EXACT, "n_batch": 16, "draft_batch": 8}
    with localspec.load(models["target"], draft=models["draft"], **small) as eng:
        with pytest.raises(InvalidParameterError, match="does not fit"):
            eng.complete("abc", max_tokens=4, tree=(4, 2, 20))  # 20 nodes > n_batch - 1
        with pytest.raises(InvalidParameterError, match="top_k 3"):
            eng.complete("abc", max_tokens=4, tree=(3, 4, 8))  # 2 banks of 4 + 1 > 8
        with pytest.raises(InvalidParameterError, match="n_draft"):
            eng.complete("abc", max_tokens=4, n_draft="fast")
        # the largest shapes that fit still run, and stay lossless
        assert_greedy_lossless(eng, "abc", eng.complete("abc", max_tokens=40, tree=(5, 3, 14)))


def test_auto_and_trees_respect_tiny_batches(models) -> None:
    """n_batch/draft_batch bound the tree (nodes, top-k); at the smallest sizes auto falls back
    to chains and plain decoding, and stays lossless."""
    for n_batch, draft_batch in ((2, 2), (4, 3), (8, 5)):
        opts = {**EXACT, "n_batch": n_batch, "draft_batch": draft_batch}
        with localspec.load(models["target"], draft=models["draft31"], **opts) as eng:
            for kw in ({}, {"tree": (3, 1, 3)}):  # auto, a top-1 tree
                c = eng.complete("the quick brown fox", max_tokens=40, **kw)
                assert_greedy_lossless(eng, "the quick brown fox", c)


def test_a_tree_without_a_drafter_decodes_plainly(models) -> None:
    with localspec.load(models["target"], draft=False, **EXACT) as eng:
        tree = eng.complete("abc", max_tokens=20, tree=(4, 2, 8))
        assert tree.stats.drafted == 0 and tree.stats.shapes == {"plain": tree.stats.steps}
        assert_greedy_lossless(eng, "abc", tree)


def test_a_top1_tree_is_the_chain_of_its_budget() -> None:
    shape = TreeShape(5, 1, 3)
    assert (shape.depth, shape.budget, str(shape)) == (3, 3, "chain 3")
    assert TreeShape(2, 1, 6) == TreeShape(2, 1, 2)


def test_a_trees_acceptance_rule_does_not_depend_on_the_engines_n_draft(agree) -> None:
    """tree=(D,1,B) accepts by the target's own position-keyed draws whatever n_draft the
    engine was loaded with, so a seed gives plain sampling's text in both engines."""
    target, draft = agree
    kw = {"max_tokens": 40, "temperature": 1.0, "seed": 3, "tree": (5, 1, 3)}
    texts = []
    for n_draft in (4, "auto"):
        with localspec.load(target, draft=draft, n_draft=n_draft, **EXACT) as eng:
            c = eng.complete("abc", **kw)
            assert max(c.stats.drafted_at and [len(c.stats.drafted_at)]) <= 3
            assert set(c.stats.shapes) <= {"chain 3", "chain 2", "chain 1", "plain"}
            texts.append(c.tokens)
            kw_plain = {k: v for k, v in kw.items() if k != "tree"}
            assert c.tokens == eng.complete("abc", n_draft=0, **kw_plain).tokens
    assert texts[0] == texts[1]


def test_a_tree_near_the_end_of_the_context(models) -> None:
    """Wide trees until the context is full: rejected nodes between accepted ones park cells
    in the gap sequence, which is given back when the room runs out; trees that no longer fit
    fall back to chains; every token stays plain greedy's."""
    with localspec.load(
        models["target"], draft=models["draft31"], **{**EXACT, "n_ctx": 256}
    ) as eng:
        gaps, tokens = [], []
        for ev in eng.complete_stream("abc", max_tokens=1000, tree=(4, 3, 12)):
            gaps.append(parts(eng).target.gap_cells)
            tokens += ev.tokens
        assert ev.finish_reason == "context_full"
        assert len(tokens) == eng.n_ctx - len(eng.tokenize("abc")) + 1
        assert max(gaps) > 0 and gaps[-1] == 0  # parked, then released
        shapes = eng.last_stats.shapes
        assert "tree 4x3/12" in shapes and any(s.startswith("chain") for s in shapes), shapes
        replay_plain_greedy(eng, eng.tokenize("abc"), tokens, margin=F32_MARGIN)


def test_trees_in_a_small_batch_park_gap_cells_in_a_sequence_that_exists(models) -> None:
    """With n_batch 16 a tree has at most 14 nodes, and the target's sequences end at 16: the
    gap sequence is the last one (it was a fixed 63, past n_seq_max, whenever n_batch < 64)."""
    opts = {**EXACT, "n_batch": 16, "draft_batch": 8}
    with localspec.load(models["target"], draft=models["draft31"], **opts) as eng:
        assert parts(eng).target.gap_seq == parts(eng).max_tree + 1 == 15
        gaps, tokens = [], []
        for ev in eng.complete_stream("the quick brown fox", max_tokens=150, tree=(4, 3, 12)):
            gaps.append(parts(eng).target.gap_cells)
            tokens += ev.tokens
        assert max(gaps) > 0  # rejected nodes between accepted ones were parked
        replay_plain_greedy(eng, eng.tokenize("the quick brown fox"), tokens, margin=F32_MARGIN)


class _Vocab:
    """What _top asks of a drafter: which target ids it can propose (None: all)."""

    def __init__(self, ids: np.ndarray | None) -> None:
        self.ids = ids

    def draft_ids(self, logits: np.ndarray) -> np.ndarray | None:
        return self.ids


@pytest.mark.parametrize("reduced", [False, True], ids=["full vocab", "d2t vocab"])
def test_a_trees_candidates_are_the_best_k_by_a_full_sort_and_leave_the_logits_alone(
    reduced,
) -> None:
    """The k best candidates of each frontier row (k passes of argmax, masking in place) are
    those of a full stable sort, log-probabilities by a float64 log-softmax, ties to the lower
    id; the logits (a view of llama.cpp's buffer) are as they were, and the rows kept for the
    nodes' rank statistics are the draft vocabulary's logits, unmasked."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((4, 3000)) * 3).astype(np.float32)
    logits[1, [5, 9, 2000]] = logits[1].max() + 1.0  # a three-way tie at the top
    ids = np.sort(rng.choice(3000, 1000, replace=False)) if reduced else None
    if reduced:  # the tie lies inside the draft vocabulary
        ids = np.union1d(ids, [5, 9, 2000])
    before = logits.copy()
    levels: list[np.ndarray] = []
    tok, lp, kept = _top(_Vocab(ids), logits, 8, levels, 2)  # type: ignore[arg-type]
    assert np.array_equal(logits, before)
    sub = logits[:, ids] if reduced else logits
    assert np.array_equal(kept, sub) and not np.shares_memory(kept, logits)
    assert np.shares_memory(kept, levels[2])  # the level's buffer, kept for the next step
    order = np.argsort(-sub, axis=-1, kind="stable")[:, :8]
    want = ids[order] if reduced else order
    assert np.array_equal(tok, want)
    s64 = sub.astype(np.float64)
    lse = np.log(np.exp(s64 - s64.max(-1, keepdims=True)).sum(-1)) + s64.max(-1)
    assert np.allclose(lp, np.take_along_axis(s64, order, -1) - lse[:, None], atol=1e-5)
    assert list(tok[1, :3]) == [5, 9, 2000]
    frozen = before.copy()
    frozen.flags.writeable = False  # a buffer it may not mask in place: it works on a copy
    tok2, _, _ = _top(_Vocab(None), frozen, 8, levels, 2)  # type: ignore[arg-type]
    assert np.array_equal(tok2, np.argsort(-before, axis=-1, kind="stable")[:, :8])


def test_chains_draft_the_same_with_or_without_ranks(models, tmp_path) -> None:
    """Without ranks a greedy chain takes each pick straight from llama.cpp's logits row (the
    draft vocabulary's entries, the rest -inf) instead of gathering the draft vocabulary first:
    the same tokens for full-vocabulary and reduced (d2t) drafters, and no rows kept."""
    d2t = tm.write_drafter(
        str(tmp_path / "d2t.gguf"), models["target"], tm.DrafterShape(draft_vocab=96)
    )
    shape = TreeShape(6, 1, 6)
    for draft in (models["draft"], models["draft31"], d2t):
        with localspec.load(models["target"], draft=draft, **EXACT) as eng:
            for prompt in PROMPTS:
                ranked = _draft(eng, prompt, shape, True)
                bare = _draft(eng, prompt, shape, False)
                assert bare.tokens == ranked.tokens and len(bare) == 6, (draft, prompt)
                assert len(ranked.scores) == 6 and not bare.scores
                assert ranked.scores[-1].rank(ranked.tokens[0]) == 0
            if draft == d2t:
                ids = parts(eng).drafter.draft_ids(np.zeros(1, np.float32))
                assert ids is not None and len(ids) == 96  # the reduced path ran
            eng.reset()


def test_each_tree_nodes_drafter_row_is_its_lone_paths(engines) -> None:
    """Independent reference for the drafter's side of a tree: the row kept for every expanded
    node equals the drafter's row after drafting that node's path alone as a chain (one pair
    at a time in sequence 0). Four levels deep, the frontier sequences are reused, so a
    sequence left holding another node's ancestors would show here; afterwards every frontier
    sequence is empty, and the first level's sequences, empty before, were not dropped again
    (llama.cpp's sequence calls scan the whole cache)."""
    from localspec.speculation.sources.eagle import _draft_tree

    eng = engines["eagle3.1"]  # norm_output: the fed-back state is normalised too
    d = parts(eng).drafter
    shape = TreeShape(4, 3, 14)
    for prompt in PROMPTS[:2]:
        _prefilled(eng, prompt, Mode("tree", shape))
        logits, h = d.flush()
        start = (logits.copy(), h.copy())
        calls: list[str] = []
        for name in ("seq_drop", "seq_cp"):
            real = getattr(d.ctx, name)
            setattr(d.ctx, name, lambda *a, _r=real, _n=name, _c=calls: (_c.append(_n), _r(*a))[1])
        try:
            tree = _draft_tree(d, start, shape, [], ranks=True)
        finally:
            del d.ctx.seq_drop, d.ctx.seq_cp
        d.rewind()
        # nodes of level 3, decoded in reused sequences, are among those checked
        assert any(tree.depths[n] == 3 for n in tree.scores if n >= 0), tree.depths
        assert all(d.ctx.seq_pos_max(s) == -1 for s in range(1, 2 * shape.top_k + 1))
        # levels 1-3 branch 3 sequences each; only level 3's held cells before (it reuses
        # level 1's), and the 6 sequences used are emptied at the end
        assert calls.count("seq_cp") == 9 and calls.count("seq_drop") == 3 + 6, calls
        for node, scores in tree.scores.items():
            path, i = [], node
            while i >= 0:
                path.append(tree.tokens[i])
                i = tree.parents[i]
            d.chain_start(start[1])
            row = start[0]
            for j, tok in enumerate(reversed(path)):
                row = d.chain_next(tok, d.end + j)
            want = d.draft_logits(row)
            d.rewind()
            np.testing.assert_allclose(scores._logits, want, atol=2e-4, rtol=1e-4)
    eng.reset()


def test_no_feedback_state_is_made_for_a_position_nothing_decodes(engines, monkeypatch) -> None:
    """A chain of k makes k - 1 feedback states (flush's and those of the first k - 2 chain
    steps: the last step's state would feed no position); a tree D deep makes states for
    the frontiers of levels 1..D-2 only. The drafts are as before (every test above)."""
    from localspec.speculation.sources.eagle import _draft_tree

    eng = engines["eagle3.1"]  # norm_output: the feedback is a norm, worth skipping
    d = parts(eng).drafter
    made = [0]
    real = d.feedback
    monkeypatch.setattr(
        d, "feedback", lambda *a, **kw: (made.__setitem__(0, made[0] + 1), real(*a, **kw))[1]
    )
    for k in (1, 2, 5):
        _prefilled(eng, PROMPTS[0], Mode("chain", TreeShape(k, 1, k)))
        made[0] = 0
        tree = parts(eng).state.draft(StepPlan(TreeShape(k, 1, k)), np.random.default_rng(0))
        assert len(tree) == k and made[0] == max(k - 1, 1), (k, made[0])  # flush makes one
    _prefilled(eng, PROMPTS[0], Mode("tree", TreeShape(4, 3, 14)))
    start = d.flush()
    made[0] = 0
    _draft_tree(d, (start[0].copy(), start[1].copy()), TreeShape(4, 3, 14), [], ranks=False)
    d.rewind()
    assert made[0] == 3 * 2  # levels 1 and 2 feed the frontiers of levels 2 and 3
    eng.reset()
