"""EAGLE-2-style dynamic draft trees: draft a tree, verify it in one target decode, accept.

Drafting (as EAGLE-2 / EAGLE-3 do it): the root's top-k children form the first frontier; at
each further depth every frontier node is decoded (one drafter batch, each node in its own KV
sequence holding the committed prefix and its ancestors), its top-k children are scored by
cumulative log-probability, and the k best of those k*k become the next frontier. All candidates
are then reranked by cumulative log-probability and the best ``budget`` kept. A child never
scores above its parent, so the kept set is closed under ancestors.

Verification: one target decode of the root (the chosen-but-undecoded token) and every kept node,
each at position n + depth, with one KV sequence per leaf; a node carries the sequences of all
leaves below it, so its attention sees exactly its ancestors (unified KV cache; llama.cpp masks
by a row's first sequence id, and every ancestor belongs to all of a node's sequences).

Acceptance walks down from the root: at each node the target's token for the next position is
chosen from that node's logits exactly as plain decoding would choose it (argmax, or a draw from
the target's distribution); if a child carries that token the walk moves into it, else the token
is emitted and the step ends. Greedy output is therefore identical to plain greedy. For sampling
this is EAGLE's multi-candidate rejection sampling with deterministic (top-k) candidates: there
each candidate x_i is accepted with probability p'(x_i) under the residual p' left after zeroing
the earlier candidates, and a final draw comes from the last residual; that sequence of trials
yields x with probability exactly p(x) and lands on candidate x_i exactly when the plain draw
would have been x_i, so it is the same as drawing y ~ p and descending when y is a child. Every
emitted token is thus drawn from the target's own distribution given the emitted prefix:
lossless by construction, whatever the drafter proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from .clocks import Clock
from .drafter import Drafter
from .errors import InvalidParameterError
from .sampling import Draws, SamplingParams
from .speculative import StepResult, now, pick, rank_of, timed
from .target import Target

MAX_TOP_K = 8
MAX_TREE_NODES = 62  # verify batch of root + nodes; sequences: 0, one per leaf, the gap one


@dataclass(frozen=True)
class TreeShape:
    """depth: draft levels; top_k: children per expanded node and frontier width; budget: nodes
    verified (the root not counted). top_k=1 with budget=depth is a chain."""

    depth: int
    top_k: int
    budget: int

    def __post_init__(self) -> None:
        if not (1 <= self.depth <= 32 and 1 <= self.top_k <= MAX_TOP_K):
            raise InvalidParameterError(
                f"tree depth must be in [1, 32] and top_k in [1, {MAX_TOP_K}], got "
                f"{self.depth}, {self.top_k}"
            )
        if not 1 <= self.budget <= MAX_TREE_NODES:
            raise InvalidParameterError(
                f"tree budget must be in [1, {MAX_TREE_NODES}], got {self.budget}"
            )
        if self.top_k == 1 and self.budget != self.depth:
            # a top-1 tree is the chain of its budget: drafting deeper could never be verified
            n = min(self.depth, self.budget)
            object.__setattr__(self, "depth", n)
            object.__setattr__(self, "budget", n)

    def clipped(self, depth: int) -> TreeShape:
        """The same shape drafted at most depth deep (near the token or context limit)."""
        if self.depth <= depth:
            return self
        nodes = max(depth, min(self.budget, depth * self.top_k**2))
        return TreeShape(depth, self.top_k, min(nodes, MAX_TREE_NODES))

    @property
    def is_chain(self) -> bool:
        return self.top_k == 1

    def __str__(self) -> str:
        if self.is_chain:
            return f"chain {self.depth}"
        return f"tree {self.depth}x{self.top_k}/{self.budget}"

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """'DEPTH,TOP_K,BUDGET' (as on the command line)."""
        try:
            d, k, b = (int(x) for x in text.split(","))
        except ValueError:
            raise InvalidParameterError(
                f"a tree shape is DEPTH,TOP_K,BUDGET (three integers), got {text!r}"
            ) from None
        return cls(d, k, b)


@dataclass
class DraftTree:
    """Nodes in depth-first order, better child first (parents before children); node i is row
    i+1 of the verify batch."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: child of the root
    depths: list[int] = field(default_factory=list)  # 1-based
    # drafter's top candidates (target token ids, best first) of each expanded node: -1 is the
    # root; used for the acceptance statistics the cost model learns from
    expanded: dict[int, np.ndarray] = field(default_factory=dict)


def _top(drafter: Drafter, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best target token ids of drafter logit rows and their log-probabilities."""
    ids = drafter.draft_ids(logits)
    sub = logits[..., ids] if ids is not None else logits
    part = np.argpartition(sub, sub.shape[-1] - k, axis=-1)[..., -k:]
    top = np.take_along_axis(sub, part, axis=-1)
    order = np.argsort(-top, axis=-1, kind="stable")
    part = np.take_along_axis(part, order, axis=-1)
    top = np.take_along_axis(top, order, axis=-1)
    m = sub.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(sub - m).sum(axis=-1, keepdims=True))
    tok = ids[part] if ids is not None else part
    return tok, top - lse


def draft_tree(drafter: Drafter, shape: TreeShape) -> DraftTree:
    """Draft a dynamic tree after ``last`` (nodes at drafter positions n, n+1, ...)."""
    k = shape.top_k
    logits, h_root = drafter.flush()
    # every expanded node keeps its MAX_TOP_K best candidates, whatever k: the cost model's
    # rank buckets (rank_of: MAX_TOP_K means "not among them") must mean the same for all shapes
    n_keep_stats = MAX_TOP_K
    tok, lp = _top(drafter, logits[None, :], n_keep_stats)
    tree = DraftTree()
    tree.expanded[-1] = tok[0]
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
        tok, lp = _top(drafter, rows_logits, n_keep_stats)
        for j, c in enumerate(frontier):
            tree.expanded[c] = tok[j]
        # k*k children scored by cumulative log-probability; the best k form the next frontier
        child_lp = (np.array([cand_lp[c] for c in frontier])[:, None] + lp[:, :k]).ravel()
        first = len(cand_lp)
        for j, c in enumerate(frontier):
            for i in range(k):
                cand_lp.append(float(child_lp[j * k + i]))
                cand_depth.append(d + 1)
                cand_parent.append(c)
                cand_tok.append(int(tok[j, i]))
        best = np.argsort(-child_lp, kind="stable")[:k]
        frontier = [first + int(b) for b in best]
        states = np.stack([drafter.feedback(rows_h[int(b) // k]) for b in best])
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
    for c in keep:
        p = cand_parent[c]
        tree.tokens.append(cand_tok[c])
        tree.parents.append(row_of[p] if p >= 0 else -1)
        tree.depths.append(cand_depth[c])
    tree.expanded = {
        (row_of[c] if c >= 0 else -1): v for c, v in tree.expanded.items() if c < 0 or c in row_of
    }
    return tree


@dataclass
class TreeOutcome:
    path: list[int]  # accepted node indices, root to deepest
    y: int  # the target's own token after the path
    ranks: list[tuple[int, int]]  # (depth of the choosing node, rank of its chosen token)


def _walk(
    tree: DraftTree, logits: np.ndarray, sp: SamplingParams, draws: Draws, pos: int
) -> TreeOutcome:
    """pos: the position of the first token chosen (the root row's next token)."""
    children: dict[int, dict[int, int]] = {}
    for i, (t, p) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        children.setdefault(p, {})[t] = i
    node = -1
    path: list[int] = []
    ranks: list[tuple[int, int]] = []
    while True:
        y, _ = pick(logits[node + 1], sp, draws.rng, draws.at(pos + len(path)))
        top = tree.expanded.get(node)
        if top is not None:
            ranks.append((len(path), rank_of(top, y)))
        nxt = children.get(node, {}).get(y)
        if nxt is None:
            return TreeOutcome(path, y, ranks)
        path.append(nxt)
        node = nxt


def tree_step(
    target: Target,
    drafter: Drafter,
    last: int,
    shape: TreeShape,
    sp: SamplingParams,
    draws: Draws,
    *,
    clock: Clock = perf_counter,
) -> StepResult:
    """Draft a tree, verify it in one target decode, accept the longest matching path."""
    t0 = now(clock)
    tree = draft_tree(drafter, shape)
    t_flush = drafter.t_flush
    t1 = now(clock)
    n = target.n
    logits = target.verify_tree(last, tree.tokens, tree.depths, tree.parents)
    t2 = now(clock)
    out = _walk(tree, logits, sp, draws, n + 1)
    target.commit_tree(last, out.path, tree.tokens)

    t3 = now(clock)
    rows = [0] + [i + 1 for i in out.path]
    accepted = [tree.tokens[i] for i in out.path]
    drafter.queue([*accepted, out.y], target.read_taps(rows[-1] + 1)[rows])
    t4 = now(clock)
    res = StepResult([*accepted, out.y], len(tree.tokens), len(out.path), 0.0, 0.0)
    res.ranks, res.c_flush = out.ranks, t_flush
    return timed(res, t0, t1, t2, t3, t4)
