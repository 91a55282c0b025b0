"""Token choice from logits: greedy, or sampling with temperature, top-k and top-p.

The same ``probs`` function defines the target's output distribution in plain decoding and in
speculation, which is what "lossless" is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no limit
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise InvalidParameterError(
                f"temperature must be in [0, 100], got {self.temperature}", parameter="temperature"
            )
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise InvalidParameterError(
                f"top_k must be an integer >= 0, got {self.top_k}", parameter="top_k"
            )
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(
                f"top_p must be in (0, 1], got {self.top_p}", parameter="top_p"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The sampling distribution over the vocabulary (float64, sums to 1)."""
    x = logits.astype(np.float64) / sp.temperature
    if 0 < sp.top_k < x.size:
        kth = np.partition(x, x.size - sp.top_k)[x.size - sp.top_k]
        x = np.where(x >= kth, x, -np.inf)
    x -= x.max()
    p = np.exp(x)
    p /= p.sum()
    if sp.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        n_keep = int(np.searchsorted(cum, sp.top_p)) + 1
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:n_keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    # inverse-CDF draw; searchsorted on the cumulative sum is exact and fast
    return sample_at(p, rng.random())


def sample_at(p: np.ndarray, u: float) -> int:
    """The inverse-CDF draw for a given uniform u in [0, 1)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), p.size - 1))


class Draws:
    """The randomness of one generation. Tokens are drawn from the target's distribution by
    inverse CDF with a uniform keyed by the token's position, so plain decoding, auto and
    draft trees turn a seed into the same text however the steps were scheduled; ``rng`` feeds
    the rest (rejection sampling of fixed chains, whose output depends on k)."""

    def __init__(self, seed: int | None, base: int) -> None:
        root = np.random.SeedSequence(seed)
        pos_seq, rest = root.spawn(2)
        self._pos_rng = np.random.default_rng(pos_seq)
        self.rng = np.random.default_rng(rest)
        self.base = base  # position of the first generated token
        self._u = np.empty(0)

    def at(self, pos: int) -> float:
        i = pos - self.base
        while i >= self._u.size:
            self._u = np.concatenate([self._u, self._pos_rng.random(max(256, self._u.size))])
        return float(self._u[i])
