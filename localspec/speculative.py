"""One speculative step, chain form: draft k tokens, verify them in one target decode, accept.

Conventions (those of llama.cpp's EAGLE-3 driver): the target's cache holds positions 0..n-1;
``last`` is the token at position n, already chosen and emitted but not yet decoded by the
target; the drafter's queue ends with the pair (last, g[n-1]), whose decoder output is the
first draft (see drafter.py).

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

from .clocks import Clock
from .drafter import Drafter
from .sampling import Draws, SamplingParams, probs, sample, sample_at
from .target import Target

GREEDY = SamplingParams()


@dataclass
class StepResult:
    tokens: list[int]  # emitted: accepted drafts, then the target's own token (the new last)
    n_drafted: int
    n_accepted: int
    t_target: float  # wall seconds of the verify decode (the statistics)
    t_draft: float  # wall seconds of the drafter's work
    # the same on the cost clock (costmodel.cost_clock: what auto learns costs from)
    c_target: float = 0.0
    c_draft: float = 0.0
    c_flush: float = 0.0  # of c_draft: writing the queued pairs
    # (draft depth, rank of the emitted token among the drafter's candidates there) for every
    # position where the drafter's distribution was computed: what the cost model learns from
    ranks: list[tuple[int, int]] = field(default_factory=list)


def now(clock: Clock) -> tuple[float, float]:
    """(wall seconds, cost-clock seconds), read together."""
    return perf_counter(), clock()


def pick(
    logits: np.ndarray, sp: SamplingParams, rng: np.random.Generator, u: float | None = None
) -> tuple[int, np.ndarray | None]:
    """Choose a token from logits: argmax (greedy) or a draw (with the uniform u when given);
    also return the distribution."""
    if sp.greedy:
        return int(np.argmax(logits)), None
    p = probs(logits, sp)
    return (sample(p, rng) if u is None else sample_at(p, u)), p


def rank_of(candidates: np.ndarray, token: int) -> int:
    """Index of token in a best-first candidate list (len when absent)."""
    hit = np.flatnonzero(candidates == token)
    return int(hit[0]) if hit.size else len(candidates)


def draft_chain(
    drafter: Drafter,
    k: int,
    sp: SamplingParams,
    rng: np.random.Generator,
    keep_logits: list[np.ndarray] | None = None,
) -> tuple[list[int], list[np.ndarray | None]]:
    """Write the queued pairs and draft k tokens after ``last`` (drafter positions n, n+1...);
    keep_logits, when given, receives a copy of each position's drafter logits."""
    logits, h = drafter.flush()
    pos = drafter.end
    drafts, qs = [], []
    for j in range(k):
        d, q = pick(logits, sp, rng)
        drafts.append(d)
        qs.append(q)
        if keep_logits is not None:
            keep_logits.append(logits.copy())
        if j < k - 1:
            logits, h = drafter.decode([d], h[None, :], pos + j)
    return drafts, qs


def accept(
    logits: np.ndarray,
    drafts: list[int],
    qs: list[np.ndarray | None],
    sp: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Target rows 0..k verify drafts 1..k; return (accepted count m, the target's token), by
    speculative rejection sampling of drafts drawn from q. Sampling only: greedy steps accept
    by the target's own argmax (accept_own_draws), where q is one-hot and this reduces to it."""
    assert not sp.greedy, "greedy drafts are accepted by accept_own_draws"
    for i, d in enumerate(drafts):
        p, q = probs(logits[i], sp), qs[i]
        assert q is not None
        if rng.random() * q[d] < p[d]:  # accept with probability min(1, p/q)
            continue
        residual = np.maximum(p - q, 0.0)
        return i, sample(residual if residual.sum() > 0 else p, rng)
    return len(drafts), sample(probs(logits[len(drafts)], sp), rng)


def accept_own_draws(
    logits: np.ndarray, drafts: list[int], sp: SamplingParams, draws: Draws, pos: int
) -> tuple[int, int]:
    """Row i draws the target's own token for position pos+i (greedy: argmax; sampling: the
    position's uniform) and accepts draft i+1 when it is that token. Every emitted token is the
    one plain decoding would draw there, so this is lossless for any drafts (used with the
    drafter's greedy picks, the single-candidate case of tree acceptance)."""
    for i, d in enumerate(drafts):
        y, _ = pick(logits[i], sp, draws.rng, draws.at(pos + i))
        if y != d:
            return i, y
    k = len(drafts)
    return k, pick(logits[k], sp, draws.rng, draws.at(pos + k))[0]


def speculative_step(
    target: Target,
    drafter: Drafter | None,
    last: int,
    k: int,
    sp: SamplingParams,
    draws: Draws,
    *,
    ranks: bool = False,
    own_draws: bool = True,
    clock: Clock = perf_counter,
) -> StepResult:
    """Advance by one target decode. k=0 (or no drafter) is plain decoding on the same path;
    with a drafter its pairs are still queued, so drafting can resume at any step. ranks: also
    report where the emitted tokens ranked in the drafter's distributions. own_draws: accept
    by the target's own position-keyed draws (greedy drafts); else, when sampling, by
    rejection sampling of drafts drawn from the drafter."""
    t0 = now(clock)
    n = target.n
    drafts: list[int] = []
    qs: list[np.ndarray | None] = []
    kept: list[np.ndarray] | None = [] if ranks else None
    rejection = not (own_draws or sp.greedy)
    if drafter is not None and k > 0:
        dsp = sp if rejection else GREEDY
        drafts, qs = draft_chain(drafter, k, dsp, draws.rng, kept)
    t1 = now(clock)

    logits = target.decode([last, *drafts], all_logits=True)
    t2 = now(clock)
    if rejection:
        m, y = accept(logits, drafts, qs, sp, draws.rng)
    else:
        m, y = accept_own_draws(logits, drafts, sp, draws, n + 1)
    if m < len(drafts):
        target.keep(n + m + 1)  # keep last, d1..dm at positions n..n+m

    t3 = now(clock)
    if drafter is not None:
        taps = target.read_taps(m + 1)
        if drafts:
            drafter.rewind()  # positions >= n held draft states, not target features
        # pairs for P = n..n+m: (token[P+1], g[P]) with token[n+1..n+m+1] = d1..dm, y
        drafter.queue([*drafts[:m], y], taps)
    t4 = now(clock)

    emitted = [*drafts[:m], y]
    res = timed(StepResult(emitted, len(drafts), m, 0.0, 0.0), t0, t1, t2, t3, t4)
    if drafts and drafter is not None:
        res.c_flush = drafter.t_flush
    if kept:
        # rank = how many draft-vocabulary logits beat the emitted token's
        res.ranks = [
            (i, int(np.count_nonzero(kept[i] > kept[i][emitted[i]])))
            for i in range(min(m + 1, len(kept)))
        ]
    return res


def timed(
    res: StepResult,
    t0: tuple[float, float],
    t1: tuple[float, float],
    t2: tuple[float, float],
    t3: tuple[float, float],
    t4: tuple[float, float],
) -> StepResult:
    """Fill a step's times from its marks: draft t0-t1, verify t1-t2, accept t2-t3 (glue),
    feeding the drafter t3-t4 (draft work too)."""
    res.t_target, res.c_target = t2[0] - t1[0], t2[1] - t1[1]
    res.t_draft = (t1[0] - t0[0]) + (t4[0] - t3[0])
    res.c_draft = (t1[1] - t0[1]) + (t4[1] - t3[1])
    return res
