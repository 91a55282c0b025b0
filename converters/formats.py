"""The drafter checkpoint layouts, as tables: how to recognise each, which tools write it, where
its settings live, what its tap ids and flags mean (and where that is open), and how its tensor
names map to llama.cpp's eagle3 GGUF. Every difference between layouts lives here.

Sources, read in public code (see docs/convert.md for what was also run here): SafeAILab/EAGLE,
sgl-project/SpecForge (and its PR #879), vllm-project/speculators, vLLM's llama_eagle3.py and
speculators config translator, Tencent/AngelSlim, lightseekorg/TorchSpec, NVIDIA/Model-Optimizer
and llama.cpp's converter.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from localspec.errors import CheckpointError

INPUTS, OUTPUTS = "inputs", "outputs"


@dataclass(frozen=True)
class Family:
    name: str
    writers: str  # the tools that write this layout (for messages)
    # how these writers number explicit tap ids: "inputs" (id L = input of layer L, llama.cpp's
    # numbering) or "outputs" (id L = output of layer L = input of layer L+1)
    taps: str
    # False: the same layout also reaches users with the other numbering, so explicit ids are
    # measured both ways (the convention above wins a tie)
    taps_certain: bool
    # flag values when the config omits them
    defaults: dict[str, bool] = field(default_factory=dict)
    # flags whose absence other tools read the other way: measured both ways when absent
    open_if_absent: tuple[str, ...] = ()
    # flags whose true value meant something else in older versions of the writer: measured
    # as both meanings when true (the current meaning wins a tie)
    old_meaning: tuple[str, ...] = ()
    # fc is [H, 3H] whatever target_hidden_size says (AngelSlim): the key is ignored
    ignores_target_hidden: bool = False


# EAGLE reference (yuhuili/EAGLE3-*): LlamaForCausalLM with draft_vocab_size. Its code taps the
# inputs of layers 2, N/2, N-3 and writes no ids; ids someone added are read as inputs by vLLM
# and llama.cpp's converter, so that is the convention, but not a certain one.
EAGLE = Family("eagle", "the EAGLE reference code", INPUTS, taps_certain=False)
# SpecForge: LlamaForCausalLMEagle3, ids count layer outputs (SGLang adds 1 when it captures).
# Before SpecForge's PR #879, norm_output (default true) only normed the head's input: plain
# EAGLE-3. In vLLM, SGLang, speculators and later SpecForge it is EAGLE-3.1's post-norm feedback.
SPECFORGE = Family(
    "specforge", "SpecForge", OUTPUTS, taps_certain=False, old_meaning=("norm_output",)
)
# TorchSpec (config carries _torchspec_version): natively output ids; its vLLM export renames
# midlayer.* to layers.0.* and adds 1 to the ids (seen for kimi_k2 configs in
# tools/convert_to_hf.py). Its norm_output is EAGLE-3.1's (TorchSpec introduced 3.1).
TORCHSPEC = Family("torchspec", "TorchSpec", OUTPUTS, taps_certain=False)
# NVIDIA ModelOpt: LlamaForCausalLMEagle3 with an eagle_config of its own keys, layers.0.*, no
# embed_tokens, the base model's full lm_head when the drafter has none. Its HF trainer hooks
# layer outputs (default ids [1, N/2-1, N-4]); some of its published drafters give boundary ids
# (input numbering, e.g. [24, 30, 36] for a 36-layer gpt-oss).
MODELOPT = Family("modelopt", "NVIDIA ModelOpt", OUTPUTS, taps_certain=False)
# AngelSlim: Eagle3LlamaForCausalLM with target_model_type; output ids (default [1, N/2-1,
# N-4]); fc is Linear(3*hidden, hidden); weights often in pytorch_model.bin.
ANGELSLIM = Family(
    "angelslim", "AngelSlim", OUTPUTS, taps_certain=False, ignores_target_hidden=True
)
# vLLM's speculators: Eagle3Speculator / Eagle3DraftModel, nested transformer_layer_config,
# layers.0.*; ids as vLLM uses them (inputs). The speculators library defaults
# norm_before_residual to false, vLLM's translator assumes true when the key is missing.
SPECULATORS = Family(
    "speculators",
    "vLLM's speculators",
    INPUTS,
    taps_certain=True,
    defaults={"norm_before_residual": True},
    open_if_absent=("norm_before_residual",),
)
# `localspec train`: SpecForge's layout plus a "localspec" record of the taps it was trained on
LOCALSPEC = Family("localspec", "localspec train", OUTPUTS, taps_certain=True)

FAMILIES = (EAGLE, SPECFORGE, TORCHSPEC, MODELOPT, ANGELSLIM, SPECULATORS, LOCALSPEC)
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# flags a user may set on the command line (the other two follow from the tensors)
SETTABLE_FLAGS = ("norm_output", "norm_before_residual")

# architectures refused outright, with what to tell the user
REFUSED_ARCHS = {
    "Eagle3DeepseekV2ForCausalLM": "MLA attention (Eagle3DeepseekV2ForCausalLM: DeepSeek-style "
    "q/kv LoRA projections, as in TorchSpec's Kimi K2.x drafters)",
    "LlamaForCausalLMEagle3Deep": "several decoder layers (ModelOpt's LlamaForCausalLMEagle3Deep)",
}
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")
# eagle_config keys only ModelOpt (and configs copied from it) write
MODELOPT_KEYS = (
    "use_input_layernorm_in_first_layer",
    "use_last_layernorm",
    "use_mtp_layernorm",
    "parallel_draft_step",
)
# eagle_config settings llama.cpp's eagle3 graph cannot honour: key -> (bad value test, reason)
EAGLE_CONFIG_LIMITS = {
    "use_aux_hidden_state": (
        lambda v: v is False,
        "an EAGLE-1 style drafter (eagle_config.use_aux_hidden_state: false): it reads one "
        "target state, not three taps",
    ),
    "use_last_layernorm": (
        lambda v: v is False,
        "a drafter without a final norm before its head (eagle_config.use_last_layernorm: "
        "false); llama.cpp's eagle3 graph always applies one",
    ),
    "use_input_layernorm_in_first_layer": (
        lambda v: v is False,
        "a drafter without hidden_norm (eagle_config.use_input_layernorm_in_first_layer: "
        "false); llama.cpp's eagle3 graph always applies one",
    ),
    "use_mtp_layernorm": (
        lambda v: bool(v),
        "MTP-style embedding and hidden norms (eagle_config.use_mtp_layernorm: true)",
    ),
    "parallel_draft_step": (
        lambda v: isinstance(v, int) and v > 1,
        "parallel drafting (eagle_config.parallel_draft_step > 1); llama.cpp drafts one "
        "token per step",
    ),
}

# the decoder layer's tensor prefixes; vLLM and llama.cpp accept both under any architecture
LAYER_PREFIXES = ("midlayer.", "layers.0.")

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
# tensors handled apart from the table: folded, converted, or dropped (t2d: llama.cpp's
# converter drops it too, and TorchSpec leaves it all ones)
SPECIAL = ("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight", "d2t", "t2d")
# features llama.cpp's eagle3 graph cannot run: tensor-name fragment -> what to tell the user
UNSUPPORTED_TENSORS = {
    "q_norm": "qwen3-style q/k norms (self_attn.q_norm)",
    "k_norm": "qwen3-style q/k norms (self_attn.k_norm)",
    "kv_a_proj": "MLA attention (DeepSeek-style kv_a_proj, as in the Kimi K2.6 drafter)",
    "q_a_proj": "MLA attention (DeepSeek-style q_a_proj)",
    "parallel_draft_heads": "parallel drafting heads (ModelOpt's parallel_draft_heads)",
    "mask_hidden": "parallel drafting (P-EAGLE's mask_hidden)",
    "weight_scale": "a quantized checkpoint (weight_scale tensors); convert an unquantized one",
    "input_scale": "a quantized checkpoint (input_scale tensors); convert an unquantized one",
}
# config keys that name such features. use_qk_norm is not one: AngelSlim copies it from a
# Hunyuan target into Llama drafters that have no q/k norms (their tensors would say so).
UNSUPPORTED_CONFIG = {
    "kv_lora_rank": "MLA attention (kv_lora_rank)",
    "q_lora_rank": "MLA attention (q_lora_rank)",
    "quantization_config": "a quantized checkpoint (quantization_config); convert an "
    "unquantized one",
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
    absent: tuple[str, ...] = ()  # flags the config does not set (their values are defaults)
    notes: list[str] = field(default_factory=list)  # what the user should know
    attention_window: int | None = None  # rows per training window (localspec train records it)


def _archs(cfg: dict[str, Any]) -> list[str]:
    archs = cfg.get("architectures") or []
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def _eagle_config(cfg: dict[str, Any]) -> dict[str, Any]:
    eagle = cfg.get("eagle_config")
    return eagle if isinstance(eagle, dict) else {}


def detect_family(cfg: dict[str, Any]) -> Family:
    archs = _archs(cfg)
    for arch in archs:
        if arch in REFUSED_ARCHS:
            raise CheckpointError(f"llama.cpp's eagle3 graph cannot run {REFUSED_ARCHS[arch]}")
    kind = cfg.get("speculators_model_type")
    if kind is not None and kind != "eagle3":
        raise CheckpointError(f"a speculators '{kind}' drafter is not an EAGLE-3 drafter")
    if kind == "eagle3" or any(a in SPECULATORS_ARCHS for a in archs):
        return SPECULATORS
    if "_torchspec_version" in cfg:
        return TORCHSPEC
    if "LlamaForCausalLMEagle3" in archs:
        if any(k in _eagle_config(cfg) for k in MODELOPT_KEYS):
            return MODELOPT
        meta = cfg.get("localspec")
        if isinstance(meta, dict) and meta.get("trained_by") == "localspec train":
            return LOCALSPEC
        return SPECFORGE
    if "Eagle3LlamaForCausalLM" in archs:
        return ANGELSLIM
    if "LlamaForCausalLM" in archs and "draft_vocab_size" in cfg:
        return EAGLE
    raise CheckpointError(
        f"unknown drafter architecture {archs or '(none)'}: expected an EAGLE-3 reference "
        "(LlamaForCausalLM with draft_vocab_size), LlamaForCausalLMEagle3 (SpecForge, "
        "TorchSpec, ModelOpt), Eagle3LlamaForCausalLM (AngelSlim) or Eagle3Speculator "
        "(speculators) checkpoint"
    )


def _training_window(cfg: dict[str, Any]) -> int | None:
    """The rows per window `localspec train` trained over (older runs did not record it)."""
    window = cfg["localspec"].get("window")
    if window is None:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window < 2**31:
        raise CheckpointError(
            f"the localspec record's window must be an integer from 1 to 2^31 - 1: {window!r}"
        )
    return window


def _tap_ids(cfg: dict[str, Any], layer: dict[str, Any], family: Family) -> list[int] | None:
    if family is LOCALSPEC:  # the trainer records the layer inputs it tapped
        ids = cfg["localspec"].get("taps_layer_inputs")
        if isinstance(ids, list) and len(ids) == 3:
            return [int(t) - 1 for t in ids]  # in the family's (output) numbering
    key = "eagle_aux_hidden_state_layer_ids"
    taps = cfg.get(key) or _eagle_config(cfg).get(key) or layer.get(key)
    if not taps:  # absent, null or [] (ModelOpt's "choose the default")
        return None
    if not isinstance(taps, list) or len(taps) != 3 or not all(isinstance(t, int) for t in taps):
        raise CheckpointError(f"{key} must list 3 integers: {taps}")
    return list(taps)


def parse_config(cfg: dict[str, Any]) -> DrafterConfig:
    family = detect_family(cfg)
    layer = cfg.get("transformer_layer_config") if family is SPECULATORS else cfg
    if not isinstance(layer, dict):
        raise CheckpointError("config.json lacks transformer_layer_config")
    eagle = _eagle_config(cfg)
    for key, what in UNSUPPORTED_CONFIG.items():
        if layer.get(key) or cfg.get(key):
            raise CheckpointError(f"llama.cpp's eagle3 graph cannot run {what}")
    for key, (bad, what) in EAGLE_CONFIG_LIMITS.items():
        if key in eagle and bad(eagle[key]):
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
    scaling = layer.get("rope_scaling") or layer.get("rope_parameters") or None
    kind = (scaling.get("rope_type") or scaling.get("type")) if scaling else None
    if kind not in (None, "default", "llama3"):
        raise CheckpointError(f"rope_scaling type '{kind}' is not supported (default, llama3)")
    flags, absent = {}, []
    for f in FLAGS:
        v = next((src[f] for src in (cfg, eagle, layer) if f in src), None)
        if v is None:
            absent.append(f)
            v = family.defaults.get(f, False)
        flags[f] = bool(v)
    if flags["fc_norm"] and flags["norm_before_fc"]:
        raise CheckpointError("config sets both fc_norm and norm_before_fc; a drafter has one")
    target_hidden = cfg.get("target_hidden_size") or layer.get("target_hidden_size")
    dc = DrafterConfig(
        family=family,
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        n_head=n_head,
        n_head_kv=int(layer.get("num_key_value_heads", n_head)),
        rms_eps=float(layer.get("rms_norm_eps", 1e-6)),
        # absent means 10000 (Hugging Face's LlamaConfig default), also when the target uses
        # another base: the EAGLE reference's Llama-3.1-8B drafter trained that way
        # transformers 5 (speculators 0.9) nests it in rope_parameters
        rope_theta=float(
            layer.get("rope_theta")
            or (layer.get("rope_parameters") or {}).get("rope_theta")
            or 10000.0
        ),
        context_length=int(layer.get("max_position_embeddings", 4096)),
        vocab_size=layer.get("vocab_size"),
        draft_vocab_size=cfg.get("draft_vocab_size") or layer.get("draft_vocab_size"),
        target_hidden_size=int(target_hidden) if target_hidden else None,
        tap_ids=_tap_ids(cfg, layer, family),
        flags=flags,
        rope_scaling=scaling if kind == "llama3" else None,
        absent=tuple(absent),
        attention_window=_training_window(cfg) if family is LOCALSPEC else None,
    )
    if family.ignores_target_hidden and target_hidden:
        dc.notes.append(
            f"{family.writers} builds fc as [H, 3H] whatever target_hidden_size says "
            f"({target_hidden}); the fc tensor's width decides"
        )
        dc.target_hidden_size = None
    return dc


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


# --- readings: what a config can mean ----------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One way to read a config: tap ids in llama.cpp's "input of layer" numbering, the flags
    to write, and in words why."""

    taps: tuple[int, int, int]
    flags: tuple[tuple[str, bool], ...]
    why: str

    @property
    def flag_dict(self) -> dict[str, bool]:
        return dict(self.flags)


FLAG_WORDS = {
    ("norm_output", True): "norm_output as EAGLE-3.1's post-norm feedback",
    ("norm_output", False): "norm_output as SpecForge before PR #879 did: norm before the head "
    "only (plain EAGLE-3)",
    ("norm_before_residual", False): "norm_before_residual false (speculators' default)",
    ("norm_before_residual", True): "norm_before_residual true (vLLM's reading of a missing key)",
}


def _tap_readings(dc: DrafterConfig, n_layer: int) -> list[tuple[list[int], str]]:
    ids, fam = dc.tap_ids, dc.family
    if ids is None:
        return [([2, n_layer // 2, n_layer - 3], f"default for a {n_layer}-layer target")]
    as_inputs = (list(ids), f"ids {ids} as inputs of layers")
    as_outputs = ([t + 1 for t in ids], f"ids {ids} as outputs of layers, +1")
    first, other = (as_inputs, as_outputs) if fam.taps == INPUTS else (as_outputs, as_inputs)
    return [first] if fam.taps_certain else [first, other]


def _flag_readings(dc: DrafterConfig, fixed: dict[str, bool]) -> list[list[tuple[str, bool]]]:
    """Per open flag, its candidate values in preference order."""
    out = []
    for f in FLAGS:
        if f in fixed:
            continue
        if f in dc.family.open_if_absent and f in dc.absent:
            default = dc.family.defaults.get(f, False)
            out.append([(f, default), (f, not default)])
        elif f in dc.family.old_meaning and dc.flags[f]:
            out.append([(f, True), (f, False)])
    return out


def readings(
    dc: DrafterConfig,
    n_layer: int,
    *,
    taps: list[int] | None = None,
    flags: dict[str, bool] | None = None,
) -> list[Reading]:
    """Every reading of the config worth measuring, the layout's convention first. taps and
    flags given by the user are taken as they are."""
    fixed = dict(flags or {})
    bad = [f for f in fixed if f not in SETTABLE_FLAGS]
    if bad:
        raise CheckpointError(f"flags {bad} cannot be set; settable: {', '.join(SETTABLE_FLAGS)}")
    tap_opts = [(list(taps), "given with --taps")] if taps else _tap_readings(dc, n_layer)
    valid = [(t, why) for t, why in tap_opts if len(t) == 3 and all(0 <= x < n_layer for x in t)]
    for t, why in tap_opts:
        if (t, why) not in valid and valid:
            dc.notes.append(f"not a reading here: {why} gives {t}, outside 0..{n_layer - 1}")
    if not valid:
        t, why = tap_opts[0]
        if taps:
            raise CheckpointError(
                f"taps {t} must be 3 layer ids in 0..{n_layer - 1} for this target"
            )
        if dc.tap_ids is None:
            raise CheckpointError(f"the default taps {t} do not fit a {n_layer}-layer target")
        tried = "; ".join(f"{w}: {t}" for t, w in tap_opts)
        raise CheckpointError(
            f"the config's tap ids fit no reading for a {n_layer}-layer target ({tried}); "
            f"llama.cpp taps layer inputs 0..{n_layer - 1} (an id of {n_layer} would be the "
            "final hidden state): pass --taps"
        )
    base = {**dc.flags, **fixed}
    out = []
    for (t, twhy), combo in itertools.product(valid, itertools.product(*_flag_readings(dc, fixed))):
        fl = {**base, **dict(combo)}
        words = [FLAG_WORDS[c] for c in combo]
        why = "; ".join([twhy, *words])
        out.append(Reading((t[0], t[1], t[2]), tuple(fl.items()), why))
    return out


def canonical_name(name: str, family: Family | None = None) -> str:
    """Source tensor name with an optional "model." and the layer prefix normalised to "L."."""
    if name.startswith("model."):
        name = name[len("model.") :]
    for prefix in LAYER_PREFIXES:
        if name.startswith(prefix):
            return "L." + name[len(prefix) :]
    return name
