"""The estimators auto learns with: ``Recent``, a cost priced at a low quantile of its recent
measurements (robust to another program's bursts), and ``FadingCounts``, counts of outcomes
that fade with the tokens generated, so that what auto believes follows a change of topic.
The cost model's EAGLE acceptance and the source choice's n-gram acceptance are both
``FadingCounts``, each read through its own prior (``shrunk``)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

LOW_Q = 0.25  # the quantile of recent observations a cost is priced at
WINDOW = 16  # observations behind each cost estimate (t(1) and plain steps: WINDOW_T1)
WINDOW_T1 = 32  # t(1) and whole plain steps, observed most often
HALF_LIFE = 512.0  # generated tokens over which acceptance evidence halves
FADE_EVERY = 16  # generated tokens gathered before the counts are faded (the fade is exact)


class Recent:
    """A low quantile (LOW_Q) of the last `window` observations of a cost. Other programs only
    ever add time to a measurement, never take it away, so the low end of recent samples is
    what the work itself costs; a burst of interference (another program busy for a while)
    moves a median as soon as it covers half the window, a low quantile only once it covers
    all but its lowest quarter. A lasting change (a longer context) still takes over after
    ``window - rank`` observations. The value it starts from counts as `weight` observations:
    a calibrated one as the repetitions behind it, a guess as none, so that the first
    measurement replaces a guess at once."""

    def __init__(self, value: float, window: int, weight: int = 0) -> None:
        self.recent: deque[float] = deque([value] * min(weight, window), maxlen=window)
        self.value = value
        self.n = weight

    def update(self, x: float) -> None:
        self.recent.append(x)
        self.n += 1
        ordered = sorted(self.recent)
        self.value = ordered[int(LOW_Q * (len(ordered) - 1))]


class FadingCounts:
    """Named count arrays whose evidence halves every HALF_LIFE generated tokens (applied once
    FADE_EVERY tokens have gathered: the same fade, fewer multiplications). ``version`` changes
    with every observation, so a reader can tell whether its cached result is stale."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        self.arrays = {name: np.zeros(shape) for name, shape in shapes.items()}
        self._pending_tokens = 0.0
        self.version = 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def observed(self) -> None:
        """Mark new evidence (after adding to an array)."""
        self.version += 1

    def advance(self, tokens: int) -> None:
        """Fade the evidence by the tokens generated since the last call."""
        self._pending_tokens += tokens
        if self._pending_tokens >= FADE_EVERY:
            f = 0.5 ** (self._pending_tokens / HALF_LIFE)
            for a in self.arrays.values():
                a *= f
            self._pending_tokens = 0.0


def shrunk(hits: Any, n: Any, prior: Any, weight: float) -> Any:
    """The estimate of a rate from (faded) hits out of n, with the prior worth `weight`
    observations: (hits + weight * prior) / (n + weight)."""
    return (hits + weight * prior) / (n + weight)
