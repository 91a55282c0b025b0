"""Mutated GGUF targets and drafters never kill the process.

Each mutated file is loaded in a subprocess (an abort would take the test runner with it):
``localspec.load(target, draft=...)`` and one short completion. Every run must end in a normal
completion or exactly one localspec error (exit code 1, one line, no traceback), never in a
signal. Where the outcome is known, the error class and the key it names are checked too: the
values llama.cpp (0.3.36) would abort on are refused by localspec/native/header_checks.py before
llama.cpp sees the file.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from localspec import errors as localspec_errors

from helpers import gguf_edit as ge
from helpers import tinymodels as tm
from helpers.gguf_edit import ARR, BOOL, F32, I32, STR, U32

# load, complete a few tokens; a localspec error becomes one line on stderr and exit code 1
RUNNER = r"""
import sys
import localspec
target, draft, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    with localspec.load(
        target, draft=False if draft == "-" else draft, n_ctx=n_ctx, n_batch=64,
        n_threads=1, n_draft=2,
    ) as eng:
        eng.complete("hello there", max_tokens=3)
except localspec.LocalspecError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
print("OK")
"""

BIG = 2**32 - 1  # -1 as an unsigned 32-bit value
MFE, UME, PME = "ModelFileError", "UnsupportedModelError", "PairMismatchError"
ANY = None  # any clean outcome: a normal run or one localspec error
LOCALSPEC_ERRORS = {
    name
    for name, cls in vars(localspec_errors).items()
    if isinstance(cls, type) and issubclass(cls, localspec_errors.LocalspecError)
}

Edit = Callable[[ge.GGUF], object]


@dataclass(frozen=True)
class Raw:
    """A change to the file's bytes: fn(data, header length) -> new data."""

    fn: Callable[[bytes, int], bytes]


@dataclass
class Case:
    id: str
    base: str  # a key of the bases fixture
    change: Edit | Raw | None  # to the parsed file, or to its bytes
    outcome: str | None  # "OK", an error class name, or ANY
    text: str = ""  # what the error message must contain
    n_ctx: int = 256


def _set(key: str, value: object, type_: int | None = None) -> Edit:
    return lambda g: g.set(key, value, type_)


def _drop(key: str) -> Edit:
    return lambda g: g.drop(key)


def _tokens(fn: Callable[[list], list]) -> Edit:
    def edit(g: ge.GGUF) -> None:
        kv = g.kv("tokenizer.ggml.tokens")
        kv.value = (kv.value[0], fn(list(kv.value[1])))

    return edit


def _token_type(index: int, value: int) -> Edit:
    def edit(g: ge.GGUF) -> None:
        kv = g.kv("tokenizer.ggml.token_type")
        types = list(kv.value[1])
        types[index] = value
        kv.value = (kv.value[0], types)

    return edit


def _tensor(tensor: str, **fields: object) -> Edit:
    """Set fields of a tensor's entry (name, dims, ggml_type, offset); a callable field value
    maps the old value to the new one."""

    def edit(g: ge.GGUF) -> None:
        t = g.tensor(tensor)
        for k, v in fields.items():
            setattr(t, k, v(getattr(t, k)) if callable(v) else v)

    return edit


def _d2t(index: int, value: int) -> Edit:
    """Set one d2t id in the data section (the header stays as it is)."""

    def edit(g: ge.GGUF) -> None:
        t = g.tensor("d2t")
        at = t.offset + 8 * (index % t.dims[0])
        g.data = g.data[:at] + struct.pack("<q", value) + g.data[at + 8 :]

    return edit


def _all(*edits: Edit) -> Edit:
    return lambda g: [e(g) for e in edits]


def _flips(seed: int) -> Raw:
    """1 to 3 random bit flips inside the header (metadata and tensor table)."""

    def fn(data: bytes, header: int) -> bytes:
        rng = random.Random(seed)
        out = bytearray(data)
        for _ in range(1 + seed % 3):
            out[rng.randrange(header)] ^= 1 << rng.randrange(8)
        return bytes(out)

    return Raw(fn)


def _word(seed: int) -> Raw:
    """One 32-bit word of the header overwritten with a boundary value."""

    def fn(data: bytes, header: int) -> bytes:
        rng = random.Random(seed)
        at = rng.randrange(header - 4)
        word = rng.choice([0, 1, 2**31, BIG, 513])
        return data[:at] + struct.pack("<I", word) + data[at + 4 :]

    return Raw(fn)


def _cut(back: int) -> Raw:
    return Raw(lambda data, header: data[: header - back])


def _cases(base: str, rows: list[tuple]) -> list[Case]:
    return [Case(f"{base}-{row[0]}", base, *row[1:]) for row in rows]


def _target_rows(a: str) -> list[tuple]:
    """Mutations every tiny target takes (a: its architecture, the key prefix)."""
    ns = f"{a}.attention.layer_norm_rms_epsilon"
    rows = [
        ("unchanged", None, "OK"),
        ("block_count-0", _set(f"{a}.block_count", 0), MFE, f"{a}.block_count is 0"),
        ("block_count-513", _set(f"{a}.block_count", 513), MFE, "block_count is 513"),
        ("block_count-u32max", _set(f"{a}.block_count", BIG), MFE, f"is {BIG}"),
        ("block_count-i32", _set(f"{a}.block_count", -1, I32), MFE, "block_count"),
        ("nextn", _set(f"{a}.nextn_predict_layers", 99, U32), MFE, "nextn_predict_layers"),
        (
            "experts-9-of-8",
            _all(_set(f"{a}.expert_count", 8, U32), _set(f"{a}.expert_used_count", 9, U32)),
            MFE,
            "expert_used_count",
        ),
        ("experts-used-only", _set(f"{a}.expert_used_count", 2, U32), MFE, "expert_used_count"),
        ("experts-2000", _set(f"{a}.expert_count", 2000, U32), MFE, "expert_count is 2000"),
        ("expert-groups", _set(f"{a}.expert_group_count", 2, U32), MFE, "expert_group_count"),
        (
            "rope-scaling-bogus",
            _set(f"{a}.rope.scaling.type", "bogus", STR),
            MFE,
            "rope.scaling.type",
        ),
        ("rope-scaling-yarn", _set(f"{a}.rope.scaling.type", "yarn", STR), "OK"),
        ("eps-negative", _set(ns, -1.0), MFE, "layer_norm_rms_epsilon is -1.0"),
        ("eps-nan", _set(ns, float("nan")), MFE, "epsilon is nan"),
        ("heads-0", _set(f"{a}.attention.head_count", 0), MFE),
        ("heads-3", _set(f"{a}.attention.head_count", 3), MFE),
        ("kv-heads-0", _set(f"{a}.attention.head_count_kv", 0), MFE, "head_count_kv is 0"),
        ("heads-array-long", _set(f"{a}.attention.head_count", (U32, [4] * 9), ARR), MFE),
        ("kv-heads-array-zero", _set(f"{a}.attention.head_count_kv", (U32, [0] * 6), ARR), MFE),
        ("ffn-array-short", _set(f"{a}.feed_forward_length", (U32, [128]), ARR), MFE),
        ("embd-0", _set(f"{a}.embedding_length", 0), MFE),
        ("embd-63", _set(f"{a}.embedding_length", 63), MFE),
        ("ctx-0", _set(f"{a}.context_length", 0), "OK"),
        # n_ctx=0 takes the GGUF's context_length: an absurd one falls back to 4096
        ("ctx-huge-as-default", _set(f"{a}.context_length", BIG), "OK", "", 0),
        (
            "rope-dims-0",
            _set(f"{a}.rope.dimension_count", 0, U32),
            MFE,
            "rope.dimension_count is 0",
        ),
        ("rope-dims-odd", _set(f"{a}.rope.dimension_count", 15, U32), MFE, "rope.dimension_count"),
        ("rope-dims-wide", _set(f"{a}.rope.dimension_count", 64, U32), MFE, "rope.dimension_count"),
        ("vocab-size-0", _set(f"{a}.vocab_size", 0), "OK"),
        (
            "token-repeated",
            _tokens(lambda t: [*t[:5], t[6], *t[6:]]),
            MFE,
            "token 6 repeats token 5",
        ),
        ("token-nul", _tokens(lambda t: ["a\0b", *t[1:]]), MFE, "tokenizer.ggml.tokens"),
        ("token-empty-named", _tokens(lambda t: ["", "[EMPTY_0]", *t[2:]]), MFE, "repeats"),
        ("token-dropped", _tokens(lambda t: t[:-1]), MFE),
        ("no-vocab", _set("tokenizer.ggml.model", "no_vocab"), UME, "no vocabulary"),
        (
            "wordpiece-byte-token",
            _all(_set("tokenizer.ggml.model", "bert"), _token_type(5, 6)),
            MFE,
            "token 5",
        ),
        ("spm-without-bytes", _set("tokenizer.ggml.model", "llama"), MFE, "byte tokens"),
        (
            "t5-adds-missing-bos",
            _all(
                _set("tokenizer.ggml.model", "t5"),
                _set("tokenizer.ggml.add_bos_token", True),
                _drop("tokenizer.ggml.bos_token_id"),
            ),
            MFE,
            "bos_token_id",
        ),
        ("bos-out-of-range", _set("tokenizer.ggml.bos_token_id", 100_000), "OK"),
        ("eos-negative", _set("tokenizer.ggml.eos_token_id", -5, I32), MFE, "eos_token_id"),
        (
            "norm-i32",
            _tensor("output_norm.weight", ggml_type=26),
            MFE,
            "output_norm.weight is 'I32'",
        ),
        ("matrix-i32", _tensor("blk.1.ffn_up.weight", ggml_type=26), MFE, "I32"),
        ("embd-i32", _tensor("token_embd.weight", ggml_type=26), MFE, "token_embd"),
        ("type-f16", _tensor("blk.0.ffn_down.weight", ggml_type=1), MFE),
        ("type-invalid", _tensor("blk.0.attn_k.weight", ggml_type=99), MFE),
        ("dim-0", _tensor("blk.0.attn_q.weight", dims=lambda d: [0, *d[1:]]), MFE),
        ("dims-swapped", _tensor("blk.2.ffn_gate.weight", dims=lambda d: d[::-1]), MFE),
        ("dim-huge", _tensor("output_norm.weight", dims=[2**40]), MFE),
        ("offset-odd", _tensor("blk.1.attn_v.weight", offset=lambda o: o + 1), MFE),
        ("offset-far", _tensor("blk.1.attn_v.weight", offset=2**62), MFE),
        ("tensor-renamed", _tensor("blk.3.attn_norm.weight", name="blk.9.attn_norm.weight"), MFE),
        ("cut-in-tensor-table", _cut(40), MFE),
        ("cut-in-metadata", Raw(lambda data, header: data[: header // 2]), MFE),
    ]
    return rows


def _llama_cases() -> list[Case]:
    rows = _target_rows("llama")
    # per-layer kv heads whose last layer differs from layer 0's (its tensors are 2 heads wide)
    kv = "llama.attention.head_count_kv"
    rows += [
        ("kv-heads-last-4", _set(kv, (U32, [2, 2, 2, 4]), ARR), MFE, "blk.3.attn_k.weight"),
        ("kv-heads-last-1", _set(kv, (U32, [2, 2, 2, 1]), ARR), MFE, "blk.3.attn_k.weight"),
    ]
    rows += [(f"flips-{i}", _flips(i), ANY) for i in range(10)]
    rows += [(f"word-{i}", _word(100 + i), ANY) for i in range(3)]
    return _cases("llama", rows)


def _qwen2_cases() -> list[Case]:
    a = "qwen2"
    return _cases(
        a,
        [
            ("unchanged", None, "OK"),
            (
                "rope-dims-8",
                _set(f"{a}.rope.dimension_count", 8, U32),
                MFE,
                "rope.dimension_count is 8",
            ),
            ("key-length-32", _set(f"{a}.attention.key_length", 32, U32), MFE, "qwen2.attention"),
            ("value-length-32", _set(f"{a}.attention.value_length", 32, U32), MFE),
            ("block_count-u32max", _set(f"{a}.block_count", BIG), MFE, "qwen2.block_count"),
            (
                "eps-nan",
                _set(f"{a}.attention.layer_norm_rms_epsilon", float("nan")),
                MFE,
                "epsilon",
            ),
            ("bias-i32", _tensor("blk.0.attn_v.bias", ggml_type=26), MFE, "I32"),
            ("token-repeated", _tokens(lambda t: [*t[:-1], t[-2]]), MFE, "repeats"),
            ("no-vocab", _set("tokenizer.ggml.model", "none"), UME, "no vocabulary"),
        ],
    )


def _gemma3_cases() -> list[Case]:
    a = "gemma3"
    pattern = f"{a}.attention.sliding_window_pattern"
    return _cases(
        a,
        [
            ("unchanged", None, "OK"),
            ("swa-pattern-1", _set(pattern, 1), MFE, "sliding_window_pattern is 1"),
            (
                "swa-pattern-none",
                _set(pattern, (BOOL, [False] * 6), ARR),
                MFE,
                "sliding_window_pattern",
            ),
            ("swa-pattern-all", _set(pattern, 0), "OK"),
            (
                "rope-dims-0",
                _set(f"{a}.rope.dimension_count", 0, U32),
                MFE,
                "rope.dimension_count is 0",
            ),
            ("rope-dims-wide", _set(f"{a}.rope.dimension_count", 64, U32), MFE, "is 64"),
            ("rope-dims-8", _set(f"{a}.rope.dimension_count", 8, U32), "OK"),
            (
                "swa-rope-dims-0",
                _set(f"{a}.rope.dimension_count_swa", 0, U32),
                MFE,
                "dimension_count_swa",
            ),
            ("key-length-16", _set(f"{a}.attention.key_length", 16), MFE),
            (
                "eps-nan",
                _set(f"{a}.attention.layer_norm_rms_epsilon", float("nan")),
                MFE,
                "epsilon",
            ),
            ("block_count-0", _set(f"{a}.block_count", 0), MFE, "gemma3.block_count"),
            ("norm-i32", _tensor("blk.2.attn_k_norm.weight", ggml_type=26), MFE, "I32"),
        ],
    )


def _drafter_cases() -> list[Case]:
    a, taps = "eagle3", "eagle3.target_layers"
    rows = [
        ("unchanged", None, "OK"),
        ("block_count-0", _set(f"{a}.block_count", 0), MFE, "eagle3.block_count is 0"),
        ("block_count-2", _set(f"{a}.block_count", 2), MFE, "eagle3.block_count is 2"),
        ("block_count-u32max", _set(f"{a}.block_count", BIG), MFE, "eagle3.block_count"),
        ("nextn", _set(f"{a}.nextn_predict_layers", 2, U32), MFE, "nextn_predict_layers"),
        ("rope-dims-0", _set(f"{a}.rope.dimension_count", 0), MFE, "rope.dimension_count is 0"),
        ("rope-dims-32", _set(f"{a}.rope.dimension_count", 32), MFE, "rope.dimension_count"),
        ("rope-scaling-empty", _set(f"{a}.rope.scaling.type", "", STR), MFE, "rope.scaling.type"),
        ("eps-negative", _set(f"{a}.attention.layer_norm_rms_epsilon", -1.0), MFE, "epsilon"),
        ("experts", _set(f"{a}.expert_count", 2000, U32), MFE, "expert_count"),
        ("kv-heads-3", _set(f"{a}.attention.head_count_kv", 3), MFE, "head_count_kv is 3"),
        ("key-length-32", _set(f"{a}.attention.key_length", 32, U32), MFE),
        # its q matrix is sized for the old width: the file contradicts itself before pairing
        ("embd-128", _set(f"{a}.embedding_length", 128), MFE, "blk.0.attn_q.weight"),
        ("taps-out-of-range", _set(taps, (I32, [1, 2, 99]), ARR), PME, "layer 99"),
        ("taps-negative", _set(taps, (I32, [-1, 2, 3]), ARR), PME, "layer -1"),
        ("taps-two", _set(taps, (I32, [1, 2]), ARR), MFE, "exactly 3"),
        ("taps-float", _set(taps, (F32, [1.0, 2.0, 3.0]), ARR), MFE),
        ("taps-strings", _set(taps, (STR, ["1", "2", "3"]), ARR), MFE, "target_layers"),
        ("target-hidden-0", _set("eagle3.target_hidden_size", 0), PME, "hidden size 0"),
        ("fc-norm-eps-text", _set("localspec.eagle3.fc_norm_eps", "x", STR), MFE, "fc_norm_eps"),
        ("fc-norm-eps-nan", _set("localspec.eagle3.fc_norm_eps", float("nan")), MFE, "fc_norm_eps"),
        ("fc-norm-text", _set("localspec.eagle3.fc_norm", "yes", STR), MFE, "fc_norm"),
        ("record-blocks-text", _set("localspec.target.block_count", "x", STR), MFE, "block_count"),
        ("record-vocab", _set("localspec.target.vocab_size", 7), PME, "vocabulary size 7"),
        ("token-repeated", _tokens(lambda t: [*t[:5], t[6], *t[6:]]), MFE, "repeats"),
        ("norm-i32", _tensor("blk.0.attn_norm_2.weight", ggml_type=26), MFE, "I32"),
        ("fc-i32", _tensor("fc.weight", ggml_type=26), MFE, "fc.weight"),
        ("cut-in-tensor-table", _cut(24), MFE),
    ]
    rows += [(f"flips-{i}", _flips(1000 + i), ANY) for i in range(10)]
    rows += [(f"word-{i}", _word(2000 + i), ANY) for i in range(3)]
    d2t = [
        ("unchanged", None, "OK"),
        ("id-too-big", _d2t(-1, tm.N_VOCAB), MFE, f"d2t is {tm.N_VOCAB}"),
        ("id-negative", _d2t(3, -1), MFE, "d2t is -1"),
        ("i32", _tensor("d2t", ggml_type=26), MFE, "d2t"),
        ("f32", _tensor("d2t", ggml_type=0), MFE, "d2t"),
    ]
    own = [
        ("unchanged", None, "OK"),
        ("token-embd-rows", _tensor("token_embd.weight", dims=[64, 200]), MFE, "token_embd"),
        ("rope-freqs-f16", _tensor("rope_freqs.weight", ggml_type=1), MFE, "rope_freqs"),
    ]
    bare = [  # written by llama.cpp's converter: no record of its target
        ("unchanged", None, "OK"),
        ("no-vocab", _set("tokenizer.ggml.model", "none"), UME, "no vocabulary"),
        (
            "wordpiece-byte-token",
            _all(_set("tokenizer.ggml.model", "bert"), _token_type(5, 6)),
            MFE,
            "byte token",
        ),
    ]
    return [
        *_cases("draft", rows),
        *_cases("draft_d2t", d2t),
        *_cases("draft_own", own),
        *_cases("draft_bare", bare),
    ]


def _hybrid_cases() -> list[Case]:
    """The recurrent hyperparameters of the hybrids that draft (qwen35 with its MTP block,
    lfm2, nemotron_h): state sizes, the conv kernel, group counts, head counts, the attention
    interval, the per-layer kinds, the MTP count."""
    q = "qwen35"
    rows = [("unchanged", None, "OK")]
    for key, values in (
        ("ssm.conv_kernel", (0, 1, 2, BIG)),
        ("ssm.state_size", (0, 3, 32, BIG)),
        ("ssm.group_count", (0, 3, 4, BIG)),
        ("ssm.time_step_rank", (0, 3, 8, BIG)),
        ("ssm.inner_size", (0, 63, 128, BIG)),
        ("full_attention_interval", (0, 1, 2, 5, BIG)),
        ("nextn_predict_layers", (0, 2, 5, 6, BIG)),
    ):
        rows += [(f"{key}-{v}", _set(f"{q}.{key}", v, U32), ANY) for v in values]
    # what llama.cpp aborts on (SIGFPE, a graph shape assert): refused first
    rows += [
        ("interval-zero", _set(f"{q}.full_attention_interval", 0, U32), MFE, "interval is 0"),
        ("inner-63", _set(f"{q}.ssm.inner_size", 63, U32), MFE, "16 x 4 = 64"),
        ("inner-128", _set(f"{q}.ssm.inner_size", 128, U32), MFE, "ssm.inner_size is 128"),
    ]
    rows.append(
        ("rope-sections-short", _set(f"{q}.rope.dimension_sections", (I32, [2, 1]), ARR), ANY)
    )
    lf = "lfm2"
    lrows = [("unchanged", None, "OK")]
    lrows += [
        (f"l_cache-{v}", _set(f"{lf}.shortconv.l_cache", v, U32), ANY) for v in (0, 1, 2, 5, BIG)
    ]
    lrows += [
        ("kv-all-conv", _set(f"{lf}.attention.head_count_kv", (I32, [0, 0, 0, 0]), ARR), ANY),
        ("kv-all-attn", _set(f"{lf}.attention.head_count_kv", (I32, [2, 2, 2, 2]), ARR), ANY),
        ("kv-short", _set(f"{lf}.attention.head_count_kv", (I32, [0, 0]), ARR), ANY),
        ("kv-scalar", _set(f"{lf}.attention.head_count_kv", 2, U32), ANY),
    ]
    nh = "nemotron_h"
    nrows = [("unchanged", None, "OK")]
    for key, values in (
        ("ssm.conv_kernel", (0, 1, 2, BIG)),
        ("ssm.state_size", (0, 3, 32, BIG)),
        ("ssm.group_count", (0, 3, 4, BIG)),
        ("ssm.time_step_rank", (0, 3, 16, BIG)),
        ("ssm.inner_size", (0, 63, 256, BIG)),
    ):
        nrows += [(f"{key}-{v}", _set(f"{nh}.{key}", v, U32), ANY) for v in values]
    nrows += [
        ("kv-all-mamba", _set(f"{nh}.attention.head_count_kv", (I32, [0, 0, 0, 0]), ARR), ANY),
        ("kv-short", _set(f"{nh}.attention.head_count_kv", (I32, [0, 2]), ARR), ANY),
        ("ff-all-mlp", _set(f"{nh}.feed_forward_length", (I32, [128] * 4), ARR), ANY),
        ("ff-short", _set(f"{nh}.feed_forward_length", (I32, [0, 0]), ARR), ANY),
    ]
    return [*_cases("qwen35_mtp", rows), *_cases("lfm2", lrows), *_cases("nemotron_h", nrows)]


CASES = [
    *_llama_cases(),
    *_qwen2_cases(),
    *_gemma3_cases(),
    *_drafter_cases(),
    *_hybrid_cases(),
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("fuzz-bases")
    t = tm.write_target(str(d / "llama.gguf"))
    return {
        "llama": t,
        "qwen2": tm.write_qwen2_target(str(d / "qwen2.gguf")),
        "gemma3": tm.write_gemma3_target(str(d / "gemma3.gguf")),
        "qwen35_mtp": tm.write_qwen35_target(str(d / "qwen35.gguf"), mtp=True),
        "lfm2": tm.write_lfm2_target(str(d / "lfm2.gguf")),
        "nemotron_h": tm.write_nemotron_h_target(str(d / "nemotron_h.gguf")),
        "draft": tm.write_drafter(str(d / "draft.gguf"), t),
        "draft_d2t": tm.write_drafter(str(d / "d2t.gguf"), t, tm.DrafterShape(draft_vocab=64)),
        "draft_own": tm.write_drafter(
            str(d / "own.gguf"), t, tm.DrafterShape(own_embeddings=True, llama3_rope=True)
        ),
        "draft_bare": tm.write_drafter(str(d / "bare.gguf"), t, localspec_keys=False),
    }


def _write(case: Case, bases: dict[str, str], folder: Path) -> tuple[str, str]:
    """The (target, drafter) pair to load for a case: its mutated file in its role, the
    unchanged llama target or drafter in the other (a qwen2/gemma3 target runs alone)."""
    g = ge.read(bases[case.base])
    if case.change is not None and not isinstance(case.change, Raw):
        case.change(g)
    data = ge.to_bytes(g)
    if isinstance(case.change, Raw):
        data = case.change.fn(data, len(ge.header_bytes(g)))
    path = folder / f"{case.id}.gguf"
    path.write_bytes(data)
    if case.base.startswith("draft"):
        return bases["llama"], str(path)
    return str(path), bases["draft"] if case.base == "llama" else "-"


def _run(target: str, draft: str, n_ctx: int) -> subprocess.CompletedProcess[str] | None:
    """The finished run, or None when it hung (RoPE over zero dimensions once did)."""
    # GGML_NO_BACKTRACE: an abort (a test failure) is reported at once, without gdb
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    try:
        return subprocess.run(
            [sys.executable, "-c", RUNNER, target, draft, str(n_ctx)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None


def _problem(case: Case, run: subprocess.CompletedProcess[str] | None) -> str | None:
    """What is wrong with a run's outcome, or None."""
    if run is None:
        return "did not finish in 60 s"
    err = run.stderr.strip()
    if run.returncode < 0:
        return f"killed by signal {-run.returncode}: {err[-300:]}"
    if run.returncode == 0:
        outcome, message = "OK", ""
    elif run.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err:
        outcome, _, message = err.partition(": ")
        if outcome not in LOCALSPEC_ERRORS:
            return f"not one localspec error: {err[-300:]}"
        if outcome in (MFE, UME, PME) and "/" not in message:  # errors about files name them
            return f"the message names no file: {err}"
    else:
        return f"exit code {run.returncode}: {err[-300:]}"
    if case.outcome is not ANY and (outcome != case.outcome or case.text not in message):
        want = f"{case.outcome} mentioning {case.text!r}"
        return f"expected {want}, got {outcome}: {message[:300]}"
    return None


def test_cases_are_many_and_named_once() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 100


def test_mutated_headers_never_abort(bases: dict[str, str], tmp_path: Path) -> None:
    files = [(c, *_write(c, bases, tmp_path)) for c in CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda f: _run(f[1], f[2], f[0].n_ctx), files))
    problems = [
        f"{c.id}: {p}" for (c, *_), r in zip(files, runs, strict=True) if (p := _problem(c, r))
    ]
    assert not problems, f"{len(problems)} of {len(CASES)} mutated files:\n" + "\n".join(problems)
