"""What auto's load-time timing (runtime/rollback.py measure_snapshot_tax) finds on tiny hybrid
targets: a plain step and a verify of n_rs_seq + 1 tokens with n_rs_seq snapshots against
none, REPEATS times each, for 2, 4, 8 and 16 snapshots; then the choice auto makes at the
snapshots these files get (runtime/rollback.py plan_rollback).

    python docs/bench/hybrid-3/snapshot_tax.py REPEATS TARGET.gguf ...
"""

from __future__ import annotations

import statistics
import sys

from localspec.native.gguf_header import GGUFHeader
from localspec.native.model import NativeModel
from localspec.runtime.rollback import (
    SNAPSHOT_TAX,
    measure_snapshot_tax,
    plan_rollback,
    with_checkpoints,
)


def main(repeats: int, paths: list[str]) -> None:
    for path in paths:
        model = NativeModel(path, n_gpu_layers=0)
        h = GGUFHeader(path)
        arch = h.architecture or "?"
        plan = plan_rollback(
            arch, h.arch_key, n_embd=model.n_embd, n_batch=512, weights_bytes=model.size_bytes
        )
        for n in (2, 4, 8, 16):
            taxes = [
                measure_snapshot_tax(model, n, n_threads=2, kv_type="f16", flash_attn=None)
                for _ in range(repeats)
            ]
            steps = [t.step for t in taxes]
            verifies = [t.verify for t in taxes]
            print(
                f"{arch:10s} {n:2d} snapshots: plain step {statistics.median(steps):+.1%} "
                f"(runs {' '.join(f'{x:+.1%}' for x in steps)}), verify of {n + 1} "
                f"{statistics.median(verifies):+.1%}; rounds {taxes[0].rounds}"
                + (f"  <- this file keeps {plan.n_rs_seq}" if n == plan.n_rs_seq else "")
            )
            if n == plan.n_rs_seq:
                chosen = [with_checkpoints(plan, t).checkpoint for t in taxes]
                print(
                    f"{'':10s} auto's choice at {n} (threshold {SNAPSHOT_TAX:.0%}): checkpoints "
                    f"in {sum(chosen)} of {len(chosen)} timings"
                )
        model.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
