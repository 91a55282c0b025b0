"""What keeping snapshots of a hybrid target's recurrent state costs plain decoding: the same
tiny target loaded for plain decoding (draft_source="none": no snapshots) and for drafting
(snapshots kept), plain replies (n_draft=0) on both, interleaved, median tok/s.

    python docs/bench/hybrid/plain_overhead.py TARGET.gguf [ROUNDS]
"""

import statistics
import sys

import localspec

path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 9
engines = {
    "loaded for plain (no snapshots)": localspec.load(
        path, draft=False, draft_source="none", n_threads=2, n_ctx=4096
    ),
    "loaded for drafting (snapshots)": localspec.load(path, draft=False, n_threads=2, n_ctx=4096),
}
msgs = [{"role": "user", "content": "Summarise: " + "the quick brown fox jumps over it. " * 40}]
for e in engines.values():
    e.chat(msgs, max_tokens=16, n_draft=0)
tps: dict[str, list[float]] = {k: [] for k in engines}
for _ in range(rounds):
    for name, e in engines.items():
        tps[name].append(e.chat(msgs, max_tokens=128, n_draft=0).stats.tokens_per_s)
base = statistics.median(tps["loaded for plain (no snapshots)"])
print(f"{path}: {rounds} rounds, 128 tokens, plain replies, median tok/s")
for name, v in tps.items():
    print(f"  {name:32s} {statistics.median(v):8.1f} tok/s  {statistics.median(v) / base:.3f}x")
