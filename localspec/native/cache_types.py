"""The KV cache types llama.cpp takes, by the names the options and flags use: read without
loading libllama (options.py checks kv_type with them)."""

from __future__ import annotations

import gguf

_Q = gguf.GGMLQuantizationType
# name -> ggml type of the K and V caches (llama_context_params.type_k / type_v)
GGML_CACHE_TYPE = {"f32": _Q.F32, "f16": _Q.F16, "bf16": _Q.BF16, "q8_0": _Q.Q8_0, "q4_0": _Q.Q4_0}
KV_TYPES = tuple(GGML_CACHE_TYPE)
QUANTIZED_KV = ("q8_0", "q4_0")  # the K and V caches take the same type
