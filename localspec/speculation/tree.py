"""The shape of a draft: how deep, how wide and how many nodes (a chain is a tree of width 1).

Draft trees are drafted by the EAGLE source (sources/eagle.py) and the n-gram source
(sources/ngram.py), verified in one target decode (runtime/target.py) and accepted by one walk
(verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidParameterError

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
