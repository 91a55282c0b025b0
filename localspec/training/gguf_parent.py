"""A drafter GGUF as the parent of a training run (`localspec train --init-from DRAFTER.gguf`).

A run's state file stays where the run was made; the GGUF travels (the shipped drafter, one a
user downloaded or converted). Its tensors, dequantized, are renamed back to the trainer's
parameters: q/k rows return to the rotate-half layout, and the folded per-tap norms of an
EAGLE-3.1 drafter (convert multiplies them into fc) come back as fc itself with unit norms,
the same function. Positions seen are not recorded in a GGUF: they count as 0.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ..converters.convert import unpermute_qk
from ..converters.eagle3_gguf import target_record
from ..converters.formats import LAYER_PREFIXES, TENSOR_MAP
from ..errors import LocalspecError
from ..files import gguf_keys as K
from ..files.ggufdata import read_tensor
from ..runtime.drafter_spec import DrafterSpec


def is_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:  # a folder, or missing: a run's state is looked for there
        return False


def gguf_parent_state(path: str, info: Any) -> dict[str, Any]:
    """The parent state (as a run's state file holds it) of a drafter GGUF made for the
    target info describes; one clear error for a file this trainer cannot go on training,
    found from the header before any tensor is read."""
    import torch

    spec = DrafterSpec(path)
    _check_target(spec, info)
    refuse = {
        "norm_before_fc": spec.norm_before_fc,
        "norm_before_residual": spec.norm_before_residual,
        "its own token embeddings": spec.has_token_embd,
        "no output head of its own": not spec.has_output,
        f"fc_norm {spec.fc_norm} with norm_output {spec.norm_output}": (
            spec.fc_norm != spec.norm_output
        ),
        "RoPE scaling (rope_freqs)": "rope_freqs.weight" in spec.header.tensors,
    }
    bad = [what for what, hit in refuse.items() if hit]
    if bad:
        raise LocalspecError(
            f"{path} is a drafter localspec train cannot go on training ({', '.join(bad)}): "
            "it trains EAGLE-3 or EAGLE-3.1 drafters of the target's width"
        )
    layer = LAYER_PREFIXES[0]
    header = spec.header
    names = {
        gguf_name: src.replace("L.", layer)
        for src, gguf_name in TENSOR_MAP.items()
        if gguf_name in header.tensors and src != "embed_tokens.weight"
    }
    have = {mine: tuple(reversed(header.tensors[g].shape)) for g, mine in names.items()}
    n_head_rows = have["lm_head.weight"][0]
    for name, shape in _shapes(info, layer, n_head_rows).items():
        if have.get(name) != shape:
            raise LocalspecError(
                f"{path}: {name} is {have.get(name, 'missing')}, the trainer's drafter for "
                f"{info.path} has {shape}: it is not a drafter of this target's shape"
            )
    draft_ids = _draft_ids(spec, info, n_head_rows)
    model = {mine: read_tensor(header, g) for g, mine in names.items()}
    for key, n in (("q_proj", info.n_head), ("k_proj", info.n_head_kv)):
        name = f"{layer}self_attn.{key}.weight"
        model[name] = unpermute_qk(model[name], n)
    if spec.fc_norm:  # folded into fc by convert: unit norms give the same encoder
        for i in range(3):
            model[f"fc_norm.{i}.weight"] = np.ones(info.hidden, dtype=np.float32)
    return {
        "config": {"variant": "eagle3.1" if spec.fc_norm else "eagle3"},
        "draft_ids": draft_ids,
        "model": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.items()},
        "taps": spec.taps,
        "positions": 0,
        "from_gguf": True,
    }


def _check_target(spec: DrafterSpec, info: Any) -> None:
    """The target convert recorded (the drafter's own check, read from the target's header
    alone) and the hyperparameters the trainer takes from the target."""
    rec = target_record(info.path)
    spec.check_record(
        SimpleNamespace(  # TargetFacts, from the header
            path=info.path,
            architecture=rec.architecture,
            n_layer=rec.block_count,
            n_embd=rec.embedding_length,
            n_vocab=rec.vocab_size,
            vocab_fingerprint=rec.vocab_fingerprint,
        )
    )
    h = spec.header
    for have, want, what in (
        (spec.target_hidden, info.hidden, "a target hidden size"),
        (spec.n_embd, info.hidden, "a hidden size"),
        (spec.vocab_size, info.n_vocab, "a vocabulary size"),
        (h.arch_key("attention.head_count"), info.n_head, "attention heads"),
        (h.arch_key("attention.head_count_kv"), info.n_head_kv, "key/value heads"),
        (h.arch_key("feed_forward_length"), info.n_ff, "a feed-forward width"),
        (h.arch_key("rope.freq_base"), info.rope_theta, "a RoPE base"),
        (spec.eps, info.rms_eps, "an RMS norm epsilon"),
        (spec.fc_norm_eps if spec.fc_norm else None, info.rms_eps, "a tap norm epsilon"),
    ):
        if have is not None and not np.isclose(float(have), float(want), rtol=1e-5, atol=0):
            raise LocalspecError(
                f"drafter {spec.path} has {what} of {have}; the trainer's drafter for "
                f"{info.path} has {want}"
            )


def _shapes(info: Any, layer: str, n_head_rows: int) -> dict[str, tuple[int, ...]]:
    """The trainer's drafter tensors for this target, in numpy order."""
    h, ff = info.hidden, info.n_ff
    kv = info.n_head_kv * (h // info.n_head)
    att = f"{layer}self_attn."
    return {
        "fc.weight": (h, 3 * h),
        f"{layer}input_layernorm.weight": (h,),
        f"{layer}hidden_norm.weight": (h,),
        f"{layer}post_attention_layernorm.weight": (h,),
        f"{att}q_proj.weight": (h, 2 * h),
        f"{att}k_proj.weight": (kv, 2 * h),
        f"{att}v_proj.weight": (kv, 2 * h),
        f"{att}o_proj.weight": (h, h),
        f"{layer}mlp.gate_proj.weight": (ff, h),
        f"{layer}mlp.up_proj.weight": (ff, h),
        f"{layer}mlp.down_proj.weight": (h, ff),
        "norm.weight": (h,),
        "lm_head.weight": (n_head_rows, h),
    }


def _draft_ids(spec: DrafterSpec, info: Any, n_head_rows: int) -> np.ndarray:
    """The target ids of the head's rows: d2t (absolute ids in a GGUF; checkpoints hold
    offsets), or every id when the head covers the vocabulary."""
    if K.T_D2T not in spec.header.tensors:
        if n_head_rows != info.n_vocab:
            raise LocalspecError(
                f"{spec.path}: the head has {n_head_rows} rows, the target {info.n_vocab} "
                "tokens, and there is no d2t"
            )
        return np.arange(n_head_rows, dtype=np.int64)
    ids = read_tensor(spec.header, K.T_D2T).astype(np.int64).reshape(-1)
    if (
        ids.shape != (n_head_rows,)
        or ids.min(initial=0) < 0
        or ids.max(initial=0) >= info.n_vocab
        or np.unique(ids).size != ids.size
    ):
        raise LocalspecError(f"{spec.path}: d2t does not map the head's rows to distinct tokens")
    return ids
