"""The EAGLE-3 / EAGLE-3.1 drafter: an ``eagle3`` GGUF in its own llama.cpp context.

llama.cpp runs the two graphs (encoder ``g = fc(taps)``, one-layer decoder). The two EAGLE-3.1
changes it lacks are applied here, around those graphs:
- fc_norm: each target tap is divided by its own RMS before encoding (the per-tap norm weights
  are already folded into ``fc.weight`` by the converter);
- norm_output: the state fed back to the next draft step is ``output_norm(h)``, not ``h``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from . import _native as N
from . import gguf_keys as K
from .errors import ModelFileError, PairMismatchError, UnsupportedModelError
from .target import Target, vocab_fingerprint

_NORM_DTYPES = {0: np.float32, 1: np.float16}  # ggml types we accept for norm vectors


class DrafterSpec:
    """What a drafter GGUF says about itself, read from its header without loading weights."""

    def __init__(self, path: str) -> None:
        h = N.GGUFHeader(path)
        if h.architecture != K.EAGLE3_ARCH:
            raise UnsupportedModelError(
                f"{path} is not an EAGLE-3 drafter (general.architecture is "
                f"'{h.architecture}', expected '{K.EAGLE3_ARCH}')"
            )
        kv = h.kv
        taps = kv.get(K.TARGET_LAYERS)
        if not isinstance(taps, list) or len(taps) != 3:
            raise ModelFileError(f"{path}: {K.TARGET_LAYERS} must list exactly 3 layer ids")
        self.path = path
        self.header = h
        self.taps: tuple[int, int, int] = (int(taps[0]), int(taps[1]), int(taps[2]))
        self.n_embd = int(kv.get(K.EMBEDDING_LENGTH) or 0)
        self.target_hidden = int(kv.get(K.TARGET_HIDDEN_SIZE) or 0)
        self.eps = float(kv.get(K.RMS_EPS) or 1e-6)
        self.norm_before_fc = bool(kv.get(K.NORM_BEFORE_FC, False))
        self.norm_before_residual = bool(kv.get(K.NORM_BEFORE_RESIDUAL, False))
        self.fc_norm = bool(kv.get(K.FC_NORM, False))
        self.fc_norm_eps = float(kv.get(K.FC_NORM_EPS, self.eps))
        self.norm_output = bool(kv.get(K.NORM_OUTPUT, False))
        if self.fc_norm and self.norm_before_fc:
            raise ModelFileError(
                f"{path} sets both {K.FC_NORM} and {K.NORM_BEFORE_FC}; a drafter has at most one"
            )
        self.has_token_embd = K.T_TOKEN_EMBD in h.tensors
        self.has_output = K.T_OUTPUT in h.tensors
        d2t = h.tensors.get(K.T_D2T)
        self.draft_vocab = int(d2t.shape[0]) if d2t is not None else None
        self.vocab_size = h.kv_len.get("tokenizer.ggml.tokens", 0)
        self.target_record = {
            "architecture": kv.get(K.TARGET_ARCH),
            "block_count": kv.get(K.TARGET_BLOCK_COUNT),
            "embedding_length": kv.get(K.TARGET_EMBEDDING_LENGTH),
            "vocab_size": kv.get(K.TARGET_VOCAB_SIZE),
            "vocab_fingerprint": kv.get(K.TARGET_VOCAB_FINGERPRINT),
        }

    @property
    def variant(self) -> str:
        return "EAGLE-3.1" if (self.fc_norm or self.norm_output) else "EAGLE-3"

    def output_norm_weight(self) -> np.ndarray:
        info = self.header.tensors.get(K.T_OUTPUT_NORM)
        if info is None or info.ggml_type not in _NORM_DTYPES:
            raise ModelFileError(f"{self.path}: {K.T_OUTPUT_NORM} missing or not F32/F16")
        w = np.fromfile(
            self.path,
            dtype=_NORM_DTYPES[info.ggml_type],
            count=int(np.prod(info.shape)),
            offset=self.header.data_offset + info.offset,
        )
        return w.astype(np.float32)

    def check_pair(self, target: Target) -> None:
        """Refuse a drafter that does not belong to this target, before any native work."""
        p = self.path
        if self.target_hidden != target.n_embd:
            raise PairMismatchError(
                f"drafter {p} was made for a target with hidden size {self.target_hidden}, "
                f"but {target.path} has {target.n_embd}"
            )
        borrows = not (self.has_token_embd and self.has_output)
        if borrows and self.n_embd != target.n_embd:
            raise PairMismatchError(
                f"drafter {p} has hidden size {self.n_embd} and borrows the target's embeddings "
                f"or output head, which have width {target.n_embd}"
            )
        for lid in self.taps:
            if not 0 <= lid < target.n_layer:
                raise PairMismatchError(
                    f"drafter {p} taps target layer {lid}, but the target has layers "
                    f"0..{target.n_layer - 1}"
                )
        if self.vocab_size != target.n_vocab:
            raise PairMismatchError(
                f"drafter {p} has a vocabulary of {self.vocab_size} tokens, the target "
                f"{target.n_vocab}"
            )
        rec = self.target_record
        if rec["architecture"] and rec["architecture"] != target.architecture:
            raise PairMismatchError(
                f"drafter {p} was made for a '{rec['architecture']}' target, not "
                f"'{target.architecture}'"
            )
        if rec["block_count"] and int(rec["block_count"]) != target.n_layer:
            raise PairMismatchError(
                f"drafter {p} was made for a target with {rec['block_count']} layers, "
                f"{target.path} has {target.n_layer}"
            )
        if rec["vocab_fingerprint"] and rec["vocab_fingerprint"] != target.vocab_fingerprint:
            raise PairMismatchError(f"drafter {p} was made for a target with a different tokenizer")
        target.check_tappable()


class Drafter:
    """A loaded drafter bound to its target's context (it may borrow embeddings and head)."""

    def __init__(
        self,
        spec: DrafterSpec,
        target: Target,
        *,
        n_batch: int,
        n_threads: int,
        n_gpu_layers: int,
        kv_type: str = "f16",
        flash_attn: bool | None = None,
        n_seq_max: int = 1,
    ) -> None:
        spec.check_pair(target)
        self.spec = spec
        self.model = N.NativeModel(spec.path, n_gpu_layers=n_gpu_layers)
        try:
            self._check_loaded(target)
            self.ctx = N.NativeContext(
                self.model,
                n_ctx=target.n_ctx,
                n_batch=n_batch,
                n_threads=n_threads,
                kv_type=kv_type,
                flash_attn=flash_attn,
                ctx_other=target.ctx,
                embeddings_nextn=True,
                n_seq_max=n_seq_max,  # draft trees: a KV sequence per frontier node
            )
        except BaseException:
            self.model.close()
            raise
        self.n_embd = self.model.n_embd
        self.n_vocab = target.n_vocab
        self.n_batch = n_batch
        self.tap_width = len(spec.taps) * target.n_embd
        self._enc_batch = N.Batch(n_batch, tokens=False, embd=self.tap_width)
        self._dec_batch = N.Batch(n_batch, tokens=True, embd=self.n_embd)
        self._out_norm = spec.output_norm_weight() if spec.norm_output else None
        self._draft_ids: np.ndarray | None | bool = False  # False: not yet known

    def _check_loaded(self, target: Target) -> None:
        if self.model.n_embd != self.spec.n_embd:
            raise ModelFileError(f"{self.spec.path}: embedding_length disagrees with its tensors")
        if self.model.n_vocab != target.n_vocab:
            raise PairMismatchError(
                f"drafter {self.spec.path} has {self.model.n_vocab} tokens, target {target.n_vocab}"
            )
        n = N.model_target_layer_ids_n(self.model.ptr)
        ids = N.model_target_layer_ids(self.model.ptr)
        if tuple(ids[i] for i in range(n)) != self.spec.taps:
            raise ModelFileError(f"{self.spec.path}: llama.cpp reads different tap ids")
        # No recorded target (e.g. made by llama.cpp's converter): compare the tokenizers.
        recorded = self.spec.target_record["vocab_fingerprint"]
        if (
            recorded is None
            and vocab_fingerprint(N.vocab_texts(self.model)) != target.vocab_fingerprint
        ):
            raise PairMismatchError(
                f"drafter {self.spec.path} carries a different tokenizer than {target.path}"
            )

    # --- the two graphs ----------------------------------------------------------------------

    def encode(self, taps: np.ndarray) -> np.ndarray:
        """g = fc(taps) for each row (per-tap RMS first for EAGLE-3.1 fc_norm); returns a copy."""
        n = taps.shape[0]
        if self.spec.fc_norm:
            taps = per_tap_rms(taps, len(self.spec.taps), self.spec.fc_norm_eps)
        out = np.empty((n, self.n_embd), dtype=np.float32)
        b = self._enc_batch
        assert b.embd is not None
        for i in range(0, n, self.n_batch):
            m = min(self.n_batch, n - i)
            b.embd[:m] = taps[i : i + m]
            # The encoder ignores positions, but llama.cpp wants them right after the cache.
            b.set(m, self.ctx.seq_pos_max() + 1, all_logits=True)
            self.ctx.encode(b, "drafter encoder")
            out[i : i + m] = N.float_rows(N.get_embeddings_nextn(self.ctx.ptr), m, self.n_embd)
        return out

    def _decode_chunks(self, tokens: list[int], embd: np.ndarray, pos0: int) -> Iterator[int]:
        """Decode pairs (token[i], embd[i]) at positions pos0.. in chunks of n_batch rows,
        yielding each chunk's offset; its rows are readable until the next chunk.

        Outputs are requested on every row: the eagle3 graph does not select output rows, so
        asking for fewer returns row 0's values (seen in llama.cpp 0.3.36). It computes every
        row's head anyway, so this costs nothing extra."""
        b = self._dec_batch
        assert b.embd is not None
        for i in range(0, len(tokens), self.n_batch):
            m = min(self.n_batch, len(tokens) - i)
            b.token[:m] = tokens[i : i + m]
            b.embd[:m] = embd[i : i + m]
            b.set(m, pos0 + i, all_logits=True)
            self.ctx.decode(b, "drafter decoder")
            yield i

    def decode(
        self, tokens: list[int], embd: np.ndarray, pos0: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode pairs; return the last row's logits (a view, valid until the next decode)
        and its feedback state (a copy)."""
        for i in self._decode_chunks(tokens, embd, pos0):
            last = len(tokens) - 1 - i  # the last row's index within the final chunk
        lg = self.ctx.logits_ith(last, self.n_vocab)
        h = N.get_embeddings_nextn_ith(self.ctx.ptr, last)
        return lg, self.feedback(N.float_rows(h, 1, self.n_embd)[0])

    def decode_all(
        self, tokens: list[int], embd: np.ndarray, pos0: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Like decode, but logits and pre-norm states of every row (copies): for checks."""
        n = len(tokens)
        logits = np.empty((n, self.n_vocab), dtype=np.float32)
        hs = np.empty((n, self.n_embd), dtype=np.float32)
        for i in self._decode_chunks(tokens, embd, pos0):
            m = min(self.n_batch, n - i)
            logits[i : i + m] = N.float_rows(N.C.llama_get_logits(self.ctx.ptr), m, self.n_vocab)
            for j in range(m):
                row = N.get_embeddings_nextn_ith(self.ctx.ptr, j)
                hs[i + j] = N.float_rows(row, 1, self.n_embd)[0]
        return logits, hs

    def decode_rows(
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
        logits = N.float_rows(N.C.llama_get_logits(self.ctx.ptr), n, self.n_vocab)
        return logits, N.float_rows(N.get_embeddings_nextn(self.ctx.ptr), n, self.n_embd)

    def draft_ids(self, logits: np.ndarray) -> np.ndarray | None:
        """Target ids the drafter can propose: llama.cpp fills the rest of a reduced (d2t) draft
        vocabulary's logits with -inf. Learnt from the first logits seen; None when all can."""
        if self._draft_ids is False:
            row = logits.reshape(-1, logits.shape[-1])[0]
            finite = np.flatnonzero(np.isfinite(row))
            self._draft_ids = None if finite.size == row.size else finite
        return self._draft_ids  # type: ignore[return-value]

    def feedback(self, h: np.ndarray) -> np.ndarray:
        """The state fed to the next draft step: h (EAGLE-3) or output_norm(h) (norm_output)."""
        if self._out_norm is None:
            return np.array(h, dtype=np.float32)
        return rms_norm(h, self.spec.eps) * self._out_norm

    def truncate(self, n_keep: int) -> None:
        self.ctx.seq_rm(n_keep)

    def clear(self) -> None:
        self.ctx.clear()

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32, copy=False)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def per_tap_rms(taps: np.ndarray, n_taps: int, eps: float) -> np.ndarray:
    """Divide each of the n_taps equal-width slices of every row by its own RMS."""
    n, w = taps.shape
    parts = taps.reshape(n, n_taps, w // n_taps)
    return rms_norm(parts, eps).reshape(n, w)
