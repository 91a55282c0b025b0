"""One speculative step, whatever drafted: draft a tree, verify it in one target decode, walk
it, keep what was accepted (after gpt-fast's ``speculative_decode``).

Conventions (those of llama.cpp's EAGLE-3 driver): the target's cache holds positions 0..n-1;
``last`` is the token at position n, already chosen and emitted but not yet decoded by the
target. A step with no draft is plain decoding on the same path.
"""

from __future__ import annotations

from .drafttree import DraftTree
from .plan import StepPlan
from .sampling import Draws, Sampler
from .specstate import SpecState
from .verify import Outcome, walk


def speculative_step(
    state: SpecState, last: int, plan: StepPlan, sampler: Sampler, draws: Draws
) -> tuple[DraftTree, Outcome]:
    n = state.n
    tree = state.draft(plan, draws.rng)
    logits = state.verify(last, tree)
    out = walk(tree, logits, sampler, draws, n + 1)
    state.commit(last, tree, out)
    return tree, out
