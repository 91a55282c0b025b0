"""Costs for the cost model behind n_draft="auto": a CPU-like verify curve, a model fed a
rank distribution, and costs injected into a real engine (an injected cost clock that
advances only by what a test assigns to native work)."""

from __future__ import annotations

import time

import numpy as np

from localspec.auto import costmodel as cm
from localspec.lowlevel import parts
from localspec.runtime.drafter import Drafter
from localspec.runtime.target import Target

# measured on the project's 2-core CPU: SmolLM2 Q4_1, one decode of n tokens, t(n)/t(1)
CPU_RATIO = {1: 1.0, 2: 1.64, 3: 2.23, 4: 2.89, 5: 3.63, 6: 3.18, 8: 4.0, 12: 6.7, 16: 8.5}


def model(times: dict[int, float], expand: float = 0.2e-3) -> cm.CostModel:
    widths = {k: expand * (1 + 0.1 * k) for k in cm.TOP_KS}
    return cm.CostModel(cm.VerifyCurve(times), widths, flush=0.3e-3)


def feed(m: cm.CostModel, rank_probs: list[float], n: int = 400, seed: int = 0) -> None:
    """n observations per depth with the given rank distribution (last entry: miss)."""
    rng = np.random.default_rng(seed)
    p = np.array(rank_probs) / sum(rank_probs)
    for _ in range(n):
        for d in range(cm.MAX_DEPTH):
            m.acceptance.observe(d, int(rng.choice(len(p), p=p)))


class CostClock:
    """An injected cost clock: it advances only by the costs a test assigns to native work,
    so auto's decisions depend on those costs and on acceptance alone, whatever the machine
    does meanwhile (the clock the cost model reads is an engine attribute)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def price_target_decodes(monkeypatch, costly) -> None:
    """Every target decode of n rows (a step's decode, a tree verify) goes through
    costly(n, its result)."""
    decode, verify_tree = Target.decode, Target.verify_tree
    monkeypatch.setattr(Target, "decode", lambda self, tokens, *, all_logits: costly(
        len(tokens), decode(self, tokens, all_logits=all_logits)))  # fmt: skip

    def priced_tree(self, root, tokens, d, p):
        # the rows decoded: on a recurrent target each branch's whole path, padded
        out = verify_tree(self, root, tokens, d, p)
        return costly(self.tree_rows, out)

    monkeypatch.setattr(Target, "verify_tree", priced_tree)


def inject_costs(monkeypatch, eng, verify, drafter: float = 0.3e-3, stall=None) -> CostClock:
    """verify(n): the cost of a target decode of n rows; drafter: of each drafter call.
    stall(n): wall seconds to sleep after a target decode (what waiting for the interpreter
    lock adds to a wall clock), counted nowhere else."""
    clock = CostClock()
    parts(eng).probe.clock = clock

    def costly(n: int, out):
        clock.t += verify(n)
        if stall is not None:
            time.sleep(stall(n))
        return out

    price_target_decodes(monkeypatch, costly)
    # flush encodes (priced) and decodes its pairs itself: one price each, as calibration's
    for name in ("decode", "decode_frontier", "encode", "chain_next", "flush"):
        real = getattr(Drafter, name)

        def priced(self, *a, _real=real, **kw):
            clock.t += drafter
            return _real(self, *a, **kw)

        monkeypatch.setattr(Drafter, name, priced)
    return clock
