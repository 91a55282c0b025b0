"""Small Hugging Face-style drafter checkpoints of every family, written with torch.

They are made from GGUF-layout tensors by the inverse of the conversion (q/k rows back to
rotate-half order, per-tap norm weights divided back out of fc), so a correct converter must
reproduce the original tensors exactly.
"""

from __future__ import annotations

import json
import os

import numpy as np

from helpers import tinymodels as tm

HF_NAMES = {
    "blk.0.attn_norm.weight": "input_layernorm.weight",
    "blk.0.attn_norm_2.weight": "hidden_norm.weight",
    "blk.0.ffn_norm.weight": "post_attention_layernorm.weight",
    "blk.0.attn_q.weight": "self_attn.q_proj.weight",
    "blk.0.attn_k.weight": "self_attn.k_proj.weight",
    "blk.0.attn_v.weight": "self_attn.v_proj.weight",
    "blk.0.attn_output.weight": "self_attn.o_proj.weight",
    "blk.0.ffn_gate.weight": "mlp.gate_proj.weight",
    "blk.0.ffn_up.weight": "mlp.up_proj.weight",
    "blk.0.ffn_down.weight": "mlp.down_proj.weight",
}


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def hf_tensors(
    gg: dict[str, np.ndarray],
    ds: tm.DrafterShape,
    family: str,
    seed: int = 0,
    *,
    prefix: str | None = None,
    n_vocab: int = tm.N_VOCAB,
):
    """GGUF-layout tensors -> the family's checkpoint tensors (torch). prefix: the decoder
    layer's tensor prefix (default: the family's)."""
    import torch

    if prefix is None:
        prefix = "layers.0." if family == "speculators" else "midlayer."
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    # rope_freqs is derived from the config by the converter, not stored in checkpoints
    for g, hf in HF_NAMES.items():
        if g not in gg:  # tests of incomplete checkpoints drop tensors on purpose
            continue
        arr = gg[g]
        if g == "blk.0.attn_q.weight":
            arr = unpermute(arr, ds.n_head)
        elif g == "blk.0.attn_k.weight":
            arr = unpermute(arr, ds.n_head_kv)
        out[prefix + hf] = arr
    fc = gg["fc.weight"]
    if ds.fc_norm:
        w = (1.0 + 0.3 * rng.standard_normal(fc.shape[1])).astype(np.float32)
        fc = fc / w[None, :]
        width = fc.shape[1] // 3
        for i in range(3):
            out[f"fc_norm.{i}.weight"] = w[i * width : (i + 1) * width]
    out["fc.weight"] = fc
    out["norm.weight"] = gg["output_norm.weight"]
    if "enc.output_norm.weight" in gg:
        out["input_norm.weight"] = gg["enc.output_norm.weight"]
    if "output.weight" in gg:
        out["lm_head.weight"] = gg["output.weight"]
    if "token_embd.weight" in gg:
        out["embed_tokens.weight"] = gg["token_embd.weight"]
    if "d2t" in gg:
        ids = gg["d2t"]
        out["d2t"] = ids - np.arange(ids.shape[0])  # offsets, as EAGLE stores them
        mask = np.zeros(n_vocab, dtype=bool)
        mask[ids[(ids >= 0) & (ids < n_vocab)]] = True
        out["t2d"] = mask
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def layer_config(ds: tm.DrafterShape) -> dict:
    return {
        "hidden_size": ds.n_embd,
        "intermediate_size": ds.n_ff,
        "num_attention_heads": ds.n_head,
        "num_key_value_heads": ds.n_head_kv,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "vocab_size": tm.N_VOCAB,
        "hidden_act": "silu",
        **({"rope_scaling": tm.LLAMA3_SCALING} if ds.llama3_rope else {}),
    }


def write_checkpoint(
    folder: str, family: str, ds: tm.DrafterShape, gg: dict[str, np.ndarray], *,
    taps: list[int] | None = None, shards: int = 1, fmt: str = "safetensors",
) -> str:  # fmt: skip
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    layer = layer_config(ds)
    flags = {"norm_before_fc": ds.norm_before_fc, "norm_before_residual": ds.norm_before_residual,
             "fc_norm": ds.fc_norm, "norm_output": ds.norm_output}  # fmt: skip
    dv = ds.draft_vocab or tm.N_VOCAB
    if family == "eagle":
        cfg = {"architectures": ["LlamaForCausalLM"], **layer, "draft_vocab_size": dv,
               "target_hidden_size": 64, **flags}  # fmt: skip
    elif family == "specforge":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": dv,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": taps, **flags}}  # fmt: skip
        if taps is None:
            del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    else:
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": layer, "draft_vocab_size": dv,
               "target_hidden_size": 64, **flags}  # fmt: skip
        if taps is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = taps
    if family == "eagle" and taps is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = taps
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    tensors = hf_tensors(gg, ds, family)
    if fmt == "bin":
        torch.save(tensors, os.path.join(folder, "pytorch_model.bin"))
        return folder
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, os.path.join(folder, "model.safetensors"))
        return folder
    weight_map = {}
    for s in range(shards):
        part = {n: tensors[n] for n in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    return folder
