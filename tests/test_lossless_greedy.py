"""Greedy speculation emits exactly the tokens the target alone emits."""

from __future__ import annotations

import pytest

import localspec

import tinymodels as tm
from conftest import EXACT

PROMPTS = ["the quick brown fox", "Once upon a time, there was", "x", "1 2 3 4 5 6 7 8 9 10"]


@pytest.fixture(scope="module")
def engines(models):
    with (
        localspec.load(models["target"], draft=models["draft"], **EXACT) as e3,
        localspec.load(models["target"], draft=models["draft31"], **EXACT) as e31,
    ):
        yield {"eagle3": e3, "eagle3.1": e31}


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("variant", ["eagle3", "eagle3.1"])
def test_greedy_equals_plain(engines, variant, k) -> None:
    eng = engines[variant]
    for prompt in PROMPTS:
        plain = eng.complete(prompt, max_tokens=120, n_draft=0)
        spec = eng.complete(prompt, max_tokens=120, n_draft=k)
        assert spec.tokens == plain.tokens, prompt
        assert spec.text == plain.text
        assert spec.stats.steps <= plain.stats.steps


def test_long_run_500_tokens(engines) -> None:
    eng = engines["eagle3.1"]
    plain = eng.complete("In the beginning", max_tokens=600, n_draft=0)
    assert len(plain.tokens) >= 500, "the tiny target stopped early; pick another prompt"
    for k in (3, 8):
        spec = eng.complete("In the beginning", max_tokens=600, n_draft=k)
        assert spec.tokens == plain.tokens


def test_plain_path_equals_llama_cpp_python(models) -> None:
    """Our plain loop is itself checked against llama-cpp-python's own generator."""
    from llama_cpp import Llama

    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        ours = eng.complete("the quick brown fox", max_tokens=80, n_draft=4).tokens
        prompt = eng.tokenize("the quick brown fox")
    llm = Llama(
        models["target"],
        n_ctx=1024,
        n_threads=2,
        verbose=False,
        type_k=0,
        type_v=0,
        flash_attn=False,
    )
    theirs = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if tok == tm.EOS or len(theirs) == 80:
            break
        theirs.append(tok)
    llm.close()
    assert ours == theirs


def test_agreeing_drafter_is_accepted(agree) -> None:
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as eng:
        plain = eng.complete("abc", max_tokens=200, n_draft=0)
        assert plain.text.startswith("defghijklmnopqrstuvwxyzabc")
        spec = eng.complete("abc", max_tokens=200, n_draft=6)
        assert spec.tokens == plain.tokens
        st = spec.stats
        assert st.acceptance_rate > 0.95, st.summary()
        assert st.tau > 6.0, st.summary()
        assert sum(spec.accepted) == st.accepted > 150


def test_partly_agreeing_drafter_mixes_accepts_and_rejects(tmp_path) -> None:
    target, draft = tm.write_agreeing_pair(str(tmp_path), break_at=ord("m"))
    with localspec.load(target, draft=draft, **EXACT) as eng:
        plain = eng.complete("abc", max_tokens=150, n_draft=0)
        spec = eng.complete("abc", max_tokens=150, n_draft=5)
        assert spec.tokens == plain.tokens
        st = spec.stats
        assert 0.3 < st.acceptance_rate < 0.97, st.summary()
        # the drafter maps m to a (not n), so it can never propose the o that follows n
        assert all(
            not acc for tok, acc in zip(spec.tokens, spec.accepted, strict=True) if tok == ord("o")
        )


def test_chunked_prefill_keeps_the_drafter_in_step(agree) -> None:
    # prompt chunks of 16 target tokens and 8 drafter rows: the drafter's first draft depends
    # on the last prompt pair, so full acceptance shows the chunks were stitched correctly
    target, draft = agree
    prompt = bytes("abcdefghijklmnopqrstuvwxyz" * 4, "ascii")
    small = {**EXACT, "n_batch": 16, "draft_batch": 8}
    with localspec.load(target, draft=draft, **small) as eng:
        plain = eng.complete(list(prompt), max_tokens=60, n_draft=0)
        spec = eng.complete(list(prompt), max_tokens=60, n_draft=7)
        assert spec.tokens == plain.tokens
        assert spec.stats.acceptance_rate > 0.95, spec.stats.summary()


def test_drafter_without_localspec_keys_loads(models, tmp_path) -> None:
    """A file as llama.cpp's own converter writes it: no recorded target, plain EAGLE-3."""
    path = tm.write_drafter(str(tmp_path / "llamacpp.gguf"), models["target"], localspec_keys=False)
    with localspec.load(models["target"], draft=path, **EXACT) as eng:
        assert eng.drafter.spec.target_record["vocab_fingerprint"] is None
        assert eng.drafter.spec.variant == "EAGLE-3"
        plain = eng.complete("hello there", max_tokens=50, n_draft=0)
        assert eng.complete("hello there", max_tokens=50, n_draft=3).tokens == plain.tokens
