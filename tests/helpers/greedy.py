"""Greedy losslessness that holds on any CPU: every emitted token is the one plain greedy
decoding would choose after the tokens emitted before it, or a near-tie of plain decoding's own
logits there.

Plain decoding is replayed independently of the speculative run: the prompt in one batch, then
the emitted tokens one at a time (teacher-forced), the target's argmax checked at each step.
Speculation verifies drafts in batches, and llama.cpp's kernels may round a batch differently
from a one-token decode (notes 16: a fresh AMD EPYC did so at 20 cached tokens); where the two
best logits lie within that rounding, the paths may pick different tokens, and from there the
replay follows the emitted tokens, so every later token is judged on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.lowlevel import parts
from localspec.speculation.sampling import SamplingParams

from helpers.llama_samplers import native_logits

# largest logit gap that counts as a near-tie: f32 weights and KV round in the last bits only;
# quantized weights with an f16 cache differed by up to ~1 logit beyond 256 cached cells
F32_MARGIN = 1e-2
QUANT_MARGIN = 1.0


def max_ties(n_tokens: int, margin: float = F32_MARGIN) -> int:
    """Near-ties are rare: an off-by-one that emits the runner-up wherever the gap is small
    would pass the margin at every token, but not this count (2, plus 1 per 64 tokens). A
    quantized target's kernels differ by up to ~1 logit past 256 cached cells, and a reply
    meets gaps that small often: CI's fresh machine saw 4 flips in 120 tokens of the default
    pair's long prompt (auto), so there it is 1 per 24 tokens, still far below the share of
    tokens an off-by-one would flip."""
    return 2 + n_tokens // (64 if margin <= F32_MARGIN else 24)


@dataclass
class Replay:
    ties: list[tuple[int, float]] = field(default_factory=list)  # (index, logit gap) accepted


def replay_plain_greedy(
    eng,
    prompt: Sequence[int],
    out: Sequence[int],
    *,
    margin: float,
    finish: str | None = None,
    sampling: SamplingParams | None = None,
) -> Replay:
    """Assert out is plain greedy decoding of prompt up to near-ties (gap < margin). finish
    "eos": plain decoding would end there too. sampling: greedy through llama.cpp's own
    sampler chain with these settings (penalties, DRY, logit bias...), its history the prompt
    and the tokens before. Leaves the engine's caches empty."""
    tgt = parts(eng).target
    active = tgt.taps_active
    tgt.set_taps_active(False)
    eng.reset()
    rep = Replay()
    try:
        history = list(prompt)

        def chain(raw: np.ndarray) -> np.ndarray:
            if sampling is None:
                return raw
            return native_logits(raw, sampling, history, tgt.model.vocab)

        logits = chain(np.array(tgt.prefill(list(prompt))[0]))
        for i, t in enumerate(out):
            y = int(np.argmax(logits))
            if y != t:
                gap = float(logits[y] - logits[t])
                assert gap < margin, (
                    f"token {i}: emitted {t}, plain greedy picks {y} by {gap:.4g} logits "
                    f"(near-tie margin {margin})"
                )
                rep.ties.append((i, gap))
            history.append(int(t))
            if i + 1 < len(out) or finish == "eos":  # the last token is decoded only to check
                logits = chain(np.array(tgt.decode([int(t)], all_logits=False)[0]))
        assert len(rep.ties) <= max_ties(len(out), margin), f"too many near-ties: {rep.ties}"
        if finish == "eos":
            y = int(np.argmax(logits))
            best_eog = float(logits[parts(eng).eog].max())
            assert parts(eng).eog[y] or logits[y] - best_eog < margin, "plain decoding would go on"
    finally:
        eng.reset()
        tgt.set_taps_active(active)
    return rep


def assert_greedy_lossless(
    eng,
    prompt: str | Sequence[int],
    completion,
    *,
    margin: float = F32_MARGIN,
    sampling: SamplingParams | None = None,
    **tok_kw,
) -> Replay:
    """The completion of prompt (text, tokenized as the engine does with tok_kw, or ids) is
    plain greedy up to near-ties (through llama.cpp's chain with `sampling` when given)."""
    ids = eng.tokenize(prompt, **tok_kw) if isinstance(prompt, str) else list(prompt)
    finish = completion.finish_reason
    return replay_plain_greedy(
        eng, ids, completion.tokens, margin=margin, finish=finish, sampling=sampling
    )
