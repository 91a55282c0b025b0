"""The drafter checkpoint families, as tables: how to recognise each, where its settings live,
its flag defaults, its tap numbering, and how its tensor names map to llama.cpp's eagle3 GGUF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from localspec.errors import CheckpointError


@dataclass(frozen=True)
class Family:
    name: str
    layer_prefix: str  # the decoder layer's tensor prefix
    # flag defaults when the config omits them (speculators defaults norm_before_residual on)
    defaults: dict[str, bool]
    # True when explicit tap ids count layer *outputs* ("after layer i" = input of layer i+1)
    taps_are_outputs: bool


# EAGLE reference checkpoints (yuhuili/EAGLE3-*): LlamaForCausalLM with one layer
EAGLE = Family("eagle", "midlayer.", {}, taps_are_outputs=False)
# SpecForge / TorchSpec / AngelSlim: LlamaForCausalLMEagle3, ids of captured layer outputs
SPECFORGE = Family("specforge", "midlayer.", {}, taps_are_outputs=True)
# vLLM's speculators: Eagle3Speculator / Eagle3DraftModel, ids as vLLM uses them (inputs)
SPECULATORS = Family("speculators", "layers.0.", {"norm_before_residual": True}, False)

FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")

# source tensor (after the layer prefix is replaced by "L.") -> GGUF tensor name
TENSOR_MAP = {
    "fc.weight": "fc.weight",
    "input_norm.weight": "enc.output_norm.weight",  # norm_before_fc
    "L.input_layernorm.weight": "blk.0.attn_norm.weight",
    "L.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "L.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "L.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "L.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "L.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "L.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "L.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "L.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "L.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "embed_tokens.weight": "token_embd.weight",
}
REQUIRED = [k for k in TENSOR_MAP if k.startswith("L.") or k in ("fc.weight", "norm.weight")]
# tensors handled apart from the table: folded, converted, or dropped
SPECIAL = ("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight", "d2t", "t2d")
# features llama.cpp's eagle3 graph cannot run: tensor-name fragment -> what to tell the user
UNSUPPORTED_TENSORS = {
    "q_norm": "qwen3-style q/k norms (self_attn.q_norm)",
    "k_norm": "qwen3-style q/k norms (self_attn.k_norm)",
    "kv_a_proj": "MLA attention (DeepSeek-style kv_a_proj, as in the Kimi K2.6 drafter)",
    "q_a_proj": "MLA attention (DeepSeek-style q_a_proj)",
}
UNSUPPORTED_CONFIG = {
    "kv_lora_rank": "MLA attention (kv_lora_rank)",
    "q_lora_rank": "MLA attention (q_lora_rank)",
    "use_qk_norm": "q/k norms (use_qk_norm)",
}


@dataclass
class DrafterConfig:
    family: Family
    hidden_size: int
    intermediate_size: int
    n_head: int
    n_head_kv: int
    rms_eps: float
    rope_theta: float
    context_length: int
    vocab_size: int | None
    draft_vocab_size: int | None
    target_hidden_size: int | None
    tap_ids: list[int] | None  # as written in the config, in the family's numbering
    flags: dict[str, bool]
    rope_scaling: dict[str, Any] | None = None  # llama3 scaling, written as rope_freqs


def detect_family(cfg: dict[str, Any]) -> Family:
    archs = cfg.get("architectures") or []
    if cfg.get("speculators_model_type") == "eagle3" or any(
        a in ("Eagle3Speculator", "Eagle3DraftModel") for a in archs
    ):
        return SPECULATORS
    if any(a in ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM") for a in archs):
        return SPECFORGE
    if "LlamaForCausalLM" in archs and "draft_vocab_size" in cfg:
        return EAGLE
    raise CheckpointError(
        f"unknown drafter architecture {archs or '(none)'}: expected an EAGLE-3 reference "
        "(LlamaForCausalLM with draft_vocab_size), SpecForge (LlamaForCausalLMEagle3) or "
        "speculators (Eagle3Speculator) checkpoint"
    )


def parse_config(cfg: dict[str, Any]) -> DrafterConfig:
    family = detect_family(cfg)
    layer = cfg.get("transformer_layer_config") if family is SPECULATORS else cfg
    if not isinstance(layer, dict):
        raise CheckpointError("config.json lacks transformer_layer_config")
    eagle: dict[str, Any] = cfg["eagle_config"] if isinstance(cfg.get("eagle_config"), dict) else {}
    for key, what in UNSUPPORTED_CONFIG.items():
        if layer.get(key) or cfg.get(key):
            raise CheckpointError(f"llama.cpp's eagle3 graph cannot run {what}")

    def need(key: str, src: dict[str, Any] = layer) -> Any:
        if key not in src:
            raise CheckpointError(f"config.json lacks '{key}'")
        return src[key]

    n_layers = int(layer.get("num_hidden_layers", 1))
    if n_layers != 1:
        raise CheckpointError(
            f"the drafter has {n_layers} decoder layers; llama.cpp's eagle3 graph runs exactly 1"
        )
    hidden = int(need("hidden_size"))
    n_head = int(need("num_attention_heads"))
    head_dim = layer.get("head_dim")
    if head_dim is not None and int(head_dim) * n_head != hidden:
        raise CheckpointError(
            f"head_dim {head_dim} x {n_head} heads != hidden {hidden}: llama.cpp's eagle3 graph "
            "needs head_dim = hidden_size / num_attention_heads"
        )
    scaling = layer.get("rope_scaling") or None
    kind = (scaling.get("rope_type") or scaling.get("type")) if scaling else None
    if kind not in (None, "default", "llama3"):
        raise CheckpointError(f"rope_scaling type '{kind}' is not supported (default, llama3)")
    flags = {}
    for f in FLAGS:
        v = cfg.get(f, eagle.get(f, layer.get(f, family.defaults.get(f, False))))
        flags[f] = bool(v)
    if flags["fc_norm"] and flags["norm_before_fc"]:
        raise CheckpointError("config sets both fc_norm and norm_before_fc; a drafter has one")
    taps = cfg.get("eagle_aux_hidden_state_layer_ids") or eagle.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if taps is not None and (
        not isinstance(taps, list) or len(taps) != 3 or not all(isinstance(t, int) for t in taps)
    ):
        raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must list 3 integers: {taps}")
    target_hidden = cfg.get("target_hidden_size") or layer.get("target_hidden_size")
    return DrafterConfig(
        family=family,
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        n_head=n_head,
        n_head_kv=int(layer.get("num_key_value_heads", n_head)),
        rms_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(layer.get("rope_theta", 10000.0)),
        context_length=int(layer.get("max_position_embeddings", 4096)),
        vocab_size=layer.get("vocab_size"),
        draft_vocab_size=cfg.get("draft_vocab_size") or layer.get("draft_vocab_size"),
        target_hidden_size=int(target_hidden) if target_hidden else None,
        tap_ids=taps,
        flags=flags,
        rope_scaling=scaling if kind == "llama3" else None,
    )


def llama3_rope_factors(scaling: dict[str, Any], theta: float, head_dim: int) -> list[float]:
    """Per-frequency divisors of Llama 3's RoPE scaling (Meta's published formula): long
    wavelengths are stretched by `factor`, short ones kept, the band between interpolated."""
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def resolve_taps(dc: DrafterConfig, n_layer_target: int) -> tuple[list[int], str]:
    """Tap ids in llama.cpp's "input of layer" numbering, and where they came from."""
    if dc.tap_ids is None:
        taps = [2, n_layer_target // 2, n_layer_target - 3]
        how = f"default for a {n_layer_target}-layer target"
    elif dc.family.taps_are_outputs:
        taps = [t + 1 for t in dc.tap_ids]
        how = f"config {dc.tap_ids} (outputs of layers, +1)"
    else:
        taps = list(dc.tap_ids)
        how = f"config {dc.tap_ids}"
    return taps, how


def canonical_name(name: str, family: Family) -> str:
    """Source tensor name with optional "model." and the layer prefix normalised to "L."."""
    if name.startswith("model."):
        name = name[len("model.") :]
    if name.startswith(family.layer_prefix):
        return "L." + name[len(family.layer_prefix) :]
    return name
