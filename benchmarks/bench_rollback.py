"""What cutting a hybrid target's recurrent state back costs, in one run: the same model in two
llama.cpp contexts, one keeping n_rs_seq per-token snapshots of the recurrent state (as
localspec runs a hybrid target that drafts) and one keeping none (plain decoding elsewhere).

Per context, interleaved rounds: a one-token decode (a plain step) and a verify decode of
k+1 tokens (a draft of k) after a 128-token context, each timed alone after an untimed reset,
and with snapshots the cut of the last k/2 tokens (one `seq_rm`) that a half-rejected draft
costs. Medians and the ratios with/without snapshots.

    python benchmarks/bench_rollback.py [-t 2] [--rounds 7] [--target FILE.gguf ...]
Without --target it writes tiny qwen35 and lfm2 targets of a few layers (random weights: the
costs of the state, not of a real model's size).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from localspec import native as N  # noqa: E402
from localspec.native.gguf_header import GGUFHeader  # noqa: E402
from localspec.runtime.rollback import plan_rollback, size_text  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402

CONTEXT = 128
DRAFTS = (4, 8, 16)


def run(path: str, threads: int, rounds: int, reps: int) -> None:
    h = GGUFHeader(path)
    arch = h.architecture or "?"
    model = N.NativeModel(path, n_gpu_layers=0)
    plan = plan_rollback(
        arch, h.arch_key, n_embd=model.n_embd, n_batch=256, weights_bytes=model.size_bytes
    )
    rs = max(DRAFTS)  # the snapshots the longest draft here needs
    ctxs = {
        n: N.NativeContext(model, n_ctx=1024, n_batch=256, n_threads=threads, n_rs_seq=n)
        for n in (0, rs)
    }
    batch = N.Batch(256)
    tok = [(7 + 13 * i) % (model.n_vocab - 8) for i in range(CONTEXT + max(DRAFTS) + 1)]

    def decode(ctx: N.NativeContext, tokens: list[int], pos0: int) -> None:
        batch.token[: len(tokens)] = tokens
        batch.set(len(tokens), pos0, all_logits=True)
        ctx.decode(batch, "bench")

    def reset(ctx: N.NativeContext) -> None:
        ctx.clear()
        decode(ctx, tok[:CONTEXT], 0)

    sizes = [1, *(k + 1 for k in DRAFTS)]
    times: dict[tuple[int, int], list[float]] = {(n, s): [] for n in ctxs for s in sizes}
    cuts: dict[int, list[float]] = {k: [] for k in DRAFTS}
    for ctx in ctxs.values():
        reset(ctx)
        decode(ctx, tok[CONTEXT : CONTEXT + 8], CONTEXT)  # warm up
    for _ in range(rounds):
        for n, ctx in ctxs.items():
            for s in sizes:
                best = float("inf")
                for _ in range(reps):
                    reset(ctx)
                    t0 = time.perf_counter()
                    decode(ctx, tok[CONTEXT : CONTEXT + s], CONTEXT)
                    best = min(best, time.perf_counter() - t0)
                times[(n, s)].append(best)
                if n and s > 1:
                    k = s - 1
                    t0 = time.perf_counter()
                    ctx.seq_rm(CONTEXT + s - k // 2)  # a draft half rejected
                    cuts[k].append(time.perf_counter() - t0)
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"== {os.path.basename(path)} ({arch}): {model.n_layer} layers, hidden {model.n_embd}")
    print(
        f"   snapshots: {plan.row_bytes and size_text(plan.row_bytes)} each; localspec keeps "
        f"{plan.n_rs_seq} at n_batch 256 ({size_text(plan.memory)}){'; ' if plan.lowered else ''}"
        f"{plan.lowered}"
    )
    print(f"   {'rows':>5} | {'no snapshots':>13} | {f'n_rs_seq {rs}':>13} | ratio | cut k/2")
    for s in sizes:
        a, b = med[(0, s)], med[(rs, s)]
        cut = f"{statistics.median(cuts[s - 1]) * 1e6:7.1f} us" if s > 1 else ""
        print(f"   {s:5d} | {a * 1e3:10.3f} ms | {b * 1e3:10.3f} ms | {b / a:5.3f} | {cut}")
    for ctx in ctxs.values():
        ctx.close()
    model.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3, help="decodes per size per round (best)")
    ap.add_argument("--target", action="append", default=[])
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"{args.rounds} rounds, best of {args.reps} per round, medians")  # fmt: skip
    paths = list(args.target)
    with tempfile.TemporaryDirectory() as d:
        if not paths:
            paths = [
                tm.write_qwen35_target(os.path.join(d, "qwen35.gguf"), n_embd=256, n_layer=8),
                tm.write_lfm2_target(os.path.join(d, "lfm2.gguf"), n_embd=256, n_layer=8),
            ]
        for p in paths:
            run(p, args.threads, args.rounds, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
