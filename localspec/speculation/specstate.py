"""The speculative state and its one owner: what the target's cache holds, what the drafter's
cache holds (its pairs mirror the target's history while it is fed), whether the target's taps
are on, and what the n-gram index has seen. Every change to them goes through SpecState's few
operations, so the rules that keep them consistent live in one place:

- ``begin``: a call's prompt, keeping what both caches can reuse;
- ``draft``, ``verify``, ``commit``: one speculative step (step.py), as its StepPlan says,
  feeding the drafter or not (``sleep`` / ``wake``: taps off / on) where the plan asks;
- ``reset``: empty both caches; ``calibrate``: time this machine (empties them too);
- ``finish``: a call ended (its context joins the session's n-gram memory);
- ``snapshot`` / ``restore``: copies of both caches, for session files.

Each operation is timed by the state's Probe (wall and cost clock), outside the algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..auto.calibration import Calibration, calibrate, stored
from ..errors import SessionStateError
from ..options import RuntimeOptions
from ..runtime.drafter import Drafter, DrafterState
from ..runtime.target import Target, TargetState
from .drafttree import DraftTree, merge
from .plan import StepPlan
from .probe import Probe
from .sources.eagle import EagleSource
from .sources.ngram import NGramProposal, NGramSource
from .verify import Outcome

RESTART_AFTER = 64  # auto: missing drafter pairs the target re-decodes rather than restart it


class SpecState:
    def __init__(self, target: Target, drafter: Drafter | None, probe: Probe) -> None:
        self.target = target
        self.drafter = drafter
        # the model drafter's drafts are labelled with its kind: "eagle", or "mtp"
        self.eagle = EagleSource(drafter, drafter.kind) if drafter is not None else None
        self.ngram = NGramSource()
        self.probe = probe
        self.indexing = False  # the n-gram index follows this call's stream
        self._pending_taps: np.ndarray | None = None  # the prompt's taps, until `chosen`
        self._prompt: list[int] = []
        self._keep = 0
        # rows the last verify decoded (a recurrent target verifies each branch's whole path)
        self.verified_rows = 0

    @property
    def fed(self) -> bool:
        """Whether the drafter is fed (taps on, its pairs queued every step). Stored once, as
        the target's tap switch; during a call only this state turns it, at the call's start
        (begin) and when a plan wakes the drafter or puts it to sleep (the scheduler only
        asks). Between calls, loading a drafter and calibration leave the taps on: the value
        means something from begin() on."""
        return self.drafter is not None and self.target.taps_active

    # --- the prompt --------------------------------------------------------------------------

    @property
    def n(self) -> int:
        """Positions the target's cache holds (the next token is decoded at n)."""
        return self.target.n

    def begin(
        self, tokens: Sequence[int], *, feed: bool, index: bool, whole_history: bool = True
    ) -> tuple[int, np.ndarray]:
        """Process a prompt: keep the cached prefix both caches can reuse, decode the rest.
        Returns (positions reused, the last row's logits). feed: the drafter drafts this call.
        whole_history: its pairs must then cover the whole history, as a fresh engine's would
        (fixed shapes: their drafts do not depend on what ran before); else (auto), when its
        pairs end far (RESTART_AFTER) before the target's reuse does, or it restarted before,
        the drafter restarts there, so a conversation never pays its whole prefill again for
        the drafter's sake.
        index: the n-gram index follows this call's stream (it catches up when a later call
        needs it)."""
        tgt, dft = self.target, self.drafter
        self.indexing = index
        tgt.set_taps_active(feed and dft is not None)
        keep = tgt.reusable(tokens)
        if dft is not None:
            # the drafter's pairs may end earlier (after plain or dormant calls, a wake, or an
            # edit): the target decodes those positions again for their taps, or the drafter
            # restarts at the target's reuse point
            have = dft.reusable(tokens, keep)
            partial = dft.start > 0  # it restarted before: its history is partial anyway
            if self.fed and not whole_history and (partial or keep - have > RESTART_AFTER):
                dft.restart(keep)
            else:
                if self.fed:
                    keep = have
                dft.keep(min(have, keep))
        tgt.keep(keep)
        with self.probe.span("prefill"):
            logits, taps = tgt.prefill(tokens[keep:])
        self._pending_taps = taps
        self._prompt = list(tokens)
        self._keep = keep
        return keep, logits

    def chosen(self, last: int) -> None:
        """The first token was chosen after the prompt: queue the drafter's pairs up to it and
        show the n-gram index the whole stream."""
        if self.fed:
            assert self.drafter is not None and self._pending_taps is not None
            # pairs (token[P+1], g[P]) for P = keep..; the last one's token is the first pick
            self.drafter.queue([*self._prompt[self._keep + 1 :], last], self._pending_taps)
        self._pending_taps = None
        if self.indexing:
            with self.probe.span("index"):
                self.ngram.sync([*self._prompt, last])

    # --- one step ----------------------------------------------------------------------------

    def lookup(self, max_len: int, branches: int) -> NGramProposal | None:
        with self.probe.span("lookup"):
            return self.ngram.lookup(max_len, branches)

    def draft(self, req: StepPlan, rng: np.random.Generator) -> DraftTree:
        """The step's draft: the drafter woken or put to sleep as the plan says, then the EAGLE
        shape (when given) and the n-gram proposal's first tokens with its alternatives, merged
        into one tree."""
        if req.wake:
            self.wake()
        if req.sleep:
            self.sleep()
        shape, proposal = req.eagle, req.proposal
        tree = DraftTree()
        if shape is not None:
            assert self.eagle is not None and self.drafter is not None and self.fed, (
                "EAGLE drafts need a fed drafter"
            )
            busy = self.drafter.ctx.busy
            with self.probe.span("flush"):
                start = self.eagle.flush()
            with self.probe.span("draft"):
                tree = self.eagle.draft(start, shape, req.sampled, rng, ranks=req.ranks)
            self.probe.note("eagle_native", self.drafter.ctx.busy - busy)
        if proposal is not None and req.ngram > 0:
            with self.probe.span("build"):
                ng = self.ngram.draft(proposal, req.ngram, req.ngram_alts)
                # the n-gram chain first: when it was worth drafting beside a model's draft it
                # is the likelier path, and a path's rows first keeps its cache cells together
                tree = merge(ng, tree) if len(tree) else ng
        if self.target.branches and not tree.is_chain:
            # a recurrent target verifies each branch apart: those past its room are dropped
            keep = self.target.fit_tree(tree.parents, tree.depths)
            if keep is not None:
                tree = tree.only(keep)
        return tree

    def verify(self, last: int, tree: DraftTree) -> np.ndarray:
        """One target decode of last and every node: logits of every row (root first)."""
        with self.probe.span("verify"):
            self.target.room(len(tree) + 1)  # parked gap cells go when a draft needs them
            if tree.is_chain:
                self.verified_rows = len(tree) + 1
                return self.target.decode([last, *tree.tokens], all_logits=True)
            logits = self.target.verify_tree(last, tree.tokens, tree.depths, tree.parents)
            self.verified_rows = self.target.tree_rows
            return logits

    def commit(self, last: int, tree: DraftTree, out: Outcome) -> None:
        """Keep last and the accepted path as history; feed the drafter and the index."""
        tgt, m = self.target, len(out.path)
        emitted = out.emitted(tree)
        # the verify's taps, read before the cut: a recurrent state without snapshots is cut
        # back by decoding again, which replaces them
        taps = None
        if self.fed:
            rows = [0] + [i + 1 for i in out.path]
            with self.probe.span("feed"):
                taps = tgt.read_verify_taps(rows)
        if tree.is_chain:
            if m < len(tree):
                tgt.keep(tgt.n - len(tree) + m)  # the verify decode appended every row
        else:
            tgt.commit_tree(last, out.path, tree.tokens)
        with self.probe.span("feed"):
            if taps is not None:
                assert self.drafter is not None
                # pairs for P = n..n+m: (token[P+1], g[P]) = the accepted drafts, then y
                self.drafter.queue(emitted, taps)
            if self.indexing:
                self.ngram.extend(emitted)

    def free_cells(self) -> int:
        """KV cells a draft tree may occupy (gap cells are released when one needs them)."""
        return self.target.n_ctx - self.target.n

    # --- feeding the drafter -----------------------------------------------------------------

    def sleep(self) -> None:
        """Stop feeding the drafter: taps off, no pairs queued."""
        self.target.set_taps_active(False)

    def wake(self) -> None:
        """Feed the drafter again: its cache restarts at the current position (it has no taps
        for the steps in between); this step's verify produces its first pair."""
        assert self.drafter is not None
        self.target.set_taps_active(True)
        self.drafter.restart(self.target.n)

    # --- the whole state ---------------------------------------------------------------------

    def reset(self) -> None:
        """Both caches empty: the next call processes its whole prompt."""
        self.target.clear()
        if self.drafter is not None:
            self.drafter.restart(0)

    def snapshot(self) -> tuple[TargetState, DrafterState | None]:
        """Copies of what both caches hold, taken between steps."""
        return self.target.capture(), self.drafter.capture() if self.drafter else None

    def restore(self, target: TargetState, drafter: DrafterState | None) -> None:
        """Make both caches hold a snapshot, as though its calls had run here: the next call
        keeps the prefix they share with its prompt, as after any call. The n-gram index
        starts empty (it catches up with the next prompt, as a fresh engine's does).
        SessionStateError, with both caches empty, when either part is refused."""
        self.forget()
        self._pending_taps = None
        try:
            self.target.restore(target)
            if self.drafter is not None:
                if drafter is None:  # session_state compares the files first
                    raise SessionStateError("it holds no drafter state")
                self.drafter.restore(drafter)
        except BaseException:
            self.reset()
            raise

    def forget(self) -> None:
        """The n-gram source forgets everything it indexed (the stream and the session's)."""
        self.ngram.forget()

    def finish(self) -> None:
        """A call ended: its stream joins the session's n-gram memory."""
        if self.indexing:
            with self.probe.span("index"):
                self.ngram.remember()

    def calibrate(
        self,
        rt: RuntimeOptions,
        *,
        max_rows: int,
        top_ks: tuple[int, ...],
        recalibrate: bool,
        progress: Callable[[float], None] | None = None,
    ) -> Calibration:
        """Time this machine's decodes (or read the stored timing); empties both caches."""
        try:
            return calibrate(
                self.target,
                self.drafter,
                rt,
                max_rows=max_rows,
                top_ks=top_ks,
                clock=self.probe.clock,
                recalibrate=recalibrate,
                progress=progress,
            )
        finally:
            self.reset()

    def calibration_stored(
        self, rt: RuntimeOptions, *, max_rows: int, top_ks: tuple[int, ...]
    ) -> bool:
        """Whether a valid calibration for this set-up is stored on disk."""
        return stored(
            self.target, self.drafter, rt, max_rows=max_rows, top_ks=top_ks, clock=self.probe.clock
        )
