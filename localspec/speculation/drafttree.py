"""A draft: a tree of proposed tokens after the target's chosen-but-undecoded token (the root).

Every draft source yields one (a chain is a tree with one child per node), trees of several
sources merge into one (a trie: equal tokens under the same parent share a node), one target
decode verifies it (SpecState.verify) and one walk accepts it (verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tree import MAX_TOP_K

EAGLE = "eagle"
NGRAM = "ngram"
RANKS = MAX_TOP_K  # ranks 0..7 are told apart; RANKS means "not among the drafter's best 8"


class Scores:
    """What a model source's distribution at one node said, to tell where the target's token
    ranked among its candidates: the number of candidates scoring above it, capped at RANKS.
    Held as the node's logits row (a copy): counting at verify is cheaper than sorting for
    every node drafted, and chains and trees then rank alike."""

    __slots__ = ("_logits", "_index")

    def __init__(self, logits: np.ndarray, index: np.ndarray | None = None):
        """index: target id -> position in logits (-1: absent), where logits holds a draft
        vocabulary's entries alone; None: logits is indexed by target id."""
        self._logits, self._index = logits, index

    def rank(self, token: int) -> int:
        j = token if self._index is None else int(self._index[token])
        if j < 0:  # the drafter cannot propose it
            return RANKS
        return min(int(np.count_nonzero(self._logits > self._logits[j])), RANKS)


@dataclass
class DraftTree:
    """Nodes in depth-first order (parents before children, a source's better child first);
    node i is row i + 1 of the verify batch, the root row 0."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: a child of the root
    depths: list[int] = field(default_factory=list)  # 1-based
    sources: list[set[str]] = field(default_factory=list)  # who proposed each node
    # a model source's scores at each node it expanded (-1: the root): the rank statistics
    scores: dict[int, Scores] = field(default_factory=dict)
    # nodes drawn from a distribution q (a sampled chain): accepted by rejection sampling
    q: dict[int, np.ndarray] = field(default_factory=dict)
    # per source, its own chain of nodes from the root (n-gram: the main continuation), to
    # credit acceptance per position
    spine: dict[str, list[int]] = field(default_factory=dict)
    # n-gram alternative branches (first node of each), beside the main continuation
    alternatives: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def add(self, token: int, parent: int, source: str) -> int:
        """The node for token under parent (an existing one when a source already proposed
        it there); returns its index. Nodes must be added parents first."""
        for i in range(parent + 1, len(self.tokens)):
            if self.parents[i] == parent and self.tokens[i] == token:
                self.sources[i].add(source)
                return i
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1 if parent >= 0 else 1)
        self.sources.append({source})
        return len(self.tokens) - 1

    def children(self) -> dict[int, dict[int, int]]:
        """parent -> {token: child}."""
        out: dict[int, dict[int, int]] = {}
        for i, (t, p) in enumerate(zip(self.tokens, self.parents, strict=True)):
            out.setdefault(p, {}).setdefault(t, i)
        return out

    def path_tokens(self, path: list[int]) -> list[int]:
        return [self.tokens[i] for i in path]

    def ordered(self) -> DraftTree:
        """The same tree in depth-first order (merging can append a source's nodes after
        another's subtree): verification needs parents before children, and the target's
        cache commit needs rows of one path in increasing order."""
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            kids.setdefault(p, []).append(i)
        order: list[int] = []
        stack = list(reversed(kids.get(-1, [])))
        while stack:
            c = stack.pop()
            order.append(c)
            stack.extend(reversed(kids.get(c, [])))
        if order == list(range(len(order))):
            return self
        return self.only(order)

    def only(self, nodes: list[int]) -> DraftTree:
        """The tree of these nodes alone, renumbered in the order given (each one's parent
        among them, and before it): what a target that cannot verify all of it keeps, or the
        whole tree in another order."""
        new = {old: i for i, old in enumerate(nodes)}
        new[-1] = -1
        return DraftTree(
            tokens=[self.tokens[o] for o in nodes],
            parents=[new[self.parents[o]] for o in nodes],
            depths=[self.depths[o] for o in nodes],
            sources=[self.sources[o] for o in nodes],
            scores={new[k]: v for k, v in self.scores.items() if k in new},
            q={new[k]: v for k, v in self.q.items() if k in new},
            spine={s: _prefix_in(chain, new) for s, chain in self.spine.items()},
            alternatives=[new[i] for i in self.alternatives if i in new],
        )


def _prefix_in(chain: list[int], new: dict[int, int]) -> list[int]:
    """A source's chain renumbered, up to its first node not kept."""
    out = []
    for i in chain:
        if i not in new:
            break
        out.append(new[i])
    return out


def merge(base: DraftTree, other: DraftTree) -> DraftTree:
    """base with other's nodes added (shared prefixes become shared nodes); other's scores and
    q are dropped where a node already has base's (one model source per tree)."""
    out = DraftTree(
        list(base.tokens),
        list(base.parents),
        list(base.depths),
        [set(s) for s in base.sources],
        dict(base.scores),
        dict(base.q),
        {s: list(n) for s, n in base.spine.items()},
        list(base.alternatives),
    )
    where = {-1: -1}
    for i, (t, p) in enumerate(zip(other.tokens, other.parents, strict=True)):
        for s in other.sources[i]:
            where[i] = out.add(t, where[p], s)
    for k, sc in other.scores.items():
        out.scores.setdefault(where[k], sc)
    for k, q in other.q.items():
        out.q.setdefault(where[k], q)
    for s, nodes in other.spine.items():
        out.spine[s] = [where[i] for i in nodes]
    out.alternatives += [where[i] for i in other.alternatives]
    return out.ordered()
