"""What a drafter GGUF says about itself (read from its header, no weights loaded) and whether
it pairs with a target: every check runs before any native call that could abort."""

from __future__ import annotations

from typing import Protocol

import gguf
import numpy as np

from .. import native as N
from ..errors import ModelFileError, PairMismatchError, UnsupportedModelError
from ..files import gguf_keys as K
from ..native.header_checks import check_header, typed
from .target import Target


class TargetFacts(Protocol):
    """What check_record reads of a target: a loaded Target, or its header's record."""

    @property
    def path(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def vocab_fingerprint(self) -> str: ...


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
        if (
            not isinstance(taps, list)
            or len(taps) != 3
            or not all(isinstance(t, int) for t in taps)
        ):
            raise ModelFileError(f"{path}: {K.TARGET_LAYERS} must list exactly 3 layer ids")
        # values llama.cpp would abort on, refused before any native call
        check_header(h, "drafter")
        self.path = path
        self.header = h
        self.taps: tuple[int, int, int] = (int(taps[0]), int(taps[1]), int(taps[2]))
        # typed reads: a key of the wrong type is a ModelFileError, not a Python crash
        self.n_embd = typed(h, K.EMBEDDING_LENGTH, int, 0)
        self.target_hidden = typed(h, K.TARGET_HIDDEN_SIZE, int, 0)
        self.eps = typed(h, K.RMS_EPS, float, 0.0) or 1e-6
        self.norm_before_fc = typed(h, K.NORM_BEFORE_FC, bool, False)
        self.norm_before_residual = typed(h, K.NORM_BEFORE_RESIDUAL, bool, False)
        self.fc_norm = typed(h, K.FC_NORM, bool, False)
        self.fc_norm_eps = typed(h, K.FC_NORM_EPS, float, self.eps)
        if not self.fc_norm_eps >= 0.0:  # also NaN: the per-tap norms divide by sqrt(ms + eps)
            raise ModelFileError(f"{path}: {K.FC_NORM_EPS} is {self.fc_norm_eps}; must be >= 0")
        self.norm_output = typed(h, K.NORM_OUTPUT, bool, False)
        window = typed(h, K.ATTENTION_WINDOW, int)
        if window is not None and window < 1:
            raise ModelFileError(f"{path}: {K.ATTENTION_WINDOW} is {window}; must be >= 1")
        self.attention_window: int | None = window
        if self.fc_norm and self.norm_before_fc:
            raise ModelFileError(
                f"{path} sets both {K.FC_NORM} and {K.NORM_BEFORE_FC}; a drafter has at most one"
            )
        self.has_token_embd = K.T_TOKEN_EMBD in h.tensors
        self.has_output = K.T_OUTPUT in h.tensors
        d2t = h.tensors.get(K.T_D2T)
        self.draft_vocab = int(d2t.shape[0]) if d2t is not None else None
        self.vocab_size = h.kv_len.get(gguf.Keys.Tokenizer.LIST, 0)
        self.target_record = {
            "architecture": typed(h, K.TARGET_ARCH, str),
            "block_count": typed(h, K.TARGET_BLOCK_COUNT, int),
            "embedding_length": typed(h, K.TARGET_EMBEDDING_LENGTH, int),
            "vocab_size": typed(h, K.TARGET_VOCAB_SIZE, int),
            "vocab_fingerprint": typed(h, K.TARGET_VOCAB_FINGERPRINT, str),
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

    def check_record(self, target: TargetFacts) -> None:
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
