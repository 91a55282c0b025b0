"""The tiny qwen2 and gemma3 targets run in llama.cpp, and the numpy reference of every target's
forward pass (tests/helpers/reference_targets.py) agrees with llama.cpp: its logits on sequences
longer than the sliding window, and its per-layer inputs with the `l_out-<il>` tensors that
llama.cpp's graph eval callback hands out. Breaking one part of the reference breaks the
agreement, so the agreement is evidence that each part is right."""

from __future__ import annotations

import os
from collections.abc import Callable

import llama_cpp
import numpy as np
import pytest

import localspec

from helpers import tinymodels as tm
from helpers.cpp_pass import llama_cpp_pass
from helpers.reference_targets import RefTarget, gelu_tanh, silu

N_TOKENS = 40  # > 6 * the tiny gemma3's window, so sliding layers drop most of the context
TOL = 1e-4  # max |ref - llama.cpp| / max |llama.cpp|, f32 weights and KV (measured <= 5e-5)
BROKEN = 1e-2  # every broken reference measured here is off by 3e-2 or more

TARGETS: dict[str, Callable[[str], str]] = {
    "llama": lambda p: tm.write_target(p),
    "qwen2": lambda p: tm.write_qwen2_target(p),
    "qwen2-tied": lambda p: tm.write_qwen2_target(p, tm.Qwen2Shape(tied=True)),
    "gemma3": lambda p: tm.write_gemma3_target(p),
    # the keys the real Gemma 3 270M GGUF leaves out: pattern 6 (5 sliding + 1 global), base 1e4
    "gemma3-defaults": lambda p: tm.write_gemma3_target(
        p, tm.Gemma3Shape(rope_theta_swa=None, swa_pattern=None)
    ),
    "gemma3-softcap": lambda p: tm.write_gemma3_target(p, tm.Gemma3Shape(final_softcap=10.0)),
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("arch-targets")
    return {name: write(str(d / f"{name}.gguf")) for name, write in TARGETS.items()}


def tokens(n: int = N_TOKENS, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


@pytest.fixture(scope="module")
def cpp_logits(targets: dict[str, str]) -> Callable[[str], np.ndarray]:
    """llama.cpp's logits for `tokens()` on a named target, computed once per target."""
    seen: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        if name not in seen:
            toks = tokens()
            seen[name] = llama_cpp_pass(targets[name], toks, [len(toks)], [])[0]
        return seen[name]

    return get


def rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.abs(ref - got).max() / np.abs(got).max())


# --- the tiny targets ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2", "gemma3"])
def test_tiny_target_loads_and_chats(targets: dict[str, str], name: str) -> None:
    msgs = [{"role": "user", "content": "the cat sat on the mat"}]
    # localspec's engine, plain decoding (no drafter), with the GGUF's own ChatML template
    with localspec.load(targets[name], n_threads=1) as eng:
        assert eng.chat_template_note == ""
        prompt, _ = eng.format_chat(msgs)
        prompt_ids = eng.tokenize(prompt, add_special=False, parse_special=True)
        reply = [
            t for ev in eng.chat_stream(msgs, max_tokens=8, temperature=0.0) for t in ev.tokens
        ]
    assert prompt_ids[0] == tm.N_VOCAB - 2  # ChatML's <|im_start|> is one control token
    assert len(reply) == 8  # specials never win: no early stop
    # llama-cpp-python alone: same architecture, same greedy tokens
    llm = llama_cpp.Llama(targets[name], n_ctx=256, n_threads=1, verbose=False)
    try:
        assert llm.metadata["general.architecture"] == name
        greedy = llm.generate(prompt_ids, top_k=1, temp=0.0)
        assert [next(greedy) for _ in range(8)] == reply
    finally:
        llm.close()


# --- the reference against llama.cpp's logits --------------------------------------------------


@pytest.mark.parametrize("name", list(TARGETS))
def test_reference_logits_equal_llama_cpp(
    targets: dict[str, str], cpp_logits: Callable[[str], np.ndarray], name: str
) -> None:
    toks = tokens()
    logits = cpp_logits(name)
    ref = RefTarget(targets[name]).forward(toks)
    assert ref.logits.shape == logits.shape
    assert rel_err(ref.logits, logits) < TOL
    assert (ref.logits.argmax(1) == logits.argmax(1)).all()


def _drop(*suffixes: str) -> Callable[[RefTarget], None]:
    def drop(ref: RefTarget) -> None:
        for k in [k for k in ref.t if k.endswith(suffixes)]:
            del ref.t[k]

    return drop


def _ones(part: str) -> Callable[[RefTarget], None]:
    def ones(ref: RefTarget) -> None:
        for k in [k for k in ref.t if part in k]:
            ref.t[k] = np.ones_like(ref.t[k])

    return ones


BREAKS: dict[str, tuple[str, Callable[[RefTarget], None]]] = {
    "qwen2 without q/k/v biases": ("qwen2", _drop(".bias")),
    "qwen2 without the k bias": ("qwen2", _drop("attn_k.bias")),
    "qwen2 with llama's rope pairs": ("qwen2", lambda r: setattr(r, "neox", False)),
    "llama with neox rope pairs": ("llama", lambda r: setattr(r, "neox", True)),
    "gemma3 without the embedding scale": ("gemma3", lambda r: setattr(r, "embed_scale", 1.0)),
    "gemma3 without sliding windows": ("gemma3", lambda r: setattr(r, "windows", [None] * 6)),
    "gemma3 (default keys) without sliding windows": (
        "gemma3-defaults",
        lambda r: setattr(r, "windows", [None] * 6),
    ),
    "gemma3 with the global rope base everywhere": (
        "gemma3",
        lambda r: setattr(r, "rope_bases", [r.rope_bases[2]] * 6),
    ),
    "gemma3 (default keys) with the global rope base everywhere": (
        "gemma3-defaults",
        lambda r: setattr(r, "rope_bases", [r.rope_bases[5]] * 6),
    ),
    "gemma3 without q/k norms": ("gemma3", _drop("attn_q_norm.weight", "attn_k_norm.weight")),
    "gemma3 without post norms' weights": ("gemma3", _ones("post_")),
    "gemma3 with silu": ("gemma3", lambda r: setattr(r, "gelu", silu)),
    "gemma3 without final softcapping": ("gemma3-softcap", lambda r: setattr(r, "softcap", None)),
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_a_broken_reference_disagrees(
    targets: dict[str, str], cpp_logits: Callable[[str], np.ndarray], case: str
) -> None:
    name, breaker = BREAKS[case]
    toks = tokens()
    logits = cpp_logits(name)
    ref = RefTarget(targets[name])
    assert rel_err(ref.forward(toks).logits, logits) < TOL
    breaker(ref)
    assert rel_err(ref.forward(toks).logits, logits) > BROKEN


def test_gelu_is_evaluated_through_an_f16_table(
    targets: dict[str, str], cpp_logits: Callable[[str], np.ndarray]
) -> None:
    """Why the reference rounds GELU's input and output to f16: ggml's CPU kernel does, and the
    exact tanh-GELU is several times further from llama.cpp (measured 2.0e-5 against 1.1e-4)."""
    toks = tokens()
    logits = cpp_logits("gemma3")
    ref = RefTarget(targets["gemma3"])
    table = rel_err(ref.forward(toks).logits, logits)
    ref.gelu = gelu_tanh
    exact = rel_err(ref.forward(toks).logits, logits)
    assert table < TOL
    assert 3 * table < exact < BROKEN


# --- the reference's per-layer inputs against the eval callback's l_out tensors ----------------


# the node holding layer 0's input: the token rows (`embd`), scaled on gemma3 (`inp_scaled`)
LAYER0_NODE = {"llama": "embd", "qwen2": "embd", "gemma3": "inp_scaled"}


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma3", "gemma3-defaults"])
@pytest.mark.parametrize("chunks", [[N_TOKENS], [7, 1, 12, 20]], ids=["one-batch", "4-batches"])
def test_layer_inputs_equal_the_callbacks_l_out(
    targets: dict[str, str], name: str, chunks: list[int]
) -> None:
    ref = RefTarget(targets[name])
    toks = tokens()
    # the input of layer L >= 1 is l_out-(L-1); the last layer's l_out feeds no layer
    names = [LAYER0_NODE[ref.arch]] + [f"l_out-{il}" for il in range(ref.n_layer - 1)]
    _, states = llama_cpp_pass(targets[name], toks, chunks, names)
    want = ref.forward(toks).inputs
    for layer, node in enumerate(names):
        got = states[node].reshape(len(toks), ref.n_embd)
        assert rel_err(want[layer], got) < (1e-6 if layer == 0 else TOL), node
    if ref.arch == "gemma3":
        got = states["inp_scaled"].reshape(len(toks), ref.n_embd)
        assert rel_err(want[0] / ref.embed_scale, got) > BROKEN


def test_reference_refuses_what_it_does_not_know(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "extra.gguf")
    extra = {"blk.0.ffn_gate_inp.weight": np.ones((4, 64), dtype=np.float32)}  # a MoE router
    tm.write_target(path, weights=extra)
    with pytest.raises(ValueError, match="blk.0.ffn_gate_inp.weight"):
        RefTarget(path)
