"""Draft sources on hybrid and recurrent targets, in one run: plain decoding against a target's
own MTP head (fixed chains and auto) and against n-gram drafts verified from a checkpoint of a
state llama.cpp keeps no snapshots of (mamba), plus what a checkpoint and its put-back cost.

Without --target it writes tiny targets whose text cycles (tests/helpers/tinymodels.py):
qwen35 with an MTP head that agrees with the trunk, and mamba. Random weights of a few layers:
these figures measure the loop and the state handling at full acceptance, not a real model
(on this CPU a real 27B's MTP step costs a small share of its target step; here it costs about
as much as the trunk's, so auto rightly keeps to plain decoding on the tiny files).

Each setting answers the same prompts, interleaved per prompt and round in a rotated order,
on an engine loaded for it (plain: draft_source="none", which keeps no snapshots). Decoding
speed is generated tokens / decoding seconds; medians per setting and the median of the
per-request ratios to plain.

    python benchmarks/bench_hybrid_sources.py [-t 2] [--rounds 5] [--max-tokens 128]
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

import localspec  # noqa: E402
from localspec.options import RuntimeOptions  # noqa: E402
from localspec.runtime.target import Target  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402

PROMPTS = [
    "the cat sat on the mat",
    "write a list of fruits: apple, pear, plum",
    "def add(a, b):\n    return a + b\n",
    "zebra quartz violin orbit",
    "once upon a time there was a small robot who",
    "1, 2, 3, 4, 5, 6, 7",
]


def settings_for(arch: str) -> list[tuple[str, str, dict]]:
    """(name, the engine's draft_source, the call's options)."""
    if arch == "qwen35":
        return [
            ("plain", "none", {"n_draft": 0}),
            ("mtp k=2", "mtp", {"n_draft": 2}),
            ("mtp k=4", "mtp", {"n_draft": 4}),
            ("mtp k=8", "mtp", {"n_draft": 8}),
            ("mtp auto", "mtp", {"n_draft": "auto"}),
            ("auto (mtp+ngram)", "auto", {}),
        ]
    return [
        ("plain", "none", {"n_draft": 0}),
        ("ngram k=4", "auto", {"n_draft": 4, "draft_source": "ngram"}),
        ("ngram k=8", "auto", {"n_draft": 8, "draft_source": "ngram"}),
        ("auto (ngram)", "auto", {}),
    ]


def bench(path: str, arch: str, threads: int, rounds: int, max_tokens: int) -> None:
    opts = {"n_threads": threads, "n_ctx": 2048}
    settings = settings_for(arch)
    engines = {src: localspec.load(path, draft=False, draft_source=src, **opts)
               for src in {s for _, s, _ in settings}}  # fmt: skip
    try:
        speed: dict[str, list[float]] = {n: [] for n, _, _ in settings}
        ratio: dict[str, list[float]] = {n: [] for n, _, _ in settings}
        acc: dict[str, list[tuple[int, int]]] = {n: [] for n, _, _ in settings}
        for r in range(rounds):
            for i, prompt in enumerate(PROMPTS):
                k = (r + i) % len(settings)
                got: dict[str, float] = {}
                for name, src, call in settings[k:] + settings[:k]:
                    eng = engines[src]
                    eng.reset()
                    eng.complete(prompt, max_tokens=max_tokens, temperature=0.0, **call)
                    st = eng.last_stats
                    got[name] = st.generated / st.t_decode if st.t_decode > 0 else 0.0
                    acc[name].append((st.drafted, st.accepted))
                for name in got:
                    speed[name].append(got[name])
                    ratio[name].append(got[name] / got["plain"])
        print(f"\n{arch} target {path}: {rounds} rounds x {len(PROMPTS)} prompts, "
              f"up to {max_tokens} tokens, greedy")  # fmt: skip
        print(f"{'setting':>18} {'tok/s':>8} {'x plain':>8} {'lowest':>7} drafted/accepted")
        for name, _, _ in settings:
            d = sum(a for a, _ in acc[name])
            a = sum(b for _, b in acc[name])
            tps, med, low = (f(v) for f, v in ((statistics.median, speed[name]),
                             (statistics.median, ratio[name]), (min, ratio[name])))  # fmt: skip
            print(f"{name:>18} {tps:8.1f} {med:7.2f}x {low:6.2f}x {d}/{a}")
    finally:
        for eng in engines.values():
            eng.close()


def checkpoint_cost(path: str, threads: int, reps: int = 200) -> None:
    """A copy of the recurrent state and its put-back, against a one-token decode."""
    t = Target(path, RuntimeOptions(n_ctx=512, n_threads=threads))
    try:
        t.prefill(list(range(1, 129)))
        state = t.ctx.state_get(0, partial=True)
        one, get, put = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            s = t.ctx.state_get(0, partial=True)
            t1 = time.perf_counter()
            assert t.ctx.state_set(s, 0, partial=True)
            t2 = time.perf_counter()
            t.decode([5], all_logits=False)
            t3 = time.perf_counter()
            t.keep(t.n - 1)  # rebuilt: keep the context's length
            get.append(t1 - t0)
            put.append(t2 - t1)
            one.append(t3 - t2)
        g, p, o = (statistics.median(x) * 1e6 for x in (get, put, one))
        print(f"\ncheckpoint of {t.architecture} ({state.size} bytes), medians of {reps}: "
              f"copy {g:.1f} us, put back {p:.1f} us; a one-token decode {o:.1f} us "
              f"(copy = {g / o:.2f} of a decode)")  # fmt: skip
    finally:
        t.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    import llama_cpp

    cpu = platform.processor() or platform.machine()
    print(f"CPU {cpu}, {args.threads} threads, llama-cpp-python {llama_cpp.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        q = tm.write_qwen35_target(os.path.join(tmp, "q.gguf"), mtp=True, cycle=8)
        m = tm.write_mamba_target(os.path.join(tmp, "m.gguf"), cycle=8)
        bench(q, "qwen35", args.threads, args.rounds, args.max_tokens)
        bench(m, "mamba", args.threads, args.rounds, args.max_tokens)
        checkpoint_cost(m, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
