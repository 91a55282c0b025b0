"""A drafter GGUF as the parent of a training run (`localspec train --init-from DRAFTER.gguf`).

A run's state file stays where the run was made; the GGUF travels (the shipped drafter, one a
user downloaded or converted). Its tensors, dequantized, are renamed back to the trainer's
parameters: q/k rows return to the rotate-half layout, and the folded per-tap norms of an
EAGLE-3.1 drafter (convert multiplies them into fc) come back as fc itself with unit norms,
the same function. Positions seen are not recorded in a GGUF: they count as 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native as N
from .. import gguf_keys as K
from ..converters.convert import unpermute_qk
from ..converters.formats import LAYER_PREFIXES, TENSOR_MAP
from ..drafter_spec import DrafterSpec
from ..errors import LocalspecError
from ..ggufdata import read_tensors
from ..target import vocab_fingerprint


def is_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:  # a folder, or missing: a run's state is looked for there
        return False


def gguf_parent_state(path: str, info: Any) -> dict[str, Any]:
    """The parent state (as a run's state file holds it) of a drafter GGUF made for the
    target info describes; one clear error for a file this trainer cannot go on training."""
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
    }
    bad = [what for what, hit in refuse.items() if hit]
    if bad:
        raise LocalspecError(
            f"{path} is a drafter localspec train cannot go on training ({', '.join(bad)}): "
            "it trains EAGLE-3 or EAGLE-3.1 drafters of the target's width"
        )
    layer = LAYER_PREFIXES[0]
    names = {
        gguf_name: src.replace("L.", layer)
        for src, gguf_name in TENSOR_MAP.items()
        if gguf_name in spec.header.tensors and src != "embed_tokens.weight"
    }
    w = read_tensors(path, [*names, *([K.T_D2T] if spec.draft_vocab else [])])
    model = {mine: w[g] for g, mine in names.items()}
    for key, n in (("q_proj", info.n_head), ("k_proj", info.n_head_kv)):
        name = f"{layer}self_attn.{key}.weight"
        if name in model:
            model[name] = unpermute_qk(model[name], n)
    if spec.fc_norm:  # folded into fc by convert: unit norms give the same encoder
        for i in range(3):
            model[f"fc_norm.{i}.weight"] = np.ones(info.hidden, dtype=np.float32)
    n_head_rows = int(model["lm_head.weight"].shape[0])
    # d2t in a GGUF holds absolute target ids (checkpoints hold offsets)
    d2t = w.get(K.T_D2T)
    draft_ids = d2t.astype(np.int64).reshape(-1) if d2t is not None else np.arange(n_head_rows)
    if (
        draft_ids.shape != (n_head_rows,)
        or draft_ids.min(initial=0) < 0
        or draft_ids.max(initial=0) >= info.n_vocab
    ):
        raise LocalspecError(f"{path}: d2t does not map the head's rows to the target's tokens")
    return {
        "config": {"variant": "eagle3.1" if spec.fc_norm else "eagle3"},
        "draft_ids": draft_ids,
        "model": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.items()},
        "taps": spec.taps,
        "positions": 0,
    }


def _check_target(spec: DrafterSpec, info: Any) -> None:
    """The target the drafter's converter recorded, and the sizes it must share with it."""
    rec, p = spec.target_record, spec.path
    for have, want, what in (
        (rec["block_count"], info.n_layer, "layers"),
        (rec["embedding_length"], info.hidden, "hidden size"),
        (rec["vocab_size"], info.n_vocab, "vocabulary size"),
        (spec.target_hidden, info.hidden, "hidden size"),
        (spec.n_embd, info.hidden, "hidden size"),
        (spec.vocab_size, info.n_vocab, "vocabulary size"),
    ):
        if have and int(have) != want:
            raise LocalspecError(
                f"drafter {p} was made for a target with {what} {have}; {info.path} has {want}"
            )
    if rec["vocab_fingerprint"]:
        model = N.NativeModel(info.path, n_gpu_layers=0)
        try:
            mine = vocab_fingerprint(model.vocab_texts())
        finally:
            model.close()
        if mine != rec["vocab_fingerprint"]:
            raise LocalspecError(f"drafter {p} was made for a target with another tokenizer")
