"""Engine benchmark: plain vs speculative decoding on SmolLM2-135M-Instruct, side by side.

Prints, all measured in this one run (medians over interleaved rounds):
- tokens/s of plain decoding and of speculation at several k, with tau and the speedup ratio;
- the target's verify-cost curve t(k)/t(1) (one decode of k tokens with logits for all);
- the Python glue time per speculative step;
- what the drafter adds in memory on top of the target.

By default the target is the SmolLM2 GGUF from the package index and the drafter the one
localspec ships for it (found next to the target or in localspec/models/); --draft takes any
other. On a 2-core CPU verifying k tokens costs nearly k decodes (docs/benchmarks.md), so fixed
chains run slower than plain there whatever the drafter; tau and the glue per step are the
numbers to compare.

    python benchmarks/bench_engine.py [--target T.gguf --draft D.gguf] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import localspec
from localspec import native as N
from localspec.files.discovery import default_target
from localspec.lowlevel import parts, verify_curve

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten year old.",
    "List five tips for learning a new programming language, with one sentence each.",
]


def kv_bytes(h: N.GGUFHeader, n_ctx: int, n_layer: int) -> int:
    """K and V cache bytes at f16 for n_layer layers (GQA: n_head_kv heads)."""
    head_dim = int(h.arch_key("embedding_length")) // int(h.arch_key("attention.head_count"))
    return 2 * 2 * n_layer * n_ctx * int(h.arch_key("attention.head_count_kv")) * head_dim


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3,4,6,8")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-layers", type=int, default=0)
    args = ap.parse_args()
    ks = [int(x) for x in args.ks.split(",")]
    target = args.target or default_target()
    with localspec.load(
        target, draft=args.draft, n_threads=args.threads, n_ctx=4096, n_gpu_layers=args.gpu_layers
    ) as eng:
        print(f"target: {target}")
        print(f"drafter: {eng.drafter_note}")
        if eng.draft_path is None:
            print("no drafter: pass --draft D.gguf", file=sys.stderr)
            return 2
        print(
            f"llama-cpp-python {N.INSTALLED_LLAMA_CPP_PYTHON}, threads {eng.n_threads}, "
            f"GPU layers {args.gpu_layers}, {args.max_tokens} tokens per prompt, "
            f"{len(PROMPTS)} prompts x {args.rounds} rounds, greedy"
        )

        prompts = [eng.format_chat([{"role": "user", "content": p}])[0] for p in PROMPTS]
        settings = [0, *ks]
        tps: dict[int, list[float]] = {k: [] for k in settings}
        taus: dict[int, list[float]] = {k: [] for k in settings}
        glue: dict[int, list[float]] = {k: [] for k in settings}
        tokens_ref: dict[int, list[int]] = {}
        eng.complete(prompts[0], max_tokens=16, parse_special=True, add_special=False)  # warm-up
        for _ in range(args.rounds):
            for i, p in enumerate(prompts):
                for k in settings:  # interleaved: every setting sees the same machine state
                    c = eng.complete(
                        p,
                        max_tokens=args.max_tokens,
                        n_draft=k,
                        parse_special=True,
                        add_special=False,
                    )
                    if k == 0:
                        tokens_ref.setdefault(i, c.tokens)
                    elif c.tokens != tokens_ref[i]:
                        print(f"!! k={k} prompt {i}: output differs from plain decoding")
                    tps[k].append(c.stats.tokens_per_s)
                    taus[k].append(c.stats.tau)
                    glue[k].append(c.stats.glue_per_step_us)

        plain = statistics.median(tps[0])
        print("\n| mode | tokens/s (median) | speedup | tau | glue/step (us) |")
        print("|---|---|---|---|---|")
        for k in settings:
            med = statistics.median(tps[k])
            name = "plain" if k == 0 else f"k={k}"
            print(
                f"| {name} | {med:.1f} | {med / plain:.2f}x | {statistics.median(taus[k]):.2f} "
                f"| {statistics.median(glue[k]):.0f} |"
            )

        curve_ks = [1, 2, 3, 4, 5, 6, 8, 12, 16]
        curve = verify_curve(eng, curve_ks, reps=15, taps=True)
        print("\nverify cost, one target decode of k tokens (median ms; ratio to k=1):")
        print("| k | " + " | ".join(str(k) for k in curve_ks) + " |")
        print("|---|" + "---|" * len(curve_ks))
        print("| ms | " + " | ".join(f"{1e3 * curve[k]:.2f}" for k in curve_ks) + " |")
        print("| t(k)/t(1) | " + " | ".join(f"{curve[k] / curve[1]:.2f}" for k in curve_ks) + " |")

        p = parts(eng)
        tgt_bytes = p.target.model.size_bytes
        d = p.drafter
        if d is not None:
            d_bytes = d.model.size_bytes
            n_ctx = p.target.n_ctx
            kv = kv_bytes(d.spec.header, n_ctx, n_layer=1)
            tgt_kv = kv_bytes(p.target.header, n_ctx, n_layer=p.target.n_layer)
            logits_buf = d.n_batch * d.n_vocab * 4
            print(
                f"\nmemory at n_ctx {n_ctx} (f16 KV): target weights {tgt_bytes / 2**20:.1f} MiB "
                f"+ KV {tgt_kv / 2**20:.1f} MiB; the drafter adds weights {d_bytes / 2**20:.1f} "
                f"MiB, KV {kv / 2**20:.1f} MiB, logits buffer {logits_buf / 2**20:.1f} MiB "
                f"({(d_bytes + kv + logits_buf) / (tgt_bytes + tgt_kv):.0%} of the target's)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
