"""Timing a step's phases, outside the algorithm: SpecState's operations run inside spans, and
the generation loop reads what each phase cost after the step.

Two clocks: the wall clock for the statistics people read, and auto's cost clock (clocks.py:
the calling thread's CPU time on the CPU, the wall clock with layers on a GPU) for what the
cost model learns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter

from ..runtime.clocks import Clock


class Probe:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock  # tests inject their own to price native work
        self.wall: dict[str, float] = {}
        self.cost: dict[str, float] = {}

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        w0, c0 = perf_counter(), self.clock()
        try:
            yield
        finally:
            self.wall[name] = self.wall.get(name, 0.0) + perf_counter() - w0
            self.cost[name] = self.cost.get(name, 0.0) + self.clock() - c0

    def note(self, name: str, wall: float) -> None:
        """Wall seconds measured elsewhere (a part of a span's time), read with the spans."""
        self.wall[name] = self.wall.get(name, 0.0) + wall

    def take(self) -> tuple[dict[str, float], dict[str, float]]:
        """(wall, cost) seconds per phase since the last take; starts afresh."""
        out = self.wall, self.cost
        self.wall, self.cost = {}, {}
        return out

    def now(self) -> tuple[float, float]:
        return perf_counter(), self.clock()
