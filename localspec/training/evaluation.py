"""Judging a drafter on held-out rows: the average over windows and the walk that follows each
reply as decoding does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import LocalspecError
from .averaging import exported_weights
from .checkpoints import build_drafter
from .config import LONG, SHORT, EvalResult, TrainConfig, read_run_state
from .data import Batcher
from .features import (
    Manifest,
    load_sequences,
    target_identity,
)
from .losses import step_losses
from .targets import target_info


def walk_chains(
    rows: dict[int, list[tuple[np.ndarray, np.ndarray]]], steps: int, limit: int | None = None
) -> tuple[float, list[float]]:
    """tau and acceptance per draft position as greedy chain decoding meets them. `rows` maps
    a sequence to its labelled rows' positions and accepted lengths. Each reply (a run of
    consecutive rows; its first token is the target's before any chain) is walked as decoding
    walks it: a chain at row p yields its L accepted tokens and the target's own, and the
    next starts at row p + L + 1; the last one stops where the reply does. Averaging over
    every row instead counts an easy stretch once per row where decoding takes it in one
    step, so that estimate reads high, by more the better the drafter. `limit` walks each
    reply's first `limit` tokens and drafts no further, as decoding with max_tokens = limit
    does. Acceptance at position j is counted as `localspec bench` counts it: chains
    accepted through j over chains that drafted j."""
    n_steps, n_tokens = 0, 0
    reach = np.zeros(steps)  # chains that accepted at least j + 1 drafts
    drafted = np.zeros(steps)  # chains that drafted position j
    for parts in rows.values():
        pos = np.concatenate([p for p, _ in parts])
        length = np.concatenate([n for _, n in parts])
        order = np.argsort(pos, kind="stable")
        pos, length = pos[order], length[order]
        for reply in np.split(np.arange(len(pos)), np.flatnonzero(np.diff(pos) != 1) + 1):
            end = len(reply) if limit is None else min(len(reply), limit - 1)
            i = 0
            while i < end:
                # tokens made so far: i + 1; decoding drafts no further than its budget
                budget = steps if limit is None else min(steps, limit - i - 2)
                n = min(int(length[reply[i]]), end - i - 1)
                n_steps += 1
                drafted[: max(budget, 0)] += 1
                reach[:n] += 1
                i += n + 1
            n_tokens += max(end, 0)
    if not n_steps:
        return float("nan"), []
    return n_tokens / n_steps, [
        float(r / d) if d else 0.0 for r, d in zip(reach, drafted, strict=True)
    ]


def evaluate(
    model: Any,
    batches: Iterable[dict[str, Any]],
    steps: int,
    loss: str = "kl",
    walk_limit: int | None = None,
) -> EvalResult:
    """Held-out loss, per-step agreement and the chain estimate of tau at k = steps: a row's
    chain accepts while each step agrees with the target (for greedy self-generated data the
    fed tokens are exactly those a real chain would see), averaged over rows and, as decoding
    meets it, walked through each reply (walk_chains, each reply's first walk_limit tokens)."""
    import torch

    loss_sum, n_b = 0.0, 0
    hits = np.zeros(steps)
    cnt = np.zeros(steps)
    chain_sum, chain_rows, cov_in, cov_all = 0.0, 0, 0, 0
    by_len = np.zeros((2, 2))  # [short, long] x [chain sum, rows]
    walk_rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    model.eval()
    with torch.no_grad():
        for t in batches:
            value, correct, counted = step_losses(model, t, steps, loss)
            loss_sum += float(value)
            n_b += 1
            run = torch.ones_like(correct[0])
            length = torch.zeros(correct[0].shape, device=correct[0].device)
            for j in range(steps):
                hits[j] += float(correct[j].sum())
                cnt[j] += float(counted[j].sum())
                run = run & correct[j]
                length = length + run.float()
            base = counted[0]
            chain_sum += float((length * base).sum())
            chain_rows += int(base.sum())
            pos = t["start"][:, None] + torch.arange(t["W"], device=base.device)[None, :]
            keep, at, got = base.cpu().numpy(), pos.cpu().numpy(), length.cpu().numpy()
            for r, si in enumerate(t["seq"]):
                walk_rows.setdefault(si, []).append((at[r][keep[r]], got[r][keep[r]].astype(int)))
            for i, part in enumerate((pos < SHORT, pos >= LONG)):
                by_len[i] += (float((length * base * part).sum()), int((base & part).sum()))
            ids0 = t["ids"][:, : t["W"], 0]
            cov_in += int(((ids0 >= 0) & base).sum())
            cov_all += int(base.sum())
    model.train()
    tau_walk, accept_walk = walk_chains(walk_rows, steps, walk_limit)
    return EvalResult(
        loss=loss_sum / max(n_b, 1),
        acc=[float(h / c) if c else 0.0 for h, c in zip(hits, cnt, strict=True)],
        tau=1.0 + chain_sum / max(chain_rows, 1),
        coverage=cov_in / max(cov_all, 1),
        # NaN where no held-out row is that short or long
        tau_short=1.0 + by_len[0, 0] / by_len[0, 1] if by_len[0, 1] else float("nan"),
        tau_long=1.0 + by_len[1, 0] / by_len[1, 1] if by_len[1, 1] else float("nan"),
        tau_walk=tau_walk,
        accept_walk=accept_walk,
    )


def estimate_on(
    target_path: str,
    state_path: str,
    folder: str,
    walk_limit: int | None = None,
    span: int | None = None,
) -> EvalResult:
    """A training run's drafter (its state file) judged on any feature folder, e.g. the
    target's own replies to a benchmark's prompts: the run's held-out estimate, on other
    rows (every window of the folder, on the CPU, in float32 where the run may have used
    bf16 matmuls). walk_limit: walk each reply's first that many tokens (walk_chains).
    span: each row attends over its last that many rows, as the runtime's attention window
    (--draft-window) runs the drafter."""
    info = target_info(target_path)
    st = read_run_state(state_path, info)
    made = Manifest.load(folder)
    if made is not None and (
        made.config.get("target") != target_identity(info.path)
        or tuple(made.config.get("taps", ())) != tuple(st.get("taps", ()))
    ):
        raise LocalspecError(
            f"{folder} was made with another target or other taps than {state_path} was trained on"
        )
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in st["config"].items() if k in fields})
    draft_ids = st["draft_ids"]
    try:
        model = build_drafter(info, cfg, draft_ids, {"model": exported_weights(st)}, [])
    except RuntimeError as exc:  # weights of another shape than the config says
        raise LocalspecError(f"cannot load the drafter of {state_path}: {exc}") from None
    model.span = span
    t2d = np.full(info.n_vocab, -1, np.int64)
    t2d[draft_ids] = np.arange(len(draft_ids))
    rows = Batcher(load_sequences(folder), cfg, t2d)
    if not rows.windows:
        raise LocalspecError(f"{folder} holds no labelled rows to judge on")
    # one batch at a time: a big folder's taps never sit in memory all at once
    batches = (rows.tensors(b, "cpu") for b in rows.batches(np.arange(len(rows.windows))))
    return evaluate(model, batches, cfg.steps_unrolled, cfg.loss, walk_limit)
