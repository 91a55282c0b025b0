"""Drafters trained with `localspec train` on the tiny relay target, for tests that need a drafter
whose acceptance means something (the measured disambiguation in `localspec convert`).

One feature set is made once; an EAGLE-3.1 and a plain EAGLE-3 drafter are trained on it for a
few seconds each (one CPU thread, so a busy machine slows them least)."""

from __future__ import annotations

import json
import os
import random
import shutil

import tinymodels as tm

TAPS = (1, 2, 3)  # inputs of target layers (the relay target has 6)


def letter_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(
            "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 5)))
            for _ in range(rng.randint(2, 10))
        )
        for _ in range(n)
    ]


def train_relay_drafters(folder: str) -> dict[str, str]:
    """Paths: the target, and the SpecForge-layout checkpoints of both variants."""
    from localspec.training import FeatureConfig, TrainConfig, train

    target = tm.write_relay_target(os.path.join(folder, "relay.gguf"))
    data = os.path.join(folder, "prompts.jsonl")
    with open(data, "w", encoding="utf-8") as fh:
        for p in letter_prompts(48, seed=0):
            fh.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    features = FeatureConfig(taps=TAPS, max_new=24, n_parallel=8, max_tokens=800)
    out = {"target": target}
    shared = os.path.join(folder, "data")
    for variant in ("eagle3.1", "eagle3"):
        run = os.path.join(folder, variant)
        if os.path.isdir(shared):  # features are the target's, whatever the variant
            shutil.copytree(shared, os.path.join(run, "data"))
        cfg = TrainConfig(
            variant=variant,
            max_steps=80,
            eval_every=1000,
            draft_vocab=64,
            window=32,
            batch_tokens=128,
            lr=3e-3,
            steps_unrolled=4,
            threads=1,
        )
        res = train(
            target,
            [data],
            run,
            config=cfg,
            features=features,
            taps=TAPS,
            n_threads=1,
            show_progress=False,
            log=lambda m: None,
        )
        if not os.path.isdir(shared):
            shutil.copytree(os.path.join(run, "data"), shared)
        out[variant] = res.checkpoint
    return out
