"""The target model in its llama.cpp context: decoding, its taps, and what its KV cache holds.

The cache bookkeeping lives here: ``tokens`` is the token at every position of sequence 0 (the
committed history that later calls can reuse), draft trees are verified in extra sequences,
and cells of rejected tree nodes are parked in a gap sequence so that cell order stays the
order plain decoding would have (see ``commit_tree``).

A recurrent or hybrid target keeps one state per sequence, which a tree's leaves cannot share:
there each branch is verified in a sequence of its own holding its whole path from the root,
forked from the history (``seq_cp``: llama.cpp copies the state at the decode), all branches
padded to one length so that they fill one ubatch (see ``_verify_branches``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import native as N
from ..errors import ContextFullError, GenerationError, SessionStateError, UnsupportedModelError
from ..native.header_checks import check_header
from ..options import RuntimeOptions
from .rollback import ROLLBACK_ARCHS, Rollback, RollbackGuard, plan_rollback, tree_branches
from .taps import GRAPH, STAGING, CallbackTaps, NextnTaps, StagingTaps, input_node, route_for


@dataclass
class TargetState:
    """A copy of what the target's cache holds (a session file's part)."""

    tokens: list[int]  # the history: the token at each position of sequence 0
    gaps: list[int]  # the position of each cell parked in the gap sequence
    memory: np.ndarray  # llama.cpp's bytes for the cells of every sequence (uint8)


class Target:
    """Owns the target model and its context; decodes batches and exposes logits and taps."""

    def __init__(
        self,
        path: str,
        rt: RuntimeOptions,
        *,
        n_seq: int = 1,
        tree_nodes: int = 0,
        tap_route: str | None = None,
        unified_kv: bool = False,
        rollback: bool | str = True,
        load_mtp: bool = False,
        snapshot_policy: Callable[[Any, Rollback], Rollback] | None = None,
    ) -> None:
        """n_seq > 1: independent sequences, each in its own KV stream (training data);
        tree_nodes > 0: draft trees of up to that many nodes can be verified; tap_route: force
        taps.GRAPH on an architecture the staging API serves too (to compare the two);
        unified_kv: the sequences share one KV stream, so rows of several fill one ubatch
        (a prefill of many short texts); rollback: a recurrent state keeps snapshots to cut it
        back after rejected drafts (False: plain decoding only, which they would slow;
        "checkpoint": a checkpoint before each verify instead, as where llama.cpp keeps none);
        load_mtp: load the file's MTP (nextn) blocks too, for an MTP drafter;
        snapshot_policy: may swap the snapshots planned for checkpoints (auto's choice from
        what they cost here: calibration.snapshot_policy)."""
        rt = rt.checked()
        self.path = path
        self.header = N.GGUFHeader(path)
        self.architecture = self.header.architecture or "unknown"
        # an EAGLE-3 drafter given as the target, or header values that would make llama.cpp
        # abort the process: refused before llama.cpp reads the file
        check_header(self.header, "target")
        self.model = N.NativeModel(path, n_gpu_layers=rt.n_gpu_layers, load_mtp=load_mtp)
        # n_ctx 0 takes the trained context_length: only a default, so a mistyped or absurd
        # one falls back to 4096 instead of failing the load
        trained_ctx = self.header.arch_key("context_length")
        if not isinstance(trained_ctx, int) or not 0 < trained_ctx <= 1 << 24:  # n_ctx's limit
            trained_ctx = 0
        self.tap_route = tap_route or route_for(self.architecture)
        # a recurrent or hybrid state: snapshots to cut it back after rejected drafts, where
        # llama.cpp keeps them (none: the target decodes plainly)
        self.recurrent = self.model.recurrent
        self.rollback = Rollback(0, 0)
        if self.recurrent and not rollback:
            kept = "snapshots of its recurrent state are kept"
            if self.architecture not in ROLLBACK_ARCHS:
                kept = "checkpoints of its recurrent state are taken"
            self.rollback = Rollback(
                0,
                0,
                f"{self.architecture}: loaded for plain decoding (draft_source none), so no "
                + kept,
            )
        elif self.recurrent and n_seq > 1:
            # drafts are verified in one sequence: parallel ones (training data) keep none
            self.rollback = Rollback(
                0, 0, f"{self.architecture}: parallel sequences keep no snapshots of its state"
            )
        elif self.recurrent:
            self.rollback = plan_rollback(
                self.architecture,
                self.header.arch_key,
                n_embd=self.model.n_embd,
                n_batch=rt.n_batch,
                weights_bytes=self.model.size_bytes,
            )
            if rollback == "checkpoint" and self.rollback.n_rs_seq:
                self.rollback = Rollback(
                    0,
                    self.rollback.row_bytes,
                    lowered="checkpoints asked for instead of snapshots",
                    checkpoint=True,
                )
            elif snapshot_policy is not None and self.rollback.n_rs_seq:
                try:
                    self.rollback = snapshot_policy(self.model, self.rollback)
                except BaseException:
                    self.model.close()
                    raise
        # draft trees: on attention caches, sequences 0 the history, 1..tree_nodes one per
        # leaf, then the gap sequence; on a recurrent state, 1..branches one per branch (as
        # many as its memory allows: each holds a state of its own), then the gap sequence
        self.branches = 0
        self.tree_note = ""  # why a recurrent target verifies chains only
        if self.recurrent and tree_nodes:
            self.branches, self.tree_note = tree_branches(
                self.rollback, self.model.size_bytes, rt.n_batch
            )
            if not self.branches:
                tree_nodes = 0
                if self.rollback.n_rs_seq:  # the snapshots take the room: checkpoints leave it
                    plain = Rollback(0, self.rollback.row_bytes, checkpoint=True)
                    more = tree_branches(plain, self.model.size_bytes, rt.n_batch)[0]
                    if more:
                        self.tree_note += (
                            f"; verified from checkpoints instead of snapshots it holds {more} "
                            "(rollback checkpoint)"
                        )
        # the gap sequence parks rejected cells; a recurrent target's follows its branches
        self.gap_seq = self.branches + 1 if self.branches else tree_nodes + 1
        n_seq_tree = self.gap_seq + 1 if tree_nodes else 1
        asked = rt.n_ctx or trained_ctx or 4096
        self._ctx_args: dict[str, Any] = {
            "n_ctx": asked,
            "n_batch": rt.n_batch,
            "n_threads": rt.threads,
            "kv_type": rt.kv_type,
            "flash_attn": rt.flash_attn,
            "n_seq_max": max(n_seq, n_seq_tree),
            # parallel sequences get a KV stream each, so attention stays per sequence (a
            # draft tree needs one unified stream, a sequence id per leaf); the graph callback
            # needs one stream too: with several, llama.cpp reorders rows by sequence
            "kv_unified": unified_kv or n_seq == 1 or self.tap_route == GRAPH,
            "n_rs_seq": self.rollback.n_rs_seq,
        }
        try:
            self.ctx = N.NativeContext(self.model, **self._ctx_args)
        except BaseException:
            self.model.close()
            raise
        # the context as asked: llama.cpp allocates at least 256 cells, in steps of 256
        # (NativeContext), but no call runs past the size asked for (the cells past it only
        # serve batches that are not kept: calibration's timings)
        if self.ctx.n_rs_seq != self.rollback.n_rs_seq:  # llama.cpp clamped it
            self.rollback = Rollback(
                0, 0, f"{self.architecture}: llama.cpp keeps no snapshots of its recurrent state"
            )
        self._guard = RollbackGuard(self.ctx.n_rs_seq)
        self.cells = self.ctx.n_ctx
        self.n_ctx = min(self.cells, asked)
        self.n_batch = self.ctx.n_batch  # at most cells
        self.n_vocab = self.model.n_vocab
        self.n_embd = self.model.n_embd
        self.n_layer = self.model.n_layer
        self.tree_nodes = tree_nodes
        self.taps: tuple[int, ...] = ()
        self._tap_source: StagingTaps | CallbackTaps | NextnTaps | None = None
        self._census: set[bytes] | None = None  # graph node names (graph callback route)
        self._batch = N.Batch(self.n_batch)
        self._tree_batch = None
        if self.branches:  # one sequence per row, as many rows as a decode holds
            self._tree_batch = N.Batch(self.n_batch)
        elif tree_nodes:
            self._tree_batch = N.Batch(tree_nodes + 1, seqs_per_row=tree_nodes)
        self._fingerprint: str | None = None
        # a recurrent state without snapshots: (position, its copy) before the last verify
        self._checkpoint: tuple[int, np.ndarray] | None = None
        self.tokens: list[int] = []  # the token at each position of sequence 0
        self._gaps: list[int] = []  # positions of cells parked in the gap sequence
        self._tree: tuple[list[list[int]], list[int]] | None = None  # last verified tree
        # on a recurrent state: the last verified tree's branches (each its nodes, root to
        # leaf), their padded length, and each verify row's batch row (root first)
        self._branched: tuple[list[list[int]], int, np.ndarray] | None = None
        self.tree_rows = 0  # rows the last verify_tree decoded (on a recurrent target: all
        # branches' padded paths)

    # --- taps --------------------------------------------------------------------------------

    def check_tappable(self, layers: tuple[int, ...] = ()) -> None:
        """Refuse, before anything native could abort, a target whose hidden states cannot
        feed a drafter: recurrent or hybrid memory whose state this target cannot cut back
        (loaded for plain decoding, or with parallel sequences), taps outside its layers, or
        a graph that does not name them."""
        if self.model.recurrent and self.max_draft == 0:
            raise UnsupportedModelError(
                f"target architecture '{self.architecture}' has recurrent (state-space) layers "
                "whose state this engine does not cut back after rejected drafts ("
                f"{self.rollback.why_not or 'no snapshots'}), so no drafter can feed on it (it "
                "still runs with draft=False)"
            )
        for lid in layers:
            if not 0 <= lid < self.n_layer:
                raise UnsupportedModelError(
                    f"tap layer {lid} is outside the target's layers 0..{self.n_layer - 1}"
                )
        if self.tap_route == GRAPH:
            census = self._graph_census()
            missing = [lid for lid in layers if input_node(lid, census) is None]
            if missing or not any(n.startswith(b"l_out-") for n in census):
                raise UnsupportedModelError(
                    f"the llama.cpp graph of '{self.architecture}' names no output for the "
                    f"layers before {missing or 'any tap'} (no l_out-<il> nodes), so the "
                    "input of those layers cannot be tapped"
                )

    def _graph_census(self) -> set[bytes]:
        """The names of the graph's nodes, from one probe decode (on a context re-created with
        the eval callback, which only a context's creation can install)."""
        if self._census is None:
            if self.ctx.graph_taps is None:
                graph = N.GraphTaps(self.n_batch, self.n_embd)
                # taps of the old context (an MTP head's) go with it: the engine puts the
                # drafter at work's taps back on the new one (Engine.use_drafter)
                self.set_taps_active(False)
                self._tap_source, self.taps = None, ()
                self.ctx.close()
                self.ctx = N.NativeContext(self.model, graph_taps=graph, **self._ctx_args)
            assert self.ctx.graph_taps is not None
            census: set[bytes] = set()
            self.ctx.graph_taps.census = census
            self.ctx.set_eval_callback(True)
            try:
                self.clear()
                self.decode([max(self.model.bos, 0)], all_logits=False)
            finally:
                self.ctx.graph_taps.census = None
                self.ctx.set_eval_callback(False)  # installed again while taps are on
                self.clear()
            self._census = census
        return self._census

    def enable_taps(self, layer_ids: tuple[int, ...]) -> None:
        """Keep the input of these layers for every decoded token (checked: no native abort).
        Called again with other layers (another drafter), the previous layers stop being kept
        first: llama.cpp would otherwise go on copying them out at every decode."""
        self.check_tappable(layer_ids)
        self.set_taps_active(False)
        self.taps = tuple(layer_ids)
        if self.tap_route == STAGING:
            self._tap_source = StagingTaps(self.ctx, self.taps)
        else:
            assert self.ctx.graph_taps is not None and self._census is not None
            nodes = [input_node(lid, self._census) for lid in self.taps]
            self._tap_source = CallbackTaps(self.ctx, [n for n in nodes if n])
        self.set_taps_active(True)

    def enable_mtp_taps(self) -> None:
        """Return, for every decoded token, the hidden state this target's own MTP head reads
        (one tap of n_embd): the target drafts with its multi-token-prediction block."""
        if self.model.n_layer_nextn < 1 or not self.model.mtp_loaded:
            raise UnsupportedModelError(f"{self.path} has no MTP head loaded")
        self.set_taps_active(False)
        self.taps = (-1,)  # one row of n_embd, not a layer's input
        self._tap_source = NextnTaps(self.ctx)
        self.set_taps_active(True)

    @property
    def has_mtp(self) -> bool:
        """The target's file has MTP (nextn) blocks and they were loaded."""
        return self.model.mtp_loaded and self.model.n_layer_nextn > 0

    def set_taps_active(self, active: bool) -> None:
        """Switch tap extraction on or off (off for plain decoding, so A/B runs are fair)."""
        if self._tap_source is not None and active != self._tap_source.active:
            self._tap_source.set_active(active)

    @property
    def taps_active(self) -> bool:
        return self._tap_source is not None and self._tap_source.active

    def read_taps(self, n_rows: int) -> np.ndarray:
        """Concatenated taps [n_rows, len(taps) * n_embd] of the last decode (a copy)."""
        assert self._tap_source is not None, "enable_taps first"
        out = np.empty((n_rows, len(self.taps) * self.n_embd), dtype=np.float32)
        self._tap_source.read(n_rows, out)
        return out

    # --- decoding the history ------------------------------------------------------------------

    @property
    def n(self) -> int:
        """Positions held in the cache (the next token is decoded at position n)."""
        return len(self.tokens)

    def decode(self, tokens: Sequence[int], *, all_logits: bool) -> np.ndarray:
        """Decode tokens (at most n_batch) after the history; return a view of the logits: one
        row per token with all_logits, else only the last row (valid until the next decode)."""
        n = len(tokens)
        if self.n + n > self.cells:  # calls stop at n_ctx themselves; calibration uses all
            raise ContextFullError(f"context window of {self.n_ctx} tokens is full")
        b = self._batch
        b.token[:n] = tokens
        b.set(n, self.n, all_logits=all_logits)
        # a recurrent state without snapshots: a draft's verify (every row's logits) starts
        # from a checkpoint that keep() puts back if drafts are rejected
        self._checkpoint = None
        if self.rollback.checkpoint and all_logits and n > 1:
            self._checkpoint = (self.n, self.ctx.state_get(0, partial=True))
        self.ctx.decode(b, "target batch")
        self._guard.decoded(n)
        self.tokens.extend(int(t) for t in tokens)
        return self.ctx.logits(n if all_logits else 1)

    def prefill(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode a prompt tail in n_batch chunks; the last row's logits (a view) and, when taps
        are on, every row's taps."""
        taps = []
        logits = None
        for a in range(0, len(tokens), self.n_batch):
            chunk = tokens[a : a + self.n_batch]
            logits = self.decode(chunk, all_logits=False)
            if self.taps_active:
                taps.append(self.read_taps(len(chunk)))
        assert logits is not None, "prefill of no tokens"
        return logits[0], (np.concatenate(taps) if taps else None)

    @property
    def max_draft(self) -> int | None:
        """The longest draft this target can verify and cut back (None: no limit; 0: none)."""
        return self.rollback.max_draft if self.recurrent else None

    def keep(self, n: int) -> None:
        """Forget every position >= n (of the history and of parked gap cells). A recurrent
        state is cut back by its snapshots where llama.cpp's rule allows (one cut after a
        decode, at most min(n_rs_seq, its tokens - 1)); otherwise it is rebuilt from the
        history, never left wrong."""
        if self.recurrent and any(p >= n for p in self._gaps):
            # a cut of the gap sequence would be read as a cut of its recurrent state: all of
            # its cells go (later tokens may then round differently, as after room())
            self._release_gaps()
        if self.recurrent and n < self.n:
            if self._guard.can_cut(self.n - n):
                self.ctx.seq_rm(n)
                self._guard.cut()
                del self.tokens[n:]
            elif self._checkpoint is not None and self._checkpoint[0] <= n:
                self._replay(n)
            else:
                self._rebuild(n)
            return
        if n < self.n or any(p >= n for p in self._gaps):
            self.ctx.seq_rm(n)
            if self._gaps:
                self.ctx.seq_rm(n, -1, self.gap_seq)
        del self.tokens[n:]
        self._gaps = [p for p in self._gaps if p < n]

    def clear(self) -> None:
        self.ctx.clear()
        self.tokens.clear()
        self._gaps.clear()
        self._guard.reset()
        self._checkpoint = None
        self._tree = self._branched = None  # a step that failed between verify and commit

    def _replay(self, n: int) -> None:
        """Back to the checkpoint taken before the last verify, then its kept tokens decoded
        again: the state of positions < n without snapshots. The checkpoint is spent."""
        assert self._checkpoint is not None
        at, state = self._checkpoint
        self._checkpoint = None
        if not self.ctx.state_set(state, 0, partial=True):
            detail = N.last_errors() or "no detail"
            self._rebuild(n)  # never a wrong state: the history decoded again
            raise GenerationError(f"llama.cpp refused a recurrent state checkpoint ({detail})")
        self.ctx.seq_rm(at)  # the verify's attention cells (the recurrent part is back at at)
        replay = self.tokens[at:n]
        del self.tokens[at:]
        if replay:
            with self._untapped():  # nobody reads them (the verify's were read before the cut)
                self.decode(replay, all_logits=False)

    @contextmanager
    def _untapped(self) -> Iterator[None]:
        """Decodes with the taps off, as they were after."""
        active = self.taps_active
        self.set_taps_active(False)
        try:
            yield
        finally:
            self.set_taps_active(active)

    def _rebuild(self, n: int) -> None:
        """A recurrent state its snapshots cannot cut back to n: decoded again from the
        history's first n tokens (taps off: no drafter reads them)."""
        history = self.tokens[:n]
        with self._untapped():
            self.clear()
            for a in range(0, len(history), self.n_batch):
                self.decode(history[a : a + self.n_batch], all_logits=False)

    def reusable(self, tokens: Sequence[int]) -> int:
        """How many leading positions of the cache a prompt of these tokens can keep: the
        common prefix, less at least the last token (its logits must be computed). A recurrent
        state holds only its last position: all of it or nothing."""
        limit = min(self.n, len(tokens) - 1)
        i = 0
        while i < limit and self.tokens[i] == tokens[i]:
            i += 1
        return 0 if self.model.recurrent and i < self.n else i

    # --- saved sessions ------------------------------------------------------------------------

    def capture(self) -> TargetState:
        """A copy of the cache, between steps (no tree sequences are live then). llama.cpp's
        state of every sequence, not of sequence 0 alone: its per-sequence copy leaves out the
        cells a sliding window masks (Gemma 3), which a cache cut back to an earlier position
        needs; and it keeps the parked gap cells, so a restored cache rounds as this one."""
        return TargetState(list(self.tokens), list(self._gaps), self.ctx.state_get())

    def restore(self, state: TargetState) -> None:
        """Make the cache hold a captured state; SessionStateError, with the cache empty, for
        one that does not fit this target or that llama.cpp refuses."""
        self.clear()
        n = len(state.tokens)
        if n > self.n_ctx or any(not 0 <= t < self.n_vocab for t in state.tokens):
            raise SessionStateError(f"its history does not fit this target ({n} tokens)")
        # one entry per parked cell (siblings share a position); they may lie past the history
        # (a rejected node deeper than the accepted path) until the next call cuts them
        gaps = state.gaps
        if any(not 0 <= p < self.n_ctx for p in gaps):
            raise SessionStateError("its parked cells lie outside the context")
        if gaps and not self.tree_nodes:
            raise SessionStateError("it parks tree cells, which this target never verifies")
        if not self.ctx.state_set(state.memory):
            detail = N.last_errors() or "no detail"
            self.clear()
            raise SessionStateError(f"llama.cpp refused the target's saved state ({detail})")
        # the cells llama.cpp restored must agree with the history and the parked positions;
        # on a recurrent target the gap sequence's position is its state's, the last parked
        # branch's end (a hybrid's is the lesser of its attention and recurrent positions)
        parked = max(gaps, default=-1) if not self.recurrent else (gaps[-1] if gaps else -1)
        if self.ctx.seq_pos_max() != n - 1 or (
            self.tree_nodes and self.ctx.seq_pos_max(self.gap_seq) != parked
        ):
            self.clear()
            raise SessionStateError("the target's saved cells disagree with its history")
        self.tokens = list(state.tokens)
        self._gaps = list(state.gaps)
        self._guard.reset()  # the restored state is cut back by rebuilding

    # --- draft trees ---------------------------------------------------------------------------

    @property
    def gap_cells(self) -> int:
        return len(self._gaps)

    def room(self, cells: int) -> int:
        """Free cells for a draft tree, releasing the parked gap cells when fewer than `cells`
        remain (later tokens may then round differently from plain decoding, rather than
        stopping early)."""
        free = self.n_ctx - self.n - len(self._gaps)
        if self._gaps and free < cells:
            self._release_gaps()
            free = self.n_ctx - self.n
        return free

    def _release_gaps(self) -> None:
        """Free every parked cell (a whole-sequence removal: on a recurrent target a partial
        one would be read as a cut of the gap sequence's state)."""
        self.ctx.seq_drop(self.gap_seq)
        self._gaps.clear()

    def _free_cells(self, rows: int) -> int:
        """Cells free beside the history for a decode of `rows` rows, the parked cells
        released when they leave too few (a recurrent target's branches)."""
        free = self.cells - self.n - len(self._gaps)
        if self._gaps and free < rows:
            self._release_gaps()
            free = self.cells - self.n
        return free

    def fit_tree(self, parents: list[int], depths: list[int]) -> list[int] | None:
        """The nodes of a draft tree this target can verify in one decode: None for all of
        them; else the paths to the first leaves (in node order) that fit. Only a recurrent
        target drops any: its branches are verified apart (as many as it holds sequences for),
        padded to the deepest one's length, in free cells."""
        if not self.branches:
            return None
        leaves, _ = leaf_sequences(parents)
        free = self._free_cells(len(leaves) * (max(depths) + 1))
        rows = min(self.n_batch, free)  # a decode's rows, the free cells
        kept, deepest = 0, 0
        for leaf in leaves:
            d = max(deepest, depths[leaf])
            if kept == self.branches or (kept + 1) * (d + 1) > rows or self.n + d >= self.n_ctx:
                break
            kept, deepest = kept + 1, d
        if kept == len(leaves):
            return None
        keep: set[int] = set()
        for leaf in leaves[:kept]:
            node = leaf
            while node >= 0 and node not in keep:
                keep.add(node)
                node = parents[node]
        return sorted(keep)

    def verify_tree(
        self, root: int, tokens: list[int], depths: list[int], parents: list[int]
    ) -> np.ndarray:
        """Decode the chosen-but-undecoded root token and a draft tree after the history, each
        node at position n + depth, in one batch; logits of every row (root first)."""
        if self.branches:
            return self._verify_branches(root, tokens, depths, parents)
        b = self._tree_batch
        n = len(tokens) + 1
        if b is None or n > b.capacity:
            raise ValueError(f"tree of {n} rows exceeds this target's tree capacity")
        pos = np.array([self.n] + [self.n + d for d in depths], dtype=np.int32)
        if int(pos.max()) >= self.n_ctx:
            raise ContextFullError(f"context window of {self.n_ctx} tokens is full")
        leaves, seqs = leaf_sequences(parents)
        for s in range(1, len(leaves) + 1):
            self.ctx.seq_cp(0, s, 0, self.n)  # each leaf's sequence sees the whole history
        b.token[:n] = [root, *tokens]
        b.set_tree(pos, seqs)
        self.ctx.decode(b, "target tree batch")
        self.tree_rows = n
        self._tree = (seqs, depths)
        return self.ctx.logits(n)

    def commit_tree(self, root: int, path: list[int], tokens: list[int]) -> None:
        """Keep the root and the accepted path (node indices, root to deepest) of the last
        verified tree as history; free the rest.

        Rejected nodes whose cells lie between accepted ones stay occupied, parked in the gap
        sequence (masked for the history) until the cache is cut below them: freed, later tokens
        would land in them and attention would sum the cache in another order than plain
        decoding does, which with an f16 cache moves logits by ~0.1 and flips near-ties. Rows
        map to consecutive cells."""
        if self.branches:
            self._commit_branch(root, path, tokens)
            return
        assert self._tree is not None, "commit_tree without verify_tree"
        seqs, depths = self._tree
        n, m = self.n, len(path)
        keep_seq = seqs[path[-1] + 1][0] if path else seqs[0][0]
        self.ctx.seq_rm(n + m + 1, -1, keep_seq)
        self.ctx.seq_cp(keep_seq, 0, n, n + m + 1)
        on_path = set(path)
        for i in range(path[-1] if path else -1):
            if i not in on_path:
                p = n + depths[i]
                self.ctx.seq_cp(seqs[i + 1][0], self.gap_seq, p, p + 1)
                self._gaps.append(p)
        for s in range(1, len(seqs[0]) + 1):
            self.ctx.seq_drop(s)
        self.tokens.append(root)
        self.tokens.extend(tokens[i] for i in path)
        self._tree = None

    def _verify_branches(
        self, root: int, tokens: list[int], depths: list[int], parents: list[int]
    ) -> np.ndarray:
        """verify_tree on a recurrent state: sequence s (1..) holds the root and the path to
        leaf s, padded (with its last token) to the deepest leaf's length, so every sequence
        brings the same number of rows and the decode is one ubatch (llama.cpp's rollback
        snapshots cover a sequence's last ubatch only). Only the first row of each node asks
        for logits. The history is forked into each (seq_cp: its state is copied at the
        decode); a cut still pending on it is applied first, as the copy would read the
        state before the cut."""
        b = self._tree_batch
        assert b is not None
        leaves, _ = leaf_sequences(parents)
        length = max(depths[leaf] for leaf in leaves) + 1
        rows = len(leaves) * length
        if len(leaves) > self.branches or rows > b.capacity:
            raise ValueError(
                f"tree of {len(leaves)} branches of {length} rows exceeds this target's "
                f"{self.branches} branch sequences or its batch"
            )
        if self.n + length > self.n_ctx or self._free_cells(rows) < rows:
            raise ContextFullError(f"context window of {self.n_ctx} tokens is full")
        if self._guard.pending:
            self._apply_cut()
        paths: list[list[int]] = []
        seq = np.empty(rows, np.int32)
        out = np.zeros(rows, np.int8)
        where = np.empty(len(tokens) + 1, np.int64)  # verify row -> batch row
        seen: set[int] = set()
        pos = np.tile(np.arange(self.n, self.n + length, dtype=np.int32), len(leaves))
        for s, leaf in enumerate(leaves):
            path = []
            node = leaf
            while node >= 0:
                path.append(node)
                node = parents[node]
            path.reverse()
            paths.append(path)
            r0 = s * length
            row = [root, *(tokens[i] for i in path)]
            row += [row[-1]] * (length - len(row))
            b.token[r0 : r0 + length] = row
            seq[r0 : r0 + length] = s + 1
            if s == 0:
                out[r0], where[0] = 1, r0
            for k, node in enumerate(path, start=1):
                if node not in seen:
                    seen.add(node)
                    out[r0 + k], where[node + 1] = 1, r0 + k
        for s in range(1, len(leaves) + 1):
            self.ctx.seq_cp(0, s, 0, self.n)
        b.set_rows(pos, seq, logits=out)
        self.ctx.decode(b, "target tree batch (one sequence per branch)")
        self.tree_rows = rows
        logits = self.ctx.logits(int(out.sum()))
        # the logits come in batch order of the rows that asked for them
        first = np.cumsum(out) - 1
        order = first[where]
        self._branched = (paths, length, where)
        if np.array_equal(order, np.arange(len(order))):
            return logits
        return logits[order]

    def _apply_cut(self) -> None:
        """Make a cut still pending on the history's recurrent state happen now: its state
        read out (from the snapshot the cut points at) and written back. A state llama.cpp
        refuses to write back is rebuilt from the history, never used."""
        self._guard.reset()
        state = self.ctx.state_get(0, partial=True)
        if not self.ctx.state_set(state, 0, partial=True):
            self._rebuild(self.n)

    def _commit_branch(self, root: int, path: list[int], tokens: list[int]) -> None:
        """commit_tree on a recurrent state. The branch holding the accepted path becomes the
        history (seq_cp into sequence 0: its cells and its state); its rows past the path are
        cut back by its snapshots where they allow, else the history keeps its state from
        before the verify and the root and path are decoded again on it (a replay, as a
        checkpoint's). Every branch sequence is then dropped."""
        assert self._branched is not None, "commit_tree without verify_tree"
        paths, length, _ = self._branched
        self._branched = None
        n, keep = self.n, self.n + len(path) + 1
        s = next(i for i, p in enumerate(paths) if p[: len(path)] == path) + 1
        past = n + length - keep  # the branch's rows after the accepted path
        whole = past == 0 or 0 < past <= min(self.rollback.n_rs_seq, length - 1)
        if whole:
            self.ctx.seq_cp(s, 0, n, keep)
            # the cells of the branches before it lie before its own: parked, so that later
            # tokens do not land in them (the cell order plain decoding has, as commit_tree
            # keeps it); the gap sequence holds the last one's state (it never decodes)
            for b in range(1, s):
                self.ctx.seq_cp(b, self.gap_seq, n, n + length)
                self._gaps.extend(range(n, n + length))
        for b in range(1, len(paths) + 1):
            self.ctx.seq_drop(b)
        kept = [root, *(tokens[i] for i in path)]
        if not whole:
            with self._untapped():  # the verify's taps were read before the commit
                self.decode(kept, all_logits=False)
            return
        self.tokens.extend(kept)
        self._guard.decoded(length)
        if past:
            self.ctx.seq_rm(keep)
            self._guard.cut()

    def read_verify_taps(self, rows: list[int]) -> np.ndarray:
        """The taps of these rows of the last verify (0: the root, i + 1: node i), read
        before it is committed."""
        if self._branched is not None:
            where = self._branched[2][rows]
            return self.read_taps(int(where.max()) + 1)[where]
        taps = self.read_taps(rows[-1] + 1)
        return taps if rows == list(range(len(rows))) else taps[rows]

    # --- independent sequences (training data) -------------------------------------------------

    def decode_rows(
        self,
        tokens: Sequence[int],
        pos: np.ndarray,
        seqs: np.ndarray,
        outputs: np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode rows of independent sequences (not the history); the logits of every row,
        or of the rows `outputs` marks (in row order). Taps cover every row either way."""
        b = self._batch
        n = len(tokens)
        b.token[:n] = tokens
        b.set_rows(pos, seqs, logits=True if outputs is None else outputs)
        self.ctx.decode(b, "target batch (parallel sequences)")
        n_out = n if outputs is None else int(np.count_nonzero(outputs))
        if n_out == 0:  # llama.cpp has no logits buffer to point at then
            return np.empty((0, self.n_vocab), np.float32)
        return self.ctx.logits(n_out)

    def forget_sequence(self, seq: int) -> None:
        self.ctx.seq_drop(seq)

    # --- vocabulary --------------------------------------------------------------------------

    @property
    def vocab_fingerprint(self) -> str:
        """sha256 over every token text: two models with equal fingerprints tokenize alike."""
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self.model.vocab_texts())
        return self._fingerprint

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def leaf_sequences(parents: list[int]) -> tuple[list[int], list[list[int]]]:
    """One KV sequence per leaf (ids 1..L): the leaves, and for each verify row (0: the root,
    i+1: node i) the sequences of all leaves below it."""
    has_child = [False] * len(parents)
    for p in parents:
        if p >= 0:
            has_child[p] = True
    leaves = [i for i in range(len(parents)) if not has_child[i]]
    seqs: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for s, leaf in enumerate(leaves, start=1):
        node = leaf
        while node >= 0:
            seqs[node + 1].append(s)
            node = parents[node]
        seqs[0].append(s)
    return leaves, seqs


def vocab_fingerprint(texts: list[bytes]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()
