"""How much the rounds of auto's snapshot timing agree (runtime/rollback.py SnapshotTax.spread,
the interquartile range of their plain-step ratios): 6 timings of TARGET at N snapshots, each
with its tax, its spread, and whether it would be stored where the kernel cannot say whether
the machine was busy (SnapshotTax.settled).

    python docs/bench/hybrid-3/snapshot_spread.py TARGET.gguf N
"""

from __future__ import annotations

import sys

from localspec.native.model import NativeModel
from localspec.runtime.rollback import measure_snapshot_tax


def main(path: str, n: int) -> None:
    model = NativeModel(path, n_gpu_layers=0)
    out = [
        measure_snapshot_tax(model, n, n_threads=2, kv_type="f16", flash_attn=None)
        for _ in range(6)
    ]
    cells = [
        f"{t.step:+.1%}/iqr {t.spread:.3f}/{'stored' if t.settled else 'not stored'}" for t in out
    ]
    print(path, n, " ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
