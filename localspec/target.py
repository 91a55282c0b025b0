"""The target model: a GGUF model in a llama.cpp context whose hidden states can be tapped."""

from __future__ import annotations

import hashlib

import numpy as np

from . import _native as N
from .errors import ContextFullError, UnsupportedModelError
from .gguf_keys import TAPPABLE_ARCHS


class Target:
    """Owns the target model and its context; decodes batches and exposes logits and taps."""

    def __init__(
        self,
        path: str,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        n_gpu_layers: int,
        kv_type: str = "f16",
        flash_attn: bool | None = None,
        n_seq: int = 1,
        tree_nodes: int = 0,
    ) -> None:
        self.path = path
        self.header = N.GGUFHeader(path)
        self.architecture = self.header.architecture or "unknown"
        self.model = N.NativeModel(path, n_gpu_layers=n_gpu_layers)
        try:
            n_ctx_train = int(self.header.arch_key("context_length") or 0)
            if n_ctx <= 0:
                n_ctx = n_ctx_train or 4096
            self.ctx = N.NativeContext(
                self.model,
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_threads=n_threads,
                kv_type=kv_type,
                flash_attn=flash_attn,
                # parallel sequences get a KV stream each, so attention stays per sequence;
                # a draft tree needs one unified stream and a sequence id per leaf
                n_seq_max=max(n_seq, tree_nodes + 2 if tree_nodes else 1),
                kv_unified=n_seq == 1,
            )
        except BaseException:
            self.model.close()
            raise
        self.n_ctx = self.ctx.n_ctx
        self.n_batch = n_batch
        self.n_vocab = self.model.n_vocab
        self.n_embd = self.model.n_embd
        self.n_layer = self.model.n_layer
        self.taps: tuple[int, ...] = ()
        self._taps_active = False
        self._batch = N.Batch(n_batch)
        self._tree_batch = N.Batch(tree_nodes + 1, seqs_per_row=tree_nodes) if tree_nodes else None
        self._fingerprint: str | None = None

    # --- taps --------------------------------------------------------------------------------

    def check_tappable(self) -> None:
        if self.architecture not in TAPPABLE_ARCHS:
            raise UnsupportedModelError(
                f"target architecture '{self.architecture}' cannot feed an EAGLE-3 drafter: its "
                "llama.cpp graph does not expose layer inputs (tappable: "
                + ", ".join(sorted(TAPPABLE_ARCHS))
                + ")"
            )

    def enable_taps(self, layer_ids: tuple[int, ...]) -> None:
        """Keep the input of these layers for every decoded token (checked: no native abort)."""
        self.check_tappable()
        for lid in layer_ids:
            if not 0 <= lid < self.n_layer:
                raise UnsupportedModelError(
                    f"tap layer {lid} is outside the target's layers 0..{self.n_layer - 1}"
                )
        self.taps = tuple(layer_ids)
        self.set_taps_active(True)

    def set_taps_active(self, active: bool) -> None:
        """Switch tap extraction on or off (off for plain decoding, so A/B runs are fair)."""
        if not self.taps or active == self._taps_active:
            return
        for lid in self.taps:
            N.set_embeddings_layer_inp(self.ctx.ptr, lid, active)
        self._taps_active = active

    def read_taps(self, n_rows: int) -> np.ndarray:
        """Concatenated taps [n_rows, len(taps) * n_embd] of the last decode (a copy)."""
        out = np.empty((n_rows, len(self.taps) * self.n_embd), dtype=np.float32)
        for j, lid in enumerate(self.taps):
            rows = N.float_rows(N.get_embeddings_layer_inp(self.ctx.ptr, lid), n_rows, self.n_embd)
            out[:, j * self.n_embd : (j + 1) * self.n_embd] = rows
        return out

    # --- decoding ----------------------------------------------------------------------------

    def decode(self, tokens: list[int], pos0: int, *, all_logits: bool) -> np.ndarray:
        """Decode tokens at positions pos0.. (at most n_batch); return a view of the logits:
        one row per token with all_logits, else only the last row (valid until next decode)."""
        n = len(tokens)
        if pos0 + n > self.n_ctx:
            raise ContextFullError(f"context window of {self.n_ctx} tokens is full")
        b = self._batch
        b.token[:n] = tokens
        b.set(n, pos0, all_logits=all_logits)
        self.ctx.decode(b, "target batch")
        n_out = n if all_logits else 1
        ptr = N.C.llama_get_logits(self.ctx.ptr)
        return N.float_rows(ptr, n_out, self.n_vocab)

    def decode_tree(self, tokens: list[int], pos: np.ndarray, seqs: list[list[int]]) -> np.ndarray:
        """Decode a draft tree (row i at pos[i] in the sequences seqs[i]); logits of every row."""
        b = self._tree_batch
        n = len(tokens)
        if b is None or n > b.capacity:
            raise ValueError(f"tree of {n} rows exceeds this target's tree capacity")
        if int(pos.max()) >= self.n_ctx:
            raise ContextFullError(f"context window of {self.n_ctx} tokens is full")
        b.token[:n] = tokens
        b.set_tree(pos, seqs)
        self.ctx.decode(b, "target tree batch")
        return N.float_rows(N.C.llama_get_logits(self.ctx.ptr), n, self.n_vocab)

    def truncate(self, n_keep: int) -> None:
        """Forget KV positions >= n_keep."""
        self.ctx.seq_rm(n_keep)

    # --- vocabulary --------------------------------------------------------------------------

    @property
    def vocab_fingerprint(self) -> str:
        """sha256 over every token text: two models with equal fingerprints tokenize alike."""
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(N.vocab_texts(self.model))
        return self._fingerprint

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def vocab_fingerprint(texts: list[bytes]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(len(t).to_bytes(4, "little"))
        h.update(t)
    return h.hexdigest()
