"""Draft trees on recurrent and hybrid targets: each branch verified in a sequence of its own
(Target.verify_tree), the accepted one made the history (cut back by its snapshots, or its
path decoded again), as many branches as the memory share holds. Checked row by row against
plain decoding, through the engine with the target's own MTP head and EAGLE drafters, and in
the cost model that prices them."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

import localspec
from localspec.errors import InvalidParameterError
from localspec.lowlevel import parts
from localspec.native import library
from localspec.options import RuntimeOptions
from localspec.runtime import rollback as rb
from localspec.runtime.rollback import MAX_BRANCHES, Rollback, tree_branches
from localspec.runtime.target import Target
from localspec.speculation.drafttree import DraftTree
from localspec.speculation.tree import TreeShape

from helpers import costs
from helpers import tinymodels as tm
from helpers.chisquare import chi2_critical, chi2_of_samples, exact_distribution
from helpers.greedy import assert_greedy_lossless

EXACT = {"kv_type": "f32", "flash_attn": False, "n_threads": 2, "n_ctx": 512}
WRITERS = {
    "qwen35": tm.write_qwen35_target,
    "lfm2": tm.write_lfm2_target,
    "nemotron_h": tm.write_nemotron_h_target,
    "mamba": tm.write_mamba_target,  # no snapshots in llama.cpp: checkpoints only
}
MODES = (
    [(a, "snapshots") for a in ("qwen35", "lfm2", "nemotron_h")]
    + [(a, "checkpoint") for a in WRITERS]
    # 2 snapshots, drafts 4 deep: a branch cut back further than they reach is decoded again
    + [("qwen35", "2 snapshots")]
)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("hybrid-trees")
    return {a: w(str(d / f"{a}.gguf")) for a, w in WRITERS.items()}


@pytest.fixture
def roomy(monkeypatch) -> None:
    """The tiny files' weights are a few hundred KiB: within the usual share the snapshots
    leave no room for a branch's state. A larger share (four times the weights) lets both be
    tested."""
    monkeypatch.setattr(rb, "MEMORY_SHARE", 4.0)


def _plain(path: str, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """Plain greedy decoding one token at a time: the tokens, and the logits each was chosen
    from (rows[i] chose toks[i])."""
    t = Target(path, RuntimeOptions(**EXACT))
    try:
        logits = np.array(t.prefill(prompt)[0])
        toks, rows = [], []
        for _ in range(n):
            toks.append(int(np.argmax(logits)))
            rows.append(logits)
            logits = np.array(t.decode([toks[-1]], all_logits=False)[0])
        return toks, rows
    finally:
        t.close()


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max())))


def _wrong(rng: np.random.Generator, n_vocab: int, right: int) -> int:
    t = int(rng.integers(0, n_vocab - 1))
    return t + 1 if t >= right else t


def _tree(rng, truth: list[int], n_vocab: int, branches: int, depth: int) -> DraftTree:
    """branches paths under the root, one of them (at random) the truth for a random number
    of tokens; the others share a random prefix of it, then leave it."""
    tree = DraftTree()
    true_at = int(rng.integers(0, branches))
    for b in range(branches):
        length = int(rng.integers(1, depth + 1))
        shared = int(rng.integers(0, length + 1)) if b == true_at else int(rng.integers(0, length))
        path = truth[:shared]
        if len(path) < length:
            path.append(_wrong(rng, n_vocab, truth[len(path)]))
        path += [int(x) for x in rng.integers(0, n_vocab, length - len(path))]
        parent = -1
        for tok in path:
            parent = tree.add(tok, parent, "test")
    return tree.ordered()


def _accepted(tree: DraftTree, truth: list[int]) -> list[int]:
    """The nodes of the tree along the truth from the root, as far as it follows it."""
    accepted, node = [], -1
    for want in truth:
        kids = {tree.tokens[c]: c for c in range(len(tree)) if tree.parents[c] == node}
        if want not in kids:
            break
        node = kids[want]
        accepted.append(node)
    return accepted


@pytest.mark.parametrize(("arch", "mode"), MODES)
def test_branches_verify_and_commit_as_plain_decoding(
    files, roomy, arch, mode, monkeypatch
) -> None:
    """Random trees (2 to all branches, shared prefixes, the accepted path anywhere), chains
    and plain steps in random order: every verified row on the accepted path, and every
    token's logits after it, equal plain decoding's. A state the commit left wrong (the cut
    not applied, a branch's state copied from before a pending cut) would differ by whole
    logits from there on."""
    path = files[arch]
    rng = np.random.default_rng(7)
    prompt = [int(x) for x in rng.integers(0, 200, 10)]
    toks, rows = _plain(path, prompt, 90)
    if mode == "2 snapshots":
        monkeypatch.setattr(rb, "DEFAULT_RS_SEQ", 2)
    t = Target(
        path,
        RuntimeOptions(**EXACT),
        tree_nodes=62,
        rollback="checkpoint" if mode == "checkpoint" else True,
    )
    try:
        assert t.rollback.checkpoint == (mode == "checkpoint")
        assert t.branches >= 2 and t.tree_nodes == 62, t.tree_note
        assert _close(np.array(t.prefill(prompt)[0]), rows[0])
        i, kinds = 0, {"tree": 0, "chain": 0, "plain": 0, "whole": 0, "pending": 0}
        # deeper than 2 snapshots reach: the scheduler never drafts that far, the target
        # still cuts back right (by decoding again)
        max_depth = 4 if mode == "2 snapshots" else min(t.max_draft or 4, 4)
        while i + max_depth + 1 < len(toks):
            last, truth = toks[i], toks[i + 1 : i + 1 + max_depth]
            kind = ["tree", "tree", "tree", "chain", "plain"][int(rng.integers(0, 5))]
            n0 = t.n
            if kind == "tree":
                kinds["pending"] += t._guard.pending
                tree = _tree(rng, truth, t.n_vocab, int(rng.integers(2, t.branches + 1)), max_depth)
                logits = t.verify_tree(last, tree.tokens, tree.depths, tree.parents)
                accepted = _accepted(tree, truth)
                assert _close(logits[0], rows[i + 1])
                for k, node in enumerate(accepted):
                    assert _close(logits[node + 1], rows[i + 2 + k]), (arch, i, k)
                leaf_depth = max(tree.depths)
                kinds["whole"] += len(accepted) == leaf_depth
                t.commit_tree(last, accepted, tree.tokens)
                i += len(accepted) + 1
            elif kind == "chain":
                a = int(rng.integers(0, min(max_depth, t.max_draft or max_depth) + 1))
                draft = truth[:a] + ([_wrong(rng, t.n_vocab, truth[a])] if a < max_depth else [])
                logits = t.decode([last, *draft], all_logits=True)
                for k in range(a + 1):
                    assert _close(logits[k], rows[i + 1 + k]), (arch, i, k)
                t.keep(n0 + a + 1)
                i += a + 1
            else:
                assert _close(np.array(t.decode([last], all_logits=False)[0]), rows[i + 1])
                i += 1
            kinds[kind] += 1
            assert t.tokens == prompt + toks[:i]
        assert _close(np.array(t.decode([toks[i]], all_logits=False)[0]), rows[i + 1])
        assert kinds["tree"] >= 10 and kinds["chain"] and kinds["plain"] and kinds["whole"]
        if mode != "checkpoint":  # a tree forked from a history whose cut was still pending
            assert kinds["pending"] > 0
    finally:
        t.close()


def _accept_branch(path: str, prompt: list[int], toks: list[int], at: str) -> list[np.ndarray]:
    """Trees of all branches 3 deep, the truth in the first or the last branch: the root rows
    of every verify (the next token's logits after each commit)."""
    rt = RuntimeOptions(kv_type="f16", n_threads=2, n_ctx=2048)
    t = Target(path, rt, tree_nodes=62, rollback="checkpoint")
    try:
        t.prefill(prompt)
        b, d, i, out = t.branches, 3, 0, []
        j = 0 if at == "first" else b - 1
        while i + d + 1 < len(toks):
            tree = DraftTree()
            for k in range(b):
                branch = toks[i + 1 : i + 1 + d] if k == j else [toks[i + 1] ^ (k + 1), 5, 5]
                parent = -1
                for tok in branch:
                    parent = tree.add(tok, parent, "test")
            logits = t.verify_tree(toks[i], tree.tokens, tree.depths, tree.parents)
            out.append(np.array(logits[0]))
            t.commit_tree(toks[i], list(range(j * d, j * d + d)), tree.tokens)
            i += d + 1
        assert (len(t._gaps) > 0) == (at == "last")
        return out
    finally:
        t.close()


def test_cells_of_branches_before_the_accepted_one_stay_parked(files, roomy) -> None:
    """The accepted branch's cells lie after those of the branches before it: freed, later
    tokens would land before the history's newest cells, and attention would sum an f16
    cache in another order than plain decoding (1.3e-3 apart here, near-ties flip on real
    models). Parked, the history's cells keep the order they have when the first branch is
    accepted: the next token's logits are the same either way."""
    path = files["qwen35"]
    prompt = list(range(30, 50))
    toks, _ = _plain(path, prompt, 80)
    first = _accept_branch(path, prompt, toks, "first")
    last = _accept_branch(path, prompt, toks, "last")
    # freed, the order moves them by ~1e-3 here; parked, they were bitwise equal here, and a
    # CPU whose kernels round a row by its place in the batch stays far below that
    assert max(float(np.abs(a - b).max()) for a, b in zip(first, last, strict=True)) < 2e-4


def test_the_taps_of_the_accepted_rows_are_plain_decodings(agreeing, roomy) -> None:
    """What the drafter is fed after a tree (here the MTP head's hidden state, one row per
    position): the rows of the accepted path, wherever its branch lay in the batch."""
    rt = RuntimeOptions(**EXACT)
    rng = np.random.default_rng(3)
    prompt = [int(x) for x in rng.integers(0, 200, 10)]
    ref = Target(agreeing, rt, load_mtp=True)
    try:
        ref.enable_mtp_taps()
        logits, _ = ref.prefill(prompt)
        toks, taps = [], []
        for _ in range(60):
            toks.append(int(np.argmax(logits)))
            logits = ref.decode([toks[-1]], all_logits=False)[0]
            taps.append(ref.read_taps(1)[0])
    finally:
        ref.close()
    t = Target(agreeing, rt, tree_nodes=62, rollback="checkpoint", load_mtp=True)
    try:
        t.enable_mtp_taps()
        t.prefill(prompt)
        i, checked = 0, 0
        while i + 4 < len(toks):
            truth = toks[i + 1 : i + 4]
            tree = _tree(rng, truth, t.n_vocab, int(rng.integers(2, t.branches + 1)), 3)
            t.verify_tree(toks[i], tree.tokens, tree.depths, tree.parents)
            accepted = _accepted(tree, truth)
            got = t.read_verify_taps([0] + [a + 1 for a in accepted])
            for k, row in enumerate(got):
                assert _close(row, taps[i + k]), (i, k)
                checked += 1
            t.commit_tree(toks[i], accepted, tree.tokens)
            i += len(accepted) + 1
        assert checked > 20
    finally:
        t.close()


def _branches_tree(b: int, depth: int, at: int, truth: list[int]) -> DraftTree:
    """b disjoint branches `depth` deep, the truth's first tokens in branch `at`."""
    tree = DraftTree()
    for k in range(b):
        parent = -1
        for d in range(depth):
            tok = truth[d] if k == at and d < len(truth) else 7 + 10 * k + d
            parent = tree.add(tok, parent, "test")
    return tree


@pytest.mark.parametrize("arch", ["qwen35", "lfm2", "nemotron_h"])
def test_a_session_with_cells_parked_past_the_history_restores(files, roomy, arch) -> None:
    """A deep tree accepted one token into its second branch parks cells past the history; a
    shallower one parks fewer after it. The gap sequence's state is the last parked branch's
    (not the deepest cell's): a capture of that cache restores, and decodes on as plain
    decoding does."""
    path = files[arch]
    prompt = list(range(30, 42))
    toks, rows = _plain(path, prompt, 12)
    rt = RuntimeOptions(**EXACT)
    t = Target(path, rt, tree_nodes=62)  # snapshots
    u = Target(path, rt, tree_nodes=62)
    try:
        t.prefill(prompt)
        wrong = (toks[2] + 1) % t.n_vocab
        deep = _branches_tree(3, 4, 1, [toks[1], wrong])  # the truth's first token, then not
        t.verify_tree(toks[0], deep.tokens, deep.depths, deep.parents)
        t.commit_tree(toks[0], [4], deep.tokens)  # branch 2's first node
        assert max(t._gaps) >= t.n  # parked past the history
        shallow = _branches_tree(2, 1, 1, [toks[3]])
        t.verify_tree(toks[2], shallow.tokens, shallow.depths, shallow.parents)
        t.commit_tree(toks[2], [1], shallow.tokens)
        assert t._gaps[-1] < max(t._gaps)
        u.restore(t.capture())
        assert u.tokens == prompt + toks[:4]
        got = np.array(u.decode([toks[4]], all_logits=False)[0])
        assert _close(got, rows[5])
    finally:
        t.close()
        u.close()


def test_a_tree_wider_than_the_branches_or_the_batch_is_cut_to_its_first_paths(files) -> None:
    t = Target(files["qwen35"], RuntimeOptions(**EXACT), tree_nodes=62, rollback="checkpoint")
    try:
        b = t.branches
        assert 2 <= b <= MAX_BRANCHES
        # b + 2 leaves under the root, the first with a child: the first b paths are kept
        parents = [-1, 0] + [-1] * (b + 1)
        depths = [1, 2] + [1] * (b + 1)
        keep = t.fit_tree(parents, depths)
        assert keep == list(range(b + 1))
        assert t.fit_tree(parents[: b + 1], depths[: b + 1]) is None  # b leaves: all of it
    finally:
        t.close()


def test_branches_are_what_the_memory_share_holds() -> None:
    row = 1000
    weights = 100_000  # 10%: 10 000 bytes
    assert tree_branches(Rollback(0, row, checkpoint=True), weights) == (MAX_BRANCHES, "")
    b, why = tree_branches(Rollback(4, row), weights)  # 4 rows of snapshots, 5 per branch
    assert b == 0 and "fewer than 2 fit in 10% of the weights" in why and "snapshots" in why
    # (10 000 - 1 000) // 2 000, less one for the parked cells' sequence
    assert tree_branches(Rollback(1, row), weights)[0] == 3
    assert tree_branches(Rollback(0, row, checkpoint=True), weights, n_batch=8)[0] == 4
    assert "holds no two branches" in tree_branches(Rollback(0, row, checkpoint=True), 10**9, 3)[1]
    assert tree_branches(Rollback(0, 0, "loaded for plain decoding"), weights)[0] == 0
    assert "cannot size" in tree_branches(Rollback(0, 0, checkpoint=True), weights)[1]


def test_a_qwen35_27b_like_shape_has_branches_only_beside_checkpoints() -> None:
    """About 150 MiB a state row and 16 GiB of weights: the 10 snapshots the share holds
    leave no room for a branch; without them it holds the most branches, 150 MiB each."""
    keys = {
        "block_count": 64, "full_attention_interval": 4, "ssm.conv_kernel": 4,
        "ssm.inner_size": 48 * 128, "ssm.state_size": 128, "ssm.group_count": 16,
    }  # fmt: skip
    plan = rb.plan_rollback("qwen35", keys.get, n_embd=5120, n_batch=512, weights_bytes=16 << 30)
    assert plan.n_rs_seq == 10
    assert tree_branches(plan, 16 << 30)[0] == 0
    checkpoint = Rollback(0, plan.row_bytes, checkpoint=True)
    assert tree_branches(checkpoint, 16 << 30) == (MAX_BRANCHES, "")


@pytest.mark.parametrize(("arch", "mode"), [("qwen35", "snapshots"), ("lfm2", "checkpoint")])
def test_the_branch_states_are_what_llama_cpp_allocates(
    files, roomy, arch, mode, monkeypatch
) -> None:
    """llama.cpp logs the recurrent memory it allocates: a state for the history, one per
    branch and one for the parked cells' sequence, each with its snapshots."""
    log: collections.deque[str] = collections.deque(maxlen=100_000)
    monkeypatch.setattr(library, "_recent_log", log)  # the log callback appends to it
    t = Target(
        files[arch],
        RuntimeOptions(**EXACT),
        tree_nodes=62,
        rollback="checkpoint" if mode == "checkpoint" else True,
    )
    try:
        b, r = t.branches, t.rollback
        logged = re.search(r"llama_memory_recurrent: size = +([0-9.]+) MiB", "".join(log))
    finally:
        t.close()
    assert b >= 2 and logged is not None
    want = (2 + b) * (1 + r.n_rs_seq) * r.row_bytes  # the history, the branches, the gap
    assert abs(float(logged.group(1)) - want / 2**20) <= 0.006, (logged.group(0), want)


# --- through the engine ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory) -> str:
    """qwen35 whose MTP head agrees with it (drafts accepted)."""
    return tm.write_qwen35_target(
        str(tmp_path_factory.mktemp("mtp-trees") / "agree.gguf"), mtp=True, cycle=8
    )


@pytest.mark.parametrize("rollback", ["snapshots", "checkpoint"])
@pytest.mark.parametrize("shape", [(3, 2, 5), (4, 3, 8), (2, 4, 6)])
def test_mtp_trees_on_a_hybrid_are_lossless_and_accepted(agreeing, roomy, rollback, shape) -> None:
    with localspec.load(agreeing, draft_source="mtp", rollback=rollback, **EXACT) as eng:
        target = parts(eng).target
        assert target.branches >= 2 and eng.drafting.max_tree > 0
        prompt = "the cat sat on the mat; the dog"
        c = eng.complete(prompt, max_tokens=60, tree=shape)
        s = eng.last_stats.sources["mtp"]
        steps = eng.last_stats.steps
        # more nodes per step than a chain of the tree's depth: trees were verified
        assert s.drafted > shape[0] * steps and s.accepted > 0, (s, steps)
        assert_greedy_lossless(eng, prompt, c)


@pytest.mark.parametrize("rollback", ["snapshots", "checkpoint"])
def test_mtp_tree_sampling_on_a_hybrid_matches_target_distribution(
    agreeing, roomy, rollback
) -> None:
    """Sampled completions through trees of the head's candidates, each branch verified in a
    sequence of its own and the accepted one cut back or decoded again: the target's own
    distribution (chi-square at p ~ 0.001)."""
    with localspec.load(agreeing, draft_source="mtp", rollback=rollback, **EXACT) as eng:
        assert parts(eng).target.branches >= 2
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt, length=4)
        stat, df, acc = chi2_of_samples(
            eng, prompt, expected, length=4, n_samples=2000, tree=(2, 2, 4)
        )
        mtp, shapes = eng.stats.sources["mtp"], eng.stats.shapes
    # trees of two levels (two or more branches) were verified, their drafts kept and not
    assert shapes.get("tree 2x2/4", 0) >= 1000, shapes
    assert 0.05 < mtp.accepted / mtp.drafted < 0.95, mtp
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


def test_a_fixed_tree_verifies_its_branches_from_checkpoints_under_auto(agreeing) -> None:
    """Under rollback="auto" a fixed tree needs no snapshots (a branch cut short is decoded
    again), and the memory they would take holds more branches."""
    with localspec.load(agreeing, draft_source="mtp", tree=(3, 2, 5), **EXACT) as eng:
        target = parts(eng).target
        assert target.rollback.checkpoint and target.branches >= 2
        c = eng.complete("the cat", max_tokens=40)
        assert eng.last_stats.sources["mtp"].accepted > 0
        assert_greedy_lossless(eng, "the cat", c)


def test_a_tree_where_the_memory_holds_no_branch_is_one_clear_error(agreeing) -> None:
    with localspec.load(agreeing, draft_source="mtp", rollback="snapshots", **EXACT) as eng:
        assert parts(eng).target.branches == 0 and eng.drafting.max_tree == 0
        with pytest.raises(InvalidParameterError, match="verifies chains only here") as e:
            eng.complete("the cat", max_tokens=4, tree=(3, 2, 5))
        assert "from checkpoints instead of snapshots it holds" in str(e.value)
        c = eng.complete("the cat", max_tokens=30, n_draft=3)  # chains still run
        assert eng.last_stats.sources["mtp"].accepted > 0
        assert_greedy_lossless(eng, "the cat", c)


@pytest.mark.parametrize("arch", ["qwen35", "lfm2", "mamba"])
def test_eagle_trees_on_recurrent_targets_are_lossless(files, roomy, arch, tmp_path) -> None:
    """A random drafter: nearly every branch is rejected (the root's own token kept, the
    branches dropped), through the graph callback's taps."""
    d = tm.random_drafter_for(files[arch], str(tmp_path / "d.eagle3.gguf"), taps=(1, 2, 3))
    with localspec.load(files[arch], draft=d, rollback="checkpoint", **EXACT) as eng:
        assert parts(eng).target.branches >= 2
        prompt = "the cat sat on the mat"
        c = eng.complete(prompt, max_tokens=40, tree=(3, 2, 5))
        assert eng.last_stats.sources["eagle"].drafted > 3 * eng.last_stats.steps
        assert_greedy_lossless(eng, prompt, c)


# --- the cost model ----------------------------------------------------------------------------


def test_a_recurrent_targets_tree_is_priced_at_its_branches_rows() -> None:
    m = costs.model({n: 10e-3 * (1 + 0.5 * (n - 1)) for n in range(1, 64)})
    shape = TreeShape(3, 2, 6)  # at most 4 leaves (6 nodes, 3 deep)
    attention = m.verify_step(shape)
    m.branches = 8
    assert m.verify_step(shape) > attention  # 4 x 4 rows against 7
    assert m.verify_step(shape) == pytest.approx(m.verify(16) + m.glue["tree"].value)
    m.branches = 2  # pruned to 2 branches: 2 x 4 rows
    assert m.verify_step(shape) == pytest.approx(m.verify(8) + m.glue["tree"].value)
    assert m.tree_rows(6, 3, 3).item() == -1  # more leaves than branches: cannot be verified
    chain = TreeShape(3, 1, 3)
    assert m.verify_step(chain) == pytest.approx(m.verify(4) + m.glue["chain"].value)


@pytest.mark.parametrize("branches", [0, 4])
def test_auto_draws_trees_on_a_recurrent_target_only_where_their_rows_pay(branches) -> None:
    """A verify curve flat up to 64 rows (a GPU's): trees pay on both layouts. One that grows
    with the rows (this CPU's): an attention target's shared rows may still pay for a tree,
    a recurrent target's branches, each its whole path, do not."""
    flat = costs.model({n: 10e-3 * (1 + 0.002 * n) for n in range(1, 65)})
    flat.branches = branches
    costs.feed(flat, [0.45, 0.3, 0.1, 0.05, 0.1])
    plan = flat.plan(16)
    assert plan.shape is not None and not plan.shape.is_chain, plan
    if branches:
        s = plan.shape
        rows = flat.tree_rows(s.budget, s.depth, s.budget - s.depth + 1)
        assert 0 < rows <= 64
    steep = costs.model({n: 10e-3 * costs.CPU_RATIO.get(n, n / 2) for n in range(1, 17)})
    steep.branches = branches
    costs.feed(steep, [0.45, 0.3, 0.1, 0.05, 0.1])
    plan = steep.plan(16)
    if branches:
        assert plan.shape is None or plan.shape.is_chain, plan


def test_info_says_how_many_branches_a_target_holds(files, roomy, monkeypatch) -> None:
    from localspec.files.fileinfo import describe, format_info

    lf = describe(files["lfm2"])["recurrent"]
    assert lf["tree_branches"] >= 2
    assert lf["branch_bytes"] == (1 + lf["snapshots"]) * lf["row_bytes"]
    assert f"draft trees of up to {lf['tree_branches']} branches" in format_info(
        describe(files["lfm2"])
    )
    monkeypatch.setattr(rb, "MEMORY_SHARE", 0.1)
    q = format_info(describe(files["qwen35"]))
    assert "draft chains only (draft trees need a recurrent state per branch" in q


def test_a_branch_trees_cost_is_learnt_at_the_rows_it_decoded(agreeing, roomy, monkeypatch):
    """The scheduler is told the rows the target decoded (every branch's padded path), not
    the tree's nodes: a verify curve taught otherwise would price chains too dear."""
    from localspec.auto.scheduler import Scheduler

    pairs: list[tuple[int, int, int]] = []  # (nodes + 1, rows decoded, rows observed)
    tree: list[tuple[int, int]] = []  # the step's tree verify, if it had one
    verify_tree, observe = Target.verify_tree, Scheduler.observe

    def spy_verify(self, root, tokens, depths, parents):
        out = verify_tree(self, root, tokens, depths, parents)
        tree.append((len(tokens) + 1, self.tree_rows))
        return out

    def spy_observe(self, plan, offer, **kw):
        if tree:  # the step that verified it
            pairs.append((*tree.pop(), kw["verify_rows"]))
        return observe(self, plan, offer, **kw)

    monkeypatch.setattr(Target, "verify_tree", spy_verify)
    monkeypatch.setattr(Scheduler, "observe", spy_observe)
    with localspec.load(agreeing, draft_source="mtp", rollback="checkpoint", **EXACT) as eng:
        eng.complete("the cat sat", max_tokens=40, tree=(3, 2, 5))
    assert pairs and any(rows > nodes for nodes, rows, _ in pairs)
    assert all(rows == seen for _, rows, seen in pairs), pairs


def test_auto_draws_trees_on_a_hybrid_where_rows_are_cheap(agreeing, roomy, monkeypatch):
    """A verify curve flat in the rows (a GPU's; injected, so the decisions do not depend on
    this machine): before its evidence says chains suffice, auto draws trees of the head's
    candidates on the hybrid, each branch in a sequence of its own, and stays lossless."""
    rows: list[int] = []
    verify_tree = Target.verify_tree

    def spy(self, root, tokens, depths, parents):
        out = verify_tree(self, root, tokens, depths, parents)
        rows.append(self.tree_rows)
        return out

    monkeypatch.setattr(Target, "verify_tree", spy)
    with localspec.load(agreeing, rollback="checkpoint", **EXACT) as eng:
        assert eng.drafting.drafter_kind == "mtp" and parts(eng).target.branches >= 2
        costs.inject_costs(monkeypatch, eng, lambda n: 10e-3 * (1 + 0.002 * n))
        prompt = "the cat sat on the mat; the cat sat on the hat; the dog"
        c = eng.complete(prompt, max_tokens=120)
        trees = [s for s in c.stats.shapes if s.startswith("tree")]
        assert trees and rows and all(r > 0 for r in rows), c.stats.shapes
        assert c.stats.sources["mtp"].accepted > 0
        assert_greedy_lossless(eng, prompt, c)


def test_the_command_line_names_a_refused_tree_as_it_was_typed(agreeing, capsys) -> None:
    from localspec.cli import main

    rc = main(["generate", agreeing, "--tree", "3,2,5", "--rollback", "snapshots", "-p", "the",
               "-n", "4", "--ctx", "512"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc != 0 and "--tree 3,2,5 cannot run: qwen35 verifies chains only here" in err, err
    rc = main(["generate", agreeing, "--tree", "3,2,5", "--rollback", "checkpoint", "-p", "the",
               "-n", "8", "--ctx", "512", "--json"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
