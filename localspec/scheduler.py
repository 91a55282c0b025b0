"""Choosing each step's draft shape: plain decoding, a chain or a tree, fixed or by auto's cost
model (which the scheduler owns, calibrates and teaches)."""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Literal

from . import _native as N
from .calibration import calibrate
from .clocks import cost_clock
from .costmodel import MAX_DEPTH, TOP_KS, CostModel, Plan, Verdict
from .drafter import Drafter
from .options import RuntimeOptions
from .speculative import StepResult
from .target import Target
from .tree import MAX_TOP_K, MAX_TREE_NODES, TreeShape


@dataclass(frozen=True)
class Mode:
    """What a call asked for: plain decoding, a fixed chain, a fixed tree, or auto."""

    kind: Literal["plain", "chain", "tree", "auto"]
    shape: TreeShape | None = None  # the fixed chain or tree

    def __str__(self) -> str:
        return str(self.shape) if self.shape is not None else self.kind

    @property
    def drafts(self) -> bool:
        return self.kind != "plain"

    @property
    def rejection_sampling(self) -> bool:
        """Fixed chains (n_draft=K) sample by rejection sampling (it accepts more; the text for
        a seed then depends on K); trees, even top-1 ones, and auto accept by the target's own
        position-keyed draws, so their text for a seed never depends on the shapes run."""
        return self.kind == "chain"


@dataclass(frozen=True)
class StepPlan:
    shape: TreeShape | None  # None: a plain step
    prediction: Plan | None = None  # auto: what the cost model expects of this step
    wake: bool = False  # feed the drafter again from this step (taps on, its cache restarts)
    sleep: bool = False  # stop feeding the drafter (taps off): no drafting can pay


def shape_label(shape: TreeShape | None) -> str:
    return "plain" if shape is None else str(shape)


class Scheduler:
    """Per step, the shape to run within the limits left (tokens, context, batch capacity)."""

    def __init__(
        self,
        target: Target,
        drafter: Drafter | None,
        rt: RuntimeOptions,
        *,
        max_tree: int,
        max_top_k: int,
    ) -> None:
        """max_tree: the most nodes a tree may verify (0: chains only); max_top_k: the widest
        frontier the drafter's batch holds."""
        self.target = target
        self.drafter = drafter
        self.rt = rt
        self.max_tree = max_tree
        self.max_top_k = max_top_k
        self.cost: CostModel | None = None  # calibrated on the first auto call
        self.mode = Mode("plain")
        # auto's clock (clocks.cost_clock); the drafter times its flushes on it too
        self.clock = cost_clock(rt.n_gpu_layers != 0 and N.gpu_offload_supported())
        if drafter is not None:
            drafter.clock = self.clock
        self.dormant = False  # auto: the drafter is not fed (taps off) while nothing pays
        self.t_calibrate = 0.0  # seconds the last start() spent timing decodes

    def start(self, mode: Mode, *, recalibrate: bool = False) -> None:
        """Begin a call. Auto's first call calibrates the cost model (from the disk cache when
        it holds this set-up), which clears both caches: call before the prompt is processed."""
        self.mode = mode
        self.t_calibrate = 0.0
        if mode.kind == "auto" and self.drafter is not None and (self.cost is None or recalibrate):
            t0 = perf_counter()
            cal = calibrate(
                self.target,
                self.drafter,
                self.rt,
                max_rows=min(self.target.n_batch, max(self.max_tree, MAX_DEPTH) + 1),
                top_ks=tuple(k for k in TOP_KS if k == 1 or k <= self.max_top_k),
                clock=self.clock,
                recalibrate=recalibrate,
            )
            self.cost = cal.cost_model(self.max_tree)
            if cal.measured:  # not when read from the disk cache
                self.t_calibrate = perf_counter() - t0
        # where no drafting can pay, start plain with taps off
        self.dormant = mode.kind == "auto" and self.cost is not None and self.cost.hopeless

    def plan(self, budget: int, free_cells: int) -> StepPlan:
        """budget: draft depth allowed (tokens and positions left); free_cells: KV cells a tree
        may still occupy in the target's cache."""
        mode = self.mode
        if self.drafter is None or not mode.drafts or budget < 1:
            return StepPlan(None)
        if mode.kind == "auto":
            assert self.cost is not None
            pred = self.cost.plan(budget)
            shape = pred.shape
            if self.dormant and shape is not None:
                self.dormant = False  # this step plain with taps: the drafter's first pair
                return StepPlan(None, pred, wake=True)
            if not self.dormant and shape is None and self.cost.hopeless:
                self.dormant = True
                return StepPlan(None, pred, sleep=True)
            return StepPlan(self._fit(shape, budget, free_cells), pred)
        assert mode.shape is not None
        return StepPlan(self._fit(mode.shape.clipped(budget), budget, free_cells))

    def explain(self) -> Verdict | None:
        """Auto's reason for what it runs now (None for fixed modes or before a plan)."""
        if self.mode.kind != "auto" or self.cost is None:
            return None
        return self.cost.explain()

    def _fit(self, shape: TreeShape | None, budget: int, free_cells: int) -> TreeShape | None:
        """A tree that does not fit the caches' room falls back to the chain of its depth."""
        if shape is None or shape.is_chain:
            return shape
        drafter_cells = self.target.n_ctx - self.target.n  # its cache mirrors the target's
        if (
            shape.budget > min(free_cells, self.max_tree)
            or (shape.depth - 1) * shape.top_k >= drafter_cells
            or shape.top_k > self.max_top_k
        ):
            d = min(shape.depth, budget)
            return TreeShape(d, 1, d)
        return shape

    def observe(self, plan: StepPlan, res: StepResult, glue: float) -> None:
        """Teach auto's cost model what the step cost (cost-clock seconds; glue: the rest of
        the step) and where the drafter's picks ranked."""
        if plan.prediction is None or self.cost is None:
            return
        shape = plan.shape
        self.cost.observe(
            shape,
            verify_rows=res.n_drafted + 1,
            t_verify=res.c_target,
            t_flush=res.c_flush,
            t_draft=res.c_draft,
            t_glue=glue,
            ranks=res.ranks,
            emitted=len(res.tokens),
        )

    @staticmethod
    def capacity(n_batch: int, draft_batch: int) -> tuple[int, int]:
        """(the most tree nodes one verify batch holds, the widest frontier the drafter's batch
        holds: two banks of top_k sequences plus the history's)."""
        max_tree = max(0, min(MAX_TREE_NODES, n_batch - 2))
        max_top_k = min(MAX_TOP_K, (min(draft_batch, n_batch) - 1) // 2)
        return max_tree, max_top_k
