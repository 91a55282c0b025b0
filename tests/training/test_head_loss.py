"""The fused head cross-entropy equals the plain autograd form: loss, top-1 tokens and both
gradients, in float32 and under bf16 autocast, with missing labels and chunked rows."""

from __future__ import annotations

import pytest
import torch

from localspec.errors import InvalidParameterError
from localspec.training import head_loss
from localspec.training.head_loss import fused_head_ce


def _inputs(seed: int, n: int = 300, hidden: int = 48, vocab: int = 500, k: int = 4):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g)
    weight = torch.randn(vocab, hidden, generator=g) * 0.2
    ids = torch.randint(0, vocab, (n, k), generator=g)
    ids[torch.rand(n, k, generator=g) < 0.2] = -1  # labels outside the draft vocabulary
    ids[:5] = -1  # rows with no label at all
    p = torch.rand(n, k, generator=g).masked_fill(ids < 0, 0.0)
    q = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    row_w = (ids[:, 0] >= 0).float() * 0.8 / n
    return h, weight, ids, q, row_w


def _same_top(got: torch.Tensor, ref: torch.Tensor, logits: torch.Tensor) -> None:
    """Top-1 tokens agree on every row whose two best logits are not a near-tie (matmuls of
    other shapes may round the last bits differently on another CPU)."""
    best = logits.detach().topk(2, dim=-1).values
    clear = (best[:, 0] - best[:, 1]) > 1e-4
    assert int(clear.sum()) > 0.9 * len(clear)
    assert torch.equal(got[clear], ref[clear])


def _plain(h, weight, ids, q, row_w):
    logits = h @ weight.T
    lp = logits.float().log_softmax(-1).gather(-1, ids.clamp_min(0))
    return (row_w * -(q * lp).sum(-1)).sum(), logits.argmax(-1)


@pytest.mark.parametrize(("chunk", "block"), [(64, 128), (64, 4096), (4096, 4096)])
def test_fused_head_ce_matches_autograd_in_float32(monkeypatch, chunk, block):
    monkeypatch.setattr(head_loss, "CHUNK_ROWS", chunk)
    monkeypatch.setattr(head_loss, "GRAD_BLOCK", block)
    ref_in = [x.clone().requires_grad_(i < 2) for i, x in enumerate(_inputs(1))]
    got_in = [x.clone().requires_grad_(i < 2) for i, x in enumerate(_inputs(1))]
    ref, ref_top = _plain(*ref_in)
    got, got_top = fused_head_ce(*got_in)
    (3.0 * ref).backward()
    (3.0 * got).backward()
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-7)
    _same_top(got_top, ref_top, got_in[0] @ got_in[1].T)
    for a, b in zip(got_in[:2], ref_in[:2], strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-8)
        assert float(b.grad.abs().max()) > 0


def test_fused_head_ce_under_bf16_autocast():
    ref_in = [x.clone().requires_grad_(i < 2) for i, x in enumerate(_inputs(2))]
    got_in = [x.clone().requires_grad_(i < 2) for i, x in enumerate(_inputs(2))]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = _plain(*ref_in)
        got, _ = fused_head_ce(*got_in)
    ref.backward()
    got.backward()
    assert abs(got.item() - ref.item()) <= 1e-2 * abs(ref.item())
    for a, b in zip(got_in[:2], ref_in[:2], strict=True):
        assert a.grad is not None and b.grad is not None and a.grad.dtype == torch.float32
        rel = float((a.grad - b.grad).norm() / b.grad.norm())
        assert rel < 2e-2, rel


def test_fused_head_ce_without_gradients():
    h, weight, ids, q, row_w = _inputs(3)
    h.requires_grad_()
    with torch.no_grad():
        got, top = fused_head_ce(h, weight, ids, q, row_w)
    assert not got.requires_grad
    ref, ref_top = _plain(h.detach(), weight, ids, q, row_w)
    assert torch.allclose(got, ref, rtol=1e-5)
    _same_top(top, ref_top, h.detach() @ weight.T)


@pytest.mark.parametrize("trained", ["h", "weight"])
def test_fused_head_ce_with_one_side_frozen(trained):
    i = 0 if trained == "h" else 1
    ref_in = [x.clone().requires_grad_(j == i) for j, x in enumerate(_inputs(4))]
    got_in = [x.clone().requires_grad_(j == i) for j, x in enumerate(_inputs(4))]
    _plain(*ref_in)[0].backward()
    fused_head_ce(*got_in)[0].backward()
    assert got_in[1 - i].grad is None
    assert torch.allclose(got_in[i].grad, ref_in[i].grad, rtol=1e-4, atol=1e-8)


def test_fused_head_ce_refuses_trained_label_weights():
    h, weight, ids, q, row_w = _inputs(5)
    with pytest.raises(InvalidParameterError, match="constants"):
        fused_head_ce(h, weight, ids, q.requires_grad_(), row_w)
