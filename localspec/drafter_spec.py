"""What a drafter GGUF says about itself (read from its header, no weights loaded) and whether
it pairs with a target: every check runs before any native call that could abort."""

from __future__ import annotations

import numpy as np

from . import _native as N
from . import gguf_keys as K
from .errors import ModelFileError, PairMismatchError, UnsupportedModelError
from .target import Target

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

    def check_record(self, target: Target) -> None:
        """The target our converter recorded in the file (architecture, layers, hidden size,
        vocabulary and tokenizer fingerprint) must be this one; files without a record (made by
        llama.cpp's converter) pass and are checked by tokenizer once loaded."""
        rec, p, t = self.target_record, self.path, target
        if rec["architecture"] and rec["architecture"] != t.architecture:
            raise PairMismatchError(
                f"drafter {p} was made for a '{rec['architecture']}' target, not '{t.architecture}'"
            )
        for key, have, what in (
            ("block_count", t.n_layer, "layers"),
            ("embedding_length", t.n_embd, "hidden size"),
            ("vocab_size", t.n_vocab, "vocabulary size"),
        ):
            value = rec[key]
            if value and int(value) != have:
                raise PairMismatchError(
                    f"drafter {p} was made for a target with {what} {value}; {t.path} has {have}"
                )
        if rec["vocab_fingerprint"] and rec["vocab_fingerprint"] != t.vocab_fingerprint:
            raise PairMismatchError(f"drafter {p} was made for a target with a different tokenizer")

    def check_pair(self, target: Target) -> None:
        """Refuse a drafter that does not belong to this target, before any native work."""
        self.check_record(target)
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
        target.check_tappable(self.taps)
