"""What another busy program does to the decode times auto learns from: raw samples of target
decodes of n rows (taps on, as drafting runs them, and one-row decodes with taps off, as plain
decoding runs them), interleaved, on a quiet machine and with N other processes spinning,
timed on both clocks auto could use (the calling thread's CPU time, auto's CPU cost clock, and
the wall clock, what the user waits for).

For every estimator a cost model could price with (low quantiles, the median, the mean), it
prints the ratio t(n)/t(1) it would learn in each condition, against the ratio of mean wall
times under that condition (what decides real tokens per second there), and writes every raw
sample to OUT.json.

    python benchmarks/bench_busy_costs.py --busy 1 --reps 60 --out docs/bench/busy-costs
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

import numpy as np

import localspec
from localspec import bench
from localspec.lowlevel import hold

SIZES = (1, 2, 4, 6, 8, 17)


def sample(eng: localspec.Engine, reps: int, seed: int) -> dict[str, dict[str, list[float]]]:
    """reps rounds; each round times every size once in a shuffled order (taps on), then a
    one-row decode with taps off, each after the same 64-token context."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {}
    with hold(eng) as p:
        target = p.target
        hi = min(1000, target.n_vocab)
        base = [int(t) for t in rng.integers(0, hi, size=64)]
        target.keep(0)
        target.set_taps_active(True)
        target.decode(base, all_logits=False)
        keys = [(n, True) for n in SIZES] + [(1, False)]
        for _ in range(reps):
            for i in rng.permutation(len(keys)):
                n, taps = keys[int(i)]
                target.set_taps_active(taps)
                target.keep(64)
                target.decode(base[:n], all_logits=True)  # settle the graph for this size
                target.keep(64)
                c0, w0 = time.thread_time(), time.perf_counter()
                target.decode(base[:n], all_logits=True)
                c1, w1 = time.thread_time(), time.perf_counter()
                name = f"{n}" if taps else "1-off"
                d = out.setdefault(name, {"cpu": [], "wall": []})
                d["cpu"].append(c1 - c0)
                d["wall"].append(w1 - w0)
    return out


ESTIMATORS = {
    "p10": lambda x: float(np.quantile(x, 0.10)),
    "p25": lambda x: float(np.quantile(x, 0.25)),
    "median": lambda x: float(np.median(x)),
    "mean": lambda x: float(np.mean(x)),
}


def report(name: str, data: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = [f"{name}: t(n)/t(1) per estimator and clock (truth: mean wall there)"]
    t1 = data["1"]
    for n in SIZES[1:]:
        d = data[str(n)]
        truth = np.mean(d["wall"]) / np.mean(t1["wall"])
        cells = []
        for clock in ("cpu", "wall"):
            for est, f in ESTIMATORS.items():
                cells.append(f"{clock}-{est} {f(d[clock]) / f(t1[clock]):.2f}")
        lines.append(f"  n={n:2d} truth {truth:.2f}: " + ", ".join(cells))
    for n in ("1", "1-off", "17"):
        d = data[n]
        q = np.quantile(d["wall"], [0.1, 0.25, 0.5, 0.9])
        c = np.quantile(d["cpu"], [0.1, 0.25, 0.5, 0.9])
        lines.append(
            f"  t({n}) ms wall p10/25/50/90 "
            + "/".join(f"{1e3 * v:.1f}" for v in q)
            + ", cpu "
            + "/".join(f"{1e3 * v:.1f}" for v in c)
            + f", wall mean {1e3 * np.mean(d['wall']):.1f}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("target", nargs="?")
    ap.add_argument("--busy", type=int, default=1)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--out", default="busy-costs")
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, object] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "machine": bench.machine(),
        "cpu": platform.processor(),
        "busy_processes": args.busy,
        "reps": args.reps,
    }
    with localspec.load(args.target) as eng:
        result["target"] = eng.target_path
        result["threads"] = eng.n_threads
        lines = []
        for name, busy in (("quiet", 0), (f"busy {args.busy}", args.busy), ("quiet again", 0)):
            with bench.busy_load(busy):
                if busy:
                    time.sleep(0.5)
                data = sample(eng, args.reps, seed=len(lines))
            result[name] = data
            lines += report(name, data)
    text = "\n".join(lines)
    print(text)
    result["report"] = lines
    with open(args.out + ".json", "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
