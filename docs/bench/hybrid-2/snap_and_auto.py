"""Plain decoding on an engine loaded for it (draft_source none: no snapshots), on a drafting
engine with n_draft=0 (snapshots kept, nothing drafted) and auto on that engine, interleaved per
prompt and round (rotated order) over the copy-wide set: decode tok/s medians, the median and
lowest per-request ratio to plain, and the median prefill. Then what one refresh of auto's
reason costs.

    python docs/bench/hybrid-2/snap_and_auto.py TARGET.gguf ROUNDS
"""

from __future__ import annotations

import statistics
import sys
import time

import localspec
from localspec.bench import load_prompt_set
from localspec.lowlevel import parts


def main(path: str, rounds: int) -> None:
    prompts = load_prompt_set("copy-wide", 18)
    plain = localspec.load(path, draft=False, draft_source="none", n_ctx=4096, n_threads=2)
    spec = localspec.load(path, draft=False, draft_source="auto", n_ctx=4096, n_threads=2)
    cfg = [("plain", plain, {"n_draft": 0}), ("snap", spec, {"n_draft": 0}), ("auto", spec, {})]
    speed: dict[str, list[float]] = {k: [] for k, _, _ in cfg}
    prefill: dict[str, list[float]] = {k: [] for k, _, _ in cfg}
    for r in range(rounds):
        for i, bp in enumerate(prompts):
            msgs = [*bp.history, {"role": "user", "content": bp.turns[0]}]
            k = (r + i) % len(cfg)
            for name, eng, call in cfg[k:] + cfg[:k]:
                eng.reset()
                st = eng.chat(msgs, max_tokens=128, temperature=0.0, **call).stats
                speed[name].append(st.generated / st.t_decode)
                prefill[name].append(st.t_prefill)
    for name in speed:
        ratios = [a / b for a, b in zip(speed[name], speed["plain"], strict=True)]
        print(
            name,
            "decode tok/s median",
            round(statistics.median(speed[name])),
            "x plain median",
            round(statistics.median(ratios), 3),
            "min",
            round(min(ratios), 3),
            "prefill ms median",
            round(1000 * statistics.median(prefill[name]), 2),
        )
    spec.complete("the cat sat on the mat", max_tokens=64)  # auto last: its reason is timed
    sched = parts(spec).scheduler
    assert sched.explain() is not None
    t = time.perf_counter()
    for _ in range(200):
        sched.explain()
    print("auto's reason, one refresh:", round((time.perf_counter() - t) / 200 * 1e6), "us")
    plain.close()
    spec.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
