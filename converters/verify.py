"""Checks of a converted drafter before anyone trusts it.

- verify(): the checkpoint in a PyTorch reference and the GGUF through llama.cpp see the same
  target features (taps of the real target GGUF on a few prompts), teacher-forced over every
  prompt position and then chained for a few draft steps; we report top-1 agreement and the
  relative logit error, and fail below a threshold per output type.
- acceptance(): the converted drafter drafting for its target on a few prompts; a wrong tap
  convention or a silently lost EAGLE-3.1 flag shows up as a low acceptance rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from localspec import native as N
from localspec.files import gguf_keys as K
from localspec.files.ggufdata import read_tensor
from localspec.stats import Stats

from .formats import DrafterConfig
from .reference import TorchEagle3

PROMPTS = [
    "The history of the printing press begins in",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Three tips for staying healthy are",
    "Water boils at 100 degrees Celsius because",
]

# (minimum top-1 agreement, maximum relative logit error at the 95th percentile of rows).
# Relative error = max |llama.cpp - reference| / (max - min of the reference logits) per row.
THRESHOLDS: dict[str, tuple[float, float]] = {
    "f32": (0.99, 1e-3),
    "f16": (0.97, 1e-2),
    "bf16": (0.95, 3e-2),
    "q8_0": (0.95, 3e-2),
}
# q4/q5 block quants and K-quants. Seen on the tests' random drafters (hidden 64): q5_1 90%
# and 3.3e-2, q4_k_m 93-95% and 4-5e-2, q4_0 83% and 7.6e-2 to 1.2e-1.
LOW_BIT = (0.75, 0.2)


def threshold(outtype: str) -> tuple[float, float]:
    return THRESHOLDS.get(outtype, LOW_BIT)


@dataclass
class VerifyReport:
    rows: int
    top1: float
    rel_err_median: float
    rel_err_p95: float
    min_top1: float
    max_rel_err: float

    @property
    def passed(self) -> bool:
        return self.top1 >= self.min_top1 and self.rel_err_p95 <= self.max_rel_err

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"verify {verdict}: {self.rows} rows, top-1 agreement {100 * self.top1:.1f}% "
            f"(need {100 * self.min_top1:.0f}%), relative logit error median "
            f"{self.rel_err_median:.2e}, p95 {self.rel_err_p95:.2e} (limit {self.max_rel_err:.2g})"
        )


def _target_matrices(target_path: str, want_head: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The target's token embeddings and output head in float32."""
    h = N.GGUFHeader(target_path)
    embd = read_tensor(h, K.T_TOKEN_EMBD)
    head = None
    if want_head:
        head = read_tensor(h, K.T_OUTPUT) if K.T_OUTPUT in h.tensors else embd  # tied
    return embd, head


def _row_errors(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: does the GGUF (a) pick the reference's (b) top token, and the largest logit
    error relative to the row's spread. A pick whose reference logit lies within twice the
    row's own error of the maximum is a near-tie and counts as agreement: quantized weights
    may flip those (trained drafters have many), and the error bound is checked anyway."""
    fin = np.isfinite(b)
    bb = np.where(fin, b, -np.inf)
    pick = np.argmax(np.where(fin, a, -np.inf), -1)
    diff = np.abs(np.where(fin, a, 0.0) - np.where(fin, b, 0.0)).max(-1)
    best = bb.max(-1)
    top1 = np.take_along_axis(bb, pick[:, None], -1)[:, 0] >= best - 2.0 * diff
    spread = best - np.where(fin, b, np.inf).min(-1)
    return top1, diff / np.maximum(spread, 1e-12)


def verify(
    gguf_path: str,
    target_path: str,
    dc: DrafterConfig,
    tensors: dict[str, Any],
    outtype: str,
    *,
    chain: int = 3,
    prompts: list[str] = PROMPTS,
) -> VerifyReport:
    """Compare the converted GGUF (llama.cpp) with the checkpoint (PyTorch reference)."""
    from localspec.engine import Engine, load
    from localspec.lowlevel import hold

    from .formats import canonical_name

    t = {canonical_name(k, dc.family): v for k, v in tensors.items()}
    own_embed, own_head = "embed_tokens.weight" in t, "lm_head.weight" in t
    eng: Engine = load(
        target_path, draft=gguf_path, kv_type="f32", flash_attn=False, n_ctx=512, n_threads=None
    )
    tops, errs = [], []
    try:
        embd, head = (None, None)
        if not (own_embed and own_head):
            embd, head = _target_matrices(target_path, want_head=not own_head)
        embed = t["embed_tokens.weight"].float().numpy() if own_embed else embd
        head_m = t["lm_head.weight"].float().numpy() if own_head else head
        assert embed is not None and head_m is not None
        d2t = None
        if "d2t" in t:
            off = t["d2t"].numpy().astype(np.int64)
            d2t = np.arange(off.shape[0]) + off
        with hold(eng) as parts:  # drives the target and drafter directly
            tgt, dft = parts.target, parts.drafter
            assert dft is not None
            tgt.set_taps_active(True)
            for prompt in prompts:
                toks = eng.tokenize(prompt)[: tgt.n_batch]
                if len(toks) < 3:
                    continue
                ref = TorchEagle3(
                    dc, t, embed=embed, head=head_m, d2t=d2t, target_vocab=tgt.n_vocab
                )
                tgt.clear()
                dft.restart(0)
                tgt.decode(toks, all_logits=False)
                taps = tgt.read_taps(len(toks))
                g = dft.encode(taps)
                g_ref = ref.encode(taps)
                # teacher-forced: pairs (token[P+1], g[P]) for every prompt position
                lg, hs = dft.decode_all(toks[1:], g[:-1], 0)
                z, fed = ref.decode(toks[1:], g_ref[:-1], 0)
                a, e = _row_errors(lg, z)
                tops.append(a)
                errs.append(e)
                # chained draft steps from the last position, on llama.cpp's choices
                h = dft.feedback(hs[-1])
                f_ref = fed[-1]
                pos = len(toks) - 1
                for step in range(chain):
                    tok = int(np.argmax(lg[-1]))
                    lg, hs = dft.decode_all([tok], h[None, :], pos + step)
                    z, fed = ref.decode([tok], f_ref[None, :], pos + step)
                    a, e = _row_errors(lg, z)
                    tops.append(a)
                    errs.append(e)
                    h, f_ref = dft.feedback(hs[-1]), fed[-1]
    finally:
        eng.close()
    top = np.concatenate(tops)
    err = np.concatenate(errs)
    lo, hi = threshold(outtype)
    return VerifyReport(
        rows=int(top.size),
        top1=float(top.mean()),
        rel_err_median=float(np.median(err)),
        rel_err_p95=float(np.percentile(err, 95)),
        min_top1=lo,
        max_rel_err=hi,
    )


def acceptance(
    target_path: str,
    draft_path: str,
    *,
    prompts: list[str] = PROMPTS,
    n_draft: int = 4,
    max_tokens: int = 48,
    n_threads: int | None = None,
) -> Stats:
    """Greedy speculation with the drafter on a few prompts; the accumulated statistics."""
    from localspec.engine import load

    with load(target_path, draft=draft_path, n_draft=n_draft, n_threads=n_threads) as eng:
        for p in prompts:
            eng.complete(p, max_tokens=max_tokens)
        return eng.stats
