"""What training needs to know of the GGUF target: its shape and vocabulary, and the default
taps."""

from __future__ import annotations

from dataclasses import dataclass

from .. import native as N
from ..errors import LocalspecError


@dataclass
class TargetInfo:
    path: str
    n_layer: int
    hidden: int
    n_ff: int
    n_head: int
    n_head_kv: int
    rms_eps: float
    rope_theta: float
    context_length: int
    n_vocab: int


def target_info(path: str) -> TargetInfo:
    h = N.GGUFHeader(path)
    emb = h.tensors.get("token_embd.weight")
    if emb is None or h.arch_key("block_count") is None:
        raise LocalspecError(f"{path} is not a transformer GGUF this trainer understands")
    n_head = int(h.arch_key("attention.head_count"))
    kv = h.arch_key("attention.head_count_kv")
    return TargetInfo(
        path=path,
        n_layer=int(h.arch_key("block_count")),
        hidden=int(h.arch_key("embedding_length")),
        n_ff=int(h.arch_key("feed_forward_length")),
        n_head=n_head,
        n_head_kv=int(kv) if isinstance(kv, int) else n_head,
        rms_eps=float(h.arch_key("attention.layer_norm_rms_epsilon") or 1e-5),
        rope_theta=float(h.arch_key("rope.freq_base") or 10000.0),
        context_length=int(h.arch_key("context_length") or 4096),
        n_vocab=int(emb.shape[1]),
    )


def default_taps(n_layer: int) -> tuple[int, int, int]:
    """llama.cpp's (and EAGLE-3's) default: inputs of layers 2, L/2 and L-3."""
    return (min(2, n_layer - 1), n_layer // 2, max(1, n_layer - 3))
