"""Refuse GGUF header values that would abort llama.cpp, before llama.cpp sees the file.

llama.cpp (0.3.36) reports most bad files as a load error, but a few values reach a
``GGML_ASSERT`` (SIGABRT), an integer division by zero (SIGFPE) or a C++ exception thrown
through its C API (std::terminate), any of which kills Python. Each check below names the spot
in ``vendor/llama.cpp`` it stands in front of. The rules are llama.cpp's own, so every file
llama.cpp can run passes; values llama.cpp merely rejects are left to its own error message.

``check_header`` is called wherever a GGUF is loaded natively (targets, drafters, llama.cpp's
quantizer): one job, validating a parsed ``GGUFHeader`` against llama.cpp's limits.
"""

from __future__ import annotations

import os
from typing import Any, Literal, NoReturn

import gguf
import numpy as np

from .. import native as N
from ..errors import ModelFileError, UnsupportedModelError
from ..files import gguf_keys as K

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES

_Q = gguf.GGMLQuantizationType
GGML_F32, GGML_I64 = _Q.F32, _Q.I64
GGML_NVFP4 = 40  # GGMLQuantizationType.NVFP4, which gguf < 0.19 (allowed by pyproject) lacks
# ggml types no weight may have: ggml computes with float and quantized weights only (I64 is
# d2t's own type, which nothing else may use)
_NON_WEIGHT_TYPES = frozenset({_Q.I8, _Q.I16, _Q.I32, _Q.I64, _Q.F64})

# Architectures whose attention this module knows rule by rule (their graphs in
# src/models/*.cpp); other architectures get the checks common to every model.
_ATTENTION_ARCHS = frozenset({"llama", "qwen2", "qwen3", "gemma3", "eagle3"})
# hybrids whose layers alternate by full_attention_interval (a modulo in their load_hparams)
_INTERVAL_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next", "qwen4exp", "minimax-01"})
# ... of which these size the gated delta net's tensors by state_size x time_step_rank and its
# graph by inner_size (head_v_dim = inner_size / time_step_rank)
_DELTA_NET_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next"})
# graphs that assert n_embd_head_v == n_embd_head_k (== n_rot where listed)
_HEAD_V_IS_K = frozenset({"llama", "qwen2", "qwen3", "eagle3"})
_HEAD_IS_ROT = frozenset({"llama", "qwen2", "qwen3"})

_NO_VOCAB = ("none", "no_vocab")
# llama-vocab.cpp load(): default special ids per tokenizer model (None: LLAMA_TOKEN_NULL)
_DEFAULT_IDS: dict[str, dict[str, int | None]] = {
    "llama": {"bos": 1, "eos": 2, "sep": None},
    "bert": {"bos": 101, "eos": None, "sep": 102},
    "gpt2": {"bos": 11, "eos": 11, "sep": None},
    "hybriddna": {"bos": 11, "eos": 11, "sep": None},
    "whitespace": {"bos": 11, "eos": 11, "sep": None},
    "t5": {"bos": None, "eos": 1, "sep": None},
    "gemma4": {"bos": None, "eos": None, "sep": None},
}
_ID_KEYS = {
    "bos": gguf.Keys.Tokenizer.BOS_ID,
    "eos": gguf.Keys.Tokenizer.EOS_ID,
    "sep": gguf.Keys.Tokenizer.SEP_ID,  # "seperator", as llama-arch.cpp spells it
}
_ADD_KEYS = {"bos": gguf.Keys.Tokenizer.ADD_BOS, "eos": gguf.Keys.Tokenizer.ADD_EOS}

Role = Literal["target", "drafter", "model"]


def check_header(h: N.GGUFHeader, role: Role = "model") -> None:
    """Raise ModelFileError (or UnsupportedModelError) for any header value that would make
    llama.cpp abort the process while loading the model, creating its context or running it.
    role: "target" also refuses an EAGLE-3 drafter and requires what generating text needs (a
    vocabulary that tokenizes any text); "drafter" adds the eagle3 drafter's own tensors."""
    _Checker(h, role).run()


def typed(h: N.GGUFHeader, key: str, kind: type, default: Any = None) -> Any:
    """A metadata value that must have this Python type (int, float, bool or str; a float key
    accepts integers): the default when the key is absent, ModelFileError when it has another
    type. For readers of our own keys, which llama.cpp never checks."""
    if key not in h.kv:
        return default
    value = h.kv[key]
    is_bool = isinstance(value, bool)
    if kind is float and isinstance(value, int) and not is_bool:
        return float(value)
    if not isinstance(value, kind) or (kind is int and is_bool):
        raise ModelFileError(f"{h.path}: {key} is {value!r}; it must be {_KIND_NAMES[kind]}")
    return value


_KIND_NAMES = {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}


def drafter_as_target_message(h: N.GGUFHeader) -> str:
    """What to say when an EAGLE-3 drafter is given where a target belongs (llama.cpp would
    only fail to create its context): what the file is, the target it records (by name, as
    `localspec convert` writes it, and by shape), the target found next to it, and how to pass
    the two."""
    kv = h.kv
    arch = kv.get(K.TARGET_ARCH)
    recorded = []
    name = kv.get(gguf.Keys.General.NAME)
    if isinstance(name, str) and " for " in name:  # "EAGLE drafter (family) for X.gguf"
        recorded.append(f"for {name.rsplit(' for ', 1)[1]}")
    if arch:
        recorded.append(
            f"for a '{arch}' target with {kv.get(K.TARGET_BLOCK_COUNT)} layers, hidden size "
            f"{kv.get(K.TARGET_EMBEDDING_LENGTH)} and {kv.get(K.TARGET_VOCAB_SIZE)} tokens"
        )
    made_for = (
        f"It was made {', '.join(recorded)}."
        if recorded
        else "It does not record which target it was made for."
    )
    target = "TARGET.gguf"
    if h.path.endswith(".eagle3.gguf"):  # the pairing convention: NAME.gguf beside it
        sibling = h.path[: -len(".eagle3.gguf")] + ".gguf"
        if os.path.isfile(sibling):
            target = sibling
            made_for += f" Its target is probably {sibling}, next to it."
    return (
        f"{h.path} is an EAGLE-3 drafter, not a target model: a drafter only proposes tokens "
        f"for the target it was made for. {made_for} Pass that target, with this file as its "
        f"drafter: `localspec chat {target} --draft {h.path}` (or `localspec generate "
        f"{target} --draft ...`), or `localspec.load('{target}', draft='{h.path}')`."
    )


def _type_name(ggml_type: int) -> str:
    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return str(ggml_type)


class _Checker:
    def __init__(self, h: N.GGUFHeader, role: Role) -> None:
        self.h, self.role = h, role
        self.arch = h.architecture or ""

    def run(self) -> None:
        if self.role == "target" and self.arch == K.EAGLE3_ARCH:
            raise UnsupportedModelError(drafter_as_target_message(self.h))
        if not self.arch or self.arch == "clip":
            return  # llama.cpp refuses these with an error of its own, before any hparam
        n_layer = self._hparams()
        if self.arch in _ATTENTION_ARCHS:
            self._attention(n_layer)
        if self.arch in _INTERVAL_ARCHS:
            self._linear_attention()
        self._tensors()
        self._vocab()

    # --- messages and typed reads --------------------------------------------------------

    def fail(
        self, key: str, value: Any, why: str, *, kind: type[Exception] = ModelFileError
    ) -> NoReturn:
        raise kind(f"{self.h.path}: {key} is {value!r}; {why}")

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def int_of(self, key: str) -> int | None:
        """An integer scalar, else None (absent, or a type llama.cpp itself rejects)."""
        v = self.h.kv.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def per_layer(self, key: str, n_layer: int) -> list[int] | None:
        """llama.cpp's get_key_or_arr: a scalar for every layer or an array of exactly
        n_layer values; None when absent or shaped so that llama.cpp throws instead."""
        v = self.h.kv.get(key)
        if isinstance(v, list):
            ok = len(v) == n_layer and all(isinstance(x, int) for x in v)
            return [int(x) for x in v] if ok else None
        n = self.int_of(key)
        return None if n is None else [n] * n_layer

    # --- llama_model_base::load_hparams (every architecture) -------------------------------

    def _hparams(self) -> int:
        key = self.key("block_count")
        n_layer = self.int_of(key)
        if n_layer is None:
            return 0  # absent or mistyped: llama.cpp throws "key not found" / "wrong type"
        # GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)
        if not 0 < n_layer <= LLAMA_MAX_LAYERS:
            self.fail(key, n_layer, f"llama.cpp needs 1 to {LLAMA_MAX_LAYERS} layers")
        nextn = self.int_of(self.key("nextn_predict_layers")) or 0
        if nextn > n_layer:  # GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all)
            self.fail(self.key("nextn_predict_layers"), nextn, f"more than the {n_layer} layers")
        self._experts(n_layer)
        if self.arch == "wavtokenizer-dec":
            for part in ("posnet", "convnext"):  # GGML_ASSERT(posnet.n_layer <= n_layer_all)
                k = self.key(f"{part}.block_count")
                if (self.int_of(k) or 0) > n_layer:
                    self.fail(k, self.int_of(k), f"more than the {n_layer} layers")
        key = self.key("rope.scaling.type")
        scaling = self.h.kv.get(key)
        if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
            # GGML_ASSERT(hparams.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)
            self.fail(key, scaling, f"llama.cpp knows {', '.join(ROPE_SCALING_TYPES)}")
        for k, v in self.h.kv.items():
            # ggml-cpu ops.cpp: GGML_ASSERT(eps >= 0.0f) in every norm (NaN fails it too)
            eps = k.startswith(f"{self.arch}.") and "epsilon" in k and isinstance(v, float)
            if eps and not v >= 0.0:
                self.fail(k, v, "a norm's epsilon must be a number >= 0")
        return n_layer

    def _experts(self, n_layer: int) -> None:
        """The expert asserts of load_hparams, in their order."""
        n_expert = self.int_of(self.key("expert_count")) or 0
        used = self.per_layer(self.key("expert_used_count"), n_layer) or [0]
        used_max = max(used)
        groups = self.int_of(self.key("expert_group_count")) or 0
        group_used = self.int_of(self.key("expert_group_used_count")) or 0
        if self.arch in ("hunyuan_vl", "hunyuan-dense") and n_expert <= 1:
            n_expert, used_max = 0, 0  # llama.cpp turns these into dense models
        ke, ku = self.key("expert_count"), self.key("expert_used_count")
        kg, kgu = self.key("expert_group_count"), self.key("expert_group_used_count")
        if n_expert > LLAMA_MAX_EXPERTS:
            self.fail(ke, n_expert, f"llama.cpp allows at most {LLAMA_MAX_EXPERTS} experts")
        if used_max > n_expert:
            self.fail(ku, used_max, f"more experts used than the {n_expert} there are ({ke})")
        if n_expert > 0:
            if used_max == 0:
                self.fail(ku, used_max, f"a model with {n_expert} experts must use some")
            if groups >= n_expert:
                self.fail(kg, groups, f"needs fewer groups than the {n_expert} experts")
            if groups > 1:
                if n_expert % groups:
                    self.fail(kg, groups, f"must divide the {n_expert} experts evenly")
                if not 0 < group_used < groups:
                    self.fail(kgu, group_used, f"must be between 1 and {groups - 1}")
        elif groups:
            self.fail(kg, groups, f"expert groups without experts ({ke} is 0)")

    # --- hybrids (their load_hparams and graphs) -------------------------------------------

    def _linear_attention(self) -> None:
        key = self.key("full_attention_interval")
        if self.int_of(key) == 0:  # (il + 1) % full_attn_interval: SIGFPE
            self.fail(key, 0, "every full_attention_interval-th layer is attention: at least 1")
        if self.arch not in _DELTA_NET_ARCHS:
            return
        inner = self.int_of(self.key("ssm.inner_size"))
        state = self.int_of(self.key("ssm.state_size"))
        heads = self.int_of(self.key("ssm.time_step_rank"))
        if inner is None or state is None or heads is None:
            return  # llama.cpp throws "key not found" or "wrong type"
        if inner != state * heads:
            # GGML_ASSERT(a->ne[d] == b->ne[d]) in the graph: the tensors are sized by
            # state_size x time_step_rank, the state by inner_size
            self.fail(
                self.key("ssm.inner_size"),
                inner,
                f"the gated delta net needs ssm.state_size x ssm.time_step_rank ({state} x "
                f"{heads} = {state * heads})",
            )

    # --- attention of the architectures known here (their load_hparams and graphs) ----------

    def _attention(self, n_layer: int) -> None:
        if n_layer == 0:
            return
        if self.arch == "eagle3" and n_layer != 1:  # GGML_ASSERT(n_layer == 1) in its graph
            self.fail(self.key("block_count"), n_layer, "an EAGLE-3 drafter has one decoder layer")
        n_embd = self.int_of(self.key("embedding_length"))
        heads = self.per_layer(self.key("attention.head_count"), n_layer)
        if n_embd is None or heads is None:
            return  # llama.cpp throws, or finds tensor shapes that disagree
        kh, kkv = self.key("attention.head_count"), self.key("attention.head_count_kv")
        heads_kv = self.per_layer(kkv, n_layer) or heads
        for il, (nh, nkv) in enumerate(zip(heads, heads_kv, strict=True)):
            # gemma3 divides n_embd by n_head(0) (SIGFPE); a graph with zero heads, or kv heads
            # that do not divide them, fails ggml's shape asserts (ggml_mul_mat broadcasting)
            if nh <= 0:
                self.fail(kh, nh, f"layer {il} has no attention heads")
            if nkv <= 0 or nh % nkv:
                self.fail(kkv, nkv, f"must divide the {nh} attention heads of layer {il}")
        head_k = self.int_of(self.key("attention.key_length"))
        head_v = self.int_of(self.key("attention.value_length"))
        if head_k is None and n_embd < heads[0]:
            self.fail(self.key("embedding_length"), n_embd, f"leaves no room for {heads[0]} heads")
        head_k = n_embd // heads[0] if head_k is None else head_k
        head_v = n_embd // heads[0] if head_v is None else head_v
        if head_k <= 0:
            self.fail(self.key("attention.key_length"), head_k, "heads need a size")
        n_rot = self.int_of(self.key("rope.dimension_count"))
        n_rot = head_k if n_rot is None else n_rot
        if self.arch in _HEAD_V_IS_K and head_v != head_k:  # GGML_ASSERT in their graphs
            self.fail(
                self.key("attention.value_length"), head_v, f"differs from key length {head_k}"
            )
        if self.arch in _HEAD_IS_ROT and n_rot != head_k:  # GGML_ASSERT(n_embd_head == n_rot)
            self.fail(self.key("rope.dimension_count"), n_rot, f"must equal head size {head_k}")
        if self.arch == "qwen2" and head_k * heads[0] != n_embd:
            # its q and output matrices are n_embd wide; the graph reshapes them into heads
            self.fail(self.key("attention.key_length"), head_k, f"x {heads[0]} heads != {n_embd}")
        self._rope(self.key("rope.dimension_count"), n_rot, head_k)
        self._head_widths(n_layer, heads, heads_kv, head_k, head_v)
        if self.arch == "gemma3":
            self._gemma3_swa(n_layer, head_k, head_v, n_rot)

    def _head_widths(
        self, n_layer: int, heads: list[int], heads_kv: list[int], head_k: int, head_v: int
    ) -> None:
        """Each layer's q, k and v matrices must be as wide as its own head counts say: a
        per-layer head_count(_kv) array whose values differ from layer 0's loads (llama.cpp
        sizes some tensors by layer 0) and then fails ggml's shape asserts in the graph."""
        kh, kkv = self.key("attention.head_count"), self.key("attention.head_count_kv")
        for il in range(n_layer):
            for part, key, n, head in (
                ("attn_q", kh, heads[il], head_k),
                ("attn_k", kkv, heads_kv[il], head_k),
                ("attn_v", kkv, heads_kv[il], head_v),
            ):
                t = self.h.tensors.get(f"blk.{il}.{part}.weight")
                if t is not None and len(t.shape) == 2 and t.shape[1] != n * head:
                    self.fail(
                        key,
                        self.h.kv.get(key),
                        f"layer {il} has {n} heads of {head}, but blk.{il}.{part}.weight has "
                        f"{t.shape[1]} outputs",
                    )

    def _rope(self, key: str, n_rot: int, head: int) -> None:
        # ggml-cpu rope: GGML_ASSERT(n_dims <= ne0) and GGML_ASSERT(n_dims % 2 == 0); 0 hangs
        if not 0 < n_rot <= head or n_rot % 2:
            self.fail(key, n_rot, f"RoPE needs an even count of dimensions in 2..{head}")

    def _gemma3_swa(self, n_layer: int, head_k: int, head_v: int, n_rot: int) -> None:
        window = self.int_of(self.key("attention.sliding_window"))
        if not window:
            return  # no sliding-window layers
        for suffix, full in (("key_length_swa", head_k), ("value_length_swa", head_v)):
            key = self.key(f"attention.{suffix}")
            value = self.int_of(key)
            if value is not None and value != full:
                # the graph sizes every layer's heads by layer 0's
                self.fail(key, value, f"differs from the full layers' {full}")
        n_rot_swa = self.int_of(self.key("rope.dimension_count_swa"))
        self._rope(
            self.key("rope.dimension_count_swa"), n_rot if n_rot_swa is None else n_rot_swa, head_k
        )
        # create_memory: GGML_ASSERT(hparams.is_swa_any()) once a sliding window is set
        key = self.key("attention.sliding_window_pattern")
        pattern = self.h.kv.get(key)
        trunk = n_layer - (self.int_of(self.key("nextn_predict_layers")) or 0)
        if isinstance(pattern, list):
            # an array of bool/u32/i32 of at most LLAMA_MAX_LAYERS, else llama.cpp throws
            V = gguf.GGUFValueType
            usable = self.h.kv_types[key][1] in (V.BOOL, V.UINT32, V.INT32)
            usable = usable and len(pattern) <= LLAMA_MAX_LAYERS
            if usable and not any(pattern[:n_layer]):
                self.fail(key, pattern, "marks no layer as sliding-window")
        elif trunk < 1 or (self.int_of(key) if key in self.h.kv else 6) == 1:
            self.fail(key, self.h.kv.get(key, 6), "leaves no sliding-window layer")

    # --- tensors -----------------------------------------------------------------------------

    def _tensors(self) -> None:
        tensors = self.h.tensors
        for name, t in tensors.items():
            if name == K.T_D2T:
                continue  # the drafter's id table, checked below
            if t.ggml_type in _NON_WEIGHT_TYPES:
                # integer weights crash ggml's CPU kernels (matmul SIGSEGV, norm SIGABRT)
                self.fail(f"tensor {name}", _type_name(t.ggml_type), "not a weight type")
            if len(t.shape) == 1 and t.ggml_type != GGML_F32:
                # vectors are norm weights, biases and RoPE factors: ggml's CPU kernels add and
                # multiply them only as F32 (binary_op aborts on "unsupported types"; rope
                # asserts F32 factors)
                self.fail(f"tensor {name}", _type_name(t.ggml_type), "a vector must be F32")
        for name, t in tensors.items():
            # NVFP4 weights: build_ffn asserts no weight has both a ".scale" and a ".bias", and
            # load_tensors that a tied (token_embd) output head has no output scale tensors
            base = name.removesuffix(".weight")
            if (
                t.ggml_type == GGML_NVFP4
                and f"{base}.scale" in tensors
                and f"{base}.bias" in tensors
            ):
                self.fail(f"tensor {base}.scale", "present", f"{name} is NVFP4 with a bias")
        emb = tensors.get(K.T_TOKEN_EMBD)
        tied_nvfp4 = K.T_OUTPUT not in tensors and emb is not None and emb.ggml_type == GGML_NVFP4
        if tied_nvfp4 and ("output.scale" in tensors or "output.input_scale" in tensors):
            self.fail("tensor output.scale", "present", "the NVFP4 output head is token_embd")
        if self.arch != K.EAGLE3_ARCH:
            return
        n_vocab = self._n_tokens()
        d2t = tensors.get(K.T_D2T)
        if d2t is not None:
            if d2t.ggml_type != GGML_I64:  # GGML_ASSERT(model.d2t->type == GGML_TYPE_I64)
                self.fail(f"tensor {K.T_D2T}", _type_name(d2t.ggml_type), "it must be I64")
            if len(d2t.shape) == 1 and n_vocab is not None:
                ids = np.fromfile(
                    self.h.path,
                    dtype="<i8",
                    count=d2t.shape[0],
                    offset=self.h.data_offset + d2t.offset,
                )
                bad_ids = ids[(ids < 0) | (ids >= n_vocab)]
                if bad_ids.size:  # ggml_set_rows: GGML_ASSERT(i1 >= 0 && i1 < ne1)
                    self.fail(
                        f"tensor {K.T_D2T}",
                        int(bad_ids[0]),
                        f"draft-to-target ids must lie in 0..{n_vocab - 1}",
                    )
        emb = tensors.get(K.T_TOKEN_EMBD)
        if emb is not None and n_vocab is not None:
            rows = emb.shape[1] if len(emb.shape) > 1 else 1
            if rows != n_vocab:  # the decoder's ggml_get_rows reads a row per target token id
                self.fail(f"tensor {K.T_TOKEN_EMBD}", rows, f"needs a row per token ({n_vocab})")

    # --- vocabulary (llama_vocab::impl::load and tokenize) -----------------------------------

    def _n_tokens(self) -> int | None:
        model = self.h.kv.get(gguf.Keys.Tokenizer.MODEL)
        if model in _NO_VOCAB:
            return self.int_of(self.key("vocab_size")) or 0  # llama.cpp's dummy tokens
        V = gguf.GGUFValueType
        if self.h.kv_types.get(gguf.Keys.Tokenizer.LIST, (0, None)) != (V.ARRAY, V.STRING):
            return None  # llama.cpp throws "cannot find tokenizer vocab" / "invalid gguf type"
        return self.h.kv_len[gguf.Keys.Tokenizer.LIST]

    def _vocab(self) -> None:
        model = self.h.kv.get(gguf.Keys.Tokenizer.MODEL)
        if not isinstance(model, str):
            return  # llama.cpp requires it and says so
        if model in _NO_VOCAB:
            # llama_tokenize and llama_vocab_get_text: GGML_ASSERT(type != LLAMA_VOCAB_TYPE_NONE)
            # (a target tokenizes prompts; a drafter's tokens are compared with its target's)
            if self.role != "model":
                self.fail(
                    gguf.Keys.Tokenizer.MODEL,
                    model,
                    "the model has no vocabulary, so its tokens cannot be read",
                    kind=UnsupportedModelError,
                )
            return
        types = self.h.kv.get(gguf.Keys.Tokenizer.TOKEN_TYPE)
        if model == "bert" and isinstance(types, list) and 6 in types:
            # the token-to-piece cache built at load calls token_to_byte for BYTE tokens,
            # which aborts for WordPiece ("fatal error")
            i = types.index(6)
            self.fail(gguf.Keys.Tokenizer.TOKEN_TYPE, 6, f"token {i} is a byte token in WordPiece")
        words = N.gguf_string_array(self.h.path, gguf.Keys.Tokenizer.LIST)
        if words is None:
            return
        # llama.cpp maps text -> id and id -> text and asserts both have one entry per token;
        # it reads C strings (cut at NUL) and names an empty token "[EMPTY_<id>]"
        seen: dict[bytes, int] = {}
        for i, raw in enumerate(words):
            w = raw or f"[EMPTY_{i}]".encode()
            if w in seen:
                shown = w.decode("utf-8", errors="replace")
                self.fail(
                    gguf.Keys.Tokenizer.LIST,
                    shown,
                    f"token {i} repeats token {seen[w]} (token ids must be unique)",
                )
            seen[w] = i
        if self.role != "target":
            return  # a drafter's vocabulary is never used to tokenize
        if model == "llama":
            # SPM falls back to byte tokens for text it cannot match: token_to_id.at() throws
            # std::out_of_range through llama_tokenize when one is missing
            for b in range(256):
                if f"<0x{b:02X}>".encode() not in seen and bytes([b]) not in seen:
                    self.fail(
                        gguf.Keys.Tokenizer.LIST,
                        f"<0x{b:02X}>",
                        "a SentencePiece vocabulary needs all 256 byte tokens <0x00>..<0xFF>",
                    )
        self._special_ids(model, len(words))

    def _special_ids(self, model: str, n_tokens: int) -> None:
        """tokenize() asserts that the BOS/EOS/SEP it adds exist: resolve each id the way
        llama.cpp does (default per tokenizer, replaced by an in-range key) and refuse a
        missing one that would be added."""
        defaults = _DEFAULT_IDS.get(model, {"bos": None, "eos": None, "sep": None})
        ids: dict[str, int | None] = {}
        for name, key in _ID_KEYS.items():
            default = defaults[name]
            ids[name] = default if default is not None and default < n_tokens else None
            value = self.int_of(key)
            if value is None or not 0 <= value < n_tokens:
                continue
            if self.h.kv_types[key][0] == gguf.GGUFValueType.UINT32:
                ids[name] = value
        # which of them tokenize() adds (and asserts): keys first, else llama.cpp's defaults,
        # where "some BPE pre-tokenizers add a BOS" counts as yes
        adds_bos = self.h.kv.get(_ADD_KEYS["bos"])
        adds_eos = self.h.kv.get(_ADD_KEYS["eos"])
        if not isinstance(adds_bos, bool):
            adds_bos = model in ("llama", "gpt2", "hybriddna", "whitespace", "gemma4")
        if not isinstance(adds_eos, bool):
            adds_eos = model == "t5"
        bpe = model in ("gpt2", "hybriddna", "whitespace", "gemma4")
        if model == "gemma4" or (bpe and self.h.kv.get(gguf.Keys.Tokenizer.PRE) == "gemma4"):
            adds_bos = True  # llama.cpp forces it for Gemma 4
        if model == "bert":  # WPM adds BOS (CLS) and SEP to every tokenized text
            need = {"bos": True, "eos": False, "sep": True}
        elif model in _DEFAULT_IDS:  # SPM, BPE and UGM add what the flags say
            need = {"bos": adds_bos, "eos": adds_eos, "sep": False}
        else:  # RWKV, PLaMo-2, test: nothing asserted
            return
        for name, needed in need.items():
            if needed and ids[name] is None:
                key = _ID_KEYS[name]
                self.fail(
                    key,
                    self.h.kv.get(key),
                    f"the tokenizer adds a {name.upper()} token but none of its "
                    f"{n_tokens} tokens is one",
                )
