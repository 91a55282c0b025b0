"""The engine's parts, for tools that work below the scripting API: the benchmarks (`localspec
bench` among them, through localspec.bench) and the converter's verification. Not a stable API:
it follows the engine's insides. Training builds its own target and needs no engine.

The CLI, the chat app and the server never import this module (a test checks it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .runtime.parts import Parts

if TYPE_CHECKING:
    from .engine import Engine


def parts(engine: Engine) -> Parts:
    """The engine's parts, to inspect. To drive them (decode, clear, switch taps), use
    ``hold``: a generation running meanwhile would find its caches changed under it."""
    return engine._parts()


@contextmanager
def hold(engine: Engine) -> Iterator[Parts]:
    """The engine's parts for direct use. A generation still running is superseded (its next
    step raises), no other call runs meanwhile, and on leaving both caches are emptied and the
    target's taps are as they were, so the engine's next call starts from a consistent state."""
    with engine._exclusive() as p:
        was_active = p.target.taps_active
        try:
            yield p
        finally:
            engine._empty_caches()
            p.target.set_taps_active(was_active)


def verify_curve(
    engine: Engine, sizes: Sequence[int], reps: int = 5, *, taps: bool
) -> dict[int, float]:
    """Median wall seconds of one target decode of n tokens with logits for all (what verifying
    a draft of n-1 tokens costs), after a 64-token context; taps on as speculation runs them,
    or off as plain decoding does. The engine's caches are emptied afterwards."""
    with hold(engine) as p:
        target = p.target
        target.set_taps_active(taps)
        hi = min(1000, target.n_vocab)
        base = [int(t) for t in np.random.default_rng(0).integers(0, hi, size=64)]
        out = {}
        for n in sizes:
            times = []
            for r in range(reps):
                target.keep(0)
                target.decode(base, all_logits=False)
                toks = [int(t) for t in np.random.default_rng(r).integers(0, hi, size=n)]
                t0 = time.perf_counter()
                target.decode(toks, all_logits=True)
                times.append(time.perf_counter() - t0)
            out[n] = statistics.median(times)
    return out


def draft_costs(engine: Engine, depth: int = 10, reps: int = 20) -> tuple[float, float]:
    """(median wall seconds of one bare drafter decode of one row, its outputs read back; median
    wall seconds of drafting a chain of ``depth`` as a step does it: the step's pair written,
    then every position picked and decoded). Their ratio is what the loop adds around the
    drafter's own work. Needs a drafter; the engine's caches are emptied afterwards."""
    from . import native as N
    from .speculation.tree import TreeShape

    with hold(engine) as p:
        state, d, target = p.state, p.drafter, p.target
        if d is None or state.eagle is None:
            raise ValueError("draft_costs needs an engine with a drafter")
        hi = min(1000, target.n_vocab)
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, hi, size=64)]
        state.begin(prompt, feed=True, index=False)
        state.chosen(prompt[-1])
        state.eagle.flush()
        mark = d.end
        target.decode([prompt[-1]], all_logits=False)  # one more step: its taps feed a pair
        taps = target.read_taps(1)
        one = N.Batch(1, tokens=True, embd=d.n_embd)
        rng = np.random.default_rng(0)
        bare, chain = [], []
        for r in range(reps + 2):  # the first two warm up
            d.keep(mark)  # the prompt's pairs alone
            one.token[0] = prompt[r % len(prompt)]
            one.set(1, mark, all_logits=True)
            t0 = time.perf_counter()
            d.ctx.decode(one, "drafter decoder")
            d.ctx.outputs(0, d.n_embd)  # reading them waits for the device
            t1 = time.perf_counter()
            d.rewind(mark)
            d.queue([prompt[0]], taps)
            t2 = time.perf_counter()
            start = state.eagle.flush()
            state.eagle.draft(start, TreeShape(depth, 1, depth), None, rng, ranks=True)
            t3 = time.perf_counter()
            if r >= 2:
                bare.append(t1 - t0)
                chain.append(t3 - t2)
    return statistics.median(bare), statistics.median(chain)
