"""The losses of one training step, over every unrolled draft step."""

from __future__ import annotations

from typing import Any

from .head_loss import fused_head_ce


def step_losses(
    model: Any, t: dict[str, Any], steps: int, loss: str = "kl"
) -> tuple[Any, list[Any], list[Any]]:
    """Weighted loss over the unrolled steps, and per step the (correct, counted) row masks.
    The head (most of the cost) runs only on rows that carry a label: prompt rows are keys
    for attention but never predicted.

    loss "lk" (Samarin et al., LK losses, arXiv 2602.23881, hybrid form): per row
    w * CE + (1 - w) * (1 - alpha), alpha = sum over the target's top labels of
    min(p_draft, p_target) (the acceptance rate of that row, from below: the labels hold
    nearly all of the target's mass) and w = exp(-3 alpha) without gradient, so the loss
    leans on cross-entropy while the drafter disagrees and on acceptance once it agrees."""
    import torch

    W = t["W"]
    in_window = torch.arange(W, device=t["taps"].device)[None, :] < t["rows"][:, None]
    outs = model.unroll(model.encode(t["taps"]), t["tokens"], steps)
    total: Any = 0.0
    correct, counted = [], []
    parts: list[tuple[Any, ...]] = []  # per step: rows' states, labels, weights (kl)
    for j, h in enumerate(outs):
        mask = t["valid"][:, j : j + W] & in_window
        sel = mask.nonzero(as_tuple=True)
        ids = t["ids"][:, j : j + W][sel]
        inv = ids < 0
        p_target = t["logp"][:, j : j + W][sel].exp().masked_fill(inv, 0.0)
        q = p_target / p_target.sum(-1, keepdim=True).clamp_min(1e-9)
        train_rows = ~inv[:, 0]  # the target's choice must be draftable
        row_w = (0.8**j) * train_rows / train_rows.sum().clamp_min(1)
        correct.append(torch.zeros_like(mask))
        counted.append(mask)
        if loss == "kl":  # all steps' rows go through the head at once, below
            parts.append((h[sel], ids, q, row_w, sel))
            continue
        logits = model.lm_head(h[sel])
        lp_ids = logits.float().log_softmax(-1).gather(-1, ids.clamp_min(0))
        alpha = torch.minimum(lp_ids.exp().masked_fill(inv, 0.0), p_target).sum(-1)
        w = torch.exp(-3.0 * alpha.detach())
        row_loss = w * -(q * lp_ids).sum(-1) + (1.0 - w) * (1.0 - alpha)
        total = total + (row_w * row_loss).sum()
        correct[j][sel] = logits.argmax(-1) == ids[:, 0]
    if parts:
        # the cross-entropy with its gradient, chunk by chunk (head_loss.py): one call for
        # every step, so the head weight is cast once and its gradient summed once
        h_all, ids_all, q_all, w_all = (torch.cat([p[i] for p in parts]) for i in range(4))
        total, top = fused_head_ce(h_all, model.lm_head.weight, ids_all, q_all, w_all)
        start = 0
        for j, (_, ids, _, _, sel) in enumerate(parts):
            correct[j][sel] = top[start : start + len(ids)] == ids[:, 0]
            start += len(ids)
    return total, correct, counted
