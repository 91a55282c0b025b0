"""The drafter head's cross-entropy against the target's top labels, fused with its gradient.

The plain autograd form (head -> log_softmax -> gather) writes several float tensors as wide
as the draft vocabulary per trained row, and zero-fills one more in gather's backward: on a
CPU that memory traffic cost as much as the head's matmuls (profiled: log_softmax, its
backward, argmax, casts and fills were 40% of a SmolLM2 step). Here the logits of a chunk of
rows live only while that chunk is processed: its loss, its top-1 token and, when gradients
are wanted, the gradient of the weighted loss with respect to the rows and the head weight
are computed at once (as Liger-Kernel's fused linear cross-entropy does), so backward only
scales the saved gradients.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidParameterError

CHUNK_ROWS = 512  # rows per chunk: bounds the transient [rows, draft vocab] logits; 512 was
# fastest on a 2-core EPYC at a 16k draft vocabulary (2048: 11% slower, 64: 1.8x)
GRAD_BLOCK = 4096  # rows whose logit gradients are kept (in the matmul dtype) for one
# head-gradient product: one float cast per block instead of one per chunk


class _FusedHeadCE(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: torch.Tensor,
        weight: torch.Tensor,
        ids: torch.Tensor,
        q: torch.Tensor,
        row_w: torch.Tensor,
        dtype: torch.dtype,
        need_h: bool,
        need_w: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, hidden = h.shape
        dev = h.device
        w = weight.to(dtype)
        hh = h.to(dtype)
        valid = ids >= 0
        safe = ids.clamp_min(0)
        qz = q.float().masked_fill(~valid, 0.0)
        qsum = qz.sum(-1)
        rw = row_w.float()
        loss = torch.zeros((), dtype=torch.float32, device=dev)
        top = torch.empty(n, dtype=torch.long, device=dev)
        grad_h = torch.empty(n, hidden, dtype=torch.float32, device=dev) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        block = max(GRAD_BLOCK, CHUNK_ROWS)
        grads = (
            torch.empty(min(n, block), weight.shape[0], dtype=dtype, device=dev)
            if need_h or need_w
            else None
        )
        for b0 in range(0, n, block):
            b1 = min(b0 + block, n)
            for s in range(b0, b1, CHUNK_ROWS):
                e = min(s + CHUNK_ROWS, b1)
                logits = (hh[s:e] @ w.T).float()
                top[s:e] = logits.argmax(-1)
                picked = logits.gather(-1, safe[s:e])
                # log-sum-exp and softmax in place: one [rows, vocab] buffer per chunk
                peak = logits.amax(-1)
                expd = logits.sub_(peak[:, None]).exp_()
                total = expd.sum(-1)
                lse = peak + total.log()
                loss += (rw[s:e] * (lse * qsum[s:e] - (qz[s:e] * picked).sum(-1))).sum()
                if grads is not None:
                    # d rows / d logits = qsum * softmax - q scattered onto the label columns
                    g = expd.mul_((rw[s:e] * qsum[s:e] / total)[:, None])
                    g.scatter_add_(-1, safe[s:e], -qz[s:e] * rw[s:e, None])
                    grads[s - b0 : e - b0] = g
                    if grad_h is not None:
                        grad_h[s:e] = (grads[s - b0 : e - b0] @ w).float()
            if grad_w is not None and grads is not None:
                grad_w += (grads[: b1 - b0].T @ hh[b0:b1]).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.h_dtype, ctx.w_dtype = h.dtype, weight.dtype
        ctx.mark_non_differentiable(top)
        return loss, top

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_top: Any) -> tuple[Any, ...]:  # type: ignore[override]
        grad_h, grad_w = ctx.saved_tensors
        dh = None if grad_h is None else (grad_h * grad_loss).to(ctx.h_dtype)
        dw = None if grad_w is None else (grad_w * grad_loss).to(ctx.w_dtype)
        return dh, dw, *(None,) * 6  # ids, q, row_w, dtype, need_h, need_w


def fused_head_ce(
    h: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    q: torch.Tensor,
    row_w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_r row_w[r] * cross-entropy of softmax(h[r] @ weight.T) against the label
    distribution q[r], and each row's top-1 draft token. h [N, H] and weight [V, H] (float32
    or bfloat16) carry gradients; ids [N, K] (< 0: no label there, its q ignored), q [N, K]
    (renormalised over the valid labels by the caller) and row_w [N] are constants. Matmuls
    run in bf16 under an enabled autocast, the softmax always in float32."""
    if q.requires_grad or row_w.requires_grad:
        raise InvalidParameterError("fused_head_ce: q and row_w are constants, not trained")
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else torch.float32
    grad = torch.is_grad_enabled()
    with torch.autocast(kind, enabled=False):
        return _FusedHeadCE.apply(
            h, weight, ids, q, row_w, dtype, grad and h.requires_grad, grad and weight.requires_grad
        )
