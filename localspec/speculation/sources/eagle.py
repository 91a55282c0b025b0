"""The EAGLE-3 / EAGLE-3.1 drafter as a draft source: chains and EAGLE-2-style dynamic trees.

Chains: the drafter's pick at each position (its argmax, or a draw from its distribution q for a
fixed chain that samples, accepted by rejection sampling in verify.py), each decoded after the
last in the drafter's history sequence.

Trees (as EAGLE-2 / EAGLE-3 draft them): the root's top-k children form the first frontier; at
each further depth every frontier node is decoded (one drafter batch, each node in its own KV
sequence holding the committed prefix and its ancestors), its top-k children are scored by
cumulative log-probability, and the k best of those k*k become the next frontier. All
candidates are then reranked by cumulative log-probability and the best ``budget`` kept. A
child never scores above its parent, so the kept set is closed under ancestors.
"""

from __future__ import annotations

import numpy as np

from ...runtime.drafter import Drafter
from ..drafttree import EAGLE, DraftTree, Scores
from ..sampling import SamplingParams, probs, sample
from ..tree import TreeShape


class EagleSource:
    """Drafts from the drafter's queued pairs; the caller (SpecState) keeps them fed."""

    def __init__(self, drafter: Drafter, name: str = EAGLE) -> None:
        """name: how its drafts are labelled (the statistics' source): "eagle", or "mtp" for
        a target's own MTP head, which drafts through the same Drafter contract."""
        self.drafter = drafter
        self.name = name
        # a chain's draft-vocabulary logits per position, and a tree's per level, reused from
        # step to step (a step's ranks are read by its own verify walk, before the next draft)
        self._rows: list[np.ndarray] = []
        self._levels: list[np.ndarray] = []

    def flush(self) -> tuple[np.ndarray, np.ndarray]:
        """Write the queued pairs: the first draft position's logits and feedback state."""
        return self.drafter.flush()

    def draft(
        self,
        start: tuple[np.ndarray, np.ndarray],
        shape: TreeShape,
        sampled: SamplingParams | None,
        rng: np.random.Generator,
        *,
        ranks: bool = True,
    ) -> DraftTree:
        """Draft from ``flush``'s start. sampled: draw a chain from the drafter's own
        distribution under these settings (rejection sampling), instead of its best picks.
        ranks: keep each position's (a tree's: each expanded node's) logits, to tell where
        the target's token ranked."""
        if shape.is_chain:
            tree = self._chain(start, shape.depth, sampled, rng, ranks)
        else:
            tree = _draft_tree(self.drafter, start, shape, self._levels, ranks, self.name)
        self.drafter.rewind()  # positions >= end held draft states, not target features
        return tree

    def _chain(
        self,
        start: tuple[np.ndarray, np.ndarray],
        k: int,
        sampled: SamplingParams | None,
        rng: np.random.Generator,
        ranks: bool,
    ) -> DraftTree:
        d = self.drafter
        logits, h = start
        pos = d.end
        tree = DraftTree()
        d.chain_start(h)
        for j in range(k):
            q = None
            if ranks:  # the row is kept for the verify walk's rank statistics
                if j == len(self._rows):
                    self._rows.append(np.empty(0, dtype=np.float32))
                sub = self._rows[j] = d.draft_logits(logits, self._rows[j])
            if sampled is None:
                tok = d.draft_token(sub) if ranks else d.best_token(logits)
            else:
                q = probs(logits, sampled)
                tok = sample(q, rng)
            node = tree.add(tok, j - 1, self.name)
            if ranks:
                tree.scores[j - 1] = Scores(sub, d.draft_index)
            if q is not None:
                tree.q[node] = q
            if j < k - 1:  # the last decode's state would feed no further position
                logits = d.chain_next(tok, pos + j, feed=j < k - 2)
        tree.spine[self.name] = list(range(k))
        return tree


def _top(
    drafter: Drafter, logits: np.ndarray, k: int, levels: list[np.ndarray], d: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The k best target token ids of drafter logit rows, best first, their
    log-probabilities, and the rows' draft-vocabulary logits, copied into levels[d] (a new
    buffer there when it cannot hold them): the nodes' rank statistics read them after the
    next decode has overwritten llama.cpp's buffer."""
    ids = drafter.draft_ids(logits)
    n, width = logits.shape[0], logits.shape[-1] if ids is None else ids.size
    while len(levels) <= d:
        levels.append(np.empty((0, 0), dtype=np.float32))
    if levels[d].shape[0] < n or levels[d].shape[1] != width:
        levels[d] = np.empty((n, width), dtype=np.float32)
    sub = levels[d][:n]
    if ids is None:
        np.copyto(sub, logits)
    else:  # mode="clip": with "raise", numpy gathers into a temporary and copies it over
        np.take(logits, ids, axis=-1, out=sub, mode="clip")
    part, top = _best_k(sub, k)
    m = top[:, :1]
    lse = m + np.log(np.exp(sub - m).sum(axis=-1, keepdims=True))
    tok = ids[part] if ids is not None else part
    return tok, top - lse, sub


def _best_k(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of each row's k largest entries, best first (ties: the lower
    index). k passes of argmax, each best masked for the next pass and restored at the end:
    for k <= 8 over a 49k vocabulary 6-12 times faster than argpartition. A row with fewer
    than k finite entries repeats index 0 at -inf (a reduced draft vocabulary's -inf columns
    are gathered away before)."""
    n = rows.shape[0]
    at = np.arange(n)
    idx = np.empty((n, k), dtype=np.int64)
    val = np.empty((n, k), dtype=rows.dtype)
    done = 0
    try:
        for j in range(k):
            a = rows.argmax(axis=-1)
            idx[:, j] = a
            val[:, j] = rows[at, a]
            rows[at, a] = -np.inf
            done += 1
    finally:
        for j in range(done - 1, -1, -1):  # put back what was masked: ranks read the rows
            rows[at, idx[:, j]] = val[:, j]
    return idx, val


def _draft_tree(
    drafter: Drafter,
    start: tuple[np.ndarray, np.ndarray],
    shape: TreeShape,
    levels: list[np.ndarray],
    ranks: bool,
    name: str = EAGLE,
) -> DraftTree:
    """A dynamic tree after ``last`` (nodes at drafter positions n, n+1, ...). levels: a
    buffer per depth for the draft-vocabulary logits of its expanded nodes, kept from step to
    step; ranks: give every expanded node its row, whose rank statistics count as a chain's
    do (the cost model's rank buckets mean the same for every shape)."""
    k = shape.top_k
    logits, h_root = start
    tok, lp, sub = _top(drafter, logits[None, :], k, levels, 0)
    expanded: dict[int, np.ndarray] = {-1: sub[0]}
    # candidates: (cumulative logp, depth, parent candidate index, token)
    cand_lp: list[float] = list(lp[0, :k])
    cand_depth: list[int] = [1] * k
    cand_parent: list[int] = [-1] * k
    cand_tok: list[int] = [int(t) for t in tok[0, :k]]
    frontier = list(range(k))  # candidate indices
    states = np.repeat(h_root[None, :], k, axis=0)  # feedback state each frontier node is fed
    seq_of: dict[int, int] = {-1: 0}  # candidate -> drafter KV sequence holding its path
    banks = (list(range(1, k + 1)), list(range(k + 1, 2 * k + 1)))
    pos = drafter.end
    for d in range(1, shape.depth):
        # decode the frontier (depth d nodes) at position n + d - 1, each in a fresh sequence
        bank = banks[d % 2]
        for j, c in enumerate(frontier):
            drafter.branch(seq_of[cand_parent[c]], bank[j])
            seq_of[c] = bank[j]
        toks = [cand_tok[c] for c in frontier]
        rows_logits, rows_h = drafter.decode_frontier(toks, states, pos + d - 1, bank[: len(toks)])
        tok, lp, sub = _top(drafter, rows_logits, k, levels, d)
        for j, c in enumerate(frontier):
            expanded[c] = sub[j]
        # k*k children scored by cumulative log-probability; the best k form the next frontier
        child_lp = (np.array([cand_lp[c] for c in frontier])[:, None] + lp).ravel()
        first = len(cand_lp)
        for j, c in enumerate(frontier):
            for i in range(k):
                cand_lp.append(float(child_lp[j * k + i]))
                cand_depth.append(d + 1)
                cand_parent.append(c)
                cand_tok.append(int(tok[j, i]))
        if d == shape.depth - 1:  # no next frontier to decode: no states to feed it
            break
        best = np.argsort(-child_lp, kind="stable")[:k]
        frontier = [first + int(b) for b in best]
        for i, b in enumerate(best):  # in place: the batch holds a copy of the last level's
            drafter.feedback(rows_h[int(b) // k], out=states[i])
    drafter.drop_branches([*banks[0], *banks[1]])

    # rerank: the best `budget` candidates (ties: shallower first), then rows in depth-first
    # order with the better child first, so the drafter's own best chain takes the first rows
    order = sorted(range(len(cand_lp)), key=lambda c: (-cand_lp[c], cand_depth[c]))
    kept = set(order[: shape.budget])
    kids: dict[int, list[int]] = {}
    for c in sorted(kept, key=lambda c: -cand_lp[c]):
        kids.setdefault(cand_parent[c], []).append(c)
    keep: list[int] = []
    stack = list(reversed(kids.get(-1, [])))
    while stack:
        c = stack.pop()
        keep.append(c)
        stack.extend(reversed(kids.get(c, [])))
    row_of = {c: i for i, c in enumerate(keep)}
    tree = DraftTree()
    for c in keep:
        p = cand_parent[c]
        tree.tokens.append(cand_tok[c])
        tree.parents.append(row_of[p] if p >= 0 else -1)
        tree.depths.append(cand_depth[c])
        tree.sources.append({name})
    if ranks:
        index = drafter.draft_index
        tree.scores = {
            (row_of[c] if c >= 0 else -1): Scores(v, index)
            for c, v in expanded.items()
            if c < 0 or c in row_of
        }
    tree.spine[name] = _best_chain(tree)
    return tree


def _best_chain(tree: DraftTree) -> list[int]:
    """The drafter's own best chain: the first child at every level (depth-first order)."""
    out, node = [], -1
    for i, p in enumerate(tree.parents):
        if p == node:
            out.append(i)
            node = i
    return out
