"""The cost model behind ``n_draft="auto"``: choose, for every step, the draft shape (nothing, a
chain, or a tree) that maximises expected tokens per second on this machine.

Expected tokens per step come from acceptance statistics: for each draft depth d, the
distribution of the rank that the target's emitted token had among the drafter's candidates
there (rank 0: the drafter's top choice). A chain of k accepts position d when the rank there is
0; a tree whose nodes have top-k children covers ranks < k. The expected accepted length of a
shape is the sum over its nodes of the probability that the path to the node is accepted (the
same expected tree EAGLE-2 and Sequoia reason with, here from measured ranks). Counts fade with a
half-life in generated tokens, so the model follows a change of topic, and a prior keeps early
estimates sane.

Expected time per step: the target's verify cost for the batch size (calibrated at load by timing
real decodes, refined on every step), the drafter's cost per depth and frontier width, and the
per-step bookkeeping, all measured.

When no drafting pays under the mean estimates, an optimistic estimate of first-position
acceptance (an upper confidence bound that widens as the counts fade) decides whether to probe
with a short chain now and then, so speculation comes back if the text turns predictable.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

import numpy as np

from ..speculation.tree import MAX_TOP_K, MAX_TREE_NODES, TreeShape
from .estimators import WINDOW, WINDOW_T1, FadingCounts, Recent, shrunk
from .verdict import Verdict, break_even

N_RANKS = MAX_TOP_K  # rank buckets 0..7; bucket 8 is "not among the drafter's top 8"
MAX_DEPTH = 32  # deepest EAGLE chain auto considers (as deep as an n-gram draft)
# deepest tree of width > 1: past it only an almost always accepted drafter gains, and there
# a chain's nodes are worth more than siblings; the search's cost grows with the depth of
# wide trees (twice the time at 32)
MAX_TREE_DEPTH = 16
TOP_KS = (1, 2, 4, 8)  # frontier widths auto considers (1 is a chain)
PRIOR_WEIGHT = 4.0  # pseudo-observations behind the prior
REPLAN_EVERY = 16  # steps after which new evidence is searched again, however little
REPLAN_LATEST = 64  # steps after which the search is repeated in any case (while fed)
# asleep (no drafts, so no new evidence), the plan changes only when a cost moves or the old
# evidence fades: it is searched again once the first-position evidence faded by this share
# (half: a HALF_LIFE of tokens). A search costs about a GPU's plain step: repeated every
# REPLAN_LATEST steps, it cost auto with a useless drafter 1.3% of plain decoding's speed on
# the H200's 1.5B shape.
ASLEEP_FADE = 0.5
REFRESH_T1 = 32  # drafting steps after which plain steps measure t(1) again (two: see observe)
UCB_Z = 1.5  # optimism of the exploration bound
# prior rank distribution at the first draft position (then each depth borrows the one above)
_PRIOR0 = np.array([0.5, 0.1, 0.05, 0.03, 0.02, 0.02, 0.01, 0.01, 0.26])


@dataclass(frozen=True)
class Plan:
    shape: TreeShape | None  # None: no drafting this step
    tokens: float  # expected tokens emitted by the step
    seconds: float  # expected time of the step
    explore: bool = False  # chosen by the optimistic bound, not the mean

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


CALIBRATION_REPS = 3


class VerifyCurve:
    """t(n), seconds for one target decode of n tokens with logits on every row, modelled as a
    base t(1) that follows the context's growth and a shape t(n)/t(1), each a low quantile of
    its recent observations (estimators.Recent). times: calibrated decode times per batch
    size (best of CALIBRATION_REPS each). Sizes between measured ones are interpolated;
    ``max_measured`` is the largest size ever measured, beyond which auto does not plan."""

    def __init__(self, times: dict[int, float]) -> None:
        # a decode of more rows never costs less than one of fewer: a calibrated time above a
        # larger size's was hit by noise (seen: t(1) 204 ms against t(2) 16 ms on a machine
        # whose cores were all busy), and an inflated t(1) would make every draft look cheap
        # until a plain step measured it again
        times = dict(times)
        sizes = sorted(times)
        for a, b in zip(reversed(sizes[:-1]), reversed(sizes[1:]), strict=True):
            times[a] = min(times[a], times[b])
        base = times[1]
        self.base = Recent(base, WINDOW_T1, CALIBRATION_REPS)
        self.ratio = {n: Recent(t / base, WINDOW, CALIBRATION_REPS) for n, t in times.items()}
        self.ratio[1] = Recent(1.0, 1, 1)
        self._sizes = sorted(self.ratio)
        self._shape_version = 0  # bumped when a size's shape t(n)/t(1) moved
        self._table_key = (-1, -1)
        self._table = np.zeros(0)
        self._mono_key = -1
        self._mono: dict[int, float] = {}

    @property
    def max_measured(self) -> int:
        return self._sizes[-1]

    def __call__(self, n: int) -> float:
        return self.base.value * self._ratio(n)

    def _monotone(self) -> dict[int, float]:
        """Each measured size's shape, never above a larger size's: a size whose recent
        decodes came out dearer than a bigger one's is taken as hit by noise (on the H200 an
        inflated t(17) made a 20-row tree look cheaper than a 16-deep chain, and auto drafted
        trees at 2.3x plain where the chain ran 3.1x). Where a GPU's kernels really make a
        small batch dearer (run 4 timed t(3) and t(4) above t(5)), the small one is priced as
        the bigger: a deeper draft at that price is the better plan anyway."""
        if self._mono_key != self._shape_version:
            low = math.inf
            for n in reversed(self._sizes):
                if n == 1:  # t(1) is the base, measured most often: never capped
                    self._mono[n] = self.ratio[n].value
                else:
                    low = min(low, self.ratio[n].value)
                    self._mono[n] = low
            self._mono_key = self._shape_version
        return self._mono

    def _ratio(self, n: int) -> float:
        m = self._monotone()
        r = m.get(n)
        if r is not None:
            return r
        s = self._sizes
        if n <= s[0]:
            return m[s[0]] * max(n, 0) / s[0]
        if n > s[-1]:  # a guess for what was never measured: the steeper of two slopes
            if len(s) == 1:
                return float(n)
            a, b = s[-2], s[-1]
            last = (m[b] - m[a]) / (b - a)
            mean = (m[b] - 1.0) / (b - 1)
            return m[b] + max(last, mean, 0.0) * (n - b)
        i = bisect_left(s, n)  # as np.searchsorted (side left), without an array per call
        a, b = s[i - 1], s[i]
        w = (n - a) / (b - a)
        return (1 - w) * m[a] + w * m[b]

    def observe(self, n: int, seconds: float) -> None:
        """One measured decode of n rows. t(1) learns only from one-row decodes and each size's
        shape only from its own decodes, so a wrong estimate of one size (a calibration hit by
        a stall) is corrected by that size's own measurements and never spreads to others."""
        if n == 1:
            self.base.update(seconds)
            return
        r = self.ratio.get(n)
        if r is None:  # a size never measured: its guessed shape is replaced by what we see
            r = self.ratio[n] = Recent(self._ratio(n), WINDOW)
            self._sizes = sorted(self.ratio)
            self._shape_version += 1
        before = r.value
        r.update(seconds / self.base.value)
        if r.value != before:
            self._shape_version += 1

    def table(self, n: int) -> np.ndarray:
        """t(0..n) as an array (the shape is kept until a size's shape moves)."""
        if self._table_key != (n, self._shape_version):
            self._table = np.array([self._ratio(i) for i in range(n + 1)])
            self._table_key = (n, self._shape_version)
        return self.base.value * self._table


class Acceptance:
    """Per draft depth, faded counts of the emitted token's rank among the drafter's picks."""

    def __init__(self) -> None:
        self.evidence = FadingCounts(ranks=(MAX_DEPTH, N_RANKS + 1))
        self.counts = self.evidence["ranks"]

    @property
    def version(self) -> int:  # changes with every observation
        return self.evidence.version

    def observe(self, depth: int, rank: int) -> None:
        if depth < MAX_DEPTH:
            self.counts[depth, min(rank, N_RANKS)] += 1.0
            self.evidence.observed()

    def advance(self, tokens: int) -> None:
        """Fade the evidence by the tokens generated since the last call."""
        self.evidence.advance(tokens)

    def probabilities(self, first_rank0: float | None = None) -> np.ndarray:
        """[MAX_DEPTH, N_RANKS + 1] rank distributions (each depth shrunk towards the one
        above); first_rank0 overrides P(rank 0) at depth 0 (for the optimistic bound)."""
        out = np.empty_like(self.counts)
        prior = _PRIOR0
        # past the deepest depth with evidence each depth is the one above: no loop there
        seen = np.flatnonzero(self.counts.any(axis=1))
        last = int(seen[-1]) if seen.size else 0
        for d in range(last + 1):
            c = self.counts[d]
            p = shrunk(c, c.sum(), prior, PRIOR_WEIGHT)
            if d == 0 and first_rank0 is not None:
                rest = p[1:] * (1 - first_rank0) / max(p[1:].sum(), 1e-12)
                p = np.concatenate([[first_rank0], rest])
            out[d] = p
            prior = p
        out[last + 1 :] = prior
        return out

    def first_rank0(self) -> float:
        """P(rank 0) at depth 0: probabilities()[0, 0], without the other depths."""
        c = self.counts[0]
        return float(shrunk(c[0], c.sum(), _PRIOR0[0], PRIOR_WEIGHT))

    def first_rank0_bound(self) -> float:
        c = self.counts[0]
        n = c.sum() + PRIOR_WEIGHT
        mean = shrunk(c[0], c.sum(), _PRIOR0[0], PRIOR_WEIGHT)
        return min(1.0, mean + UCB_Z * math.sqrt(mean * (1 - mean) / n))


def _nodes_best_first(
    p: np.ndarray, top_k: int, max_depth: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The expected tree drafted max_depth deep with frontier width top_k: its node values
    (the probability that the path to the node is accepted) best first, each node's depth,
    and how many nodes the depths 1..d hold (per d)."""
    # A tree keeps children in the drafter's own rank order, so a rank-j child never counts for
    # more than its better-ranked siblings (cumulative minimum; a no-op on sane statistics).
    p = np.minimum.accumulate(p[:max_depth, :top_k], axis=1)
    if top_k == 1:  # a chain: one node per depth, already best first
        return np.cumprod(p[:, 0]), np.arange(1, max_depth + 1), np.arange(1, max_depth + 1)
    frontier = np.ones(1)
    values: list[np.ndarray] = []
    for d in range(max_depth):
        children = np.multiply.outer(frontier, p[d]).ravel()
        values.append(children)
        # the top_k best children, in any order (the frontier is a set)
        frontier = -np.partition(-children, top_k - 1)[:top_k]
    v = np.concatenate(values)
    sizes = [c.size for c in values]
    dd = np.repeat(np.arange(1, max_depth + 1), sizes)
    order = np.argsort(-v, kind="stable")
    return v[order], dd[order], np.cumsum(sizes)


def expected_lengths(p: np.ndarray, top_k: int, max_depth: int) -> list[np.ndarray]:
    """For each depth D <= max_depth, the best-first node values of the expected tree drafted
    D deep with frontier width top_k: value = probability the path to the node is accepted.
    Their prefix sums are the expected accepted lengths for each node budget."""
    v, dd, _ = _nodes_best_first(p, top_k, max_depth)
    return [v[dd <= depth] for depth in range(1, max_depth + 1)]


def expected_gains(p: np.ndarray, top_k: int, max_depth: int, max_nodes: int) -> np.ndarray:
    """[max_depth, max_nodes] expected tokens of a step whose tree is drafted D = row + 1 deep
    and verifies n = column + 1 nodes (1 + the best n node values at depths <= D, as
    expected_lengths gives them); NaN where no such tree exists (fewer than D nodes, more
    than the drafted ones, or a chain of other than D nodes). One pass for every depth."""
    v, dd, held = _nodes_best_first(p, top_k, max_depth)
    # A row counts its best max_nodes nodes. Once the depths up to some D hold that many, a
    # node below the max_nodes-th best of theirs counts in no row that deep or deeper, and the
    # shallower rows hold only nodes shallower than D: drop the rest (most of the candidates
    # of wide, deep trees).
    if held[-1] > max_nodes:
        d = int(np.searchsorted(held, max_nodes)) + 1  # depths 1..d hold >= max_nodes
        keep = (dd < d) | (v >= v[dd <= d][max_nodes - 1])
        v, dd = v[keep], dd[keep]
    within = dd[None, :] <= np.arange(1, max_depth + 1)[:, None]  # [depth, node]
    total = 1.0 + np.cumsum(np.where(within, v, 0.0), axis=1)
    count = np.cumsum(within, axis=1)
    gains = np.full((max_depth, max_nodes), np.nan)
    rows, cols = np.nonzero(within & (count <= max_nodes))
    gains[rows, count[rows, cols] - 1] = total[rows, cols]
    n = np.arange(1, max_nodes + 1)[None, :]
    depth = np.arange(1, max_depth + 1)[:, None]
    gains[n != depth if top_k == 1 else n < depth] = np.nan
    return gains


@dataclass(frozen=True)
class ReadyCosts:
    """What keeping the drafter ready costs: a one-token decode with the taps on and with them
    off (the staging API's outputs, or the graph callback, which is removed while they are
    off), and what switching them costs (the decode after a switch rebuilds llama.cpp's
    scheduler). Measured by calibration; equal on and off where nothing is tapped."""

    t1_on: float
    t1_off: float
    switch: float = 0.0


PLAIN_GLUE = 30e-6  # a plain step's bookkeeping, until measured


class CostModel:
    """Measured costs and acceptance; ``plan`` picks the next step's shape.

    Plain steps are priced twice: with the drafter fed (taps on, its pairs queued: what auto
    pays while it stays ready to draft) and unfed (taps off: plain decoding's own cost, the bar
    every draft must beat). Their difference, the ready tax, and the cost of switching decide
    how long a drafter that is not drafting stays fed."""

    def __init__(
        self,
        verify: VerifyCurve,
        draft_depth: dict[int, float],
        flush: float,
        *,
        ready: ReadyCosts | None = None,
        max_nodes: int = MAX_TREE_NODES,
    ) -> None:
        self.verify = verify
        # per frontier width; writing the queued pairs and the first draft distribution
        self.expand = {k: Recent(t, WINDOW, CALIBRATION_REPS) for k, t in draft_depth.items()}
        self.flush = Recent(flush, WINDOW, CALIBRATION_REPS)
        t1 = verify(1)
        self.tapped = ready is not None  # a drafter's taps exist: fed and unfed steps differ
        ready = ready or ReadyCosts(t1, t1)
        # a one-token decode with the taps off costs no more than with them on, and the one
        # with them on is the curve's t(1): timings saying otherwise caught another program
        t1_on = min(ready.t1_on, t1)
        ready = replace(ready, t1_on=t1_on, t1_off=min(ready.t1_off, t1_on))
        # whole plain steps (decode, bookkeeping, the drafter's feed), fed and unfed; the
        # calibrated decode counts as its repetitions, the glue is a guess until measured
        self.plain = {
            fed: Recent(t + PLAIN_GLUE, WINDOW_T1, CALIBRATION_REPS)
            for fed, t in ((True, ready.t1_on), (False, ready.t1_off))
        }
        self.t1_off = Recent(ready.t1_off, WINDOW_T1, CALIBRATION_REPS)  # the decode alone
        # the fed t(1) first measured after the unfed plain step was: while the drafter stays
        # fed, the unfed cost follows the context's growth with t(1) from there (None: no fed
        # one-token decode measured since, so the unfed cost is as measured)
        self._unfed_base: float | None = t1
        self.switch = Recent(ready.switch, WINDOW, CALIBRATION_REPS)
        self.glue = {  # guesses, replaced by the first measurement
            "chain": Recent(80e-6, WINDOW),
            "tree": Recent(300e-6, WINDOW),
        }
        self.acceptance = Acceptance()
        self.max_nodes = max_nodes
        # a recurrent target verifies each branch of a tree in a sequence of its own, padded
        # to the deepest (Target.verify_tree): at most this many (0: the leaves share rows)
        self.branches = 0
        self._plan: Plan | None = None
        self._searched: Plan | None = None  # the last search's result (what auto intends)
        # no drafting pays even on optimistic acceptance: the engine then stops feeding the
        # drafter (taps off) until a later search says otherwise
        self.hopeless = False
        self._plan_version: tuple[int, int] = (-1, -1)
        self._plan_seen = 0.0  # first-position drafts behind the last search (faded)
        self._plan_plain = 0.0  # plain decoding's cost at the last search
        self._probe_bar = math.inf  # hopeless: the bound at which a probe would pay
        self._costs_version = 0  # bumped when a measured cost moved: plans are made again
        self._verify_version = 0  # ... when the verify curve did (asleep, plain's is compared)
        self._plan_verify = 0  # _verify_version at the last search
        self._steps_since_plan = 0
        self._steps_since_t1 = 0  # steps since a settled one-row decode was measured
        self._last_rows = 1  # the previous step's verify rows
        self.searches = 0  # searches run, and the seconds they took (host time per step)
        self.search_s = 0.0

    # --- prediction --------------------------------------------------------------------------

    @property
    def ready_tax(self) -> float:
        """Seconds a plain step costs more with the drafter fed than without."""
        return max(0.0, self.plain[True].value - self.plain[False].value)

    def rewake_cost(self) -> float:
        """Seconds that sleeping and waking again costs: two switches of the taps and the
        wake step, which runs fed."""
        return 2 * self.switch.value + self.ready_tax

    def step_time(self, shape: TreeShape | None) -> float:
        """Expected seconds of a step; plain (None): plain decoding's, with the drafter unfed
        (what every draft must beat, since a drafter that does not pay is put to sleep)."""
        if shape is None:
            grown = self.verify(1) / self._unfed_base if self._unfed_base else 1.0
            return self.plain[False].value * grown
        return self.verify_step(shape) + self.drafting(shape)

    def at_least_plain(self, seconds: float) -> float:
        """A step that verifies a draft, priced no lower than a plain step: it does all of a
        plain step's work and more. Estimates made at different moments on a busy machine can
        disagree; this keeps every draft at least as dear as plain decoding, so no expected
        speedup exceeds the tokens a step is expected to emit."""
        return max(seconds, self.step_time(None))

    def tree_rows(self, nodes: Any, depth: Any, leaves: Any) -> np.ndarray:
        """Rows a tree's verify decodes (arrays broadcast): its root and nodes; on a recurrent
        target each leaf's path apart, padded to the deepest, leaves x (depth + 1), and -1
        where it has more leaves than the target has branch sequences."""
        if not self.branches:
            return np.asarray(nodes) + 1
        depth, leaves = np.asarray(depth), np.asarray(leaves)
        return np.where(leaves <= self.branches, leaves * (depth + 1), -1)

    def verify_step(self, shape: TreeShape) -> float:
        """Seconds of a draft step's verify and bookkeeping (no drafting): the target's decode
        of the root and the draft's nodes, never less than a plain step. A tree on a recurrent
        target is priced at the most rows its nodes can take (every node past the deepest
        path a leaf of its own)."""
        if shape.is_chain:
            rows = 1 + min(shape.budget, shape.depth)
        else:
            leaves = min(shape.budget - shape.depth + 1, self.branches or shape.budget)
            rows = int(self.tree_rows(shape.budget, shape.depth, max(leaves, 1)))
        mode = "chain" if shape.is_chain else "tree"
        return self.at_least_plain(self.verify(rows) + self.glue[mode].value)

    def drafting(self, shape: TreeShape) -> float:
        """Seconds the EAGLE drafter spends drafting this shape (0 without a drafter)."""
        if not self.expand:
            return 0.0
        expand = self.expand.get(shape.top_k) or self.expand[max(self.expand)]
        return self.flush.value + (shape.depth - 1) * expand.value

    def predict(self, shape: TreeShape | None, p: np.ndarray | None = None) -> Plan:
        """Expected tokens and seconds of one step with this shape (no search)."""
        if shape is None:
            return Plan(None, 1.0, self.step_time(None))
        p = self.acceptance.probabilities() if p is None else p
        depth = min(shape.depth, MAX_DEPTH)
        vals = expected_lengths(p, shape.top_k, depth)[depth - 1]
        nodes = shape.depth if shape.is_chain else shape.budget
        return Plan(shape, 1.0 + float(vals[:nodes].sum()), self.step_time(shape))

    def _search(self, p: np.ndarray, budget: int, top_ks: tuple[int, ...]) -> Plan:
        best = Plan(None, 1.0, self.step_time(None))
        # never a verify batch larger than one measured: an extrapolated cost is a guess
        max_nodes = min(self.max_nodes, self.verify.max_measured - 1)
        if min(MAX_DEPTH, budget, max_nodes) < 1:
            return best
        measured = self.verify.max_measured
        verify = self.verify.table(measured)  # t(0..measured), cached
        for k in top_ks:
            if k not in self.expand:  # widths the engine cannot draft were not calibrated
                continue
            max_depth = min(MAX_DEPTH if k == 1 else MAX_TREE_DEPTH, budget, max_nodes)
            depths = np.arange(max_depth)  # drafting D deep costs D - 1 expansions
            gains = expected_gains(p, k, max_depth, max_nodes)
            glue = self.glue["chain" if k == 1 else "tree"].value
            # each step's verify and bookkeeping, no cheaper than a plain step; then drafting
            if k == 1 or not self.branches:
                checked = np.maximum(verify[2 : max_nodes + 2] + glue, self.step_time(None))
                verifies = np.broadcast_to(checked[None, :], gains.shape)
            else:
                # a recurrent target's branches: as many rows as its nodes can take, never
                # more than a measured decode nor more leaves than it holds sequences for
                deep = depths[:, None] + 1
                nodes = np.arange(1, max_nodes + 1)[None, :]
                rows = self.tree_rows(nodes, deep, nodes - deep + 1)
                fits = (rows > 0) & (rows <= measured)
                verifies = np.where(
                    fits,
                    np.maximum(verify[np.where(fits, rows, 0)] + glue, self.step_time(None)),
                    np.inf,
                )
            times = verifies + (self.flush.value + depths * self.expand[k].value)[:, None]
            rate = gains / times
            if np.isnan(rate).all():
                continue
            # the first best in (depth, nodes) order: ties go to the shallower, smaller tree
            d, n = np.unravel_index(int(np.nanargmax(rate)), rate.shape)
            if rate[d, n] > best.tokens_per_s:
                shape = TreeShape(int(d) + 1, k, int(n) + 1)
                best = Plan(shape, float(gains[d, n]), float(times[d, n]))
        return best

    def plan(self, budget: int, *, fed: bool = True) -> Plan:
        """The shape for the next step; budget caps the draft depth (tokens or context left);
        fed: the drafter is fed now (asleep, t(1) is not refreshed: the plan is what would
        wake it). The search (about a millisecond) is repeated when a cost moved, when the
        first-position evidence grew by a quarter since the last one, after REPLAN_EVERY
        steps with new evidence, or after REPLAN_LATEST steps (evidence fades with the
        tokens: a probe may come due). Asleep, nothing new is learnt of acceptance: it is
        repeated when the verify curve moved, when plain decoding's cost is 10% off what the
        last search used, when the evidence faded by ASLEEP_FADE, or when the optimistic
        bound reached the threshold at which a probe pays. In between the last plan is
        reused."""
        self._steps_since_plan += 1
        seen = float(self.acceptance.counts[0].sum())
        grown = seen - self._plan_seen >= max(1.0, 0.25 * self._plan_seen)
        due = self.acceptance.version != self._plan_version[0] and (
            grown or self._steps_since_plan >= REPLAN_EVERY
        )
        moved = self._costs_version != self._plan_version[1]
        if fed:
            late = self._steps_since_plan >= REPLAN_LATEST
        else:
            late = self._plan_seen - seen >= max(1e-9, ASLEEP_FADE * self._plan_seen) or (
                self.hopeless and self.acceptance.first_rank0_bound() >= self._probe_bar
            )
            # plain decoding's cost against the search's: a slow drift counts, an estimate
            # flipping to and fro on a noisy machine does not
            drift = abs(self.step_time(None) - self._plan_plain) > 0.1 * self._plan_plain
            moved = drift or self._verify_version != self._plan_verify
        if self._plan is None or due or moved or late:
            self._replan()
        plan = self._plan
        assert plan is not None
        if fed and plan.shape is not None and self._steps_since_t1 >= REFRESH_T1:
            # drafting for a long while: plain decoding's own cost (the bar drafting must beat)
            # was not measured since; one plain step measures it again
            return Plan(None, 1.0, self.step_time(None), explore=True)
        if plan.shape is not None and plan.shape.depth > budget:
            plain = self.predict(None)
            if budget < 1:
                return plain
            # clipped near the end: drafting only if the model still expects it to pay
            clipped = self.predict(plan.shape.clipped(budget))
            return clipped if clipped.tokens_per_s > plain.tokens_per_s else plain
        return plan

    def new_call(self) -> None:
        """A call begins: its first decode follows the prompt's (or another mode's), whose
        size the model did not see, so it counts as coming after another size."""
        self._last_rows = 0

    def skip(self) -> None:
        """A step that reused an earlier plan without asking for one (auto's quiet steps)."""
        self._steps_since_plan += 1

    def _replan(self) -> None:
        t0 = perf_counter()
        self._steps_since_plan = 0
        self._plan_version = (self.acceptance.version, self._costs_version)
        self._plan_seen = float(self.acceptance.counts[0].sum())
        self._plan_plain = self.step_time(None)
        self._plan_verify = self._verify_version
        budget = MAX_DEPTH
        p = self.acceptance.probabilities()
        plan = self._search(p, budget, TOP_KS)
        self.hopeless = False
        if plan.shape is None:
            # nothing pays on current estimates: probe with a chain if an optimistic first-
            # position acceptance says it might
            bound = self.acceptance.first_rank0_bound()
            hopeful = self._search(self.acceptance.probabilities(bound), budget, (1,))
            if hopeful.shape is not None:
                plan = Plan(hopeful.shape, hopeful.tokens, hopeful.seconds, explore=True)
            else:
                self.hopeless = True
                self._probe_bar = self._probe_threshold(bound, budget)
        self._plan = self._searched = plan
        self.searches += 1
        self.search_s += perf_counter() - t0

    def _probe_threshold(self, bound: float, budget: int) -> float:
        """The optimistic first-position acceptance above which a probe chain would pay at
        today's costs (inf: none would): asleep, the bound is checked against it instead of
        searching again as the evidence fades. Bisection; drafting pays more the likelier
        the first position is accepted, deeper ones following it through the prior."""

        def pays(b: float) -> bool:
            p = self.acceptance.probabilities(b)
            return self._search(p, budget, (1,)).shape is not None

        if not pays(1.0):
            return math.inf
        lo, hi = bound, 1.0
        # finer than the bound grows in one fade of the evidence (16 tokens: 0.005 late in a
        # never-accepted drafter's sleep on the H200's curve), so the probe is not delayed
        while hi - lo > 0.002:
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if pays(mid) else (mid, hi)
        return hi

    def explain(self, *, eagle: bool = True) -> Verdict | None:
        """Why auto runs what it runs now (None before its first plan); eagle: the EAGLE
        drafter takes part (else drafts are the n-gram index's, priced without drafting)."""
        if self._searched is None:
            return None
        return self.verdict(self._searched, eagle=eagle)

    def verdict(self, plan: Plan, *, eagle: bool = True) -> Verdict:
        """Why this plan: its expected gain and the break-even acceptance of drafting here,
        every cost in plain steps at today's prices (so a draft never reads cheaper than its
        own verify, nor a speedup above the tokens per step)."""
        plain = self.step_time(None)
        best: tuple[float, int] | None = None  # (needed, k)
        fallback: tuple[float, int] | None = None  # no k can pay: the least hopeless
        # every chain's step at once, as verify_step and step_time price each: its verify and
        # bookkeeping, never below a plain step, and (with EAGLE in the call) its drafting;
        # without EAGLE a draft is the n-gram index's: no drafter runs
        ks = np.arange(1, min(MAX_DEPTH, self.verify.max_measured - 1) + 1)
        steps = self.verify.table(self.verify.max_measured)[ks + 1] + self.glue["chain"].value
        steps = np.maximum(steps, plain)
        if eagle and self.expand:
            expand = self.expand.get(1) or self.expand[max(self.expand)]
            steps = steps + (self.flush.value + (ks - 1) * expand.value)
        ratios = steps / plain
        # 1 + a + ... + a^k is at most 1 + k a and below 1 / (1 - a): a length needs at least
        # the larger of (r - 1) / k and (r - 1) / r. Lengths are solved in the order of that
        # bound, and none whose bound cannot beat the best so far is (the same choice, a
        # few solves instead of one per length); ties go to the shorter chain
        bound = np.maximum((ratios - 1.0) / ks, (ratios - 1.0) / ratios)
        feasible = ks + 1 >= ratios
        for i in np.argsort(bound, kind="stable").tolist():
            if best is not None and bound[i] > best[0] + 1e-9:
                break
            if not feasible[i]:
                continue
            k = int(ks[i])
            need = break_even(float(ratios[i]), k)
            if need is not None and (
                best is None or need < best[0] - 1e-9 or (need <= best[0] + 1e-9 and k < best[1])
            ):
                best = (need, k)
        if best is None and ks.size:  # no length can pay: the least hopeless
            i = int(np.argmin(ratios / (ks + 1)))
            fallback = (float(ratios[i] / (ks[i] + 1)), int(ks[i]))
        needed: float | None = None
        if best is not None:
            needed, k = best
        elif fallback is not None:
            k = fallback[1]
        else:  # only one-token decodes were measured: a draft is priced at no size
            k = 1
        chain = TreeShape(k, 1, k)
        verify_ratio = self.verify_step(chain) / plain
        cost_ratio = verify_ratio + (self.drafting(chain) / plain if eagle else 0.0)
        seconds = self.step_time(plan.shape) if plan.shape is not None else plain
        return Verdict(
            shape=plan.shape,
            explore=plan.explore,
            expected_speedup=plan.tokens * plain / seconds if seconds > 0 else 1.0,
            expected_tokens=plan.tokens,
            chain=k,
            cost_ratio=cost_ratio,
            verify_ratio=verify_ratio,
            needed=needed,
            reached=self.acceptance.first_rank0(),
            drafts_seen=float(self.acceptance.counts[0].sum()),
            ready_tax=self.ready_tax / plain if plain > 0 else 0.0,
            switch_s=self.switch.value,
        )

    # --- learning ----------------------------------------------------------------------------

    def observe(
        self,
        shape: TreeShape | None,
        *,
        verify_rows: int,
        t_verify: float,
        t_flush: float,
        t_draft: float,
        t_glue: float | None,
        ranks: list[tuple[int, int]],
        emitted: int,
        fed: bool = True,
        switched: bool = False,
    ) -> None:
        """One step's costs (cost clock) and the ranks the target's tokens had among the
        drafter's candidates; t_glue None: a step whose glue is not an EAGLE or plain step's.
        fed: the step ran with the drafter fed (taps on); switched: its decode came right
        after the taps were switched, so what it cost beyond its size's decode is the
        switch's (and it teaches nothing else about costs)."""
        fed = fed or not self.tapped  # untapped, every step runs as calibrated
        # a one-token decode right after a bigger one pays for llama.cpp building its graph
        # again (a CUDA graph captured anew: milliseconds on a GPU, where a t(1) learnt from
        # it made plain decoding look dear and kept a useless drafter drafting), so t(1) and
        # plain steps learn from settled ones only: a refresh runs two plain steps
        prev, self._last_rows = self._last_rows, verify_rows
        settled = verify_rows > 1 or prev == 1
        if verify_rows == 1 and settled and fed and not switched:
            self._steps_since_t1 = 0  # the curve's t(1) learns from this one
        else:
            self._steps_since_t1 += 1
        if shape is not None and self._plan is not None and self._plan.explore:
            self._plan = None  # a probe is one step (once it ran): decide again afterwards
        if switched:
            if verify_rows == 1:  # a one-token decode's cost is known both ways
                expected = self.verify(1) if fed else self.t1_off.value
                self.switch.update(max(t_verify - expected, 0.0))
        elif settled:
            self._observe_costs(
                shape, verify_rows, t_verify, t_flush, t_draft, t_glue, fed, verify_rows == prev
            )
        for depth, rank in ranks:
            self.acceptance.observe(depth, rank)
        self.acceptance.advance(emitted)

    def _observe_costs(
        self,
        shape: TreeShape | None,
        rows: int,
        t_verify: float,
        t_flush: float,
        t_draft: float,
        t_glue: float | None,
        fed: bool,
        same_size: bool,
    ) -> None:
        before = self.verify(rows), self.step_time(None)
        # the curve is the verify cost with the taps on, as drafting runs it: an unfed
        # one-row decode prices plain decoding alone. A bigger decode right after one of
        # another size pays for llama.cpp building its graph again too: it teaches its size
        # only if that size was never measured, so auto prices a shape as it runs repeated
        # (learning from such decodes had priced a shape that ran now and then dear for good)
        if (fed or rows > 1) and (rows == 1 or same_size or rows not in self.verify.ratio):
            self.verify.observe(rows, t_verify)
        if shape is None and rows == 1 and t_glue is not None:
            # the whole step, the drafter's feed with it
            for state in (fed,) if self.tapped else (True, False):
                self.plain[state].update(t_verify + t_glue + t_draft)
            if not (fed and self.tapped):
                self.t1_off.update(t_verify)
                self._unfed_base = None if self.tapped else self.verify(1)
            elif self._unfed_base is None:
                self._unfed_base = self.verify(1)
        if shape is not None:
            self.flush.update(t_flush)
            if shape.depth > 1:
                per = max(t_draft - t_flush, 0.0) / (shape.depth - 1)
                self.expand.setdefault(shape.top_k, Recent(per, WINDOW)).update(per)
            if t_glue is not None:
                self.glue["chain" if shape.is_chain else "tree"].update(t_glue)
        after = self.verify(rows), self.step_time(None)
        if any(abs(a - b) > 0.1 * b for a, b in zip(after, before, strict=True)):
            self._costs_version += 1
        if abs(after[0] - before[0]) > 0.1 * before[0]:
            self._verify_version += 1
