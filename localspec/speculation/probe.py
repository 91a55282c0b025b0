"""Timing a step's phases, outside the algorithm: SpecState's operations run inside spans, and
the generation loop reads what each phase cost after the step.

Two clocks: the wall clock for the statistics people read, and auto's cost clock (clocks.py:
the calling thread's CPU time on the CPU, the wall clock with layers on a GPU) for what the
cost model learns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter

from ..runtime.clocks import Clock


@dataclass(frozen=True)
class StepCosts:
    """What a step cost on the cost clock, per phase (Probe spans)."""

    verify: float
    flush: float
    draft: float
    lookup: float  # the n-gram lookup (every step that may draft n-grams pays it)
    build: float  # building the n-gram draft into the step's tree
    feed: float
    glue: float  # the rest of the step

    @classmethod
    def of(cls, cost: dict[str, float], total: float) -> StepCosts:
        """A step's costs from its spans (``Probe.take``'s cost clock) and the cost clock's
        reading over the whole step: the rest is glue."""
        return cls(
            verify=cost.get("verify", 0.0),
            flush=cost.get("flush", 0.0),
            draft=cost.get("draft", 0.0),
            lookup=cost.get("lookup", 0.0),
            build=cost.get("build", 0.0),
            feed=cost.get("feed", 0.0),
            glue=max(0.0, total - sum(cost.values())),
        )


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
