"""The EAGLE-3 / EAGLE-3.1 drafter in its own llama.cpp context, and what its KV cache holds.

llama.cpp runs the two graphs (encoder ``g = fc(taps)``, one-layer decoder). The two EAGLE-3.1
changes it lacks are applied here, around those graphs:
- fc_norm: each target tap is divided by its own RMS before encoding (the per-tap norm weights
  are already folded into ``fc.weight`` by the converter);
- norm_output: the state fed back to the next draft step is ``output_norm(h)``, not ``h``.

Cache convention (llama.cpp's EAGLE-3 driver): position P holds the pair (token[P+1], g[P]),
g[P] = fc(taps of target position P). Positions [start, end) are written; pairs after them wait
in a queue with their taps not yet encoded, so steps that do not draft cost the drafter nothing.
The queue's last pair is (last, g[n-1]) for the target's chosen-but-undecoded token, whose
decoder output is the first draft. Positions from ``end`` on are scratch for draft states.

An attention window (the rows a drafter was trained over, or the user's choice) limits what
drafts attend to: sequence 0 then holds only the last ``window`` pairs, and one more sequence,
the history, every pair before them (the cells are shared, not copied; pairs join it when
they leave the window or a session is saved, so a short history makes no extra call). So the
window can move back after an edit, and a saved session holds the whole history. A drafter
trained on 512-row windows never learnt to spread its attention over 1-3k rows of history;
the window shows it what it was trained on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .. import native as N
from ..errors import InvalidParameterError, ModelFileError, PairMismatchError, SessionStateError
from ..options import RuntimeOptions
from .drafter_spec import DrafterSpec
from .target import Target, vocab_fingerprint

ENCODE_AT = 256  # queued tap rows that trigger an encode (bounds the queue's memory)


@dataclass
class DrafterState:
    """A copy of what the drafter's cache holds (a session file's part)."""

    start: int
    end: int
    pair_tokens: list[int]  # the token of every pair from start on
    queued_g: np.ndarray  # [rows, n_embd] encoded pairs after end, not yet written
    queued_taps: np.ndarray  # [rows, tap width] then taps not yet encoded
    memory: np.ndarray  # llama.cpp's bytes for the written pairs' sequence (uint8)


class Drafter:
    """A loaded drafter bound to its target's context (it may borrow embeddings and head)."""

    kind = "eagle"  # what drafts (the statistics' source name): "mtp" for a target's own head

    def __init__(
        self,
        spec: DrafterSpec,
        target: Target,
        rt: RuntimeOptions,
        *,
        n_seq_max: int = 1,
        window: int | None = None,
    ) -> None:
        """n_seq_max: KV sequences for a draft tree's frontier (1: chains only). window: the
        pairs drafts attend to, the latest ones (None: all)."""
        rt = rt.checked()
        spec.check_pair(target)
        if window is not None and window < 1:
            raise InvalidParameterError(
                f"the drafter's attention window must be >= 1, got {window}"
            )
        self.spec = spec
        # read before loading anything: a bad norm tensor must not leak a model and context
        self._out_norm = spec.output_norm_weight() if spec.norm_output else None
        self.model = N.NativeModel(spec.path, n_gpu_layers=rt.n_gpu_layers)
        try:
            self._check_loaded(target)
            self._open(target, rt, n_seq_max, window, len(spec.taps) * target.n_embd)
        except BaseException:
            self.model.close()
            raise

    def _open(
        self,
        target: Target,
        rt: RuntimeOptions,
        n_seq_max: int,
        window: int | None,
        tap_width: int,
        *,
        mtp: bool = False,
    ) -> None:
        """The drafter's context on self.model and its empty cache; mtp: the context runs the
        target's own MTP block (the model is the target's)."""
        self.window = window
        # the sequence that holds the pairs before the window (the history): with a window
        # the one after the frontier's, else 0 (which then holds every pair)
        self._hist = n_seq_max if window is not None else 0
        n_seq = self._hist + 1 if window is not None else n_seq_max
        self.n_batch = min(rt.draft_batch, rt.n_batch)
        self.ctx = N.NativeContext(
            self.model,
            n_ctx=target.n_ctx,
            # llama.cpp sizes a batch to hold a row per sequence
            n_batch=max(self.n_batch, n_seq),
            n_threads=rt.threads,
            kv_type=rt.kv_type,
            flash_attn=rt.flash_attn,
            ctx_other=None if mtp else target.ctx,
            embeddings_nextn=True,
            n_seq_max=n_seq,
            mtp=mtp,
        )
        self.n_batch = self.ctx.n_batch  # at most n_ctx
        self.n_embd = self.model.n_embd
        self.n_vocab = target.n_vocab
        self.tap_width = tap_width
        self._enc_batch = N.Batch(self.n_batch, tokens=False, embd=self.tap_width)
        self._dec_batch = N.Batch(self.n_batch, tokens=True, embd=self.n_embd)
        # a chain's steps: one row of sequence 0 whose embedding is the fed-back state
        self._one = N.Batch(1, tokens=True, embd=self.n_embd)
        self._one.set(1, 0, all_logits=True)
        assert self._one.embd is not None
        self._pending = self._one.embd[0]  # the state the next chain_next decodes with
        self._draft_ids: np.ndarray | None | bool = False  # False: not yet known
        self._draft_index: np.ndarray | None = None  # target id -> draft-vocabulary index
        # the cache: written positions [start, end), then queued pairs
        self.start = 0
        self.end = 0
        self._pair_tokens: list[int] = []  # token of every pair from start on
        self._queued_g: list[np.ndarray] = []  # encoded rows of queued pairs
        self._queued_taps: list[np.ndarray] = []  # ... then taps not yet encoded
        self._n_queued_taps = 0
        # with a window: sequence 0 holds the pairs [_win_from, end), the history
        # [start, _hist_to), and start <= _win_from <= _hist_to (what left the window is in
        # the history; the window's own pairs join it lazily)
        self._win_from = 0
        self._hist_to = 0
        # frontier sequences that may hold cells: llama.cpp's sequence calls scan every cell
        # of the cache (as long as the target's), so an empty sequence is not dropped again
        self._branched: set[int] = set()

    def _check_loaded(self, target: Target) -> None:
        if self.model.n_embd != self.spec.n_embd:
            raise ModelFileError(f"{self.spec.path}: embedding_length disagrees with its tensors")
        if self.model.n_vocab != target.n_vocab:
            raise PairMismatchError(
                f"drafter {self.spec.path} has {self.model.n_vocab} tokens, target {target.n_vocab}"
            )
        if self.model.target_layer_ids() != self.spec.taps:
            raise ModelFileError(f"{self.spec.path}: llama.cpp reads different tap ids")
        # No recorded target (e.g. made by llama.cpp's converter): compare the tokenizers.
        recorded = self.spec.target_record["vocab_fingerprint"]
        if recorded is None and vocab_fingerprint(self.model.vocab_texts()) != (
            target.vocab_fingerprint
        ):
            raise PairMismatchError(
                f"drafter {self.spec.path} carries a different tokenizer than {target.path}"
            )

    # --- the cache ---------------------------------------------------------------------------

    @property
    def next_pos(self) -> int:
        """The position of the next pair to queue (while fed, the target's cache length)."""
        return self.start + len(self._pair_tokens)

    def queue(self, tokens: Sequence[int], taps: np.ndarray) -> None:
        """Queue pairs (tokens[i], g of taps[i]) at the next positions; taps are encoded in bulk
        later (or now, when many are waiting)."""
        self._pair_tokens.extend(int(t) for t in tokens)
        self._queued_taps.append(taps)
        self._n_queued_taps += taps.shape[0]
        if self._n_queued_taps >= ENCODE_AT:
            self._encode_queued()

    def _encode_queued(self) -> None:
        if self._queued_taps:
            q = self._queued_taps
            self._queued_g.append(self.encode(np.concatenate(q) if len(q) > 1 else q[0]))
            self._queued_taps, self._n_queued_taps = [], 0

    def flush(self) -> tuple[np.ndarray, np.ndarray]:
        """Write the queued pairs; return the last row's logits and feedback state: the
        distribution and input of the first draft position. The logits are a view valid until
        the next decode; the state is the one chain_next decodes with next (it changes with
        the next chain_start, chain_next or flush)."""
        tokens = self._pair_tokens[self.end - self.start :]
        n = len(tokens)
        b = self._dec_batch
        assert b.embd is not None
        outside = 0 if self.window is None else self._slide(self.end + n)
        try:
            if (
                not outside
                and not self._queued_g
                and len(self._queued_taps) == 1
                and n <= self.n_batch
            ):
                # a step's few pairs: their taps encoded straight into the decoder's batch
                assert self._queued_taps[0].shape[0] == n, "a queued pair without its taps"
                self.encode(self._queued_taps[0], out=b.embd[:n])
                b.token[:n] = tokens
                b.set(n, self.end, all_logits=True)
                self.ctx.decode(b, "drafter decoder")
                self._queued_taps, self._n_queued_taps = [], 0  # kept queued if it failed
                last = n - 1
            else:
                self._encode_queued()
                q = self._queued_g
                g = np.concatenate(q) if len(q) > 1 else q[0]
                # pairs the window has already passed go to the history alone (a row's K/V
                # do not depend on what it attends to: the drafter has one layer)
                for _ in self._decode_chunks(tokens[:outside], g[:outside], self.end, self._hist):
                    pass
                for i in self._decode_chunks(tokens[outside:], g[outside:], self.end + outside):
                    last = n - outside - 1 - i  # the last row's index within the final chunk
                self._queued_g = []
        except BaseException:  # the pairs stay queued; no cell of theirs stays written
            self.ctx.seq_rm(self.end, seq=-1)
            self._win_from = min(self._win_from, self.end)
            self._hist_to = min(self._hist_to, self.end)
            raise
        self.end += n
        logits, h = self.ctx.outputs(last, self.n_embd)
        return logits, self.feedback(h, out=self._pending)

    def _slide(self, new_end: int) -> int:
        """Make sequence 0 hold the written pairs from new_end - window on, for pairs to be
        written up to new_end; return how many of those fall before the window."""
        assert self.window is not None
        cut = max(self.start, new_end - self.window)
        if cut > self._win_from and self._win_from < self.end:  # they stay in the history
            self._to_history(min(cut, self.end))
            self.ctx.seq_rm(self._win_from, min(cut, self.end), seq=0)
        elif cut < self._win_from:  # moved back (an edit): the history has them
            self.ctx.seq_cp(self._hist, 0, cut, self._win_from)
        if cut > self.end:  # the pairs before the window will be written to the history
            self._hist_to = cut
        self._win_from = cut
        return max(0, cut - self.end)

    def _to_history(self, pos: int) -> None:
        """Make the history sequence hold every written pair before pos."""
        if self._hist != 0 and self._hist_to < pos:
            self.ctx.seq_cp(0, self._hist, self._hist_to, pos)
            self._hist_to = pos

    def rewind(self, pos: int | None = None) -> None:
        """Forget the draft states written after the pairs (positions >= end, or >= pos)."""
        self.ctx.seq_rm(self.end if pos is None else pos)

    def restart(self, pos: int) -> None:
        """An empty cache whose first pair will sit at pos (after a stretch without taps, the
        drafter restarts from there and attends only to what follows)."""
        self.ctx.clear()
        self._branched.clear()
        self.start = self.end = self._win_from = self._hist_to = pos
        self._pair_tokens = []
        self._queued_g, self._queued_taps, self._n_queued_taps = [], [], 0

    def reusable(self, tokens: Sequence[int], limit: int) -> int:
        """The first position, up to limit, whose pair is missing for a history of these
        tokens: pair P is valid while it carries tokens[P + 1]. 0 when the cache restarted
        after position 0 (auto woke up mid-generation): pairs [0, start) were never written,
        and a drafter that attends to a part of the history drafts unlike a fresh one."""
        if self.start > 0:
            return 0
        p, stop = 0, min(limit, self.next_pos, len(tokens) - 1)
        while p < stop and self._pair_tokens[p - self.start] == tokens[p + 1]:
            p += 1
        return p

    def keep(self, pos: int) -> None:
        """Keep the pairs before pos, written or queued; forget the rest."""
        if pos < self.start:
            self.restart(pos)  # nothing before start was written: `reusable` then says 0
            return
        if pos < self.end:
            self.ctx.seq_rm(pos, seq=-1)  # the window's and the history's
            self.end = pos
            self._win_from = min(self._win_from, pos)
            self._hist_to = min(self._hist_to, pos)
        self._encode_queued()
        n_written = self.end - self.start
        if self._queued_g:
            g = np.concatenate(self._queued_g)[: max(0, pos - self.end)]
            self._queued_g = [g] if len(g) else []
        del self._pair_tokens[max(pos - self.start, n_written) :]

    # --- saved sessions ------------------------------------------------------------------------

    def capture(self) -> DrafterState:
        """A copy of the cache, between steps: the history sequence then holds exactly the
        written pairs (draft states are rewound and frontier sequences dropped after each
        draft; with a window, the window's pairs join the history first)."""
        self._to_history(self.end)
        g = np.concatenate(self._queued_g) if self._queued_g else np.empty((0, self.n_embd))
        taps = self._queued_taps
        t = np.concatenate(taps) if taps else np.empty((0, self.tap_width))
        return DrafterState(
            self.start,
            self.end,
            list(self._pair_tokens),
            g.astype(np.float32, copy=False),
            t.astype(np.float32, copy=False),
            self.ctx.state_get(self._hist),
        )

    def restore(self, state: DrafterState) -> None:
        """Make the cache hold a captured state; SessionStateError, with the cache empty, for
        one that does not fit this drafter or that llama.cpp refuses."""
        self.restart(0)
        s = state
        queued = len(s.pair_tokens) - (s.end - s.start)
        if (
            not 0 <= s.start <= s.end <= s.start + len(s.pair_tokens)
            or s.queued_g.ndim != 2
            or s.queued_g.shape[1] != self.n_embd
            or s.queued_taps.ndim != 2
            or s.queued_taps.shape[1] != self.tap_width
            or s.queued_g.shape[0] + s.queued_taps.shape[0] != queued
            or any(not 0 <= t < self.n_vocab for t in s.pair_tokens)
        ):
            raise SessionStateError("the drafter's saved pairs do not fit this drafter")
        if not self.ctx.state_set(s.memory, self._hist):
            detail = N.last_errors() or "no detail"
            self.restart(0)
            raise SessionStateError(f"llama.cpp refused the drafter's saved state ({detail})")
        self.ctx.seq_rm(s.end, seq=-1)  # nothing past the written pairs (none is saved then)
        if self.ctx.seq_pos_max(self._hist) != (s.end - 1 if s.end > s.start else -1):
            self.restart(0)
            raise SessionStateError("the drafter's saved cells disagree with its pairs")
        self.start, self.end = s.start, s.end
        # a window is filled from the history at the next flush
        self._win_from = self._hist_to = s.end
        self._pair_tokens = list(s.pair_tokens)
        self._queued_g = [s.queued_g] if len(s.queued_g) else []
        self._queued_taps = [s.queued_taps] if len(s.queued_taps) else []
        self._n_queued_taps = len(s.queued_taps)

    # --- the two graphs ----------------------------------------------------------------------

    def encode(self, taps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """g = fc(taps) for each row (per-tap RMS first for EAGLE-3.1 fc_norm), copied into
        out (a new array when None)."""
        n = taps.shape[0]
        if out is None:
            out = np.empty((n, self.n_embd), dtype=np.float32)
        b = self._enc_batch
        assert b.embd is not None
        k = len(self.spec.taps)
        for i in range(0, n, self.n_batch):
            m = min(self.n_batch, n - i)
            if self.spec.fc_norm:  # normalised straight into the batch: no copy of the taps
                per_tap_rms(taps[i : i + m], k, self.spec.fc_norm_eps, out=b.embd[:m])
            else:
                b.embd[:m] = taps[i : i + m]
            # The encoder ignores positions, but llama.cpp wants them right after the cache.
            b.set(m, self.ctx.seq_pos_max() + 1, all_logits=True)
            self.ctx.encode(b, "drafter encoder")
            out[i : i + m] = self.ctx.nextn(m, self.n_embd)
        return out

    def _decode_chunks(
        self, tokens: Sequence[int], embd: np.ndarray, pos0: int, seq: int = 0
    ) -> Iterator[int]:
        """Decode pairs (token[i], embd[i]) at positions pos0.. of sequence seq in chunks of
        n_batch rows, yielding each chunk's offset; its rows are readable until the next chunk.

        Outputs are requested on every row: the eagle3 graph does not select output rows, so
        asking for fewer returns row 0's values (seen in llama.cpp 0.3.36). It computes every
        row's head anyway, so this costs nothing extra."""
        b = self._dec_batch
        assert b.embd is not None
        for i in range(0, len(tokens), self.n_batch):
            m = min(self.n_batch, len(tokens) - i)
            b.token[:m] = tokens[i : i + m]
            b.embd[:m] = embd[i : i + m]
            if seq == 0:
                b.set(m, pos0 + i, all_logits=True)
            else:
                b.set_rows(np.arange(pos0 + i, pos0 + i + m), np.full(m, seq))
            self.ctx.decode(b, "drafter decoder")
            yield i

    def decode(
        self, tokens: Sequence[int], embd: np.ndarray, pos0: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode pairs; return the last row's logits (a view, valid until the next decode)
        and its feedback state (a copy)."""
        for i in self._decode_chunks(tokens, embd, pos0):
            last = len(tokens) - 1 - i  # the last row's index within the final chunk
        logits, h = self.ctx.outputs(last, self.n_embd)
        return logits, self.feedback(h)

    def chain_start(self, state: np.ndarray) -> None:
        """The feedback state the next chain_next call decodes its token with (flush's is
        already in place)."""
        if state is not self._pending:
            self._pending[:] = state

    def chain_next(self, token: int, pos: int, *, feed: bool = True) -> np.ndarray:
        """Decode (token, the pending state) at pos: a chain's next draft position. Returns
        its logits (a view, valid until the next decode) and keeps its feedback state pending
        for the next call, so a chain step allocates nothing and copies one state row.
        feed=False: no call follows (the chain's last position), so no state is made."""
        b = self._one
        assert b.embd is not None
        b.token[0] = token
        b.pos[0] = pos
        self.ctx.decode(b, "drafter decoder")
        logits, h = self.ctx.one_output(self.n_embd)
        if feed:  # the norm's numpy calls are a third of a position's host time
            self.feedback(h, out=self._pending)
        return logits

    def decode_all(
        self, tokens: Sequence[int], embd: np.ndarray, pos0: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Like decode, but logits and pre-norm states of every row (copies): for checks."""
        n = len(tokens)
        logits = np.empty((n, self.n_vocab), dtype=np.float32)
        hs = np.empty((n, self.n_embd), dtype=np.float32)
        for i in self._decode_chunks(tokens, embd, pos0):
            m = min(self.n_batch, n - i)
            logits[i : i + m] = self.ctx.logits(m)
            for j in range(m):
                hs[i + j] = self.ctx.nextn_ith(j, self.n_embd)
        return logits, hs

    # --- draft trees: one KV sequence per frontier node ----------------------------------------

    def branch(self, parent_seq: int, seq: int) -> None:
        """Make seq hold exactly what parent_seq holds (a frontier node's ancestors)."""
        if seq in self._branched:
            self.ctx.seq_drop(seq)
        self._branched.add(seq)
        self.ctx.seq_cp(parent_seq, seq)

    def drop_branches(self, seqs: Sequence[int]) -> None:
        """Empty these frontier sequences (those branched since they were last emptied)."""
        for s in seqs:
            if s in self._branched:
                self.ctx.seq_drop(s)
                self._branched.discard(s)

    def decode_frontier(
        self, tokens: list[int], embd: np.ndarray, pos: int, seqs: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode one pair per sequence, all at position pos (a draft tree's frontier); return
        every row's logits and pre-norm state (views, valid until the next decode)."""
        n = len(tokens)
        b = self._dec_batch
        assert b.embd is not None
        b.token[:n] = tokens
        b.embd[:n] = embd
        b.set_rows(np.full(n, pos, dtype=np.int32), np.asarray(seqs, dtype=np.int32))
        self.ctx.decode(b, "drafter decoder (tree)")
        return self.ctx.logits(n), self.ctx.nextn(n, self.n_embd)

    # --- outputs -------------------------------------------------------------------------------

    def draft_ids(self, logits: np.ndarray) -> np.ndarray | None:
        """Target ids the drafter can propose: llama.cpp fills the rest of a reduced (d2t) draft
        vocabulary's logits with -inf. Learnt from the first logits seen; None when all can."""
        if self._draft_ids is False:
            row = logits.reshape(-1, logits.shape[-1])[0]
            finite = np.flatnonzero(np.isfinite(row))
            self._draft_ids = None if finite.size == row.size else finite
            if self._draft_ids is not None:
                self._draft_index = np.full(row.size, -1, dtype=np.int64)
                self._draft_index[finite] = np.arange(finite.size)
        return self._draft_ids  # type: ignore[return-value]

    @property
    def draft_index(self) -> np.ndarray | None:
        """Target id -> index among draft_ids (-1: not in the draft vocabulary); None while
        every id can be drafted (or before the first logits)."""
        return self._draft_index

    def draft_logits(self, logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The logits of the draft vocabulary alone (a third of a 49k vocabulary for a 16k
        d2t drafter), copied into out (allocated when None): argmax and ranks read only these.
        Their order is draft_ids'."""
        ids = self.draft_ids(logits)
        n = logits.shape[-1] if ids is None else ids.size
        if out is None or out.shape != (n,):
            out = np.empty(n, dtype=np.float32)
        if ids is None:
            np.copyto(out, logits)
        else:
            np.take(logits, ids, out=out, mode="clip")  # "raise" gathers via a temporary
        return out

    def best_token(self, logits: np.ndarray) -> int:
        """The target id of a logits row's best entry, read straight from llama.cpp's row:
        a reduced vocabulary's other entries are -inf, and ties go to the lower id either way,
        so it is draft_token(draft_logits(logits)) without the gather."""
        return int(logits.argmax())

    def draft_token(self, sub: np.ndarray) -> int:
        """The target id of the best entry of draft_logits."""
        i = int(np.argmax(sub))
        ids = self._draft_ids
        return i if ids is None or ids is False else int(ids[i])  # type: ignore[index]

    def feedback(self, h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The state fed to the next draft step: h (EAGLE-3) or output_norm(h) (norm_output),
        written into out (a new array when None)."""
        if out is None:
            out = np.empty(h.shape[-1], dtype=np.float32)
        if self._out_norm is None:
            np.copyto(out, h)
        else:  # the scale in Python floats: 1.8 µs a call against numpy scalars' 2.5 alone
            scale = 1.0 / math.sqrt(float(np.dot(h, h)) / h.size + self.spec.eps)
            np.multiply(h, self._out_norm, out=out)
            out *= scale
        return out

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def per_tap_rms(
    taps: np.ndarray, n_taps: int, eps: float, out: np.ndarray | None = None
) -> np.ndarray:
    """Divide each of the n_taps equal-width slices of every row by its own RMS (into out,
    [rows, width] float32, when given: a step's few rows cost a handful of numpy calls)."""
    n, w = taps.shape
    if taps.dtype != np.float32:
        taps = taps.astype(np.float32)
    if out is None:
        out = np.empty((n, w), dtype=np.float32)
    parts = taps.reshape(n, n_taps, w // n_taps)
    scale = np.einsum("ijk,ijk->ij", parts, parts)  # no squared copy of the taps
    # in place, as few numpy calls as can be (Python floats stay float32 under NEP 50)
    scale *= n_taps / w
    scale += eps
    scale **= -0.5
    assert out.flags.c_contiguous and out.dtype == np.float32  # reshaped as a view below
    np.multiply(parts, scale[:, :, None], out=out.reshape(n, n_taps, w // n_taps))
    return out
