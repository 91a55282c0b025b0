"""Token choice from logits: greedy, or sampling with temperature, top-k and top-p.

The same ``probs`` function defines the target's output distribution in plain decoding and in
speculation, which is what "lossless" is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidParameterError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no limit
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise InvalidParameterError(f"temperature must be in [0, 100], got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise InvalidParameterError(f"top_k must be an integer >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")

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
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), p.size - 1))
