"""Write an ``eagle3`` GGUF exactly as llama.cpp 0.3.36 loads it (plus localspec's keys).

Tensors come in GGUF naming and numpy layout (a linear layer is [out, in]); q/k weights must
already be in llama.cpp's RoPE layout. The tokenizer is copied from the target GGUF, so the
pair shares one vocabulary. The file is written next to its destination and renamed into place
only when complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from localspec import native as N
from localspec.errors import ModelFileError
from localspec.files import gguf_keys as K
from localspec.runtime.target import vocab_fingerprint


@dataclass
class Eagle3Config:
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    rms_eps: float
    rope_theta: float
    context_length: int
    target_layers: tuple[int, int, int]
    target_hidden: int
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    fc_norm_eps: float | None = None
    norm_output: bool = False
    attention_window: int | None = None  # rows per training window, when known


@dataclass
class TargetRecord:
    """What a drafter records about its target, read from the target GGUF."""

    header: N.GGUFHeader
    architecture: str
    block_count: int
    embedding_length: int
    vocab_size: int
    vocab_fingerprint: str


def target_record(target_path: str) -> TargetRecord:
    h = N.GGUFHeader(target_path, max_str_array=1 << 30)
    tokens = h.kv.get(gguf.Keys.Tokenizer.LIST)
    if not isinstance(tokens, list):
        raise ModelFileError(f"{target_path} has no tokenizer.ggml.tokens")
    # the trunk's layers, as llama.cpp counts them (llama_model_n_layer): MTP (nextn) blocks
    # after the trunk are in the header's block_count too
    nextn = h.arch_key("nextn_predict_layers")
    return TargetRecord(
        header=h,
        architecture=h.architecture or "",
        block_count=int(h.arch_key("block_count") or 0) - (nextn if isinstance(nextn, int) else 0),
        embedding_length=int(h.arch_key("embedding_length") or 0),
        vocab_size=len(tokens),
        vocab_fingerprint=vocab_fingerprint([t.encode("utf-8") for t in tokens]),
    )


def _copy_tokenizer(w: gguf.GGUFWriter, h: N.GGUFHeader) -> None:
    for key, (vtype, sub) in h.kv_types.items():
        if not key.startswith("tokenizer."):
            continue
        value = h.kv[key]
        if sub is not None:
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(sub))
        else:
            w.add_key_value(key, value, gguf.GGUFValueType(vtype))


def write_eagle3_gguf(
    path: str,
    cfg: Eagle3Config,
    tensors: Mapping[str, Any],
    target_path: str,
    *,
    name: str = "eagle3 drafter",
    localspec_keys: bool = True,
) -> None:
    """localspec_keys=False writes only what llama.cpp's own converter writes (plain EAGLE-3,
    no recorded target), as used to check that such files load."""
    rec = target_record(target_path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".localspec-", suffix=".gguf.part", dir=folder)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, K.EAGLE3_ARCH)
        w.add_name(name)
        w.add_context_length(cfg.context_length)
        w.add_embedding_length(cfg.n_embd)
        w.add_block_count(1)
        w.add_feed_forward_length(cfg.n_ff)
        w.add_head_count(cfg.n_head)
        w.add_head_count_kv(cfg.n_head_kv)
        w.add_layer_norm_rms_eps(cfg.rms_eps)
        w.add_rope_freq_base(cfg.rope_theta)
        w.add_rope_dimension_count(cfg.n_embd // cfg.n_head)
        w.add_vocab_size(rec.vocab_size)
        w.add_array(K.TARGET_LAYERS, [int(x) for x in cfg.target_layers])
        w.add_uint32(K.TARGET_HIDDEN_SIZE, cfg.target_hidden)
        w.add_bool(K.NORM_BEFORE_FC, cfg.norm_before_fc)
        w.add_bool(K.NORM_BEFORE_RESIDUAL, cfg.norm_before_residual)
        if localspec_keys:
            eps = cfg.fc_norm_eps if cfg.fc_norm_eps is not None else cfg.rms_eps
            w.add_uint32(K.FORMAT_VERSION, 1)
            w.add_bool(K.FC_NORM, cfg.fc_norm)
            w.add_float32(K.FC_NORM_EPS, eps)
            w.add_bool(K.NORM_OUTPUT, cfg.norm_output)
            if cfg.attention_window is not None:
                w.add_uint32(K.ATTENTION_WINDOW, cfg.attention_window)
            w.add_string(K.TARGET_ARCH, rec.architecture)
            w.add_uint32(K.TARGET_BLOCK_COUNT, rec.block_count)
            w.add_uint32(K.TARGET_EMBEDDING_LENGTH, rec.embedding_length)
            w.add_uint32(K.TARGET_VOCAB_SIZE, rec.vocab_size)
            w.add_string(K.TARGET_VOCAB_FINGERPRINT, rec.vocab_fingerprint)
        _copy_tokenizer(w, rec.header)
        for tname, arr in tensors.items():
            if isinstance(arr, tuple):  # (packed bytes, ggml type) from gguf.quants
                w.add_tensor(tname, arr[0], raw_dtype=arr[1])
            else:
                w.add_tensor(tname, np.ascontiguousarray(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def set_reading(path: str, taps: tuple[int, int, int], flags: Mapping[str, bool]) -> None:
    """Rewrite, in place, the keys that differ between readings of one checkpoint (the tap ids,
    norm_before_residual, norm_output): same sizes, so the tensors are not touched."""
    r = gguf.GGUFReader(path, "r+")
    try:
        layers = r.fields[K.TARGET_LAYERS]
        if len(layers.data) != 3:
            raise ModelFileError(f"{path} has {len(layers.data)} target layers, not 3")
        for i, t in zip(layers.data, taps, strict=True):
            layers.parts[i][0] = t
        for key, name in ((K.NORM_BEFORE_RESIDUAL, "norm_before_residual"),
                          (K.NORM_OUTPUT, "norm_output")):  # fmt: skip
            if name in flags:
                r.fields[key].parts[r.fields[key].data[0]][0] = bool(flags[name])
        r.data.flush()
    finally:
        del r
