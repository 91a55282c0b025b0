"""Train an EAGLE-3.1 (or EAGLE-3) drafter for a GGUF target: ``localspec train``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from itertools import chain

from ..datasets import records
from ..errors import InvalidParameterError
from .checkpoints import load_parent
from .config import STATE, TrainConfig, TrainResult, check_config, check_resumable
from .data import build_features
from .features import DataReport, FeatureConfig, Manifest, data_folder
from .targets import default_taps, target_info
from .trainer import Trainer

__all__ = ["DataReport", "FeatureConfig", "TrainConfig", "TrainResult", "data_folder", "train"]


def train(
    target: str,
    data: Sequence[str],
    out: str,
    *,
    config: TrainConfig | None = None,
    features: FeatureConfig | None = None,
    taps: Sequence[int] | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int = 0,
    log: Callable[[str], None] = print,
    show_progress: bool = True,
) -> TrainResult:
    """Make training data with the target (data: files or sharegpt/mtbench/humaneval), then
    train, resuming whatever `out` already holds. Records that cannot be used are skipped;
    the progress line, the log and the result's `data` count them by reason. Returns the
    checkpoint folder, metrics and those counts."""
    from tqdm import tqdm

    cfg = config or TrainConfig()
    info = target_info(target)
    tap_ids = tuple(int(t) for t in taps) if taps is not None else default_taps(info.n_layer)
    if len(tap_ids) != 3:
        raise InvalidParameterError(f"an EAGLE-3 drafter reads 3 taps, got {list(tap_ids)}")
    fcfg = features or FeatureConfig(taps=tap_ids)
    fcfg.taps = tap_ids
    if not data:
        raise InvalidParameterError("no training data given")
    # refused now, not after hours of making data
    check_config(cfg)
    check_resumable(cfg, out)
    if cfg.init_from and not os.path.isfile(os.path.join(out, STATE)):
        load_parent(cfg, info, tap_ids)
    threads = n_threads or max(1, os.cpu_count() or 1)
    os.makedirs(out, exist_ok=True)
    items = chain.from_iterable(records(d) for d in data)
    bar = tqdm(desc="features", unit="tok", total=fcfg.max_tokens, disable=not show_progress)
    done = Manifest.load(os.path.join(out, "data"))
    if done is not None:
        bar.set_postfix_str(str(done.report()), refresh=False)
        bar.update(done.n_tokens)

    def on_item(rows: int, report: DataReport) -> None:
        bar.set_postfix_str(str(report), refresh=False)
        bar.update(rows)

    try:
        manifest = build_features(
            target,
            items,
            os.path.join(out, "data"),
            fcfg,
            n_threads=threads,
            n_gpu_layers=n_gpu_layers,
            progress=on_item,
        )
    finally:
        bar.close()
    report = manifest.report()
    log(f"data: {report}")
    trainer = Trainer(target, out, cfg, tap_ids, log=log)
    total = cfg.max_steps
    tbar = tqdm(
        desc="train", unit="step", total=total, initial=trainer.step, disable=not show_progress
    )
    shown: dict[str, str] = {}

    def on_step(rec: dict[str, float]) -> None:
        shown["seen"] = _count(rec["positions"])
        shown["epoch"] = f"{rec['epoch']:.2f}"
        shown["loss"] = f"{rec['loss']:.3f}"
        shown["acc0"] = f"{rec['acc0']:.2f}"
        if "held_tau" in rec:  # the held-out estimate: tau and agreement per draft step
            shown["held tau"] = f"{rec['held_tau']:.2f}"
            acc: list[float] = rec["held_acc"]  # type: ignore[assignment]
            shown["steps"] = "/".join(f"{a:.0%}".rstrip("%") for a in acc) + "%"
        tbar.set_postfix(shown, refresh=False)
        tbar.update(1)

    try:
        result = trainer.run(on_step)
    finally:
        tbar.close()
    result.data = report
    return result


def _count(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"
