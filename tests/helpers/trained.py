"""Drafters trained with `localspec train` on the tiny relay target, for tests that need a drafter
whose acceptance means something (the measured disambiguation in `localspec convert`).

One feature set is made once; an EAGLE-3.1 and a plain EAGLE-3 drafter are trained on it for a
few seconds each (one CPU thread, so a busy machine slows them least).

The relay target is context-free (its attention adds nothing), so every greedy reply is the same
8-token cycle "auvwxyzE" and a drafter could predict it from its token input alone; the taps are
redundant there. Two settings keep the outcome from being a lottery that the CPU's rounding
decides (with soft labels and the default init, 80 steps gave the right reading 48-100%
acceptance and margins of 3-79 points depending on the seed, or on MKL's AVX2 vs AVX-512
kernels for the same seed):
- labels are the target's greedy token (top_labels=1): after "a" the target gives "u" 0.57 and
  "d" 0.30, so a drafter fitted to the distribution has its top choice there on a knife's edge,
  while the measurement (greedy chains) accepts only the target's top choice;
- init="target-layer": fc starts by passing the deepest tap through at its own scale (rms ~59)
  and the attention output starts at the target's (zero), so the drafter reads the target's
  state from its taps and its pre-norm state stays far from the post-norm one (rms 19-46
  against 1 after training; 0.6-2.8 with the default init), as in drafters for real targets.
  A wrong tap numbering or norm_output meaning then fails clearly, whatever rounding the
  training took: margins of 97-100 (taps) and 41-62 points (norm_output) over 10 seeds."""

from __future__ import annotations

import json
import os
import random
import shutil

from helpers import tinymodels as tm

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
    features = FeatureConfig(taps=TAPS, max_new=24, n_parallel=8, max_tokens=800, top_labels=1)
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
            lr=1e-3,
            steps_unrolled=4,
            init="target-layer",
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
