"""An independent numpy reference of the EAGLE-3 / EAGLE-3.1 drafter equations.

Written from the equations (EAGLE-3 paper, EAGLE-3.1 release notes), not from llama.cpp's
graph: weights are read back from the GGUF with gguf-py, RoPE is llama's adjacent-pair form.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader


def rms(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def read_tensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    r = GGUFReader(path)
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        tensors[t.name] = np.array(t.data).reshape(shape)
    return tensors, metadata(r)


def metadata(r: GGUFReader) -> dict[str, object]:
    """A GGUF's metadata values, tokenizer arrays left out."""
    meta: dict[str, object] = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer."):
            continue
        try:
            meta[k] = f.contents()
        except Exception:
            continue
    return meta


class RefDrafter:
    """The drafter as equations, with its own KV cache (a list of k/v per position)."""

    def __init__(self, path: str, target_tok_embd: np.ndarray, target_output: np.ndarray):
        t, m = read_tensors(path)
        self.t = {k: v.astype(np.float64) for k, v in t.items() if k != "d2t"}
        self.d2t = t.get("d2t")
        self.eps = float(m["eagle3.attention.layer_norm_rms_epsilon"])
        self.n_head = int(m["eagle3.attention.head_count"])
        self.n_head_kv = int(m["eagle3.attention.head_count_kv"])
        self.theta = float(m["eagle3.rope.freq_base"])
        self.norm_before_fc = bool(m.get("eagle3.norm_before_fc", False))
        self.norm_before_residual = bool(m.get("eagle3.norm_before_residual", False))
        self.fc_norm = bool(m.get("localspec.eagle3.fc_norm", False))
        self.fc_norm_eps = float(m.get("localspec.eagle3.fc_norm_eps", self.eps))
        self.norm_output = bool(m.get("localspec.eagle3.norm_output", False))
        self.emb = self.t.get("token_embd.weight", target_tok_embd.astype(np.float64))
        self.head = self.t.get("output.weight", target_output.astype(np.float64))
        self.n_vocab = target_tok_embd.shape[0]
        self.k_cache: dict[int, np.ndarray] = {}
        self.v_cache: dict[int, np.ndarray] = {}

    # g = W_fc [RMS_0(a_0); RMS_1(a_1); RMS_2(a_2)]   (3.1 fc_norm, weights folded into W_fc)
    # g = W_fc (w_enc * RMS(a))                        (norm_before_fc)
    # g = W_fc a                                       (EAGLE-3)
    def encode(self, taps: np.ndarray) -> np.ndarray:
        a = taps.astype(np.float64)
        if self.fc_norm:
            w = a.shape[-1] // 3
            a = np.concatenate(
                [rms(a[..., i * w : (i + 1) * w], self.fc_norm_eps) for i in range(3)], -1
            )
        elif self.norm_before_fc:
            a = rms(a, self.eps) * self.t["enc.output_norm.weight"]
        return a @ self.t["fc.weight"].T

    def _rope(self, x: np.ndarray, pos: int) -> np.ndarray:
        # x: [heads, head_dim]; llama (NORM) RoPE rotates adjacent pairs (2i, 2i+1)
        hd = x.shape[-1]
        inv = self.theta ** (-np.arange(0, hd, 2) / hd)
        if "rope_freqs.weight" in self.t:  # llama3-style scaling divides each frequency
            inv = inv / self.t["rope_freqs.weight"]
        ang = pos * inv
        c, s = np.cos(ang), np.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def decode(
        self, token: int, g: np.ndarray, pos: int, *, low: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decoder row at `pos`, attending to the cached positions low..pos (an attention
        window: low > 0); returns (logits over the target vocabulary, h pre-norm)."""
        t, eps = self.t, self.eps
        g = g.astype(np.float64)
        e = rms(self.emb[token], eps) * t["blk.0.attn_norm.weight"]
        gn = rms(g, eps) * t["blk.0.attn_norm_2.weight"]
        resid = gn if self.norm_before_residual else g
        x = np.concatenate([e, gn])
        hd = t["blk.0.attn_q.weight"].shape[0] // self.n_head
        q = (t["blk.0.attn_q.weight"] @ x).reshape(self.n_head, hd)
        k = (t["blk.0.attn_k.weight"] @ x).reshape(self.n_head_kv, hd)
        v = (t["blk.0.attn_v.weight"] @ x).reshape(self.n_head_kv, hd)
        self.k_cache[pos] = self._rope(k, pos)
        self.v_cache[pos] = v
        q = self._rope(q, pos)
        ps = sorted(p for p in self.k_cache if low <= p <= pos)
        K = np.stack([self.k_cache[p] for p in ps])  # [T, kv, hd]
        V = np.stack([self.v_cache[p] for p in ps])
        rep = self.n_head // self.n_head_kv
        out = np.empty((self.n_head, hd))
        for h in range(self.n_head):
            sc = K[:, h // rep] @ q[h] / np.sqrt(hd)
            w = np.exp(sc - sc.max())
            out[h] = (w / w.sum()) @ V[:, h // rep]
        ffn_inp = t["blk.0.attn_output.weight"] @ out.reshape(-1) + resid
        y = rms(ffn_inp, eps) * t["blk.0.ffn_norm.weight"]
        ff = t["blk.0.ffn_down.weight"] @ (
            silu(t["blk.0.ffn_gate.weight"] @ y) * (t["blk.0.ffn_up.weight"] @ y)
        )
        h_pre = ffn_inp + ff
        z = self.head @ (rms(h_pre, eps) * t["output_norm.weight"])
        if self.d2t is not None:
            full = np.full(self.n_vocab, -np.inf)
            full[self.d2t] = z
            z = full
        return z, h_pre

    def feedback(self, h_pre: np.ndarray) -> np.ndarray:
        # EAGLE-3.1 norm_output: the next step sees the post-norm state
        if self.norm_output:
            return rms(h_pre, self.eps) * self.t["output_norm.weight"]
        return h_pre

    def truncate(self, n_keep: int) -> None:
        for p in [p for p in self.k_cache if p >= n_keep]:
            del self.k_cache[p], self.v_cache[p]
