"""Aggregate tok/s (all tokens over all decoding seconds, every set) per setting, new / old,
from the eight bench runs of run.sh and run2.sh; and each run's greedy replies that differ
from plain's."""

import json
import os

here = os.path.dirname(os.path.abspath(__file__))


def agg(name: str) -> dict[str, tuple[float, float]]:
    with open(os.path.join(here, f"{name}.json")) as fh:
        d = json.load(fh)
    out: dict[str, list[float]] = {}
    for s in d["sets"].values():
        for row in s["settings"]:
            g, tps = row["generated"], row["tokens_per_s"]
            acc = out.setdefault(row["setting"], [0.0, 0.0, 0])
            acc[0] += g
            acc[1] += g / tps if tps else 0.0
            acc[2] += row.get("mismatches") or 0
    return {k: (v[0] / v[1], v[2]) for k, v in out.items()}


# run.sh: old1 new1 new2 old2; run2.sh: new3 old3 old4 new4 (each order once, so a drift of
# the machine over the half hour weighs on both alike)
runs = {n: agg(n) for n in ("old1", "new1", "new2", "old2", "new3", "old3", "old4", "new4")}
for n, r in runs.items():
    print(n, {k: round(v[0], 1) for k, v in r.items()})
for setting in runs["old1"]:
    old = [runs[n][setting][0] for n in runs if n.startswith("old")]
    new = [runs[n][setting][0] for n in runs if n.startswith("new")]
    mism = {n: runs[n][setting][1] for n in runs}
    print(
        f"{setting:8s} old {sum(old) / 4:7.2f} tok/s  new {sum(new) / 4:7.2f} tok/s  "
        f"new/old {sum(new) / sum(old):.3f}  replies unlike plain's per run {mism}"
    )
