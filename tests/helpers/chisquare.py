"""The statistical losslessness check shared by the sampling tests: the exact distribution of a
few sampled tokens, computed from the target's own logits one context at a time, against the
frequencies of many seeded speculative completions (chi-square, p ~ 0.001)."""

from __future__ import annotations

import math

import numpy as np

from localspec.lowlevel import parts
from localspec.speculation.sampling import SamplingParams

from helpers.llama_samplers import native_distribution

SP = {"temperature": 30.0, "top_k": 3}
N_SAMPLES = 3000
LEN = 3


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper critical value of chi-square at p ~ 0.001 (Wilson-Hilferty approximation)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def exact_distribution(
    eng, prompt: list[int], sp_kw: dict = SP, length: int = LEN
) -> dict[tuple[int, ...], float]:
    """P(t1, .., t_length) from the target's own logits, one context at a time, through
    llama.cpp's own sampler chain with the context as its history (a sequence ends early at
    an end-of-generation token, which is not emitted: key ends with -1)."""
    sp = SamplingParams(**sp_kw)
    tgt = parts(eng).target
    tgt.set_taps_active(False)

    def dist(ctx: list[int]) -> np.ndarray:
        tgt.clear()
        logits = np.array(tgt.decode(ctx, all_logits=False)[0])
        return native_distribution(logits, sp, ctx, tgt.model.vocab)

    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, pr in out.items():
            if len(seq) and seq[-1] < 0:  # ended
                nxt[seq] = pr
                continue
            p = dist(prompt + list(seq))
            for t in np.nonzero(p)[0]:
                key = (*seq, -1) if parts(eng).eog[t] else (*seq, int(t))
                nxt[key] = nxt.get(key, 0.0) + pr * p[t]
        out = nxt
    return out


def chi2_of_samples(
    eng,
    prompt: list[int],
    expected: dict,
    sp_kw: dict = SP,
    *,
    length: int = LEN,
    n_samples: int = N_SAMPLES,
    **gen: object,
) -> tuple[float, int, float]:
    """(chi-square statistic, degrees of freedom, accepted drafts per completion) of n_samples
    completions of `length` tokens, seeds 0.., with the call options gen (default n_draft=2)."""
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    gen = gen or {"n_draft": 2}
    for seed in range(n_samples):
        c = eng.complete(prompt, max_tokens=length, seed=seed, **sp_kw, **gen)
        key = (*c.tokens, -1) if c.finish_reason == "eos" else tuple(c.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += c.stats.accepted
    # pool cells with small expectation so the chi-square approximation holds
    stat, pooled_e, pooled_o, df = 0.0, 0.0, 0, -1
    for key, p in expected.items():
        e, o = p * n_samples, counts.pop(key, 0)
        if e < 5:
            pooled_e += e
            pooled_o += o
            continue
        stat += (o - e) ** 2 / e
        df += 1
    pooled_o += sum(counts.values())  # anything outside the support lands here
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        df += 1
    elif pooled_o:
        stat = math.inf
    return stat, df, accepted / n_samples


def repeating_prompt(eng, length: int = LEN) -> list[int]:
    """The prompt "abc" after every token the target can sample at positions 1..length - 1, each
    followed by its likeliest successor: the index then proposes a continuation at every
    drafted position.
    (The noisy pair's target reads only the last token: the distribution is the same for any
    prompt ending in "c".)"""
    tail = eng.tokenize("abc")
    tgt = parts(eng).target
    reach = {t for seq in exact_distribution(eng, tail, length=length - 1) for t in seq if t >= 0}
    out: list[int] = []
    for t in sorted(reach):
        tgt.clear()
        out += [t, int(np.argmax(tgt.decode([t], all_logits=False)[0]))]
    tgt.clear()
    return out + tail
