"""Draft trees: greedy output identical to plain greedy, per-node logits equal to lone path
decodes, clean KV caches afterwards, and clear errors for shapes that cannot run."""

from __future__ import annotations

import numpy as np
import pytest

import localspec
from localspec.errors import InvalidParameterError
from localspec.sampling import Draws, SamplingParams
from localspec.stats import Stats
from localspec.tree import GAP_SEQ, TreeShape, draft_tree, leaf_sequences

from conftest import EXACT

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
def test_tree_greedy_equals_plain(engines, pair, shape) -> None:
    eng = engines[pair]
    for prompt in PROMPTS:
        plain = eng.complete(prompt, max_tokens=100, n_draft=0)
        spec = eng.complete(prompt, max_tokens=100, tree=shape)
        assert spec.tokens == plain.tokens, prompt
        assert spec.text == plain.text
        assert spec.stats.mode == str(TreeShape(*shape))
    if pair == "agree":  # the agreeing drafter's trees are accepted deep
        assert spec.stats.tau > min(shape[0], 3), spec.stats.summary()


def test_auto_greedy_equals_plain(engines) -> None:
    for eng in engines.values():
        for prompt in PROMPTS:
            plain = eng.complete(prompt, max_tokens=80, n_draft=0)
            auto = eng.complete(prompt, max_tokens=80)  # n_draft="auto" is the default
            assert auto.tokens == plain.tokens, prompt
            assert auto.stats.mode == "auto"
            assert sum(auto.stats.shapes.values()) == auto.stats.steps


def test_tree_leaves_both_caches_clean(engines) -> None:
    eng = engines["agree"]
    c = eng.complete("abcdefgh", max_tokens=50, tree=(5, 4, 24), add_special=False)
    n = len(eng.tokenize("abcdefgh", add_special=False)) + len(c.tokens) - 1
    # the target holds exactly the committed tokens in sequence 0, no tree sequence survives
    assert eng.target.ctx.seq_pos_max(0) == n - 1
    assert all(eng.target.ctx.seq_pos_max(s) == -1 for s in range(1, GAP_SEQ))
    assert all(eng.drafter.ctx.seq_pos_max(s) == -1 for s in range(1, 17))


def test_tree_node_logits_equal_lone_path_decodes(engines) -> None:
    """Independent reference: each node's row of the one-batch tree verify equals the target's
    logits after decoding that node's path alone, one token at a time, in a fresh cache."""
    eng = engines["eagle3.1"]
    tokens = eng.tokenize("Once upon a time")
    sp = SamplingParams()
    eng.target.set_taps_active(True)
    st = eng._prefill(tokens, eng.drafter, sp, Draws(0, len(tokens)), Stats())
    tree = draft_tree(eng.drafter, st, TreeShape(4, 3, 14))
    assert len(tree.tokens) == 14 and max(tree.depths) >= 3
    leaves, seqs = leaf_sequences(tree.parents)
    for s in range(1, len(leaves) + 1):
        eng.target.ctx.seq_cp(0, s, 0, st.n)
    pos = np.array([st.n] + [st.n + d for d in tree.depths], dtype=np.int32)
    got = eng.target.decode_tree([st.last, *tree.tokens], pos, seqs).copy()

    def path(i: int) -> list[int]:
        out = []
        while i >= 0:
            out.append(tree.tokens[i])
            i = tree.parents[i]
        return out[::-1]

    for row in range(15):
        ctx = [*tokens, st.last] + (path(row - 1) if row else [])
        eng.target.ctx.clear()
        eng.target.decode(tokens, 0, all_logits=False)
        for j, t in enumerate(ctx[len(tokens) :]):
            want = eng.target.decode([t], len(tokens) + j, all_logits=False)[0]
        np.testing.assert_allclose(got[row], want, atol=2e-4, rtol=1e-4)
    eng.target.ctx.clear()


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
        plain = eng.complete("abc", max_tokens=40, n_draft=0)
        assert eng.complete("abc", max_tokens=40, tree=(5, 3, 14)).tokens == plain.tokens


def test_auto_and_trees_respect_tiny_batches(models) -> None:
    """n_batch/draft_batch bound the tree (nodes, top-k); at the smallest sizes auto falls back
    to chains and plain decoding, and stays lossless."""
    for n_batch, draft_batch in ((2, 2), (4, 3), (8, 5)):
        opts = {**EXACT, "n_batch": n_batch, "draft_batch": draft_batch}
        with localspec.load(models["target"], draft=models["draft31"], **opts) as eng:
            plain = eng.complete("the quick brown fox", max_tokens=40, n_draft=0)
            auto = eng.complete("the quick brown fox", max_tokens=40)
            assert auto.tokens == plain.tokens
            chain = eng.complete("the quick brown fox", max_tokens=40, tree=(3, 1, 3))
            assert chain.tokens == plain.tokens


def test_a_tree_without_a_drafter_decodes_plainly(models) -> None:
    with localspec.load(models["target"], draft=False, **EXACT) as eng:
        plain = eng.complete("abc", max_tokens=20, n_draft=0)
        tree = eng.complete("abc", max_tokens=20, tree=(4, 2, 8))
    assert tree.tokens == plain.tokens and tree.stats.drafted == 0
