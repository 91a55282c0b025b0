"""One training step with the fused head loss against the plain autograd head, side by side.

The same batches of a feature folder (made by `localspec train`) are trained in alternating
order with the head's cross-entropy computed two ways: `fused_head_ce` (loss, top-1 and
gradients chunk by chunk) and the plain form (head -> log_softmax -> gather, autograd). Each
mode has its own copy of the same initial model, so both see the same weights' statistics.
Prints seconds per step and labelled positions per second for each (medians), and the ratio.
Steps are timed as training runs them, less gradient clipping (the same in both modes).

    python benchmarks/bench_train_step.py [--data runs/curve/text/data] [--steps 6] [-t 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch

from localspec.files.discovery import default_target
from localspec.training import config as C
from localspec.training import losses as L
from localspec.training import targets as TG
from localspec.training import trainer as T


def plain_head_ce(
    h: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, q: torch.Tensor, row_w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's cross-entropy as autograd computes it without the fused function."""
    logits = h @ weight.T
    lp = logits.float().log_softmax(-1).gather(-1, ids.clamp_min(0))
    return (row_w * -(q * lp).sum(-1)).sum(), logits.argmax(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="runs/curve/text/data", help="a feature folder")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per mode")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    a = ap.parse_args()
    if a.steps < 1 or a.threads < 1:
        ap.error("--steps and --threads must be >= 1")
    work = tempfile.mkdtemp(prefix="ls-bench-step-")
    try:
        os.symlink(os.path.abspath(a.data), os.path.join(work, "data"))
        cfg = C.TrainConfig(batch_tokens=a.batch_tokens, threads=a.threads, eval_batches=1)
        target = default_target()
        taps = TG.default_taps(TG.target_info(target).n_layer)
        tr = T.Trainer(target, work, cfg, taps, log=lambda m: None)
        order = np.random.default_rng(0).permutation(len(tr.train_data.windows))
        batches = tr.train_data.batches(order)[: a.steps + 1]
        models = {"fused": tr.model, "plain": _copy(tr.model)}
        opts = {k: torch.optim.AdamW(m.parameters(), lr=cfg.lr) for k, m in models.items()}
        times: dict[str, list[float]] = {k: [] for k in models}
        rows: list[int] = []
        for i, b in enumerate(batches):
            t = tr.train_data.tensors(b, "cpu")
            for mode in ("fused", "plain") if i % 2 else ("plain", "fused"):
                L.fused_head_ce = T_FUSED if mode == "fused" else plain_head_ce  # type: ignore[assignment]
                t0 = time.perf_counter()
                with tr._autocast():
                    loss, _, counted = L.step_losses(models[mode], t, cfg.steps_unrolled)
                opts[mode].zero_grad(set_to_none=True)
                loss.backward()
                opts[mode].step()
                if i:  # the first batch warms both up
                    times[mode].append(time.perf_counter() - t0)
            if i:
                rows.append(int(counted[0].sum()))
        L.fused_head_ce = T_FUSED  # type: ignore[assignment]
        med_rows = statistics.median(rows)
        print(
            f"precision {tr.precision}, {a.threads} thread(s), {a.steps} steps of "
            f"{a.batch_tokens} rows (median {med_rows:.0f} labelled), "
            f"draft vocabulary {len(tr.draft_ids)}"
        )
        for mode, ts in times.items():
            s = statistics.median(ts)
            print(f"{mode:>6}: {s:6.2f} s/step  {med_rows / s:7.1f} labelled positions/s")
        ratio = statistics.median(times["plain"]) / statistics.median(times["fused"])
        print(f"fused is {ratio:.2f}x the plain head's speed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy(model: Any) -> Any:
    import copy

    return copy.deepcopy(model)


T_FUSED = L.fused_head_ce

if __name__ == "__main__":
    main()
