"""Per request, the median over rounds of auto's end-to-end and decode ratios to plain in a
benchmarks/bench_copy.py --json file (its own summary gives every single run's ratio, which on
these tiny targets is mostly the machine's noise), and the extra time auto spends outside
decoding per call.

    python docs/bench/hybrid-3/per_request.py RUNS.json
"""

from __future__ import annotations

import collections
import json
import statistics
import sys


def main(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        settings = json.load(fh)["settings"]
    runs = {
        name: {(r["prompt"], r["round"]): r for r in settings[name]["runs"]}
        for name in ("plain", "auto")
    }
    e2e, dec, extra = (collections.defaultdict(list) for _ in range(3))
    for key, p in runs["plain"].items():
        a = runs["auto"].get(key)
        if a is None:
            continue
        e2e[key[0]].append(p["e2e_s"] / a["e2e_s"])
        dec[key[0]].append(p["decode_s"] / a["decode_s"])
        extra[key[0]].append((a["e2e_s"] - a["decode_s"]) - (p["e2e_s"] - p["decode_s"]))
    med = {p: statistics.median(v) for p, v in e2e.items()}
    for p in sorted(med, key=med.__getitem__):
        rounds = " ".join(f"{x:.2f}" for x in e2e[p])
        print(
            f"{p:28s} end to end {med[p]:.3f} (rounds {rounds}), decode "
            f"{statistics.median(dec[p]):.3f}, outside decoding +"
            f"{1000 * statistics.median(extra[p]):.2f} ms"
        )
    low = min(med, key=med.__getitem__)
    print(
        f"requests whose median is below 0.97 end to end: {sum(v < 0.97 for v in med.values())} "
        f"of {len(med)}; decode: {sum(statistics.median(v) < 0.97 for v in dec.values())}; "
        f"lowest end to end {med[low]:.3f} ({low})"
    )


if __name__ == "__main__":
    main(sys.argv[1])
