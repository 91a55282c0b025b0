"""Tiny GGUF targets and eagle3 drafters, written with `gguf` so tests download nothing.

The target is a real `llama` GGUF with a byte-level BPE tokenizer (GPT-2 style, 256 byte tokens
plus a few merges and ChatML specials) and a ChatML chat template.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import gguf
import numpy as np

from localspec.converters.eagle3_gguf import Eagle3Config, write_eagle3_gguf

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def vocab() -> tuple[list[str], list[int]]:
    tokens = _byte_tokens() + ["".join(m.split()) for m in MERGES] + SPECIALS
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)  # 1 normal, 3 control
    return tokens, types


N_VOCAB = len(vocab()[0])
EOS = N_VOCAB - 3  # <|endoftext|>


@dataclass(frozen=True)
class TargetShape:
    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    arch: str = "llama"


def _add_tokenizer(w: gguf.GGUFWriter, chat_template: str = CHATML) -> None:
    tokens, types = vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(EOS)
    w.add_eos_token_id(EOS)
    w.add_add_bos_token(False)
    if chat_template:  # "" writes a model without one
        w.add_chat_template(chat_template)


def write_target(
    path: str,
    shape: TargetShape = TargetShape(),
    *,
    seed: int = 0,
    weights: dict | None = None,
    chat_template: str = CHATML,
    zeros: bool = False,
    kv: dict | None = None,
) -> str:
    """A random llama target; ``weights`` overrides tensors by GGUF name. zeros: matrices of
    zeros instead (a large model whose weights do not matter, made in seconds: a dense
    kernel costs the same for any values). kv: more metadata (general.sampling.*, ...):
    floats as f32, ints as i32, strings as strings."""
    rng = np.random.default_rng(seed)
    s = shape
    hd = s.n_embd // s.n_head

    def rnd(*shape_: int, scale: float = 1.0) -> np.ndarray:
        if zeros:
            return np.zeros(shape_, dtype=np.float32)
        return (rng.standard_normal(shape_) * scale / np.sqrt(shape_[-1])).astype(np.float32)

    head = rnd(N_VOCAB, s.n_embd, scale=4.0)
    head[-len(SPECIALS) :] = 0.0  # specials score 0 and so never win: long runs never end early
    t: dict[str, np.ndarray] = {
        "token_embd.weight": rnd(N_VOCAB, s.n_embd, scale=np.sqrt(s.n_embd)),
        "output_norm.weight": np.ones(s.n_embd, dtype=np.float32),
        "output.weight": head,
    }
    for i in range(s.n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(s.n_embd, dtype=np.float32)
        t[f"blk.{i}.attn_q.weight"] = rnd(s.n_head * hd, s.n_embd)
        t[f"blk.{i}.attn_k.weight"] = rnd(s.n_head_kv * hd, s.n_embd)
        t[f"blk.{i}.attn_v.weight"] = rnd(s.n_head_kv * hd, s.n_embd)
        t[f"blk.{i}.attn_output.weight"] = rnd(s.n_embd, s.n_head * hd)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(s.n_embd, dtype=np.float32)
        t[f"blk.{i}.ffn_gate.weight"] = rnd(s.n_ff, s.n_embd)
        t[f"blk.{i}.ffn_up.weight"] = rnd(s.n_ff, s.n_embd)
        t[f"blk.{i}.ffn_down.weight"] = rnd(s.n_embd, s.n_ff)
    t.update(weights or {})

    w = gguf.GGUFWriter(path, s.arch)
    w.add_name("tiny test target")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_rope_freq_base(s.rope_theta)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(N_VOCAB)
    for key, value in (kv or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_int32(key, value)
        else:
            w.add_float32(key, value)
    _finish(w, t, chat_template)
    return path


def _finish(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], chat_template: str) -> None:
    """Tokenizer, chat template and f32 tensors, then write and close."""
    w.add_file_type(0)
    _add_tokenizer(w, chat_template)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# small enough that the tiny head's frequencies fall in all three bands
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@dataclass(frozen=True)
class DrafterShape:
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    taps: tuple[int, int, int] = (1, 2, 3)
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    own_embeddings: bool = False  # carry token_embd/output instead of borrowing the target's
    draft_vocab: int | None = None  # with d2t: the first draft_vocab... ids chosen at random
    llama3_rope: bool = False  # llama3 rope scaling (a rope_freqs tensor)
    attention_window: int | None = None  # the recorded training window (localspec's key)


def drafter_tensors(
    ds: DrafterShape, target_hidden: int, *, seed: int = 1, scale: float = 1.0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = ds.n_embd
    hd = d // ds.n_head

    def rnd(*shape_: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape_) * s * scale / np.sqrt(shape_[-1])).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {
        "fc.weight": rnd(d, 3 * target_hidden, s=np.sqrt(3.0)),
        "output_norm.weight": norm_w(d),
        "blk.0.attn_norm.weight": norm_w(d),
        "blk.0.attn_norm_2.weight": norm_w(d),
        "blk.0.attn_q.weight": rnd(ds.n_head * hd, 2 * d),
        "blk.0.attn_k.weight": rnd(ds.n_head_kv * hd, 2 * d),
        "blk.0.attn_v.weight": rnd(ds.n_head_kv * hd, 2 * d),
        "blk.0.attn_output.weight": rnd(d, ds.n_head * hd),
        "blk.0.ffn_norm.weight": norm_w(d),
        "blk.0.ffn_gate.weight": rnd(ds.n_ff, d),
        "blk.0.ffn_up.weight": rnd(ds.n_ff, d),
        "blk.0.ffn_down.weight": rnd(d, ds.n_ff),
    }
    if ds.norm_before_fc:
        t["enc.output_norm.weight"] = norm_w(3 * target_hidden)
    if ds.llama3_rope:
        from localspec.converters.formats import llama3_rope_factors

        f = llama3_rope_factors(LLAMA3_SCALING, 10000.0, hd)
        t["rope_freqs.weight"] = np.array(f, dtype=np.float32)
    n_out = ds.draft_vocab or N_VOCAB
    if ds.own_embeddings or ds.draft_vocab:
        t["output.weight"] = rnd(n_out, d, s=4.0)
    if ds.own_embeddings:
        t["token_embd.weight"] = rnd(N_VOCAB, d, s=np.sqrt(d))
    if ds.draft_vocab:
        ids = np.sort(rng.choice(N_VOCAB, size=ds.draft_vocab, replace=False))
        t["d2t"] = ids.astype(np.int64)
    return t


def write_drafter(
    path: str,
    target_path: str,
    ds: DrafterShape = DrafterShape(),
    *,
    target: TargetShape = TargetShape(),
    seed: int = 1,
    tensors: dict[str, np.ndarray] | None = None,
    localspec_keys: bool = True,
) -> str:
    cfg = Eagle3Config(
        n_embd=ds.n_embd,
        n_ff=ds.n_ff,
        n_head=ds.n_head,
        n_head_kv=ds.n_head_kv,
        rms_eps=1e-5,
        rope_theta=10000.0,
        context_length=target.n_ctx,
        target_layers=ds.taps,
        target_hidden=target.n_embd,
        norm_before_fc=ds.norm_before_fc,
        norm_before_residual=ds.norm_before_residual,
        fc_norm=ds.fc_norm,
        norm_output=ds.norm_output,
        attention_window=ds.attention_window,
    )
    t = tensors if tensors is not None else drafter_tensors(ds, target.n_embd, seed=seed)
    write_eagle3_gguf(path, cfg, t, target_path, localspec_keys=localspec_keys)
    return path


# --- a pair built to agree -------------------------------------------------------------------
# The target is a bigram "counter": embeddings are one-hot, every layer adds nothing (zero
# output projections), and the head maps token t to sigma(t), the next letter a..z cyclically.
# The drafter reads t_P from the taps (g = one-hot of t_P), its FFN maps one-hot(t) to
# one-hot(sigma(t)) on the residual, and its head predicts sigma of that: sigma^2(t_P) = the
# token after next, which is exactly what the target will say. Feeding h back continues the
# chain, so the drafter agrees with the target at every depth.

AGREE_EMBD = 288  # >= N_VOCAB so every token has its own one-hot direction
LETTERS = [ord(c) for c in "abcdefghijklmnopqrstuvwxyz"]


def sigma() -> np.ndarray:
    s = np.array(LETTERS[0:1] * N_VOCAB)  # everything else goes to 'a'
    for i, c in enumerate(LETTERS):
        s[c] = LETTERS[(i + 1) % len(LETTERS)]
    return s


def write_agreeing_pair(
    folder: str,
    *,
    break_at: int | None = None,
    head_noise: float = 0.0,
    eos_after: int | None = None,
    name: str = "agree",
    shape: TargetShape | None = None,
    head_scale: float = 4.0,
) -> tuple[str, str]:
    """Target and drafter that agree; with break_at=c the drafter is wrong after letter c.
    head_noise adds random logits to the (shared) head, so sampling has real choices;
    head_scale scales the head (a small one spreads the distribution at temperature 1, where
    llama.cpp's top-p, typical-p and min-p judge it).
    shape: a target of that size (n_embd >= N_VOCAB) whose layers are zeros, as costly to run
    as a real model of its shape (benchmarks)."""
    ts = shape or TargetShape(n_embd=AGREE_EMBD, n_layer=4, n_head=4, n_head_kv=4, n_ff=32)
    d = ts.n_embd
    sg = sigma()
    if eos_after is not None:
        sg[eos_after] = EOS
    eye = np.eye(N_VOCAB, d, dtype=np.float32)
    head = np.zeros((N_VOCAB, d), dtype=np.float32)
    head[sg, np.arange(N_VOCAB)] = 1.0  # logit of sigma(t) is high for one-hot(t)
    if head_noise:
        head += np.random.default_rng(5).standard_normal(head.shape).astype(np.float32) * head_noise
    w: dict[str, np.ndarray] = {"token_embd.weight": eye, "output.weight": head * head_scale}
    for i in range(ts.n_layer):
        w[f"blk.{i}.attn_output.weight"] = np.zeros((d, d), dtype=np.float32)
        w[f"blk.{i}.ffn_down.weight"] = np.zeros((d, ts.n_ff), dtype=np.float32)
    tpath = write_target(os.path.join(folder, f"{name}.gguf"), ts, weights=w, zeros=bool(shape))

    heads = (4, 4) if shape is None else (shape.n_head, shape.n_head_kv)
    ds = DrafterShape(
        n_embd=d, n_head=heads[0], n_head_kv=heads[1], n_ff=N_VOCAB, taps=(0, 1, 2),
        own_embeddings=False,
    )  # fmt: skip
    t = drafter_tensors(ds, d, seed=3)
    fc = np.zeros((d, 3 * d), dtype=np.float32)
    fc[:, :d] = np.eye(d)  # g = the first tap = one-hot(t_P)
    t["fc.weight"] = fc
    t["blk.0.attn_output.weight"] = np.zeros((d, d), dtype=np.float32)  # attention adds nothing
    for norm_name in (
        "output_norm.weight",
        "blk.0.attn_norm.weight",
        "blk.0.attn_norm_2.weight",
        "blk.0.ffn_norm.weight",
    ):
        t[norm_name] = np.ones(d, dtype=np.float32)
    # FFN on x = rms_norm(one-hot(t)) = sqrt(d) * one-hot(t): gate/up pick coordinate t,
    # down writes one-hot(sigma(t)) - one-hot(t), so h = one-hot(sigma(t)).
    big = 8.0
    t["blk.0.ffn_gate.weight"] = (np.eye(N_VOCAB, d) * big).astype(np.float32)
    t["blk.0.ffn_up.weight"] = np.eye(N_VOCAB, d, dtype=np.float32)
    xi = np.sqrt(d)
    act = xi * big / (1 + np.exp(-xi * big)) * xi  # silu(gate x) * up x at the hot coordinate
    down = np.zeros((d, N_VOCAB), dtype=np.float32)
    for tok in range(N_VOCAB):
        nxt = sg[tok]
        if break_at is not None and tok == break_at:
            nxt = LETTERS[0]  # a deliberate disagreement
        down[nxt, tok] += 1.0 / act
        down[tok, tok] -= 1.0 / act
    t["blk.0.ffn_down.weight"] = down
    ds_path = os.path.join(folder, f"{name}.eagle3.gguf")
    write_drafter(ds_path, tpath, ds, target=ts, tensors=t)
    return tpath, ds_path


# --- a target whose taps differ per layer ------------------------------------------------------
# The agreeing target's layers add nothing, so every tap holds the same state and no tap
# numbering can be told from another. Here every layer's FFN replaces the one-hot code of the
# token by its image under a random permutation of its own, so the input of layer L is
# one-hot(pi_{L-1}(...pi_0(t))) and each layer's tap speaks another code. The head maps the
# last code to sigma(t) (with noise, so a few letters go elsewhere). `scale` multiplies the
# residual stream, as the large activations of real targets do: an EAGLE-3 drafter trained on
# it carries a large state, which is what tells its pre-norm feedback from EAGLE-3.1's.


def _permuting_ffn(perm: np.ndarray, d: int, scale: float) -> dict[str, np.ndarray]:
    """gate/up pick coordinate t of rms_norm(x) = sqrt(d) * one-hot(t); down writes
    scale * (one-hot(perm[t]) - one-hot(t)), so x = scale * one-hot(t) leaves as
    scale * one-hot(perm[t])."""
    big = 8.0
    xi = np.sqrt(d)
    act = xi * big / (1 + np.exp(-xi * big)) * xi  # silu(gate x) * up x at the hot coordinate
    down = np.zeros((d, N_VOCAB), dtype=np.float32)
    down[perm, np.arange(N_VOCAB)] += scale / act
    down[np.arange(N_VOCAB), np.arange(N_VOCAB)] -= scale / act
    return {
        "ffn_gate.weight": (np.eye(N_VOCAB, d) * big).astype(np.float32),
        "ffn_up.weight": np.eye(N_VOCAB, d, dtype=np.float32),
        "ffn_down.weight": down,
    }


def write_relay_target(
    path: str, *, n_layer: int = 6, scale: float = 1000.0, head_noise: float = 0.3, seed: int = 7
) -> str:
    d = AGREE_EMBD
    ts = TargetShape(n_embd=d, n_layer=n_layer, n_head=4, n_head_kv=4, n_ff=N_VOCAB)
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {"token_embd.weight": np.eye(N_VOCAB, d, dtype=np.float32) * scale}
    code = np.arange(N_VOCAB)  # the code of token t after the layers so far
    for i in range(n_layer):
        perm = rng.permutation(N_VOCAB)
        w[f"blk.{i}.attn_output.weight"] = np.zeros((d, d), dtype=np.float32)
        for name, arr in _permuting_ffn(perm, d, scale).items():
            w[f"blk.{i}.{name}"] = arr
        code = perm[code]
    head = np.zeros((N_VOCAB, d), dtype=np.float32)
    head[sigma(), code] = 1.0
    head += rng.standard_normal(head.shape).astype(np.float32) * head_noise
    w["output.weight"] = head * 4.0
    return write_target(path, ts, weights=w)


# --- targets of architectures llama.cpp's staging API cannot tap ---------------------------------
# Random weights with every part of the architecture switched on and large enough to matter: a
# reference that forgets a bias, a norm weight, the embedding scale, the sliding window or a
# layer's RoPE base gets the logits visibly wrong. Same tokenizer and chat template as above.


def _rng_tensors(
    seed: int,
) -> tuple[
    Callable[..., np.ndarray], Callable[[int], np.ndarray], Callable[[int, float], np.ndarray]
]:
    """Random matrices (scaled by 1/sqrt(fan-in)), norm weights around 1, and biases."""
    rng = np.random.default_rng(seed)

    def rnd(*shape_: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape_) * scale / np.sqrt(shape_[-1])).astype(np.float32)

    def around_one(n: int) -> np.ndarray:  # a norm weight that is not all ones
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(n) * scale).astype(np.float32)

    return rnd, around_one, bias


@dataclass(frozen=True)
class Qwen2Shape:
    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx: int = 2048
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tied: bool = False  # no output.weight: the head is token_embd (Qwen2.5 up to 3B)


def write_qwen2_target(
    path: str,
    shape: Qwen2Shape = Qwen2Shape(),
    *,
    seed: int = 0,
    weights: dict[str, np.ndarray] | None = None,
    chat_template: str = CHATML,
) -> str:
    """A random `qwen2` target: llama's block with q/k/v biases and NEOX RoPE."""
    s = shape
    hd = s.n_embd // s.n_head
    rnd, around_one, bias = _rng_tensors(seed)
    emb = rnd(N_VOCAB, s.n_embd, scale=4.0)
    emb[-len(SPECIALS) :] = 0.0  # specials score 0 when tied, so long runs never end early
    t: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "output_norm.weight": around_one(s.n_embd),
    }
    if not s.tied:
        head = rnd(N_VOCAB, s.n_embd, scale=4.0)
        head[-len(SPECIALS) :] = 0.0
        t["output.weight"] = head
    for i in range(s.n_layer):
        t[f"blk.{i}.attn_norm.weight"] = around_one(s.n_embd)
        t[f"blk.{i}.attn_q.weight"] = rnd(s.n_head * hd, s.n_embd)
        t[f"blk.{i}.attn_q.bias"] = bias(s.n_head * hd, 1.0)
        t[f"blk.{i}.attn_k.weight"] = rnd(s.n_head_kv * hd, s.n_embd)
        t[f"blk.{i}.attn_k.bias"] = bias(s.n_head_kv * hd, 1.0)
        t[f"blk.{i}.attn_v.weight"] = rnd(s.n_head_kv * hd, s.n_embd)
        t[f"blk.{i}.attn_v.bias"] = bias(s.n_head_kv * hd, 0.5)
        t[f"blk.{i}.attn_output.weight"] = rnd(s.n_embd, s.n_head * hd)
        t[f"blk.{i}.ffn_norm.weight"] = around_one(s.n_embd)
        t[f"blk.{i}.ffn_gate.weight"] = rnd(s.n_ff, s.n_embd)
        t[f"blk.{i}.ffn_up.weight"] = rnd(s.n_ff, s.n_embd)
        t[f"blk.{i}.ffn_down.weight"] = rnd(s.n_embd, s.n_ff)
    t.update(weights or {})

    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name("tiny qwen2 test target")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_rope_freq_base(s.rope_theta)
    w.add_vocab_size(N_VOCAB)
    _finish(w, t, chat_template)
    return path


@dataclass(frozen=True)
class Gemma3Shape:
    n_embd: int = 64
    n_layer: int = 6
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32  # gemma3 heads are wider than n_embd / n_head (270M: 4 x 256 on 640)
    n_ff: int = 128
    n_ctx: int = 2048
    rope_theta: float = 1_000_000.0  # global layers
    # sliding-window layers; None writes no key and llama.cpp uses 10000 (what the 270M GGUF does)
    rope_theta_swa: float | None = 100.0
    sliding_window: int = 6  # a query sees itself and the 5 tokens before it
    # every n-th layer is global (layers 2 and 5 here); None writes no key and llama.cpp uses 6
    # (5 sliding layers, then 1 global: what the 270M GGUF does)
    swa_pattern: int | None = 3
    rms_eps: float = 1e-6
    final_softcap: float | None = None  # gemma3.final_logit_softcapping (Gemma 3 ships none)


def write_gemma3_target(
    path: str,
    shape: Gemma3Shape = Gemma3Shape(),
    *,
    seed: int = 0,
    weights: dict[str, np.ndarray] | None = None,
    chat_template: str = CHATML,
) -> str:
    """A random `gemma3` target: embeddings scaled by sqrt(n_embd), four norms per layer plus
    q/k norms, GELU FFN, sliding-window layers between global ones with their own RoPE base, the
    head tied to the embeddings. Norm weights are stored as llama.cpp multiplies them (the
    converter has already added Gemma's +1)."""
    s = shape
    rnd, around_one, _ = _rng_tensors(seed)
    emb = rnd(N_VOCAB, s.n_embd, scale=4.0)
    emb[-len(SPECIALS) :] = 0.0  # the head is tied: specials score 0 and never win
    t: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "output_norm.weight": around_one(s.n_embd),
    }
    for i in range(s.n_layer):
        t[f"blk.{i}.attn_norm.weight"] = around_one(s.n_embd)
        t[f"blk.{i}.attn_q.weight"] = rnd(s.n_head * s.head_dim, s.n_embd)
        t[f"blk.{i}.attn_k.weight"] = rnd(s.n_head_kv * s.head_dim, s.n_embd)
        t[f"blk.{i}.attn_v.weight"] = rnd(s.n_head_kv * s.head_dim, s.n_embd)
        t[f"blk.{i}.attn_q_norm.weight"] = around_one(s.head_dim)
        t[f"blk.{i}.attn_k_norm.weight"] = around_one(s.head_dim)
        t[f"blk.{i}.attn_output.weight"] = rnd(s.n_embd, s.n_head * s.head_dim)
        t[f"blk.{i}.post_attention_norm.weight"] = around_one(s.n_embd)
        t[f"blk.{i}.ffn_norm.weight"] = around_one(s.n_embd)
        t[f"blk.{i}.ffn_gate.weight"] = rnd(s.n_ff, s.n_embd, scale=2.0)
        t[f"blk.{i}.ffn_up.weight"] = rnd(s.n_ff, s.n_embd)
        t[f"blk.{i}.ffn_down.weight"] = rnd(s.n_embd, s.n_ff)
        t[f"blk.{i}.post_ffw_norm.weight"] = around_one(s.n_embd)
    t.update(weights or {})

    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("tiny gemma3 test target")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_rope_freq_base(s.rope_theta)
    if s.rope_theta_swa is not None:
        w.add_rope_freq_base_swa(s.rope_theta_swa)
    w.add_sliding_window(s.sliding_window)
    if s.swa_pattern is not None:
        w.add_sliding_window_pattern(s.swa_pattern)
    if s.final_softcap is not None:
        w.add_final_logit_softcapping(s.final_softcap)
    w.add_vocab_size(N_VOCAB)
    _finish(w, t, chat_template)
    return path


def write_mamba_target(
    path: str, *, n_embd: int = 64, n_layer: int = 4, seed: int = 0, cycle: int = 0
) -> str:
    """A tiny `mamba` (recurrent, state-space) target: llama.cpp keeps no snapshots of its
    state, so drafts are verified from a checkpoint and replayed (runtime/rollback.py). With
    cycle > 0 its text cycles (as _hybrid_embd_head makes it), so n-gram drafts are accepted."""
    rng = np.random.default_rng(seed)
    inner, state, conv, dt_rank = 2 * n_embd, 16, 4, max(1, n_embd // 16)

    def rnd(*shape_: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape_) * scale / np.sqrt(shape_[-1])).astype(np.float32)

    emb, head = rnd(N_VOCAB, n_embd, scale=np.sqrt(n_embd)), rnd(N_VOCAB, n_embd, scale=4.0)
    if cycle:
        emb, head = _hybrid_embd_head(rnd, n_embd, cycle)
    t: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "output_norm.weight": np.ones(n_embd, dtype=np.float32),
        "output.weight": head,
    }
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(n_embd, dtype=np.float32)
        t[f"blk.{i}.ssm_in.weight"] = rnd(2 * inner, n_embd)
        t[f"blk.{i}.ssm_conv1d.weight"] = rnd(inner, conv)
        t[f"blk.{i}.ssm_conv1d.bias"] = np.zeros(inner, dtype=np.float32)
        t[f"blk.{i}.ssm_x.weight"] = rnd(dt_rank + 2 * state, inner)
        t[f"blk.{i}.ssm_dt.weight"] = rnd(inner, dt_rank)
        t[f"blk.{i}.ssm_dt.bias"] = np.zeros(inner, dtype=np.float32)
        t[f"blk.{i}.ssm_a"] = -np.ones((inner, state), dtype=np.float32)
        t[f"blk.{i}.ssm_d"] = np.ones(inner, dtype=np.float32)
        t[f"blk.{i}.ssm_out.weight"] = rnd(n_embd, inner)
    w = gguf.GGUFWriter(path, "mamba")
    w.add_name("tiny recurrent test target")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_head_count_kv(0)
    w.add_ssm_conv_kernel(conv)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(0)
    _add_tokenizer(w)
    for name, arr in t.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_drafter_for(
    target_path: str, path: str, *, taps: tuple[int, int, int] | None = None, seed: int = 11
) -> str:
    """A random EAGLE-3.1 drafter (f16 matrices) shaped for any GGUF target: its hidden size,
    a head per 64 columns (the eagle3 graph needs hidden = heads x head size), default taps
    (2, L/2, L-3). It borrows the target's embeddings and head. Never accepted, so it serves
    losslessness checks and cost measurements, not speed."""
    from localspec.native import GGUFHeader

    h = GGUFHeader(target_path)
    n_embd, n_layer = int(h.arch_key("embedding_length")), int(h.arch_key("block_count"))
    n_layer -= int(h.arch_key("nextn_predict_layers") or 0)  # the trunk's layers
    n_head = n_embd // 64 if n_embd % 64 == 0 else int(h.arch_key("attention.head_count"))
    n_kv = n_head // 3 if n_head % 3 == 0 else n_head // 2 if n_head % 2 == 0 else n_head
    taps = taps or (2, n_layer // 2, n_layer - 3)
    ds = DrafterShape(n_embd=n_embd, n_head=n_head, n_head_kv=n_kv, n_ff=2 * n_embd, taps=taps)
    cfg = Eagle3Config(
        n_embd=n_embd,
        n_ff=ds.n_ff,
        n_head=n_head,
        n_head_kv=n_kv,
        rms_eps=1e-5,
        rope_theta=float(h.arch_key("rope.freq_base") or 10000.0),
        context_length=8192,
        target_layers=taps,
        target_hidden=n_embd,
        fc_norm=True,
        norm_output=True,
    )
    tensors = {
        k: v.astype(np.float16) if v.ndim == 2 else v
        for k, v in drafter_tensors(ds, n_embd, seed=seed).items()
    }
    write_eagle3_gguf(path, cfg, tensors, target_path, name="random drafter (tests)")
    return path


def _hybrid_embd_head(rnd: Callable[..., np.ndarray], n_embd: int, cycle: int):
    """Random embeddings and head; cycle > 0: the head follows the embeddings through a
    permutation of short cycles (token t is followed by the next of its cycle of `cycle`
    tokens), strongly enough that the layers only perturb it: greedy text repeats, so n-gram
    drafts are accepted, and prompts that break the cycle make them rejected."""
    emb = rnd(N_VOCAB, n_embd, scale=16.0 if cycle else 4.0)
    head = rnd(N_VOCAB, n_embd, scale=4.0)
    if cycle:
        order = np.random.default_rng(cycle).permutation(N_VOCAB - len(SPECIALS))
        nxt = np.arange(N_VOCAB)
        for a in range(0, len(order) - cycle + 1, cycle):
            ring = order[a : a + cycle]
            nxt[ring] = np.roll(ring, -1)
        head = head * 0.1
        head[nxt[: N_VOCAB - len(SPECIALS)]] += emb[: N_VOCAB - len(SPECIALS)]
    emb[-len(SPECIALS) :] = 0.0
    head[-len(SPECIALS) :] = 0.0  # specials score 0 and never win
    return emb, head


# --- hybrid targets (recurrent layers beside attention): qwen35 (gated delta nets, an optional
# MTP block) and lfm2 (short convolutions). Names and shapes follow the vendored llama.cpp's
# loaders (src/models/qwen35.cpp, lfm2.cpp); numpy shapes are ggml's ne reversed.


def write_qwen35_target(
    path: str,
    *,
    n_embd: int = 64,
    n_layer: int = 4,
    mtp: bool = False,
    seed: int = 0,
    chat_template: str = CHATML,
    cycle: int = 0,
) -> str:
    """A random `qwen35` target: every `full_attn_interval`-th layer (here the 4th: 3 linear + 1
    attention for n_layer=4) is gated full attention (Q projection carries a sigmoid gate, q/k
    RMS norms, partial interleaved M-RoPE); the others are gated delta net layers (fused qkv
    projection, z gate, short causal conv, per-v-head decay ssm_a * softplus(alpha + dt_bias),
    sigmoid beta, gated RMS norm). mtp=True appends one nextn (MTP) block after the trunk:
    `qwen35.nextn_predict_layers = 1` and `block_count = n_layer + 1`; with cycle > 0 its head
    agrees with the trunk (it carries the given token's embedding through)."""
    rnd, around_one, bias = _rng_tensors(seed)
    rng = np.random.default_rng(seed + 1000)  # ssm_a only; keeps rnd's stream like the others

    # full attention
    n_head, n_head_kv = 4, 2
    hd = n_embd // n_head  # head_dim (key_length = value_length); half of it rotary
    n_ff = 2 * n_embd
    full_attn_interval = 4
    # gated delta net: k heads = ssm.group_count, v heads = ssm.time_step_rank, both of size
    # ssm.state_size; ssm.inner_size = value dim = d_state * n_v_heads
    d_state, n_k_heads, n_v_heads, d_conv = 16, 2, 4, 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim

    emb, head = _hybrid_embd_head(rnd, n_embd, cycle)  # specials score 0 and never win
    t: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "output_norm.weight": around_one(n_embd),
        "output.weight": head,
    }

    def attn_block(i: int) -> None:
        t[f"blk.{i}.attn_q.weight"] = rnd(2 * n_head * hd, n_embd)  # query and gate, per head
        t[f"blk.{i}.attn_k.weight"] = rnd(n_head_kv * hd, n_embd)
        t[f"blk.{i}.attn_v.weight"] = rnd(n_head_kv * hd, n_embd)
        t[f"blk.{i}.attn_output.weight"] = rnd(n_embd, n_head * hd)
        t[f"blk.{i}.attn_q_norm.weight"] = around_one(hd)
        t[f"blk.{i}.attn_k_norm.weight"] = around_one(hd)

    def norms_and_ffn(i: int) -> None:
        t[f"blk.{i}.attn_norm.weight"] = around_one(n_embd)
        t[f"blk.{i}.post_attention_norm.weight"] = around_one(n_embd)
        t[f"blk.{i}.ffn_gate.weight"] = rnd(n_ff, n_embd)
        t[f"blk.{i}.ffn_up.weight"] = rnd(n_ff, n_embd)
        t[f"blk.{i}.ffn_down.weight"] = rnd(n_embd, n_ff)

    for i in range(n_layer):
        norms_and_ffn(i)
        if (i + 1) % full_attn_interval == 0:
            attn_block(i)
        else:
            t[f"blk.{i}.attn_qkv.weight"] = rnd(conv_dim, n_embd)
            t[f"blk.{i}.attn_gate.weight"] = rnd(value_dim, n_embd)  # z
            t[f"blk.{i}.ssm_conv1d.weight"] = rnd(conv_dim, d_conv, scale=2.0)
            t[f"blk.{i}.ssm_dt.bias"] = bias(n_v_heads, 0.5)
            # stored negative (-exp(A_log)); no ".weight" suffix
            t[f"blk.{i}.ssm_a"] = -rng.uniform(0.3, 3.0, n_v_heads).astype(np.float32)
            t[f"blk.{i}.ssm_beta.weight"] = rnd(n_v_heads, n_embd)
            t[f"blk.{i}.ssm_alpha.weight"] = rnd(n_v_heads, n_embd)
            t[f"blk.{i}.ssm_norm.weight"] = around_one(d_state)
            t[f"blk.{i}.ssm_out.weight"] = rnd(n_embd, value_dim)
    if mtp:
        i = n_layer
        norms_and_ffn(i)
        attn_block(i)
        t[f"blk.{i}.nextn.eh_proj.weight"] = rnd(n_embd, 2 * n_embd)  # [enorm(e); hnorm(h)]
        t[f"blk.{i}.nextn.enorm.weight"] = around_one(n_embd)
        if cycle:  # an agreeing head: the next token's embedding carried through, h ignored,
            # so it predicts what follows the token it is given, as the cycling trunk does
            t[f"blk.{i}.nextn.enorm.weight"] = np.ones(n_embd, dtype=np.float32)
            eh = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)
            eh[:, :n_embd] = 4.0 * np.eye(n_embd, dtype=np.float32)
            t[f"blk.{i}.nextn.eh_proj.weight"] = eh
        t[f"blk.{i}.nextn.hnorm.weight"] = around_one(n_embd)
        t[f"blk.{i}.nextn.shared_head_norm.weight"] = around_one(n_embd)
        # nextn.embed_tokens / nextn.shared_head_head left out: token_embd / output are used

    w = gguf.GGUFWriter(path, "qwen35")
    w.add_name("tiny qwen35 test target" + (" with mtp" if mtp else ""))
    qwen35_keys(
        w,
        Qwen35Keys(n_embd, n_layer, n_head, n_head_kv, hd, n_ff, d_state, n_k_heads, n_v_heads),
        mtp=mtp,
    )
    _finish(w, t, chat_template)
    return path


@dataclass(frozen=True)
class Qwen35Keys:
    """What a qwen35 header says of its shape (the trunk's layers: an MTP block comes after)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    d_state: int
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    d_conv: int = 4
    interval: int = 4  # full_attention_interval: every interval-th layer is attention
    n_ctx: int = 2048
    rotary_share: int = 2  # head_dim / rotary dims (partial interleaved M-RoPE)


def qwen35_keys(w: gguf.GGUFWriter, k: Qwen35Keys, *, mtp: bool) -> None:
    """The qwen35 architecture's keys for this shape (mtp: one nextn block after the trunk)."""
    n_rot = k.head_dim // k.rotary_share
    w.add_context_length(k.n_ctx)
    w.add_embedding_length(k.n_embd)
    w.add_block_count(k.n_layer + (1 if mtp else 0))
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_feed_forward_length(k.n_ff)
    w.add_head_count(k.n_head)
    w.add_head_count_kv(k.n_head_kv)
    w.add_key_length(k.head_dim)
    w.add_value_length(k.head_dim)
    w.add_rope_freq_base(10_000_000.0)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections(
        [n_rot // 4, n_rot // 8, n_rot // 2 - n_rot // 4 - n_rot // 8, 0]  # sum n_rot / 2
    )
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(k.d_conv)
    w.add_ssm_state_size(k.d_state)
    w.add_ssm_group_count(k.n_k_heads)
    w.add_ssm_time_step_rank(k.n_v_heads)
    w.add_ssm_inner_size(k.d_state * k.n_v_heads)
    w.add_full_attention_interval(k.interval)
    w.add_vocab_size(N_VOCAB)


def write_nemotron_h_target(
    path: str,
    *,
    n_embd: int = 64,
    seed: int = 0,
    chat_template: str = CHATML,
    cycle: int = 0,
) -> str:
    """A random `nemotron_h` target (Mamba-2 hybrid): four layers, chosen by the per-layer
    head_count_kv and feed_forward_length arrays as llama.cpp reads them (both 0: a Mamba-2
    mixer; head_count_kv > 0: attention without RoPE; feed_forward_length > 0: a squared-ReLU
    MLP): mamba2, attention, mamba2, MLP. The Mamba-2 mixer: in_proj to z, x, B, C and dt per
    head, a causal depthwise conv over x, B, C, per-head decay A and skip D, a grouped RMS norm
    gated by z, out_proj."""
    rnd, around_one, bias = _rng_tensors(seed)
    n_head, n_head_kv, n_ff = 4, 2, 2 * n_embd
    hd = n_embd // n_head
    d_inner, d_state, n_group, d_conv = 2 * n_embd, 16, 2, 4
    n_ssm_head = 8  # head size d_inner / n_ssm_head = 16
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_ssm_head
    conv_dim = d_inner + 2 * n_group * d_state
    kinds = ["mamba2", "attention", "mamba2", "mlp"]
    emb, head = _hybrid_embd_head(rnd, n_embd, cycle)
    t: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "output_norm.weight": around_one(n_embd),
        "output.weight": head,
    }
    for i, kind in enumerate(kinds):
        t[f"blk.{i}.attn_norm.weight"] = around_one(n_embd)
        if kind == "mamba2":
            t[f"blk.{i}.ssm_in.weight"] = rnd(d_in_proj, n_embd)
            t[f"blk.{i}.ssm_conv1d.weight"] = rnd(conv_dim, d_conv, scale=2.0)
            t[f"blk.{i}.ssm_conv1d.bias"] = bias(conv_dim, 0.1)
            t[f"blk.{i}.ssm_dt.bias"] = bias(n_ssm_head, 0.5)
            a = -np.random.default_rng(seed + 100 + i).uniform(0.3, 3.0, n_ssm_head)
            t[f"blk.{i}.ssm_a"] = a.astype(np.float32).reshape(n_ssm_head, 1)  # no ".weight"
            t[f"blk.{i}.ssm_d"] = (1.0 + bias(n_ssm_head, 0.3)).reshape(n_ssm_head, 1)
            t[f"blk.{i}.ssm_norm.weight"] = around_one(d_inner).reshape(n_group, -1)
            t[f"blk.{i}.ssm_out.weight"] = rnd(n_embd, d_inner)
        elif kind == "attention":
            t[f"blk.{i}.attn_q.weight"] = rnd(n_head * hd, n_embd)
            t[f"blk.{i}.attn_k.weight"] = rnd(n_head_kv * hd, n_embd)
            t[f"blk.{i}.attn_v.weight"] = rnd(n_head_kv * hd, n_embd)
            t[f"blk.{i}.attn_output.weight"] = rnd(n_embd, n_head * hd)
        else:
            t[f"blk.{i}.ffn_up.weight"] = rnd(n_ff, n_embd)
            t[f"blk.{i}.ffn_down.weight"] = rnd(n_embd, n_ff)
    w = gguf.GGUFWriter(path, "nemotron_h")
    w.add_name("tiny nemotron_h test target")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(kinds))
    w.add_feed_forward_length([n_ff if k == "mlp" else 0 for k in kinds])
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head_kv if k == "attention" else 0 for k in kinds])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_eps(1e-5)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_state_size(d_state)
    w.add_ssm_group_count(n_group)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_inner_size(d_inner)
    w.add_vocab_size(N_VOCAB)
    _finish(w, t, chat_template)
    return path


def write_lfm2_target(
    path: str,
    *,
    n_embd: int = 64,
    n_layer: int = 4,
    seed: int = 0,
    chat_template: str = CHATML,
    cycle: int = 0,
) -> str:
    """A random `lfm2` target: short-conv layers (in_proj to B, C, x; causal depthwise conv of
    B*x over l_cache taps; C * conv; out_proj) and attention layers (q/k RMS norms, NEOX RoPE)
    chosen by a per-layer head_count_kv array (0 = conv). One attention layer at index
    n_layer // 2 (3 conv + 1 attention for n_layer=4). Each layer: operator norm, mixer,
    ffn_norm, SwiGLU FFN. The final norm is named `token_embd_norm` (llama.cpp's LFM2 quirk)."""
    rnd, around_one, _ = _rng_tensors(seed)
    n_head, n_head_kv, l_cache = 4, 2, 3
    hd = n_embd // n_head
    n_ff = 2 * n_embd
    attn_layers = {n_layer // 2}
    head_kv = [n_head_kv if i in attn_layers else 0 for i in range(n_layer)]

    emb, head = _hybrid_embd_head(rnd, n_embd, cycle)
    t: dict[str, np.ndarray] = {
        "token_embd.weight": emb,
        "token_embd_norm.weight": around_one(n_embd),  # the output norm
        "output.weight": head,
    }
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = around_one(n_embd)
        t[f"blk.{i}.ffn_norm.weight"] = around_one(n_embd)
        t[f"blk.{i}.ffn_gate.weight"] = rnd(n_ff, n_embd)
        t[f"blk.{i}.ffn_up.weight"] = rnd(n_ff, n_embd)
        t[f"blk.{i}.ffn_down.weight"] = rnd(n_embd, n_ff)
        if i in attn_layers:
            t[f"blk.{i}.attn_q.weight"] = rnd(n_head * hd, n_embd)
            t[f"blk.{i}.attn_k.weight"] = rnd(n_head_kv * hd, n_embd)
            t[f"blk.{i}.attn_v.weight"] = rnd(n_head_kv * hd, n_embd)
            t[f"blk.{i}.attn_output.weight"] = rnd(n_embd, n_head * hd)
            t[f"blk.{i}.attn_q_norm.weight"] = around_one(hd)
            t[f"blk.{i}.attn_k_norm.weight"] = around_one(hd)
        else:
            t[f"blk.{i}.shortconv.in_proj.weight"] = rnd(3 * n_embd, n_embd, scale=2.0)
            t[f"blk.{i}.shortconv.conv.weight"] = rnd(n_embd, l_cache, scale=2.0)
            t[f"blk.{i}.shortconv.out_proj.weight"] = rnd(n_embd, n_embd)

    w = gguf.GGUFWriter(path, "lfm2")
    w.add_name("tiny lfm2 test target")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(head_kv)  # per layer: 0 marks a short-conv layer
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(l_cache)
    w.add_vocab_size(N_VOCAB)
    _finish(w, t, chat_template)
    return path
