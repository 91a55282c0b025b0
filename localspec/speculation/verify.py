"""Accepting a verified draft: the one walk down a draft tree, for every source and shape.

At each node (the root first) the target's token for the next position is chosen from that
node's logits exactly as plain decoding would choose it: the sampler chain applied with the
node's own history (the generation's tokens, then the path's down to the node: a penalty's
window holds the drafted tokens before it), then the likeliest survivor or a draw from the
target's distribution with the position's own uniform (sampling.Draws). If a child carries that
token the walk moves into it, else the token is emitted and the step ends. Every emitted token
is then the one plain decoding would emit, whatever the sources proposed: lossless by
construction, and for a seed the text never depends on the shapes run. For several
deterministic candidates this equals EAGLE's multi-candidate rejection sampling: trying
candidate x_i with probability p'(x_i) under the residual p' left after zeroing the earlier ones
lands on x_i exactly when a plain draw would be x_i. An n-gram proposal is such a candidate
(q one-hot: accepted with probability p(x)).

A node whose child was drawn from the drafter's distribution q (a fixed chain while sampling,
DraftTree.q) is accepted by speculative rejection sampling instead (Leviathan et al. 2023;
Chen et al. 2023): accept d with probability min(1, p(d)/q(d)), on rejection draw from
norm(max(p - q, 0)). It accepts with probability 1 - TV(p, q), more than matching a plain draw
does, and is exact too; its text for a seed depends on the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .drafttree import DraftTree
from .sampling import Draws, Sampler, SamplingParams, probs, sample, sample_at


@dataclass
class Outcome:
    """What the walk accepted."""

    path: list[int]  # accepted nodes, root to deepest
    y: int  # the target's own token after the path (emitted last)
    # (depth, rank) at each model-expanded node the walk chose from: where the target's token
    # ranked among that source's candidates (the cost model's acceptance statistics)
    ranks: list[tuple[int, int]] = field(default_factory=list)

    def emitted(self, tree: DraftTree) -> list[int]:
        return [*tree.path_tokens(self.path), self.y]


def pick(
    logits: np.ndarray, sp: SamplingParams, rng: np.random.Generator, u: float | None = None
) -> int:
    """A token from logits without history (the samplers that read none): the likeliest
    survivor (greedy) or a draw (with the uniform u when given)."""
    if sp.greedy and not sp.logit_bias and sp.typical_p == 1.0:
        return int(np.argmax(logits))
    p = probs(logits, sp)
    return sample(p, rng) if u is None else sample_at(p, u)


def walk(tree: DraftTree, logits: np.ndarray, sampler: Sampler, draws: Draws, pos: int) -> Outcome:
    """Rows: 0 the root, i + 1 node i. pos: the position of the root row's next token."""
    children = tree.children()
    node, out = -1, Outcome([], -1)
    path: list[int] = []  # the accepted nodes' tokens: the history after the sampler's own
    while True:
        row = logits[node + 1]
        kids = children.get(node, {})
        sampled = [c for c in kids.values() if c in tree.q]
        nxt: int | None
        if sampled:
            assert len(kids) == 1, "a sampled draft is its parent's only child"
            p = sampler.distribution(row, path)
            y, hit = _rejection(p, tree.tokens[sampled[0]], tree.q[sampled[0]], draws)
            nxt = sampled[0] if hit else None
        else:
            y = sampler.choose(row, path, draws.rng, draws.at(pos + len(out.path)))
            nxt = kids.get(y)
        scores = tree.scores.get(node)
        if scores is not None:
            out.ranks.append((len(out.path), scores.rank(y)))
        if nxt is None:
            out.y = y
            return out
        out.path.append(nxt)
        path.append(y)
        node = nxt


def _rejection(p: np.ndarray, d: int, q: np.ndarray, draws: Draws) -> tuple[int, bool]:
    """(the token, whether it is the draft d) by speculative rejection sampling against the
    target's distribution p."""
    if draws.rng.random() * q[d] < p[d]:  # accept with probability min(1, p/q)
        return d, True
    residual = np.maximum(p - q, 0.0)
    return sample(residual if residual.sum() > 0 else p, draws.rng), False
