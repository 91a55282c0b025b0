"""The native door: every staging symbol binds, and failures name the required version."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import native as N
from localspec.errors import NativeLibraryError
from localspec.lowlevel import parts

from helpers import tinymodels as tm


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
    from localspec.native import library

    monkeypatch.setattr(library, "INSTALLED_LLAMA_CPP_PYTHON", "0.3.99")
    with pytest.raises(NativeLibraryError, match=r"llama-cpp-python==0\.3\.36"):
        library._bind_staging()


def test_missing_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.native import library

    bogus = dict(library._STAGING)
    bogus["nope"] = ("_Z4nopev", [], None)
    monkeypatch.setattr(library, "_STAGING", bogus)
    with pytest.raises(NativeLibraryError, match=r"_Z4nopev.*0\.3\.36"):
        library._bind_staging()


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


def test_one_output_finds_the_state_row_after_decodes_of_any_size(agree) -> None:
    """one_output reads only the logits' address and takes the state row's from what it saw
    there before. Between one-row decodes come decodes and encodes of other sizes: more rows
    than the context has sequences lay llama.cpp's output buffer out again at the same
    address, and the largest makes it allocate a bigger buffer. Its views must still hold
    what llama.cpp's own getter returns for the state row."""
    import localspec

    from conftest import EXACT

    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as eng:
        dft = parts(eng).drafter
        ctx, w = dft.ctx, dft.n_embd
        rng = np.random.default_rng(0)
        one, many = N.Batch(1, embd=w), N.Batch(dft.n_batch, embd=w)
        wide = ctx.n_seq_max + 3  # laid out by its own row count, not by n_seq_max
        assert wide < dft.n_batch
        dft.restart(0)
        pos, last_address, relaid, previous = 0, None, 0, 0
        for n in (1, 1, 7, 1, dft.n_batch, 1, wide, 1, -wide, 1, 3, 1, wide + 1, 1):
            if n < 0:  # the encoder: it lays the buffer out by its row count too
                dft.encode(rng.standard_normal((-n, dft.tap_width)).astype(np.float32))
            else:
                b = one if n == 1 else many
                assert b.embd is not None
                b.token[:n] = rng.integers(0, tm.N_VOCAB, n)
                b.embd[:n] = rng.standard_normal((n, w))
                b.set(n, pos, all_logits=True)
                ctx.decode(b, "test")
                pos += n
            if n == 1:
                logits, h = ctx.one_output(w)
                np.testing.assert_array_equal(h, ctx.nextn_ith(0, w))
                address = logits.ctypes.data
                relaid += int(abs(previous) > ctx.n_seq_max and address == last_address)
                last_address = address
            previous = n
        assert relaid >= 3, "no one-row decode came after another layout at the same address"
        eng.reset()


def test_a_batch_set_after_other_layouts_is_sequence_0_with_the_outputs_asked() -> None:
    """Batch.set rewrites the sequence and output fields only when an earlier call left them
    otherwise: after tree and multi-sequence layouts, every row set is in sequence 0 alone,
    with an output on every row or on the last one only."""
    b = N.Batch(8, seqs_per_row=3)

    def check(n: int, pos0: int, all_logits: bool) -> None:
        b.set(n, pos0, all_logits=all_logits)
        assert b.struct.n_tokens == n
        assert b.pos[:n].tolist() == list(range(pos0, pos0 + n))
        assert b.n_seq_id[:n].tolist() == [1] * n and b.seq_ids[:n, 0].tolist() == [0] * n
        want = [1] * n if all_logits else [0] * (n - 1) + [1]
        assert b.logits[:n].tolist() == want

    check(3, 5, True)
    b.set_tree(np.arange(6, dtype=np.int32), [[1, 2], [1], [2, 3], [3], [4, 5, 6], [7]])
    check(6, 0, True)
    check(8, 2, False)
    check(4, 9, True)
    b.set_rows(np.arange(5, dtype=np.int32), np.array([3, 1, 2, 0, 4], dtype=np.int32),
               logits=np.array([0, 1, 0, 0, 1], dtype=np.int8))  # fmt: skip
    check(5, 1, True)
    check(1, 40, False)
    check(7, 0, True)
