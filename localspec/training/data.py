"""Training data: features made by the target, the draft vocabulary, and the batches of windows
a step trains on."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..datasets import Record
from ..errors import InvalidParameterError, LocalspecError
from .config import TrainConfig
from .features import (
    DataReport,
    FeatureConfig,
    FeatureWriter,
    Manifest,
    Sequence,
)


def build_features(
    target_path: str,
    items: Iterable[Record],
    folder: str,
    fcfg: FeatureConfig,
    *,
    n_threads: int,
    n_gpu_layers: int = 0,
    progress: Callable[[int, DataReport], None] | None = None,
) -> Manifest:
    """Write the features of `items` to `folder` (resuming it); its manifest holds the counts."""
    from ..options import RuntimeOptions
    from ..runtime.target import Target

    n_batch = max(512, fcfg.n_parallel)
    # generating: a KV stream per sequence. The data's own text: one shared stream that holds
    # the sequence a batch ends in and the next batch (earlier ones are done by then)
    fixed = not fcfg.generate
    rt = RuntimeOptions(
        n_ctx=fcfg.seq_len + 2 * n_batch if fixed else fcfg.seq_len * fcfg.n_parallel,
        n_batch=n_batch,
        n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
    )
    target = Target(target_path, rt, n_seq=fcfg.n_parallel, unified_kv=fixed)
    import torch

    threads = torch.get_num_threads()
    # the labels' top-k runs between decodes, while llama.cpp's threads are idle
    torch.set_num_threads(max(1, n_threads))
    try:
        target.enable_taps(fcfg.taps)
        return FeatureWriter(target, folder, fcfg).run(items, progress)
    finally:
        torch.set_num_threads(threads)
        target.close()


def check_eval_data(eval_folder: str, own: str) -> None:
    """--eval-data must be another feature folder made by the same target with the same taps
    and labels: one clear error otherwise, before anything is trained or judged."""
    if os.path.isdir(own) and os.path.samefile(eval_folder, own):
        raise InvalidParameterError(
            f"--eval-data {eval_folder} is this run's own training data; give another folder"
        )
    theirs, mine = Manifest.load(eval_folder), Manifest.load(own)
    if theirs is None or mine is None:
        return  # load_sequences names the missing one
    keys = ("taps", "target", "top_labels")
    if theirs.target_fingerprint != mine.target_fingerprint or any(
        theirs.config.get(k) != mine.config.get(k) for k in keys
    ):
        raise LocalspecError(
            f"--eval-data {eval_folder} was made with another target, other taps or other "
            f"labels than this run's data ({ {k: theirs.config.get(k) for k in keys} } against "
            f"{ {k: mine.config.get(k) for k in keys} })"
        )


def _hashed_share(key: str, seed: int) -> float:
    """A number in [0, 1) fixed by a sequence's name: the held-out split draws on it."""
    return zlib.crc32(f"{seed}:{key}".encode()) / 2**32


def choose_draft_vocab(seqs: list[Sequence], size: int, n_vocab: int) -> np.ndarray:
    """The `size` target tokens the target predicts most often (ascending ids): the drafter can
    only propose these, so coverage of the target's own choices is what counts."""
    size = min(size, n_vocab)
    counts = np.zeros(n_vocab, dtype=np.float64)
    for s in seqs:  # only rows whose label is trained on
        ids = s.label_ids[s.labelled]
        np.add.at(counts, ids[:, 0], 1.0)
        np.add.at(counts, ids[:, 1:].reshape(-1), 1e-3)  # ties: likely alternatives
    order = np.lexsort((np.arange(n_vocab), -counts))
    return np.sort(order[:size]).astype(np.int64)


class Batcher:
    """Windows of sequences packed into padded batches (tensors on the training device)."""

    def __init__(self, seqs: list[Sequence], cfg: TrainConfig, t2d_map: np.ndarray) -> None:
        self.seqs = seqs
        self.cfg = cfg
        self.map = t2d_map
        # windows start prompt_context rows before the first label (at most window - 2, so
        # the first window trains rows too): long prompts cost layer compute for every row,
        # while the drafter mostly attends to recent positions
        pc = min(cfg.prompt_context, cfg.window - 2)
        self.windows = [
            (i, a, min(a + cfg.window, len(s.taps)))
            for i, s in enumerate(seqs)
            for a in range(max(0, s.loss_start - 1 - pc), len(s.taps), cfg.window)
            if min(a + cfg.window, len(s.taps)) - a >= 2
        ]

    def batches(self, order: np.ndarray) -> list[list[tuple[int, int, int]]]:
        """Group windows (in this order) into batches of about batch_tokens rows."""
        out: list[list[tuple[int, int, int]]] = []
        cur: list[tuple[int, int, int]] = []
        rows = 0
        for w in (self.windows[i] for i in order):
            n = w[2] - w[1]
            if cur and (rows + n) > self.cfg.batch_tokens:
                out.append(cur)
                cur, rows = [], 0
            cur.append(w)
            rows += n
        if cur:
            out.append(cur)
        return out

    def tensors(self, batch: list[tuple[int, int, int]], device: str) -> dict[str, Any]:
        import torch

        S = self.cfg.steps_unrolled
        B = len(batch)
        W = max(b - a for _, a, b in batch)
        C = W + S - 1  # columns c = P + j; the label sits at sequence position a + c + 1
        H3 = self.seqs[batch[0][0]].taps.shape[1]
        K = self.seqs[batch[0][0]].label_ids.shape[1]
        taps = np.zeros((B, W, H3), np.float32)
        tok = np.zeros((B, C), np.int64)
        ids = np.full((B, C, K), -1, np.int64)
        logp = np.zeros((B, C, K), np.float32)
        valid = np.zeros((B, C), bool)
        for r, (si, a, b) in enumerate(batch):
            s = self.seqs[si]
            n_rows = len(s.taps)
            taps[r, : b - a] = s.taps[a:b]
            lo, hi = a + 1, min(a + 1 + C, n_rows)  # label positions that exist
            if hi <= lo:
                continue
            n = hi - lo
            tok[r, :n] = s.tokens[lo:hi]
            ids[r, :n] = self.map[s.label_ids[lo:hi]]
            logp[r, :n] = s.label_logp[lo:hi]
            # a column is trained only if its row P = c - j lies inside the window: checked
            # per step in the loss; here: the label exists and belongs to a reply
            valid[r, :n] = s.labelled[lo:hi]
        return {
            "taps": torch.from_numpy(taps).to(device),
            "tokens": torch.from_numpy(tok).to(device),
            "ids": torch.from_numpy(ids).to(device),
            "logp": torch.from_numpy(logp).to(device),
            "valid": torch.from_numpy(valid).to(device),
            "rows": torch.tensor([b - a for _, a, b in batch], device=device),
            "start": torch.tensor([a for _, a, _ in batch], device=device),
            "seq": [si for si, _, _ in batch],
            "W": W,
        }
