"""An independent numpy reference of the target forward pass for llama, qwen2 and gemma3 GGUFs.

Written from each architecture's equations (Llama; Qwen2 = Llama + q/k/v biases + NEOX RoPE;
Gemma 3 = scaled embeddings, sandwich norms, q/k norms, GELU-tanh FFN, 5:1 sliding/global layers
with their own RoPE bases), not by calling llama.cpp. Weights are read back with gguf-py
(quantized ones dequantized), all arithmetic is float64.

`RefTarget(path).forward(tokens)` returns the hidden state entering every layer and the logits for
tokens at positions 0..n-1. `inputs[L]` is what layer L reads: for L >= 1 the output of layer L-1,
which llama.cpp's graph names `l_out-(L-1)`; for L = 0 the token embedding (times sqrt(n_embd) on
gemma3, llama.cpp's `inp_scaled`).

One deliberate concession to the CPU backend: ggml evaluates GELU through a float16 lookup table
(the input rounded to f16, the table's value is an f16), so `gelu` does the same by default; the
exact tanh-GELU is `gelu_tanh` (set `ref.gelu = gelu_tanh` to see the difference it makes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from helpers.reference import metadata

ARCHS = ("llama", "qwen2", "gemma3")


@dataclass(frozen=True)
class TargetPass:
    inputs: np.ndarray  # [n_layer, n_tokens, n_embd]: the hidden state entering each layer
    logits: np.ndarray  # [n_tokens, n_vocab]


def rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    # Gemma's gelu_pytorch_tanh
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def gelu_f16_table(x: np.ndarray) -> np.ndarray:
    """tanh-GELU as ggml's CPU backend evaluates it: f16 input, f16 result, identity/zero
    beyond +-10."""
    x16 = x.astype(np.float32).astype(np.float16).astype(np.float64)
    y = gelu_tanh(x16).astype(np.float32).astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def read_gguf(path: str) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """Tensors as float64 arrays in math order ([out, in] for matrices) and the metadata."""
    r = GGUFReader(path)
    tensors: dict[str, np.ndarray] = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            a = np.asarray(t.data)
        else:
            a = dequantize(np.asarray(t.data), t.tensor_type)
        tensors[t.name] = a.reshape(shape).astype(np.float64)
    return tensors, metadata(r)


def rope(x: np.ndarray, pos: np.ndarray, base: float, n_rot: int, neox: bool) -> np.ndarray:
    """Rotary embedding of x [T, heads, hd] at positions pos [T]. NEOX pairs dimension i with
    i + n_rot/2 (qwen2, gemma3); llama pairs 2i with 2i+1. Dimensions past n_rot pass through."""
    inv = base ** (-np.arange(0, n_rot, 2) / n_rot)
    ang = pos[:, None, None] * inv[None, None, :]  # [T, 1, n_rot/2]
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    if neox:
        a, b = x[..., : n_rot // 2], x[..., n_rot // 2 : n_rot]
        out[..., : n_rot // 2] = a * c - b * s
        out[..., n_rot // 2 : n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * c - b * s
        out[..., 1:n_rot:2] = a * s + b * c
    return out


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int | None):
    """Causal attention for q [T, H, hd] over k, v [T, H_kv, hd]; query head h reads kv head
    h // (H / H_kv). With a window W, position i sees positions i-W+1..i."""
    n, n_head, _ = q.shape
    rep = n_head // k.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    out = np.empty((n, n_head, v.shape[2]))
    for h in range(n_head):
        sc = (q[:, h] @ k[:, h // rep].T) * scale
        sc = np.where(allowed, sc, -np.inf)
        w = np.exp(sc - sc.max(axis=1, keepdims=True))
        out[:, h] = (w / w.sum(axis=1, keepdims=True)) @ v[:, h // rep]
    return out


class RefTarget:
    """The target as equations. Its hyperparameters are plain attributes read from the GGUF, so a
    test can change one (embed_scale, windows, rope_bases, softcap, gelu, neox) or drop a tensor
    from `t` and see that the reference then disagrees with llama.cpp."""

    def __init__(self, path: str) -> None:
        self.t, m = read_gguf(path)
        arch = str(m["general.architecture"])
        if arch not in ARCHS:
            raise ValueError(f"{path}: the reference knows {', '.join(ARCHS)}, not {arch}")
        self.arch = arch

        def key(name: str, default: object = None) -> object:
            v = m.get(f"{arch}.{name}", default)
            if v is None:
                raise ValueError(f"{path}: no {arch}.{name}")
            return v

        self.n_layer = int(key("block_count"))  # type: ignore[call-overload]
        self.n_embd = int(key("embedding_length"))  # type: ignore[call-overload]
        self.n_head = int(key("attention.head_count"))  # type: ignore[call-overload]
        self.n_head_kv = int(key("attention.head_count_kv", self.n_head))  # type: ignore[call-overload]
        self.head_dim = int(key("attention.key_length", self.n_embd // self.n_head))  # type: ignore[call-overload]
        self.n_rot = int(key("rope.dimension_count", self.head_dim))  # type: ignore[call-overload]
        self.eps = float(key("attention.layer_norm_rms_epsilon"))  # type: ignore[arg-type]
        base = float(key("rope.freq_base", 10000.0))  # type: ignore[arg-type]
        self.neox = arch != "llama"
        self.rope_bases = [base] * self.n_layer
        self.windows: list[int | None] = [None] * self.n_layer
        self.embed_scale = 1.0
        self.softcap: float | None = None
        self.attn_scale = 1.0 / np.sqrt(self.head_dim)
        self.gelu: Callable[[np.ndarray], np.ndarray] = gelu_f16_table
        if arch == "gemma3":
            self.embed_scale = float(np.float32(np.sqrt(self.n_embd)))
            window = int(key("attention.sliding_window", 0))  # type: ignore[call-overload]
            if window > 0:
                # Gemma 3: 5 sliding-window layers, then one global (unless the file says)
                pattern = m.get(f"{arch}.attention.sliding_window_pattern", 6)
                if isinstance(pattern, list):
                    sliding = [bool(p) for p in pattern]
                else:
                    n = int(pattern)  # type: ignore[call-overload]
                    sliding = [n == 0 or il % n < n - 1 for il in range(self.n_layer)]
                local_base = float(key("rope.freq_base_swa", 10000.0))  # type: ignore[arg-type]
                for il in range(self.n_layer):
                    if sliding[il]:
                        self.windows[il] = window
                        self.rope_bases[il] = local_base
            cap = m.get(f"{arch}.final_logit_softcapping")
            self.softcap = float(cap) if cap else None  # type: ignore[arg-type]
            if self.n_layer == 62:  # Gemma 3 27B: query_pre_attn_scalar = n_embd / n_head
                self.attn_scale = 1.0 / np.sqrt(self.n_embd / self.n_head)
        unknown = [n for n in self.t if not self._known(n)]
        if unknown:
            raise ValueError(f"{path}: the reference does not know {', '.join(unknown[:5])}")

    def _known(self, name: str) -> bool:
        if name in ("token_embd.weight", "output_norm.weight", "output.weight", "output.bias"):
            return True
        parts = name.split(".", 2)
        own = {
            "llama": set(),
            "qwen2": {"attn_q.bias", "attn_k.bias", "attn_v.bias"},
            "gemma3": {
                "attn_q_norm.weight",
                "attn_k_norm.weight",
                "post_attention_norm.weight",
                "post_ffw_norm.weight",
            },
        }[self.arch]
        common = {
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
        }
        return parts[0] == "blk" and len(parts) == 3 and parts[2] in common | own

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.t[f"{name}.weight"].T
        b = self.t.get(f"{name}.bias")
        return y if b is None else y + b

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return rms(x, self.eps) * self.t[name]

    def _attention(self, il: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        n, hd = h.shape[0], self.head_dim
        q = self._linear(h, p + "attn_q").reshape(n, self.n_head, hd)
        k = self._linear(h, p + "attn_k").reshape(n, self.n_head_kv, hd)
        v = self._linear(h, p + "attn_v").reshape(n, self.n_head_kv, hd)
        if p + "attn_q_norm.weight" in self.t:  # gemma3: RMS-normalise each head
            q = self._norm(q, p + "attn_q_norm.weight")
        if p + "attn_k_norm.weight" in self.t:
            k = self._norm(k, p + "attn_k_norm.weight")
        q = rope(q, pos, self.rope_bases[il], self.n_rot, self.neox)
        k = rope(k, pos, self.rope_bases[il], self.n_rot, self.neox)
        o = attend(q, k, v, self.attn_scale, self.windows[il])
        return self._linear(o.reshape(n, -1), p + "attn_output")

    def _ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        act = self.gelu if self.arch == "gemma3" else silu
        gate = act(self._linear(h, p + "ffn_gate"))
        return self._linear(gate * self._linear(h, p + "ffn_up"), p + "ffn_down")

    def _layer(self, il: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        a = self._attention(il, self._norm(x, p + "attn_norm.weight"), pos)
        if self.arch == "gemma3":  # sandwich norms: each branch is normalised before it is added
            x = x + self._norm(a, p + "post_attention_norm.weight")
            f = self._ffn(il, self._norm(x, p + "ffn_norm.weight"))
            return x + self._norm(f, p + "post_ffw_norm.weight")
        x = x + a
        return x + self._ffn(il, self._norm(x, p + "ffn_norm.weight"))

    def forward(self, tokens: Sequence[int]) -> TargetPass:
        """Tokens at positions 0..n-1 of an empty context."""
        ids = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(len(ids), dtype=np.float64)
        x = self.t["token_embd.weight"][ids] * self.embed_scale
        inputs = []
        for il in range(self.n_layer):
            inputs.append(x)
            x = self._layer(il, x, pos)
        head = self.t.get("output.weight", self.t["token_embd.weight"])  # tied when absent
        logits = self._norm(x, "output_norm.weight") @ head.T
        if "output.bias" in self.t:
            logits = logits + self.t["output.bias"]
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return TargetPass(inputs=np.stack(inputs), logits=logits)


def reference_forward(path: str, tokens: Sequence[int]) -> TargetPass:
    """`RefTarget(path).forward(tokens)`, for one-off use."""
    return RefTarget(path).forward(tokens)
