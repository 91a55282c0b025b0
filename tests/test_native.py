"""The native door: every staging symbol binds, and failures name the required version."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import _native as N
from localspec.errors import NativeLibraryError
from localspec.lowlevel import parts

import tinymodels as tm


def test_every_staging_function_does_its_job(agree) -> None:
    """Each bound staging symbol, called for real on the bigram pair, returns what the models
    were built to give: the target adds nothing in its layers, so the input of every layer is
    the token's one-hot embedding; the drafter's encoder copies the first tap, and its decoder
    state is one-hot(sigma(token))."""
    import localspec

    from conftest import EXACT

    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as eng:
        tgt, dft = parts(eng).target, parts(eng).drafter
        d = tgt.n_embd
        eye = np.eye(tm.N_VOCAB, d, dtype=np.float32)
        toks = list(b"hello")
        tgt.clear()
        for lid in (0, 1, 2):  # llama_set_embeddings_layer_inp
            tgt.ctx.keep_layer_input(lid, True)
        tgt.decode(toks, all_logits=False)
        for lid in (0, 1, 2):  # llama_get_embeddings_layer_inp
            np.testing.assert_allclose(tgt.ctx.layer_input(lid, len(toks)), eye[toks], atol=1e-6)
        assert dft.model.target_layer_ids() == (0, 1, 2)  # llama_model_target_layer_ids(_n)
        assert dft.ctx.other() == tgt.ctx.ptr  # llama_get_ctx_other
        # llama_set_embeddings_nextn (at creation) + llama_get_embeddings_nextn: the encoder
        g = dft.encode(tgt.read_taps(len(toks)))
        np.testing.assert_allclose(g, eye[toks], atol=1e-5)
        # llama_get_embeddings_nextn_ith: the decoder's pre-norm state of each row
        dft.restart(0)
        _, hs = dft.decode_all(toks[1:], g[:-1], 0)
        sigma = tm.sigma()
        # (the FFN built in tinymodels reaches its target up to silu(8 sqrt(d)) < 1: 3e-3)
        np.testing.assert_allclose(hs, eye[sigma[toks[:-1]]], atol=1e-2)
        eng.reset()


def test_wrong_version_is_refused_with_the_required_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(N, "INSTALLED_LLAMA_CPP_PYTHON", "0.3.99")
    with pytest.raises(NativeLibraryError, match=r"llama-cpp-python==0\.3\.36"):
        N._bind_staging()


def test_missing_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = dict(N._STAGING)
    bogus["nope"] = ("_Z4nopev", [], None)
    monkeypatch.setattr(N, "_STAGING", bogus)
    with pytest.raises(NativeLibraryError, match=r"_Z4nopev.*0\.3\.36"):
        N._bind_staging()


def test_header_reader_matches_gguf_py(models: dict[str, str]) -> None:
    from gguf import GGUFReader

    h = N.GGUFHeader(models["draft"])
    r = GGUFReader(models["draft"])
    assert h.architecture == "eagle3"
    assert h.kv["eagle3.target_layers"] == [1, 2, 3]
    assert set(h.tensors) == {t.name for t in r.tensors}
    for t in r.tensors:
        assert h.tensors[t.name].shape == tuple(int(x) for x in t.shape)
        assert h.data_offset + h.tensors[t.name].offset == t.data_offset
