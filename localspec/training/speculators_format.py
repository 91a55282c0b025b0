"""The trained drafter in vLLM's speculators layout (speculators 0.9), for serving the same
drafter with vLLM or SGLang once a user outgrows one machine.

Written as speculators' own `save_pretrained` writes an `Eagle3DraftModel`: a flat config with
`speculators_model_type: eagle3`, the decoder layer's settings nested in
`transformer_layer_config`, and `layers.0.*` weights. Tap ids are layer inputs, as vLLM
captures them (`aux_hidden_state_layers`). The target's token embeddings are included, so the
checkpoint loads whole without the verifier's weights.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .files import draft_vocab_maps, write_checkpoint

SPECULATORS_DIR = "speculators"
SPECULATORS_VERSION = "0.9.0"


# the Hugging Face class of a verifier, by its GGUF architecture
HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def speculators_config(
    c: Any,
    taps: tuple[int, ...],
    verifier: str | None,
    draft_steps: int,
    architecture: str = "llama",
) -> dict[str, Any]:
    """config.json for a drafter of DraftConfig `c` tapping the inputs of layers `taps`."""
    layer = {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "head_dim": c.hidden_size // c.n_head,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": c.rms_eps,
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": [int(t) for t in taps],
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": bool(c.fc_norm),
        "norm_output": bool(c.norm_output),
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "dtype": "float32",
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(draft_steps),
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            # the Hugging Face model the GGUF target was made from: vLLM serves that one
            "verifier": {
                "name_or_path": verifier,
                "architectures": [HF_ARCHITECTURES[architecture]]
                if architecture in HF_ARCHITECTURES
                else [],
            },
        },
    }


def speculators_tensors(model: Any, draft_ids: np.ndarray) -> dict[str, Any]:
    """Our parameter names (SpecForge's `midlayer.*`) as speculators names them."""
    out = {}
    for name, value in model.state_dict().items():
        key = "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name
        out[key] = value.detach().float().cpu().contiguous()
    out["embed_tokens.weight"] = model.embed.detach().float().cpu().contiguous()
    out.update(draft_vocab_maps(draft_ids, model.c.vocab_size))
    return out


def export_speculators(
    model: Any,
    folder: str,
    taps: tuple[int, ...],
    draft_ids: np.ndarray,
    *,
    verifier: str | None,
    draft_steps: int,
    architecture: str = "llama",
) -> str:
    """Write folder/speculators (config.json, model.safetensors), replacing it whole. A
    verifier given as a local folder is recorded by its absolute path."""
    if verifier and os.path.isdir(verifier):
        verifier = os.path.abspath(verifier)
    return write_checkpoint(
        os.path.join(folder, SPECULATORS_DIR),
        speculators_tensors(model, draft_ids),
        speculators_config(model.c, taps, verifier, draft_steps, architecture),
    )
