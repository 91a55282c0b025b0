"""A PyTorch reference of the EAGLE-3 / EAGLE-3.1 drafter, on the checkpoint's own tensors.

Written in the Hugging Face layout (rotate-half RoPE, un-folded fc_norm weights), so that it
checks the converter's permutations and folds, not just llama.cpp against itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .formats import DrafterConfig, llama3_rope_factors


class TorchEagle3:
    """Teacher-forced and chained decoding with an explicit KV cache (float64 on the CPU)."""

    def __init__(
        self,
        dc: DrafterConfig,
        tensors: dict[str, Any],
        *,
        embed: np.ndarray,
        head: np.ndarray,
        d2t: np.ndarray | None,
        target_vocab: int,
    ) -> None:
        import torch

        self.torch = torch
        self.dc = dc
        self.t = {k: v.to(torch.float64) for k, v in tensors.items() if v.is_floating_point()}
        self.embed = torch.from_numpy(np.asarray(embed, dtype=np.float64))
        self.head = torch.from_numpy(np.asarray(head, dtype=np.float64))
        self.d2t = None if d2t is None else torch.from_numpy(np.asarray(d2t, dtype=np.int64))
        self.target_vocab = target_vocab
        hd = dc.hidden_size // dc.n_head
        inv = 1.0 / dc.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        if dc.rope_scaling is not None:
            inv = inv / torch.tensor(llama3_rope_factors(dc.rope_scaling, dc.rope_theta, hd))
        self.inv_freq = inv
        self.k_cache: list[Any] = []
        self.v_cache: list[Any] = []

    def _rms(self, x: Any, w: Any | None = None) -> Any:
        y = x / self.torch.sqrt((x * x).mean(-1, keepdim=True) + self.dc.rms_eps)
        return y if w is None else y * w

    def encode(self, taps: np.ndarray) -> np.ndarray:
        torch, t, f = self.torch, self.t, self.dc.flags
        a = torch.from_numpy(np.asarray(taps, dtype=np.float64))
        if f["fc_norm"]:  # EAGLE-3.1: one RMSNorm per tap, each with its own weight
            parts = a.chunk(3, dim=-1)
            a = torch.cat([self._rms(p, t[f"fc_norm.{i}.weight"]) for i, p in enumerate(parts)], -1)
        elif f["norm_before_fc"]:
            a = self._rms(a, t["input_norm.weight"])
        return (a @ t["fc.weight"].T).numpy()

    def _rotate(self, x: Any, pos: Any) -> Any:
        ang = pos[:, None].to(self.torch.float64) * self.inv_freq[None, :]
        cos = self.torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
        sin = self.torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        half = x.shape[-1] // 2
        rot = self.torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def decode(self, tokens: list[int], g: np.ndarray, pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows (token[i], g[i]) at positions pos0..; returns full-vocabulary logits and the
        state fed back to the next step (post-norm with norm_output), one row each."""
        torch, t, dc = self.torch, self.t, self.dc
        n = len(tokens)
        gg = torch.from_numpy(np.asarray(g, dtype=np.float64))
        e = self._rms(self.embed[torch.tensor(tokens)], t["L.input_layernorm.weight"])
        gn = self._rms(gg, t["L.hidden_norm.weight"])
        resid = gn if dc.flags["norm_before_residual"] else gg
        x = torch.cat([e, gn], -1)
        hd = dc.hidden_size // dc.n_head
        q = (x @ t["L.self_attn.q_proj.weight"].T).view(n, dc.n_head, hd)
        k = (x @ t["L.self_attn.k_proj.weight"].T).view(n, dc.n_head_kv, hd)
        v = (x @ t["L.self_attn.v_proj.weight"].T).view(n, dc.n_head_kv, hd)
        pos = torch.arange(pos0, pos0 + n)
        q, k = self._rotate(q, pos), self._rotate(k, pos)
        self.k_cache.append(k)
        self.v_cache.append(v)
        K, V = torch.cat(self.k_cache), torch.cat(self.v_cache)
        rep = dc.n_head // dc.n_head_kv
        K, V = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, K) / hd**0.5
        n_past = K.shape[0] - n
        mask = torch.arange(K.shape[0])[None, :] > (n_past + torch.arange(n))[:, None]
        scores = scores.masked_fill(mask[None], float("-inf"))
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), V).reshape(n, -1)
        h = att @ t["L.self_attn.o_proj.weight"].T + resid
        y = self._rms(h, t["L.post_attention_layernorm.weight"])
        gate = y @ t["L.mlp.gate_proj.weight"].T
        h = (
            h
            + (torch.nn.functional.silu(gate) * (y @ t["L.mlp.up_proj.weight"].T))
            @ t["L.mlp.down_proj.weight"].T
        )
        normed = self._rms(h, t["norm.weight"])
        z = normed @ self.head.T
        if self.d2t is not None:
            full = torch.full((n, self.target_vocab), float("-inf"), dtype=torch.float64)
            full[:, self.d2t] = z
            z = full
        fed = normed if dc.flags["norm_output"] else h
        return z.numpy(), fed.numpy()
