"""Writing a run's files so that a reader (or a resumed run) sees the old version or the new
one, never half of one: single files, and checkpoint folders of weights plus config."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np


def atomic_save(path: str, write: Callable[[str], object]) -> None:
    """write(tmp) into a temporary file beside path, then rename it over path."""
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_checkpoint(out: str, tensors: dict[str, Any], config: dict[str, Any]) -> str:
    """A checkpoint folder (model.safetensors + config.json) put in out's place whole."""
    from safetensors.torch import save_file

    tmp = tempfile.mkdtemp(dir=os.path.dirname(out), prefix=".tmp-ckpt-")
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh, indent=2)
        if os.path.isdir(out):
            old = out + ".old"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def draft_vocab_maps(draft_ids: np.ndarray, vocab_size: int) -> dict[str, Any]:
    """EAGLE-3's vocabulary maps: d2t as offsets (target id = i + d2t[i]), t2d a mask."""
    import torch

    ids = torch.from_numpy(np.asarray(draft_ids, dtype=np.int64))
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(len(ids)), "t2d": t2d}
