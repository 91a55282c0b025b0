"""Small `localspec train` runs on the tiny targets: the taps, prompt files of random letter
words, and feature and training configs small enough for a test (needs PyTorch: test modules
import this after pytest.importorskip("torch"))."""

from __future__ import annotations

import json
import random

from localspec.training import FeatureConfig, TrainConfig

TAPS = (1, 2, 3)


def write_prompts(path: str, n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            words = [
                "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 5)))
                for _ in range(rng.randint(2, 10))
            ]
            fh.write(json.dumps({"messages": [{"role": "user", "content": " ".join(words)}]}))
            fh.write("\n")
    return path


def feature_config(**kw) -> FeatureConfig:
    base = {"taps": TAPS, "max_new": 40, "n_parallel": 4, "max_tokens": 4000}
    base.update(kw)
    return FeatureConfig(**base)


def train_config(**kw) -> TrainConfig:
    base = {
        "max_steps": 80,
        "eval_every": 20,
        "draft_vocab": 64,
        "window": 64,
        "batch_tokens": 256,
        "lr": 3e-3,
        "steps_unrolled": 4,
    }
    base.update(kw)
    return TrainConfig(**base)
