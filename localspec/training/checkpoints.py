"""A run's drafter on disk: building it from a config, its state file, its parent run or GGUF,
and the exported checkpoint."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import native as N
from ..errors import LocalspecError
from ..files.ggufdata import read_tensors
from .averaging import EMA_KEY, exported_weights
from .config import CHECKPOINT, TrainConfig, read_run_state
from .features import (
    Sequence,
)
from .files import atomic_save, draft_vocab_maps, write_checkpoint
from .gguf_parent import gguf_parent_state, is_gguf
from .targets import TargetInfo


def export_checkpoint(
    model: Any, folder: str, taps: tuple[int, ...], draft_ids: np.ndarray, meta: dict[str, Any]
) -> str:
    """Write the drafter in SpecForge's layout (LlamaForCausalLMEagle3, safetensors)."""
    c = model.c
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update(draft_vocab_maps(draft_ids, c.vocab_size))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "num_hidden_layers": 1,
        "head_dim": c.hidden_size // c.n_head,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "fc_norm": c.fc_norm,
        "norm_output": c.norm_output,
        # SpecForge numbers taps as layer outputs: input of layer i = output of layer i-1
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [t - 1 for t in taps]},
        "localspec": meta,
    }
    return write_checkpoint(os.path.join(folder, CHECKPOINT), tensors, config)


def _save_state(path: str, state: dict[str, Any]) -> None:
    import torch

    atomic_save(path, lambda tmp: torch.save(state, tmp))


def build_drafter(
    info: TargetInfo,
    cfg: TrainConfig,
    draft_ids: np.ndarray,
    resume: dict[str, Any] | None,
    init_seqs: list[Sequence],
) -> Any:
    """The drafter model for this target and config: a saved state's weights (resume), or
    initialised as cfg.init says from the target's tensors (init_seqs: a sample of the
    training data, for the taps' scale)."""
    import torch

    from .model import DraftConfig, Eagle3Drafter

    i, v31 = info, cfg.variant == "eagle3.1"
    dc = DraftConfig(
        hidden_size=i.hidden,
        intermediate_size=i.n_ff,
        n_head=i.n_head,
        n_head_kv=i.n_head_kv,
        target_hidden_size=i.hidden,
        vocab_size=i.n_vocab,
        draft_vocab_size=len(draft_ids),
        rms_eps=i.rms_eps,
        rope_theta=i.rope_theta,
        context_length=i.context_length,
        fc_norm=v31,
        norm_output=v31,
    )
    top = i.n_layer - 1
    names = ["token_embd.weight", "output_norm.weight"]
    hdr = N.GGUFHeader(i.path)
    if "output.weight" in hdr.tensors:
        names.append("output.weight")
    if cfg.init == "target-layer" and resume is None:
        names += [f"blk.{top}.{n}" for n in TOP_LAYER_TENSORS]
    w = read_tensors(i.path, names)
    embed = torch.from_numpy(w["token_embd.weight"])
    model = Eagle3Drafter(dc, embed)
    if resume is not None:
        model.load_state_dict(resume["model"])
    elif cfg.init != "random":
        sample = np.concatenate([s.taps for s in init_seqs]).astype(np.float32)
        rms = np.sqrt(np.square(sample.reshape(len(sample), 3, i.hidden)).mean(axis=(0, 2)))
        model.init_from_target(w, draft_ids, rms, top if cfg.init == "target-layer" else None)
    return model


def load_parent(cfg: TrainConfig, info: TargetInfo, taps: tuple[int, ...]) -> dict[str, Any]:
    """The state of the run cfg.init_from names (its folder or state file, or a drafter GGUF),
    checked to fit a run of cfg: the same target, taps, variant and draft vocabulary size (its
    weights are loaded as they are)."""
    assert cfg.init_from
    if is_gguf(cfg.init_from):
        st = gguf_parent_state(cfg.init_from, info)
    else:
        st = read_run_state(cfg.init_from, info)
    if tuple(st["taps"]) != tuple(taps):
        raise LocalspecError(
            f"{cfg.init_from} taps layers {list(st['taps'])}, this run {list(taps)}: pass the "
            "same --taps"
        )
    theirs = st["config"].get("variant")
    if theirs != cfg.variant:
        raise LocalspecError(
            f"{cfg.init_from} holds a drafter of variant {theirs}, this run trains "
            f"{cfg.variant}: pass the same --variant"
        )
    size = min(cfg.draft_vocab, info.n_vocab)  # what choose_draft_vocab would pick
    if len(st["draft_ids"]) != size:
        raise LocalspecError(
            f"{cfg.init_from} drafts from {len(st['draft_ids'])} tokens, this run from "
            f"{size}: pass --draft-vocab {len(st['draft_ids'])}"
        )
    # the drafter that run exported (its average, where it kept one) is where this one starts
    return {k: v for k, v in st.items() if k != EMA_KEY} | {"model": exported_weights(st)}


TOP_LAYER_TENSORS = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
