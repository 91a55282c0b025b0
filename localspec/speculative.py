"""One speculative step, chain form: draft k tokens, verify them in one target decode, accept.

Conventions (those of llama.cpp's EAGLE-3 driver):
- the target's KV holds positions 0..n-1; ``last`` is the token at position n, already chosen
  and emitted but not yet decoded by the target;
- drafter KV position P holds the pair (token[P+1], g[P]) where g[P] = fc(taps of position P).
  Pairs whose g is known but not yet written wait in a queue; the last queued pair is
  (last, g[n-1]), whose decoder output is the first draft.

Sampling is lossless by speculative rejection sampling (Leviathan et al. 2023; Chen et al.
2023): draft d ~ q (the drafter's distribution under the same temperature/top-k/top-p), accept
with probability min(1, p(d)/q(d)), on rejection draw from norm(max(p - q, 0)); after k
acceptances draw a bonus token from p. We use it rather than sample-and-match because for any q
it accepts with probability 1 - TV(p, q), never less than sample-and-match (which accepts with
p(d) for a greedy draft d). Greedy decoding accepts while the draft equals the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from .drafter import Drafter
from .sampling import SamplingParams, probs, sample
from .target import Target


@dataclass
class ChainState:
    n: int  # target KV holds positions 0..n-1
    last: int  # token at position n, chosen but not yet decoded by the target
    drafter_n: int = 0  # drafter KV holds positions 0..drafter_n-1
    queue_tokens: list[int] = field(default_factory=list)  # pairs not yet written to the drafter
    queue_g: list[np.ndarray] = field(default_factory=list)  # ... their g row blocks


@dataclass
class StepResult:
    tokens: list[int]  # emitted: accepted drafts, then the target's own token
    n_drafted: int
    n_accepted: int
    t_target: float
    t_draft: float


def pick(
    logits: np.ndarray, sp: SamplingParams, rng: np.random.Generator
) -> tuple[int, np.ndarray | None]:
    """Choose a token from logits: argmax (greedy) or a draw; also return the distribution."""
    if sp.greedy:
        return int(np.argmax(logits)), None
    p = probs(logits, sp)
    return sample(p, rng), p


def draft_chain(
    drafter: Drafter, st: ChainState, k: int, sp: SamplingParams, rng: np.random.Generator
) -> tuple[list[int], list[np.ndarray | None]]:
    """Write the queued pairs and draft k tokens after ``last`` (drafter positions n, n+1...)."""
    g = np.concatenate(st.queue_g) if len(st.queue_g) > 1 else st.queue_g[0]
    logits, h = drafter.decode(st.queue_tokens, g, st.drafter_n)
    st.drafter_n += len(st.queue_tokens)
    st.queue_tokens, st.queue_g = [], []
    drafts, qs = [], []
    for j in range(k):
        d, q = pick(logits, sp, rng)
        drafts.append(d)
        qs.append(q)
        if j < k - 1:
            logits, h = drafter.decode([d], h[None, :], st.n + j)
    return drafts, qs


def accept(
    logits: np.ndarray,
    drafts: list[int],
    qs: list[np.ndarray | None],
    sp: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Target rows 0..k verify drafts 1..k; return (accepted count m, the target's token)."""
    if sp.greedy:
        for i, d in enumerate(drafts):
            y = int(np.argmax(logits[i]))
            if y != d:
                return i, y
        return len(drafts), int(np.argmax(logits[len(drafts)]))
    for i, d in enumerate(drafts):
        p, q = probs(logits[i], sp), qs[i]
        assert q is not None
        if rng.random() * q[d] < p[d]:  # accept with probability min(1, p/q)
            continue
        residual = np.maximum(p - q, 0.0)
        return i, sample(residual if residual.sum() > 0 else p, rng)
    return len(drafts), sample(probs(logits[len(drafts)], sp), rng)


def speculative_step(
    target: Target,
    drafter: Drafter | None,
    st: ChainState,
    k: int,
    sp: SamplingParams,
    rng: np.random.Generator,
) -> StepResult:
    """Advance by one target decode. k=0 (or no drafter) is plain decoding on the same path."""
    t0 = perf_counter()
    drafts: list[int] = []
    qs: list[np.ndarray | None] = []
    if drafter is not None and k > 0:
        drafts, qs = draft_chain(drafter, st, k, sp, rng)
    t1 = perf_counter()

    logits = target.decode([st.last, *drafts], st.n, all_logits=True)
    t2 = perf_counter()
    m, y = accept(logits, drafts, qs, sp, rng)
    if m < len(drafts):
        target.truncate(st.n + m + 1)  # keep last, d1..dm at positions n..n+m

    t3 = perf_counter()
    if drafter is not None:
        taps = target.read_taps(m + 1)
        if drafts:
            drafter.truncate(st.n)  # positions >= n held draft states, not target features
            st.drafter_n = st.n
        # pairs for P = n..n+m: (token[P+1], g[P]) with token[n+1..n+m+1] = d1..dm, y
        st.queue_tokens.extend([*drafts[:m], y])
        st.queue_g.append(drafter.encode(taps))
    t4 = perf_counter()

    st.n += m + 1
    st.last = y
    return StepResult([*drafts[:m], y], len(drafts), m, t2 - t1, (t1 - t0) + (t4 - t3))
