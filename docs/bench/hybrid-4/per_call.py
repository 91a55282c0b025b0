"""Where auto's time per call goes beside plain decoding's, on one target: two engines (plain,
draft_source none; auto with its defaults), the copy-wide requests run by both in alternating
order, ROUNDS rounds after a warm-up one; the parts of a call timed by wrapping the methods
that do them (perf_counter, so the wrappers' own ~1 us a call is in every figure), as means per
call in milliseconds. Nested parts (s.*, ss.*: the scheduler's and the speculative state's)
lie inside `step`; `residual` is the call less its top-level parts.

    python docs/bench/hybrid-4/per_call.py TARGET.gguf ROUNDS
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from typing import Any

import localspec
from localspec import engine as E
from localspec import stats as ST
from localspec.auto import scheduler as S
from localspec.bench import load_prompt_set
from localspec.speculation import generation as G
from localspec.speculation import specstate as SS

PARTS = [
    (E.Engine, "reset", "reset"),
    (E.Engine, "_prompt_tokens", "prompt_tokens"),
    (G.Generation, "prefill", "prefill"),
    (G.Generation, "_emit", "emit"),
    (G.Generation, "_step", "step"),
    (SS.SpecState, "lookup", "ss.lookup"),
    (S.Scheduler, "plan", "s.plan"),
    (SS.SpecState, "draft", "ss.draft"),
    (SS.SpecState, "verify", "ss.verify"),
    (SS.SpecState, "commit", "ss.commit"),
    (S.Scheduler, "observe", "s.observe"),
    (G.Generation, "_remember", "remember"),
    (S.Scheduler, "explain", "explain"),
    (ST.Stats, "add", "stats.add"),
]
TOP = {"reset", "prompt_tokens", "prefill", "emit", "step", "remember", "explain", "stats.add"}


def main(path: str, rounds: int) -> None:
    acc: dict[str, float] = collections.defaultdict(float)

    def wrap(cls: Any, name: str, label: str) -> None:
        f = getattr(cls, name)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[label] += time.perf_counter() - t0

        setattr(cls, name, timed)

    for cls, name, label in PARTS:
        wrap(cls, name, label)
    prompts = load_prompt_set("copy-wide", 18)
    common = {"draft": False, "n_ctx": 4096, "n_threads": 2, "flash_attn": False}
    engines = {s: localspec.load(path, draft_source=s, **common) for s in ("none", "auto")}
    res: dict[str, dict[str, list[float]]] = {s: collections.defaultdict(list) for s in engines}
    for r in range(rounds + 1):
        for bp in prompts:
            msgs = [*bp.history, {"role": "user", "content": bp.turns[0]}]
            for src in ("none", "auto") if r % 2 else ("auto", "none"):
                acc.clear()
                t0 = time.perf_counter()
                engines[src].reset()
                engines[src].chat(msgs, max_tokens=128, temperature=0.0)
                acc["total"] = time.perf_counter() - t0
                acc["residual"] = acc["total"] - sum(v for k, v in acc.items() if k in TOP)
                if r:  # the first round warms up (auto's first call times the machine)
                    for k, v in acc.items():
                        res[src][k].append(v)
    print(f"{path}: {rounds} rounds of {len(prompts)} requests, means per call")
    for k in [*(label for _, _, label in PARTS), "residual", "total"]:
        a = 1000 * statistics.mean(res["auto"].get(k, [0.0]))
        p = 1000 * statistics.mean(res["none"].get(k, [0.0]))
        print(f"{k:14s} plain {p:8.3f} ms  auto {a:8.3f} ms  diff {a - p:+.3f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
