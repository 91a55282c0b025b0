"""Tiny reproductions of published drafter checkpoints, one per layout: the config keys, tensor
names, dtypes (fp16/bf16 weights, int64 d2t, bool t2d) and file kinds (pytorch_model.bin, sharded
.bin, single and sharded safetensors) their tools write, at the tests' tiny scale.

Nothing here was downloaded (no hub access): each recipe is made from the public code or config
named in its comment. Weights are the random GGUF-layout tensors of tinymodels, mapped back by
hfcheckpoints.hf_tensors, so a correct conversion reproduces them up to the dtype's rounding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helpers import tinymodels as tm
from helpers.hfcheckpoints import hf_tensors

TARGET_LAYERS = 8  # the layout tests' target: hidden 64, 8 layers, RoPE base 500000
TARGET_ROPE = 500000.0


def _llama(ds: tm.DrafterShape, dtype: str, **extra: Any) -> dict[str, Any]:
    """The LlamaConfig keys the drafters' configs carry (shapes at tiny scale)."""
    return {
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": ds.n_embd,
        "initializer_range": 0.02,
        "intermediate_size": ds.n_ff,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": ds.n_head,
        "num_key_value_heads": ds.n_head_kv,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": tm.N_VOCAB,
        **extra,
    }


@dataclass
class Published:
    """How a tool writes a drafter: its config, layer prefix, dtype, files, dropped tensors."""

    config: Callable[[tm.DrafterShape], dict[str, Any]]
    prefix: str = "midlayer."
    dtype: str = "float16"
    files: str = "safetensors"  # bin | bin-sharded | safetensors | safetensors-sharded
    drop: tuple[str, ...] = ("embed_tokens.weight",)  # tensors the tool does not save
    t2d_all_ones: bool = False  # TorchSpec initialises t2d to ones
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata


LAYOUTS: dict[str, Published] = {
    # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: the EAGLE reference's eagle/traineagle3/config.json
    # (no rope_theta: RoPE at 10000 whatever the target uses), pytorch_model.bin in fp16,
    # no embed_tokens (the 850 MB file), d2t/t2d
    "eagle-llama31": Published(
        lambda ds: {
            "architectures": ["LlamaForCausalLM"],
            **_llama(ds, "float16"),
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
        },
        files="bin",
    ),
    # an EAGLE reference drafter with its own embed_tokens (llama.cpp's loader names
    # Llama 3.3 70B's), shards of pytorch_model.bin with an index
    "eagle-own-embeddings": Published(
        lambda ds: {
            "architectures": ["LlamaForCausalLM"],
            **_llama(ds, "float16", rope_theta=TARGET_ROPE),
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
        },
        files="bin-sharded",
        drop=(),
    ),
    # SpecForge's configs/llama3-8B-eagle3.json: LlamaForCausalLMEagle3, no tap ids, no flags;
    # safetensors without embed_tokens (SpecForge >= 0.1.1)
    "specforge-llama31": Published(
        lambda ds: {
            "architectures": ["LlamaForCausalLMEagle3"],
            **_llama(ds, "float16"),
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
        },
    ),
    # SpecForge's configs/qwen3-30B-A3B-eagle3.1.json: fc_norm and norm_output true (whose
    # meaning changed with SpecForge's PR #879), bf16
    "specforge-eagle31": Published(
        lambda ds: {
            "architectures": ["LlamaForCausalLMEagle3"],
            **_llama(ds, "bfloat16", head_dim=ds.n_embd // ds.n_head, rope_theta=1000000.0),
            "attention_bias": False,
            "fc_norm": True,
            "norm_output": True,
            "rope_scaling": None,
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
        },
        dtype="bfloat16",
    ),
    # TorchSpec's tools/convert_to_hf.py --export-for-vllm: midlayer.* renamed layers.0.*,
    # tap ids moved by +1, _torchspec_version in the config and the safetensors header,
    # t2d left all ones; sharded here
    "torchspec-vllm-export": Published(
        lambda ds: {
            "architectures": ["LlamaForCausalLMEagle3"],
            **_llama(ds, "bfloat16", head_dim=ds.n_embd // ds.n_head, rope_theta=TARGET_ROPE),
            "fc_norm": True,
            "norm_output": True,
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 5, 6]},
            "_torchspec_version": "0.1.0",
        },
        prefix="layers.0.",
        dtype="bfloat16",
        files="safetensors-sharded",
        t2d_all_ones=True,
        metadata={"torchspec_version": "0.1.0"},
    ),
    # AngelSlim's train/configs/qwen3-8b-eagle3.json: Eagle3LlamaForCausalLM, target_model_type,
    # pytorch_model.bin in bf16, fc built as Linear(3 * hidden, hidden)
    "angelslim-qwen3": Published(
        lambda ds: {
            "architectures": ["Eagle3LlamaForCausalLM"],
            **_llama(ds, "bfloat16", head_dim=ds.n_embd // ds.n_head, rope_theta=1000000),
            "target_model_type": "qwen3",
            "attention_bias": False,
            "max_window_layers": 36,
            "rope_scaling": None,
            "sliding_window": None,
            "use_sliding_window": False,
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
        },
        dtype="bfloat16",
        files="bin",
    ),
    # AngelSlim's hunyuan-7b-eagle3.json copies the Hunyuan target's keys, use_qk_norm among
    # them, into a Llama drafter without q/k norms; a target_hidden_size that fc ignores
    "angelslim-hunyuan": Published(
        lambda ds: {
            "architectures": ["Eagle3LlamaForCausalLM"],
            **_llama(ds, "bfloat16", rope_theta=10000.0, tie_word_embeddings=True),
            "target_model_type": "hunyuan_v1_dense",
            "attention_head_dim": ds.n_embd // ds.n_head,
            "norm_type": "rms",
            "use_qk_norm": True,
            "use_cla": False,
            "target_hidden_size": 2 * ds.n_embd,
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
        },
        dtype="bfloat16",
        files="bin",
    ),
    # vllm-project/speculators: Eagle3Speculator with transformer_layer_config,
    # speculators_config, auto_map; layers.0.* and the drafter's embed_tokens; explicit
    # norm_before_residual
    "speculators-llama31": Published(
        lambda ds: {
            "architectures": ["Eagle3Speculator"],
            "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"},
            "speculators_model_type": "eagle3",
            "speculators_version": "0.2.0",
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": 3,
                        "accept_tolerance": 0.0,
                        "verifier_accept_k": 1,
                    }
                ],
                "verifier": {
                    "name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
                    "architectures": ["LlamaForCausalLM"],
                },
            },
            "transformer_layer_config": {
                **_llama(ds, "bfloat16", rope_theta=TARGET_ROPE),
                "architectures": ["LlamaForCausalLM"],
            },
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
            "norm_before_residual": True,
            "target_hidden_size": None,
            "torch_dtype": "bfloat16",
        },
        prefix="layers.0.",
        dtype="bfloat16",
        drop=(),
    ),
    # the gpt-oss style EAGLE-3 "v3" drafters as SGLang's PR #32334 and llama.cpp's converter
    # describe them: norm_before_fc with input_norm.weight, tap ids given (speculators layout)
    "speculators-norm-before-fc": Published(
        lambda ds: {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {**_llama(ds, "bfloat16", rope_theta=150000.0)},
            "draft_vocab_size": ds.draft_vocab or tm.N_VOCAB,
            "norm_before_residual": False,
            "norm_before_fc": True,
            "eagle_aux_hidden_state_layer_ids": [1, 4, 6],
        },
        prefix="layers.0.",
        dtype="bfloat16",
    ),
    # NVIDIA ModelOpt's export (modelopt/torch/export/plugins/hf_spec_configs.py and
    # hf_spec_export.py): LlamaForCausalLMEagle3 with its eagle_config keys and the default ids
    # [1, N/2-1, N-4]; layers.0.*; no embed_tokens; the base model's full-vocabulary lm_head,
    # no d2t/t2d
    "modelopt-llama31": Published(
        lambda ds: {
            "architectures": ["LlamaForCausalLMEagle3"],
            **_llama(ds, "bfloat16", rope_theta=TARGET_ROPE, head_dim=ds.n_embd // ds.n_head),
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "pretraining_tp": 1,
            "rope_scaling": None,
            "draft_vocab_size": tm.N_VOCAB,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
                "use_aux_hidden_state": True,
                "use_input_layernorm_in_first_layer": True,
                "use_last_layernorm": True,
                "use_mtp_layernorm": False,
                "next_layer_regular": True,
                "parallel_draft_step": 1,
                "parallel_draft_heads_num_layers": 1,
            },
        },
        prefix="layers.0.",
        dtype="bfloat16",
    ),
}

# TorchSpec's configs/draft_models/kimi_k25_eagle3_mla.json (shapes cut down)
KIMI_MLA_CONFIG = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": tm.N_VOCAB,
    "draft_vocab_size": tm.N_VOCAB,
    "torch_dtype": "bfloat16",
    "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "use_mtp_layernorm": False,
    },
}


def shape_for(name: str) -> tm.DrafterShape:
    """The drafter each recipe carries (flags as its config says, a draft vocabulary where the
    tool writes d2t)."""
    if name == "modelopt-llama31":
        return tm.DrafterShape()
    if name in ("specforge-eagle31", "torchspec-vllm-export"):
        return tm.DrafterShape(fc_norm=True, norm_output=True, draft_vocab=96)
    if name == "speculators-llama31":
        return tm.DrafterShape(norm_before_residual=True, own_embeddings=True, draft_vocab=96)
    if name == "speculators-norm-before-fc":
        return tm.DrafterShape(norm_before_fc=True, draft_vocab=96)
    if name == "eagle-own-embeddings":
        return tm.DrafterShape(own_embeddings=True, draft_vocab=96)
    return tm.DrafterShape(draft_vocab=96)


def gguf_tensors(name: str, seed: int = 11) -> dict[str, np.ndarray]:
    """The GGUF-layout tensors the recipe's checkpoint is made from (and converts back to)."""
    ds = shape_for(name)
    gg = tm.drafter_tensors(ds, 64, seed=seed)
    if name == "modelopt-llama31":  # the base model's lm_head, full vocabulary, no d2t
        rng = np.random.default_rng(seed + 1)
        gg["output.weight"] = (rng.standard_normal((tm.N_VOCAB, ds.n_embd)) / 2).astype(np.float32)
    return gg


def write_published(folder: str, name: str, gg: dict[str, np.ndarray] | None = None) -> str:
    import torch
    from safetensors.torch import save_file

    recipe = LAYOUTS[name]
    ds = shape_for(name)
    gg = gg if gg is not None else gguf_tensors(name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(recipe.config(ds), fh, indent=2)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[recipe.dtype]
    tensors = {}
    for k, v in hf_tensors(gg, ds, "any", prefix=recipe.prefix).items():
        if k in recipe.drop:
            continue
        if k == "t2d" and recipe.t2d_all_ones:
            v = torch.ones_like(v)
        tensors[k] = v.to(dtype) if v.is_floating_point() else v
    names = sorted(tensors)
    if recipe.files == "bin":
        torch.save(tensors, os.path.join(folder, "pytorch_model.bin"))
        return folder
    if recipe.files == "safetensors":
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata=recipe.metadata)
        return folder
    weight_map = {}
    is_bin = recipe.files == "bin-sharded"
    for s in range(2):
        part = {n: tensors[n] for n in names[s::2]}
        if is_bin:
            fname = f"pytorch_model-{s + 1:05d}-of-00002.bin"
            torch.save(part, os.path.join(folder, fname))
        else:
            fname = f"model-{s + 1:05d}-of-00002.safetensors"
            save_file(part, os.path.join(folder, fname), metadata=recipe.metadata)
        weight_map.update({n: fname for n in part})
    index = "pytorch_model.bin.index.json" if is_bin else "model.safetensors.index.json"
    with open(os.path.join(folder, index), "w") as fh:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, fh)
    return folder


def rounded(gg: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """gg as the recipe's dtype stores it (what a correct conversion gives back)."""
    import torch

    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[LAYOUTS[name].dtype]
    return {
        k: (torch.from_numpy(v).to(dtype).float().numpy() if v.dtype == np.float32 else v)
        for k, v in gg.items()
    }
