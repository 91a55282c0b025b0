"""A hybrid target of a real model's shape with an MTP head, made on the spot (nothing to
download), and what speculation on it gains and costs (bench_gpu.py --shape qwen3.5-27b-mtp).

The target is qwen35 (gated delta nets, every 4th layer gated attention) with one nextn (MTP)
block, its matrices Q4_K and zero, so a decode costs about what the real model's does (the
tiny test tokenizer's 262 tokens stand in for its 248k: the output head, about 5% of a 27B's
weights, is left out of the cost). With zero layers the residual stream carries the token's
embedding, the head follows a permutation of short cycles (tests/helpers/tinymodels
_hybrid_embd_head), and the MTP block carries the drafted token's embedding through to the
same head: every MTP draft agrees with the target, so the figures measure the loop's overhead
at full acceptance, not a model's acceptance. Printed and returned:

1. what the snapshots cost: a one-token decode and a verify of n_rs_seq + 1 rows with and
   without them (runtime/rollback.measure_snapshot_tax, the timing auto runs at load), and
   their memory;
2. tokens/s of plain decoding, MTP chains and auto, interleaved in rotated rounds (medians),
   each reply checked against plain decoding's.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import gguf
import numpy as np

import localspec
from localspec.lowlevel import parts
from localspec.native.model import NativeModel
from localspec.runtime.rollback import measure_snapshot_tax, size_text

from helpers import tinymodels as tm

Q4_K = gguf.GGMLQuantizationType.Q4_K
Q4_K_M = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M


SHAPES = {
    # Qwen3.5-27B-like: 64 layers 5120 wide, 48 of them gated delta nets (16 k-heads, 48
    # v-heads of 128), 16 gated attention (24 heads, 4 kv heads of 256, a quarter rotary),
    # FFN 17408
    "qwen3.5-27b-mtp": tm.Qwen35Keys(
        5120, 64, 24, 4, 256, 17408, 128, 16, 48, n_ctx=8192, rotary_share=4
    ),
    "hybrid-small": tm.Qwen35Keys(  # a dry run
        512, 8, 4, 2, 128, 1024, 64, 2, 4, n_ctx=8192, rotary_share=4
    ),
}


def _zero_q4k(rows: int, cols: int) -> np.ndarray:
    """A zero Q4_K matrix [rows, cols] as its bytes (every block: scales and quants 0)."""
    block, size = gguf.GGML_QUANT_SIZES[Q4_K]
    assert cols % block == 0, f"Q4_K rows hold multiples of {block} values, not {cols}"
    return np.zeros((rows, cols // block * size), dtype=np.uint8)


def write_hybrid_shape(path: str, shape: tm.Qwen35Keys) -> str:
    """The zero-weight qwen35 target with one agreeing MTP block (see the module's text)."""
    s = shape
    rnd, _, _ = tm._rng_tensors(0)
    emb, head = tm._hybrid_embd_head(rnd, s.n_embd, 8)
    key_dim, value_dim = s.d_state * s.n_k_heads, s.d_state * s.n_v_heads
    conv_dim = 2 * key_dim + value_dim
    ones = np.ones(s.n_embd, dtype=np.float32)
    f32: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "output_norm.weight": ones,
        "output.weight": head,
    }
    q4: dict[str, tuple[int, int]] = {}

    def block(i: int, attention: bool) -> None:
        f32[f"blk.{i}.attn_norm.weight"] = ones
        f32[f"blk.{i}.post_attention_norm.weight"] = ones
        q4[f"blk.{i}.ffn_gate.weight"] = (s.n_ff, s.n_embd)
        q4[f"blk.{i}.ffn_up.weight"] = (s.n_ff, s.n_embd)
        q4[f"blk.{i}.ffn_down.weight"] = (s.n_embd, s.n_ff)
        if attention:
            q4[f"blk.{i}.attn_q.weight"] = (2 * s.n_head * s.head_dim, s.n_embd)
            q4[f"blk.{i}.attn_k.weight"] = (s.n_head_kv * s.head_dim, s.n_embd)
            q4[f"blk.{i}.attn_v.weight"] = (s.n_head_kv * s.head_dim, s.n_embd)
            q4[f"blk.{i}.attn_output.weight"] = (s.n_embd, s.n_head * s.head_dim)
            f32[f"blk.{i}.attn_q_norm.weight"] = np.ones(s.head_dim, dtype=np.float32)
            f32[f"blk.{i}.attn_k_norm.weight"] = np.ones(s.head_dim, dtype=np.float32)
            return
        q4[f"blk.{i}.attn_qkv.weight"] = (conv_dim, s.n_embd)
        q4[f"blk.{i}.attn_gate.weight"] = (value_dim, s.n_embd)
        q4[f"blk.{i}.ssm_out.weight"] = (s.n_embd, value_dim)
        f32[f"blk.{i}.ssm_conv1d.weight"] = np.zeros((conv_dim, s.d_conv), dtype=np.float32)
        f32[f"blk.{i}.ssm_dt.bias"] = np.zeros(s.n_v_heads, dtype=np.float32)
        f32[f"blk.{i}.ssm_a"] = -np.ones(s.n_v_heads, dtype=np.float32)
        f32[f"blk.{i}.ssm_beta.weight"] = np.zeros((s.n_v_heads, s.n_embd), dtype=np.float32)
        f32[f"blk.{i}.ssm_alpha.weight"] = np.zeros((s.n_v_heads, s.n_embd), dtype=np.float32)
        f32[f"blk.{i}.ssm_norm.weight"] = np.ones(s.d_state, dtype=np.float32)

    for i in range(s.n_layer):
        block(i, (i + 1) % s.interval == 0)
    i = s.n_layer  # the MTP block: attention, then the drafted token's embedding carried on
    block(i, True)
    eh = np.zeros((s.n_embd, 2 * s.n_embd), dtype=np.float16)
    eh[:, : s.n_embd] = 4.0 * np.eye(s.n_embd, dtype=np.float16)
    f32[f"blk.{i}.nextn.enorm.weight"] = ones
    f32[f"blk.{i}.nextn.hnorm.weight"] = ones
    f32[f"blk.{i}.nextn.shared_head_norm.weight"] = ones

    w = gguf.GGUFWriter(path, "qwen35")
    w.add_name("qwen3.5-like hybrid shape, zero weights, agreeing MTP head")
    tm.qwen35_keys(w, s, mtp=True)
    w.add_file_type(Q4_K_M)
    tm._add_tokenizer(w, tm.CHATML)
    for name, arr in f32.items():
        w.add_tensor(name, arr)
    w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", eh)
    for name, (rows, cols) in q4.items():
        w.add_tensor(name, _zero_q4k(rows, cols), raw_dtype=Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"n_draft": 0}),
    ("mtp chain 1", {"n_draft": 1, "draft_source": "mtp"}),
    ("mtp chain 2", {"n_draft": 2, "draft_source": "mtp"}),
    ("mtp chain 3", {"n_draft": 3, "draft_source": "mtp"}),
    ("mtp chain 4", {"n_draft": 4, "draft_source": "mtp"}),
    ("auto", {"draft_source": "mtp"}),
]
PROMPTS = ["the cat sat on the mat", "once upon a time", "a b c d e f g"]


def run(shape_name: str, *, tokens: int, rounds: int, gpu_layers: int, folder: str) -> dict:
    """Both parts of the module's text on one shape; the numbers, also printed."""
    t0 = time.perf_counter()
    path = write_hybrid_shape(os.path.join(folder, f"{shape_name}.gguf"), SHAPES[shape_name])
    made = time.perf_counter() - t0
    size = os.path.getsize(path)
    print(f"{shape_name}: {size / 2**30:.2f} GiB written in {made:.0f} s")
    report: dict = {"shape": shape_name, "file_bytes": size, "gpu_layers": gpu_layers}
    common: dict[str, Any] = {"n_gpu_layers": gpu_layers, "n_ctx": 4096, "rollback": "snapshots"}
    with localspec.load(path, draft_source="mtp", **common) as eng:
        target = parts(eng).target
        r = target.rollback
        report["snapshots"] = {"n_rs_seq": r.n_rs_seq, "row_bytes": r.row_bytes}
        print(f"snapshots: {r.n_rs_seq} of {size_text(r.row_bytes)} ({size_text(r.memory)}); "
              f"{r.lowered or 'as many as asked'}")  # fmt: skip
    model = NativeModel(path, n_gpu_layers=gpu_layers)
    try:
        rs = max(r.n_rs_seq, 1)
        tax = [measure_snapshot_tax(model, rs, n_threads=os.cpu_count() or 4, kv_type="f16",
                                    flash_attn=None) for _ in range(3)]  # fmt: skip
    finally:
        model.close()
    report["snapshot_tax"] = [{"step": t.step, "verify": t.verify, "rounds": t.rounds} for t in tax]
    for t in tax:
        print(f"  {t.text()} ({t.rounds} rounds)")
    rates: dict[str, list[float]] = {n: [] for n, _ in SETTINGS}
    same: dict[str, bool] = {n: True for n, _ in SETTINGS}
    shapes: dict[str, str] = {}
    accepted: dict[str, list[int]] = {n: [0, 0] for n, _ in SETTINGS}  # accepted, drafted
    with localspec.load(path, draft_source="mtp", **common) as eng:
        eng.complete("warm up", max_tokens=16)
        want = {p: eng.complete(p, max_tokens=tokens, n_draft=0).tokens for p in PROMPTS}
        for rnd in range(rounds):
            order = SETTINGS[rnd % len(SETTINGS) :] + SETTINGS[: rnd % len(SETTINGS)]
            for name, kw in order:
                for p in PROMPTS:
                    t1 = time.perf_counter()
                    c = eng.complete(p, max_tokens=tokens, **kw)
                    rates[name].append(len(c.tokens) / (time.perf_counter() - t1))
                    same[name] &= c.tokens == want[p]
                    shapes[name] = c.stats.shape_summary()
                    accepted[name][0] += c.stats.accepted
                    accepted[name][1] += c.stats.drafted
    base = statistics.median(rates["plain"])
    report["speeds"] = {}
    print(f"{tokens} greedy tokens, {rounds} rounds x {len(PROMPTS)} prompts (medians):")
    for name, _ in SETTINGS:
        med = statistics.median(rates[name])
        acc, drafted = accepted[name]
        report["speeds"][name] = {"tok_s": med, "x_plain": med / base, "same": same[name],
                                  "shapes": shapes[name], "accepted": acc,
                                  "drafted": drafted}  # fmt: skip
        print(f"  {name:12s} {med:9.1f} tok/s {med / base:5.2f}x plain  "
              f"{'same as plain' if same[name] else 'DIFFERS'}  accepted {acc}/{drafted}  "
              f"{shapes[name]}")  # fmt: skip
    return report
