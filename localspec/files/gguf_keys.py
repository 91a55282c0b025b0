"""GGUF names localspec reads and writes, kept as data (gguf-py has no EAGLE-3 constants).

llama.cpp's own ``eagle3`` keys come from ``src/llama-arch.cpp`` (0.3.36). The ``localspec.*``
keys are ours: llama.cpp ignores unknown metadata keys, so a drafter carrying them still loads
in llama.cpp (it just runs without the EAGLE-3.1 behaviour there).
"""

from __future__ import annotations

EAGLE3_ARCH = "eagle3"

# llama.cpp's keys (prefix "eagle3.")
TARGET_LAYERS = "eagle3.target_layers"  # int32[3]: "input of layer" ids of the target taps
TARGET_HIDDEN_SIZE = "eagle3.target_hidden_size"
NORM_BEFORE_RESIDUAL = "eagle3.norm_before_residual"  # residual is RMS_hid(g) instead of g
NORM_BEFORE_FC = "eagle3.norm_before_fc"  # one RMSNorm over the whole concatenation
EMBEDDING_LENGTH = "eagle3.embedding_length"
RMS_EPS = "eagle3.attention.layer_norm_rms_epsilon"

# localspec's keys, written by `localspec convert` (documented in docs/gguf-keys.md)
FORMAT_VERSION = "localspec.format_version"  # uint32, currently 1
FC_NORM = "localspec.eagle3.fc_norm"  # bool: divide each tap by its own RMS before the encoder
FC_NORM_EPS = "localspec.eagle3.fc_norm_eps"  # float32: epsilon of those per-tap norms
NORM_OUTPUT = "localspec.eagle3.norm_output"  # bool: feed back output_norm(h), not h
# uint32: the rows of the windows it was trained on; drafts attend over that many latest pairs
ATTENTION_WINDOW = "localspec.eagle3.attention_window"
TARGET_ARCH = "localspec.target.architecture"  # string: general.architecture of the target
TARGET_BLOCK_COUNT = "localspec.target.block_count"  # uint32
TARGET_EMBEDDING_LENGTH = "localspec.target.embedding_length"  # uint32
TARGET_VOCAB_SIZE = "localspec.target.vocab_size"  # uint32
TARGET_VOCAB_FINGERPRINT = "localspec.target.vocab_fingerprint"  # string: sha256 of the vocab

# tensors of an eagle3 GGUF (llama.cpp names)
T_FC = "fc.weight"
T_ENC_NORM = "enc.output_norm.weight"
T_OUTPUT_NORM = "output_norm.weight"
T_OUTPUT = "output.weight"
T_TOKEN_EMBD = "token_embd.weight"
T_D2T = "d2t"

# Architectures whose llama.cpp graph records layer inputs for the staging API (grep
# `t_layer_inp` in vendor/llama.cpp/src/models/ of llama-cpp-python 0.3.36). Asking any other
# one for staged inputs hits a GGML_ASSERT that aborts the process: those are tapped through
# the graph's eval callback instead (taps.py).
STAGING_ARCHS = frozenset(
    {
        "llama",
        "nanbeige",
        "qwen3",
        "qwen3moe",
        "gemma3n",
        "gemma4",
        "muse-glimmer",
        "deepseek4",
        "nemotron_h",
        "bailingmoe3",
        "hunyuan_vl",
        "gpt-oss",
        "lfm2",
        "minimax-01",
        "minimax-m2",
        "qwen3next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "mimo2",
    }
)

# Recurrent and hybrid (state-space) architectures (llm_arch_is_recurrent / _hybrid in
# vendor/llama.cpp/src/llama-arch.cpp, 0.3.36): their state is cut back after rejected drafts
# by snapshots or a checkpoint (runtime/rollback.py), they verify a tree's branches in a
# sequence each (one state per sequence), and drafters tap them through the graph callback.
# The loaded model's own flags (llama_model_is_recurrent / _hybrid) decide at load; this list
# lets `info` say so from the header alone.
RECURRENT_ARCHS = frozenset(
    {
        "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7",
        "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
        "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next",
        "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
    }
)  # fmt: skip
