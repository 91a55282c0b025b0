"""Reading a Hugging Face drafter checkpoint folder: config.json and its tensors.

Handles the layouts drafters are published in: one ``pytorch_model.bin``, one
``model.safetensors``, or shards listed in ``*.index.json``. Every failure names the file.
"""

from __future__ import annotations

import json
import os
from typing import Any

from localspec.errors import CheckpointError

_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLES = ("model.safetensors", "pytorch_model.bin")


def read_config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder} has no config.json (is it a drafter checkpoint?)")
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return cfg


def weight_files(folder: str) -> list[str]:
    """The tensor files of a checkpoint, in a stable order."""
    for index in _INDEXES:
        path = os.path.join(folder, index)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    weight_map = json.load(fh)["weight_map"]
            except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"{path} is not a valid shard index: {exc}") from None
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
            if missing:
                raise CheckpointError(f"{path} lists missing shard(s): {', '.join(missing)}")
            return [os.path.join(folder, f) for f in files]
    for single in _SINGLES:
        path = os.path.join(folder, single)
        if os.path.isfile(path):
            return [path]
    raise CheckpointError(
        f"{folder} has no weights (expected {', '.join(_SINGLES)} or a shard index)"
    )


def load_tensors(folder: str) -> dict[str, Any]:
    """All tensors of the checkpoint as torch tensors on the CPU."""
    import torch

    tensors: dict[str, Any] = {}
    for path in weight_files(folder):
        try:
            if path.endswith(".safetensors"):
                from safetensors.torch import load_file

                part = load_file(path, device="cpu")
            else:
                part = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt or truncated: safetensors/pickle/zip errors
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        if not isinstance(part, dict):
            raise CheckpointError(f"{path} does not hold a tensor dictionary")
        tensors.update(part)
    return tensors
