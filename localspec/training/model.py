"""The EAGLE-3 / EAGLE-3.1 drafter as a PyTorch module for training, in SpecForge's names.

Training-time test: the drafter is unrolled for several draft steps. Step j at row P sits at
position P + j, reads the true token x[P+1+j] and the state it produced itself at step j-1, and
attends to the step-0 keys of positions 0..P plus its own keys of steps 1..j at row P. That is
exactly what a chained draft from position P sees at run time, so one pass over a sequence
trains every draft depth without re-running anything token by token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    n_head: int
    n_head_kv: int
    target_hidden_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    context_length: int = 4096
    fc_norm: bool = True  # EAGLE-3.1: one RMSNorm per tap before fc
    norm_output: bool = True  # EAGLE-3.1: feed back the post-norm state
    n_taps: int = 3

    def as_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv = c.n_head, c.n_head_kv
        self.hd = c.hidden_size // c.n_head
        self.q_proj = nn.Linear(2 * c.hidden_size, c.n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.n_head_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.n_head_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(c.n_head * self.hd, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.mlp = MLP(c)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


ATTN_BLOCK = 512  # query rows per attention block in windows longer than 2 blocks


def _attention(
    q: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    scale: float,
    span: int | None = None,
) -> torch.Tensor:
    """Step j's attention (j = len(keys) - 1): every row attends causally to the step-0 keys
    (only the last `span` of them, as the runtime's attention window does) and to its own
    row's keys of steps 1..j. A long window goes in blocks of query rows, each recomputed in
    the backward pass instead of kept: the scores of a 3,584-row window over 5 unrolled steps
    would otherwise hold tens of GB for the backward pass."""
    T = q.shape[2]
    if T <= 2 * ATTN_BLOCK:
        return _attention_rows(q, keys, values, scale, 0, span)
    from torch.utils.checkpoint import checkpoint

    # copies of the lists: the recomputation runs in the backward pass, after later steps
    # have appended their keys to the caller's
    keys_j, values_j = tuple(keys), tuple(values)
    blocks = [
        checkpoint(
            _attention_rows,
            q[:, :, a : a + ATTN_BLOCK],
            keys_j,
            values_j,
            scale,
            a,
            span,
            use_reentrant=False,
            preserve_rng_state=False,  # nothing random inside
        )
        for a in range(0, T, ATTN_BLOCK)
    ]
    return torch.cat(blocks, 2)


def _attention_rows(
    q: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    scale: float,
    a: int,
    span: int | None = None,
) -> torch.Tensor:
    """_attention for the query rows a..a+n (q holds only those): the step-0 keys after row
    a+n-1 are masked for all of them, so they are left out."""
    n = q.shape[2]
    b = a + n
    rows = torch.arange(b, device=q.device)
    causal = rows[None, :] > rows[a:, None]  # True = masked
    if span is not None:  # and those more than span - 1 rows back
        causal = causal | (rows[None, :] <= rows[a:, None] - span)
    s0 = (q @ keys[0][:, :, :b].transpose(-1, -2)) * scale
    s0 = s0.masked_fill(causal, float("-inf"))
    j = len(keys) - 1
    extra = [(q * keys[i][:, :, a:b]).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]
    p = torch.cat([s0, *extra], -1).softmax(-1)
    att = p[..., :b] @ values[0][:, :, :b]
    for i in range(1, j + 1):
        att = att + p[..., b + i - 1 : b + i] * values[i][:, :, a:b]
    return att


class Eagle3Drafter(nn.Module):
    """Parameters carry the checkpoint names (fc, fc_norm.i, midlayer.*, norm, lm_head); the
    target's token embeddings are a frozen buffer that is not saved."""

    embed: torch.Tensor  # buffers, declared for the type checker
    inv_freq: torch.Tensor
    # step-0 keys each row attends to (None: all before it); estimates set it to judge a
    # drafter as the runtime's attention window runs it
    span: int | None = None

    def __init__(self, c: DraftConfig, embed: torch.Tensor) -> None:
        super().__init__()
        self.c = c
        self.fc = nn.Linear(c.n_taps * c.target_hidden_size, c.hidden_size, bias=False)
        self.fc_norm = nn.ModuleList(
            [RMSNorm(c.target_hidden_size, c.rms_eps) for _ in range(c.n_taps)] if c.fc_norm else []
        )
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("embed", embed, persistent=False)
        hd = c.hidden_size // c.n_head
        inv = 1.0 / c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        std = 0.02
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)

    def encode(self, taps: torch.Tensor) -> torch.Tensor:
        """g from the concatenated taps [..., n_taps * target_hidden]."""
        if self.c.fc_norm:
            parts = taps.chunk(self.c.n_taps, dim=-1)
            taps = torch.cat([n(p) for n, p in zip(self.fc_norm, parts, strict=True)], -1)
        return self.fc(taps)

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = pos[:, None].float() * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], -1)
        return ang.cos()[None, None], ang.sin()[None, None]

    def unroll(self, g: torch.Tensor, next_tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Run the training-time test: g [B, T, H] at rows P; next_tokens [B, T + steps - 1]
        holds x[P+1+j] at column P + j. Returns the post-norm states of every step."""
        c, L = self.c, self.midlayer
        a = L.self_attn
        B, T, H = g.shape
        rows = torch.arange(T, device=g.device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        rep = a.n_head // a.n_kv
        scale = 1.0 / math.sqrt(a.hd)
        hidden = g
        outs = []
        for j in range(steps):
            emb = self.embed[next_tokens[:, j : j + T]]
            hn = L.hidden_norm(hidden)
            x = torch.cat([L.input_layernorm(emb), hn], -1)
            q = a.q_proj(x).view(B, T, a.n_head, a.hd).transpose(1, 2)
            k = a.k_proj(x).view(B, T, a.n_kv, a.hd).transpose(1, 2)
            v = a.v_proj(x).view(B, T, a.n_kv, a.hd).transpose(1, 2)
            cos, sin = self._rope(rows + j)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            keys.append(k)
            values.append(v)
            att = _attention(q, keys, values, scale, self.span)
            h = a.o_proj(att.transpose(1, 2).reshape(B, T, -1)) + hidden
            h = h + L.mlp(L.post_attention_layernorm(h))
            normed = self.norm(h)
            outs.append(normed)
            hidden = normed if c.norm_output else h
        return outs

    # --- initialisation from the target ------------------------------------------------------

    @torch.no_grad()
    def init_from_target(
        self,
        w: dict[str, np.ndarray],
        draft_ids: np.ndarray,
        tap_rms: np.ndarray | None,
        top: int | None,
    ) -> None:
        """Start from the target instead of noise: its output head rows and final norm give a
        head that already maps states to the right tokens. With `top`, also copy the target's
        top layer (the hidden-state halves of q/k/v) and let fc pass the deepest tap through;
        that layer predicts the token after P, which the drafter already has as input, not the
        one after P+1, so it is not the default."""
        c, L, H = self.c, self.midlayer, self.c.hidden_size

        def t(name: str) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(w[name], dtype=np.float32))

        head = t("output.weight") if "output.weight" in w else t("token_embd.weight")
        self.lm_head.weight.copy_(head[torch.from_numpy(draft_ids.astype(np.int64))])
        self.norm.weight.copy_(t("output_norm.weight"))
        if top is None:
            return
        p = f"blk.{top}."
        L.input_layernorm.weight.copy_(t(p + "attn_norm.weight"))
        L.hidden_norm.weight.copy_(t(p + "attn_norm.weight"))
        hd = H // c.n_head
        for proj, name, heads in (
            (L.self_attn.q_proj, "attn_q.weight", c.n_head),
            (L.self_attn.k_proj, "attn_k.weight", c.n_head_kv),
            (L.self_attn.v_proj, "attn_v.weight", 0),
        ):
            m = t(p + name)
            if heads:  # llama.cpp stores q/k permuted for its RoPE; undo it
                m = m.view(heads, hd // 2, 2, H).transpose(1, 2).reshape(heads * hd, H)
            proj.weight[:, H:].copy_(m)
        L.self_attn.o_proj.weight.copy_(t(p + "attn_output.weight"))
        L.post_attention_layernorm.weight.copy_(t(p + "ffn_norm.weight"))
        L.mlp.gate_proj.weight.copy_(t(p + "ffn_gate.weight"))
        L.mlp.up_proj.weight.copy_(t(p + "ffn_up.weight"))
        L.mlp.down_proj.weight.copy_(t(p + "ffn_down.weight"))
        fc = torch.zeros_like(self.fc.weight)
        last = (c.n_taps - 1) * c.target_hidden_size
        fc[:, last : last + H] = torch.eye(H)
        self.fc.weight.copy_(fc)
        if c.fc_norm and tap_rms is not None:  # keep the deepest tap at its natural scale
            deepest = self.fc_norm[c.n_taps - 1]
            assert isinstance(deepest, RMSNorm)
            deepest.weight.fill_(float(tap_rms[c.n_taps - 1]))
