"""Paces the streaming redraws by what they cost the UI thread, so rendering never takes more
than a set share of a core from the engine, however fast tokens come and however slowly the
terminal renders (a frame of a long reply costs milliseconds of layout and compositing).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class FrameBudget:
    """ready() says whether a redraw may start now: at most one per min_interval, and only
    once the UI thread's CPU time since the last redraw began, spread over the wall time
    since then, is down to `share` of a core; but always after max_interval."""

    def __init__(
        self,
        share: float = 0.08,
        min_interval: float = 1 / 20,
        max_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,  # the calling (UI) thread's CPU time
    ) -> None:
        self.share, self.min_interval, self.max_interval = share, min_interval, max_interval
        self._clock, self._cpu = clock, cpu
        self._t0 = self._cpu0 = float("-inf")

    def ready(self) -> bool:
        elapsed = self._clock() - self._t0
        spent = self._cpu() - self._cpu0
        return elapsed >= min(self.max_interval, max(self.min_interval, spent / self.share))

    def start(self) -> None:
        """A redraw starts now (call from the UI thread)."""
        self._t0, self._cpu0 = self._clock(), self._cpu()
