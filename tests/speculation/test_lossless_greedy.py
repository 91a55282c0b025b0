"""Greedy speculation emits the tokens the target alone emits (plain greedy, replayed one token
at a time; see helpers/greedy.py for the near-tie rule that makes this hold on any CPU)."""

from __future__ import annotations

import pytest

import localspec
from localspec.lowlevel import parts

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.greedy import F32_MARGIN, assert_greedy_lossless, replay_plain_greedy

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
def test_greedy_is_plain_greedy(engines, variant, k) -> None:
    eng = engines[variant]
    for prompt in PROMPTS:
        spec = eng.complete(prompt, max_tokens=120, n_draft=k)
        assert len(spec.tokens) == 120 and spec.stats.drafted > 0
        assert spec.text == eng.detokenize(spec.tokens)
        assert_greedy_lossless(eng, prompt, spec)


def test_long_run_600_tokens(engines) -> None:
    eng = engines["eagle3.1"]
    for k in (3, 8):
        spec = eng.complete("In the beginning", max_tokens=600, n_draft=k)
        assert len(spec.tokens) == 600, "the tiny target stopped early; pick another prompt"
        assert_greedy_lossless(eng, "In the beginning", spec)


def test_plain_path_is_exactly_the_replay_and_llama_cpp_pythons(models) -> None:
    """Our plain loop computes what the replay does (same decode shapes: no tie allowed), and
    llama-cpp-python's own greedy generator agrees with it up to near-ties."""
    from llama_cpp import Llama

    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        prompt = eng.tokenize("the quick brown fox")
        plain = eng.complete(prompt, max_tokens=80, n_draft=0)
        assert replay_plain_greedy(eng, prompt, plain.tokens, margin=F32_MARGIN).ties == []
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
        assert len(theirs) == 80
        replay_plain_greedy(eng, prompt, theirs, margin=F32_MARGIN)


def bigram_accepts(prompt: bytes, out: list[int], k: int, break_at: int | None) -> list[int]:
    """Accepted drafts per step that the bigram pair must give, by simulating its drafter.
    From the pair (last, g[n-1]) it drafts d_j = sigma(f^j(t[n-1])), where f is sigma except
    f(break_at) = 'a'; the target continues t[n+j] = sigma^(j+1)(t[n-1]). Steps draft
    min(k, tokens left - 1), as the engine does, and accept while drafts match."""
    sg = tm.sigma()

    def f(t: int) -> int:
        return tm.LETTERS[0] if t == break_at else int(sg[t])

    seq = [*prompt, *out]
    n, generated, accepts = len(prompt), 1, []
    while generated < len(out):
        s, m = seq[n - 1], 0
        for j in range(1, min(k, len(out) - generated - 1) + 1):
            s = f(s)
            if int(sg[s]) != seq[n + j]:
                break
            m += 1
        accepts.append(m)
        n += m + 1
        generated += m + 1
    return accepts


def test_agreeing_drafter_accepts_every_draft(agree) -> None:
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as eng:
        evs = list(eng.complete_stream("abc", max_tokens=200, n_draft=6))
        spec = eng.last_stats
        tokens = [t for ev in evs for t in ev.tokens]
        assert bytes(tokens).startswith(b"defghijklmnopqrstuvwxyzabc")
        per_step = [sum(ev.accepted) for ev in evs[1:]]
        assert per_step == bigram_accepts(b"abc", tokens, 6, None)
        assert per_step[:-1] == [6] * (len(per_step) - 1)  # k accepted at every full step
        assert spec.accepted == sum(per_step) and spec.steps == len(per_step)


def test_partly_agreeing_drafter_accepts_exactly_what_it_can(tmp_path) -> None:
    target, draft = tm.write_agreeing_pair(str(tmp_path), break_at=ord("m"))
    with localspec.load(target, draft=draft, **EXACT) as eng:
        evs = list(eng.complete_stream("abc", max_tokens=150, n_draft=5))
        tokens = [t for ev in evs for t in ev.tokens]
        per_step = [sum(ev.accepted) for ev in evs[1:]]
        assert per_step == bigram_accepts(b"abc", tokens, 5, ord("m"))
        assert 0 < sum(per_step) < 5 * len(per_step)  # both accepts and rejects happened
        accepted = [a for ev in evs for a in ev.accepted]
        # the drafter maps m to a (not n), so it can never propose the o that follows n
        assert all(not a for t, a in zip(tokens, accepted, strict=True) if t == ord("o"))
        assert_greedy_lossless(eng, "abc", eng.complete("abc", max_tokens=150, n_draft=5))


def test_chunked_prefill_keeps_the_drafter_in_step(agree) -> None:
    # prompt chunks of 16 target tokens and 8 drafter rows: the drafter's first draft depends
    # on the last prompt pair, so full acceptance shows the chunks were stitched correctly
    target, draft = agree
    prompt = bytes("abcdefghijklmnopqrstuvwxyz" * 4, "ascii")
    small = {**EXACT, "n_batch": 16, "draft_batch": 8}
    with localspec.load(target, draft=draft, **small) as eng:
        spec = eng.complete(list(prompt), max_tokens=60, n_draft=7)
        assert_greedy_lossless(eng, list(prompt), spec)
        assert spec.stats.accepted == sum(bigram_accepts(prompt, spec.tokens, 7, None))
        assert spec.stats.acceptance_rate > 0.95, spec.stats.summary()


def test_drafter_without_localspec_keys_loads(models, tmp_path) -> None:
    """A file as llama.cpp's own converter writes it: no recorded target, plain EAGLE-3."""
    path = tm.write_drafter(str(tmp_path / "llamacpp.gguf"), models["target"], localspec_keys=False)
    with localspec.load(models["target"], draft=path, **EXACT) as eng:
        assert parts(eng).drafter.spec.target_record["vocab_fingerprint"] is None
        assert parts(eng).drafter.spec.variant == "EAGLE-3"
        spec = eng.complete("hello there", max_tokens=50, n_draft=3)
        assert_greedy_lossless(eng, "hello there", spec)
