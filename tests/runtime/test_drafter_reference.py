"""llama.cpp's drafter graphs plus our EAGLE-3.1 additions equal a numpy reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import localspec
from localspec.lowlevel import parts
from localspec.runtime.drafter import Drafter

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.reference import RefDrafter, read_tensors

FLAG_SETS = [
    {},
    {"norm_before_fc": True},
    {"norm_before_residual": True},
    {"fc_norm": True},
    {"norm_output": True},
    {"fc_norm": True, "norm_output": True},
    {"fc_norm": True, "norm_output": True, "norm_before_residual": True},
    {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True},
    {"own_embeddings": True},
    {"llama3_rope": True, "fc_norm": True},
    {"draft_vocab": 96},
    {"draft_vocab": 80, "fc_norm": True, "norm_output": True, "own_embeddings": True},
]


def _close(a: np.ndarray, b: np.ndarray, tol: float = 2e-4) -> float:
    err = np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12)
    assert err < tol, f"relative error {err:.2e}"
    return float(err)


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: "+".join(f) or "eagle3")
def test_encoder_and_decoder_match_reference(models, tmp_path, flags) -> None:
    ds = tm.DrafterShape(**flags)
    path = tm.write_drafter(str(tmp_path / "d.gguf"), models["target"], ds, seed=7)
    tt, _ = read_tensors(models["target"])
    with localspec.load(models["target"], draft=path, **EXACT) as eng:
        ref = RefDrafter(path, tt["token_embd.weight"], tt["output.weight"])
        dft: Drafter = parts(eng).drafter
        tgt = parts(eng).target
        tgt.set_taps_active(True)
        prompt = eng.tokenize("the quick brown fox jumps over")
        tgt.clear()
        dft.restart(0)
        tgt.decode(prompt, all_logits=False)
        taps = tgt.read_taps(len(prompt))
        g = dft.encode(taps)
        _close(g, ref.encode(taps))

        # prompt pairs (token[P+1], g[P]) and the first draft from (next, g[n-1])
        nxt = 97
        pairs = [*prompt[1:], nxt]
        logits, h = dft.decode(pairs, g, 0)
        for p, tok in enumerate(pairs):
            z, hp = ref.decode(tok, g[p], p)
        fin = np.isfinite(z)
        assert np.array_equal(np.isfinite(logits), fin)
        _close(logits[fin], z[fin])
        _close(h, ref.feedback(hp))
        # chained draft steps feed the (post-norm for 3.1) state back
        pos = len(prompt)
        for step, tok in zip(range(4), itertools.cycle([101, 32, 120])):
            logits, h = dft.decode([tok], h[None, :], pos + step)
            z, hp = ref.decode(tok, ref.feedback(hp), pos + step)
            _close(logits[fin], z[fin])
            _close(h, ref.feedback(hp))
