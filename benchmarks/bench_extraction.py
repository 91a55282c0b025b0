"""Training-data extraction against the target's own prefill, side by side in one run.

For the same ShareGPT conversations (the corpus's own replies, as `localspec train
--no-generate` reads them), interleaved rounds of:

1. **prefill**: the target decodes every conversation as a prompt, in n_batch chunks, one
   sequence at a time, output for the last row only, no taps: the rate of a plain prefill;
2. **extract**: `localspec train`'s feature pass writes the shards (taps, top-8 labels) of the
   same conversations into a fresh folder;
3. **generate** (with --generate): the feature pass on the first user turns, the target
   writing its own replies (16 sequences decoding together), for the rate of that data.

Prints tokens/s per mode (median over rounds), extract/prefill, and the disk cost of a million
positions of each kind of shard.

    python benchmarks/bench_extraction.py [--records 40] [--rounds 3] [-t 2] [--generate]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import statistics
import tempfile
import time

from localspec.datasets import Record, Unusable, records
from localspec.files.discovery import default_target
from localspec.options import RuntimeOptions
from localspec.runtime.target import Target
from localspec.training.data import build_features
from localspec.training.features import FeatureConfig, FeatureWriter
from localspec.training.targets import default_taps, target_info


def pick_records(n: int, skip: int) -> list[Record]:
    return list(itertools.islice(records("sharegpt"), skip, skip + n))


def token_sequences(path: str, recs: list[Record], fcfg: FeatureConfig) -> list[list[int]]:
    """The token sequences the feature pass decodes for these records (unusable ones left out)."""
    rt = RuntimeOptions(n_ctx=2048, n_batch=512, n_threads=1)
    t = Target(path, rt, n_seq=fcfg.n_parallel)
    try:
        writer = FeatureWriter(t, tempfile.mkdtemp(prefix="ls-bench-"), fcfg)
        out = []
        for i, r in enumerate(recs):
            with contextlib.suppress(Unusable):
                out.append(writer._prepare(i, r).tokens)
        shutil.rmtree(writer.folder, ignore_errors=True)
        return out
    finally:
        t.close()


def prefill_rate(path: str, seqs: list[list[int]], n_ctx: int, threads: int) -> float:
    t = Target(path, RuntimeOptions(n_ctx=n_ctx, n_batch=512, n_threads=threads))
    try:
        t0 = time.perf_counter()
        for s in seqs:
            t.clear()
            t.prefill(s)
        return sum(len(s) for s in seqs) / (time.perf_counter() - t0)
    finally:
        t.close()


def extract_rate(
    path: str, recs: list[Record], fcfg: FeatureConfig, threads: int
) -> tuple[float, float]:
    """Positions/s of the feature pass, and bytes on disk per position."""
    folder = tempfile.mkdtemp(prefix="ls-bench-")
    try:
        t0 = time.perf_counter()
        m = build_features(path, iter(recs), folder, fcfg, n_threads=threads)
        dt = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        return m.n_tokens / dt, size / max(m.n_tokens, 1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--records", type=int, default=40)
    ap.add_argument("--skip", type=int, default=100, help="records skipped at the start")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--generate", action="store_true", help="also time self-generated replies")
    a = ap.parse_args()
    path = a.target or default_target()
    taps = default_taps(target_info(path).n_layer)
    recs = pick_records(a.records, a.skip)
    fixed = FeatureConfig(taps=taps, generate=False, max_tokens=10**9)
    gen = FeatureConfig(taps=taps, generate=True, max_tokens=10**9, max_new=128)
    seqs = token_sequences(path, recs, fixed)
    n_tok = sum(len(s) for s in seqs)
    n_ctx = max(len(s) for s in seqs) + 16
    print(f"target {os.path.basename(path)}, taps {list(taps)}, {a.threads} threads")
    print(f"{len(seqs)} of {len(recs)} ShareGPT records usable as fixed text, {n_tok} tokens")
    rates: dict[str, list[float]] = {"prefill": [], "extract": [], "generate": []}
    disk: dict[str, float] = {}
    for r in range(a.rounds):
        rates["prefill"].append(prefill_rate(path, seqs, n_ctx, a.threads))
        rate, disk["extract"] = extract_rate(path, recs, fixed, a.threads)
        rates["extract"].append(rate)
        if a.generate:
            rate, disk["generate"] = extract_rate(path, recs[:16], gen, a.threads)
            rates["generate"].append(rate)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items() if v))
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    print("\nmode      tokens/s (median)   of prefill   disk per 1M positions")
    for k, v in med.items():
        size = f"{disk[k] * 1e6 / 2**30:.2f} GiB" if k in disk else "-"
        print(f"{k:<9} {v:>12.0f}        {v / med['prefill']:>8.2f}x   {size:>12}")


if __name__ == "__main__":
    main()
