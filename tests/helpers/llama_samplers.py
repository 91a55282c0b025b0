"""llama.cpp's own sampler chain, through llama-cpp-python's bindings: the independent
reference localspec's samplers are checked against (the same chain llama-server builds: logit
bias, penalties, DRY, top-k, typical-p, top-p, min-p, temperature)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as C
import numpy as np

from localspec.speculation.sampling import SamplingParams


def native_distribution(
    logits: np.ndarray,
    sp: SamplingParams,
    history: Sequence[int],
    vocab: ctypes.c_void_p | None = None,
) -> np.ndarray:
    """The distribution llama.cpp's chain leaves over the vocabulary after `history` (every
    token accepted into the chain first); greedy: all mass on its choice. vocab: the model's,
    for DRY's sequence breakers."""
    lg = native_logits(logits, sp, history, vocab)
    out = np.zeros(lg.size)
    if sp.greedy:
        out[int(np.argmax(lg))] = 1.0
        return out
    keep = lg > -np.inf
    x = lg[keep] / np.float64(np.float32(sp.temperature))
    p = np.exp(x - x.max())
    out[keep] = p / p.sum()
    return out


def native_logits(
    logits: np.ndarray,
    sp: SamplingParams,
    history: Sequence[int],
    vocab: ctypes.c_void_p | None = None,
) -> np.ndarray:
    """The logits llama.cpp's chain leaves before the temperature (-inf where a sampler cut
    the token): the greedy choice is their argmax, and their gaps are the near-ties."""
    n = logits.size
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    try:
        if sp.logit_bias:
            arr = (C.llama_logit_bias * len(sp.logit_bias))(
                *[C.llama_logit_bias(t, b) for t, b in sp.logit_bias]
            )
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_logit_bias(n, len(arr), arr))
        C.llama_sampler_chain_add(
            chain,
            C.llama_sampler_init_penalties(
                n, sp.repeat_last_n, sp.repeat_penalty, sp.frequency_penalty, sp.presence_penalty
            ),
        )
        if sp.dries:
            assert vocab is not None, "DRY needs the model's vocabulary"
            breakers = [b.encode() for b in sp.dry_sequence_breakers]
            cb = (ctypes.c_char_p * len(breakers))(*breakers)
            C.llama_sampler_chain_add(
                chain,
                C.llama_sampler_init_dry(
                    vocab,
                    sp.dry_multiplier,
                    sp.dry_base,
                    sp.dry_allowed_length,
                    sp.dry_penalty_last_n,
                    cb,
                    len(breakers),
                ),
            )
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(sp.top_k))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_typical(sp.typical_p, 0))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(sp.top_p, 0))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(sp.min_p, 0))
        for t in history:
            C.llama_sampler_accept(chain, int(t))
        data = (C.llama_token_data * n)()
        for i, x in enumerate(np.asarray(logits, dtype=np.float32).tolist()):
            data[i].id, data[i].logit, data[i].p = i, x, 0.0
        cur = C.llama_token_data_array(data, n, -1, False)
        C.llama_sampler_apply(chain, ctypes.byref(cur))
        ids = np.array([cur.data[i].id for i in range(cur.size)])
        lg = np.array([cur.data[i].logit for i in range(cur.size)], dtype=np.float64)
    finally:
        C.llama_sampler_free(chain)
    out = np.full(n, -np.inf)
    out[ids] = lg
    return out
