"""Auto against plain, beside plain against plain (the noise floor), per request: three engines
on one target (plain twice, draft_source none, and auto with its defaults), each copy-wide
request run by all three in a rotated order, ROUNDS times; per request the median over rounds
of each end-to-end and decode ratio to the first plain engine; then how many requests' medians
fall below 0.97 for the second plain engine and for auto, and the lowest.

    python docs/bench/hybrid-3/aa_auto.py TARGET.gguf ROUNDS
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
    common = {"draft": False, "n_ctx": 4096, "n_threads": 2, "flash_attn": False}
    engines = {
        "plain": localspec.load(path, draft_source="none", **common),
        "plain2": localspec.load(path, draft_source="none", **common),
        "auto": localspec.load(path, **common),
    }
    print("auto's rollback:", parts(engines["auto"]).target.rollback)
    names = list(engines)
    e2e: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    dec: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for r in range(rounds):
        for i, bp in enumerate(prompts):
            msgs = [*bp.history, {"role": "user", "content": bp.turns[0]}]
            k = (r + i) % len(names)
            for name in names[k:] + names[:k]:
                eng = engines[name]
                eng.reset()
                t0 = time.perf_counter()
                st = eng.chat(msgs, max_tokens=128, temperature=0.0).stats
                e2e[name].setdefault(bp.id, []).append(time.perf_counter() - t0)
                dec[name].setdefault(bp.id, []).append(st.t_decode / st.generated)
    for name in ("plain2", "auto"):
        for label, table in (("end to end", e2e), ("decode", dec)):
            med = {
                p: statistics.median(
                    b / a for a, b in zip(table[name][p], table["plain"][p], strict=True)
                )
                for p in table["plain"]
            }
            low = min(med, key=med.__getitem__)
            print(
                f"{name:6s} {label:10s} per-request median x plain: median "
                f"{statistics.median(med.values()):.3f}, lowest {med[low]:.3f} ({low}), "
                f"{sum(v < 0.97 for v in med.values())} of {len(med)} below 0.97"
            )
        each = {
            p: statistics.median(b / a for a, b in zip(e2e[name][p], e2e["plain"][p], strict=True))
            for p in e2e["plain"]
        }
        print(
            f"{name:6s} per request (end to end): "
            + ", ".join(f"{p} {v:.2f}" for p, v in each.items())
        )
    for eng in engines.values():
        eng.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
