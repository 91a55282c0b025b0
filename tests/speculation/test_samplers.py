"""llama.cpp's samplers in localspec: the chain checked against llama.cpp's own (through
llama-cpp-python's bindings) on random logits and histories, DRY on a real vocabulary, and
lossless under speculation: greedy replies equal an independent plain loop through llama.cpp's
chain (penalties, DRY, logit bias, each position with its own history), sampled ones have
its distribution (chi-square), and bad settings get one clear error naming them."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import localspec
from localspec.errors import InvalidParameterError
from localspec.lowlevel import parts
from localspec.speculation.sampling import DRY_BREAKERS, Sampler, SamplingParams

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.chisquare import chi2_critical, chi2_of_samples, exact_distribution
from helpers.greedy import assert_greedy_lossless
from helpers.llama_samplers import native_distribution, native_logits

CHAINS = {
    "penalties": {
        "repeat_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.2,
        "repeat_last_n": 32,
        "temperature": 0.9,
    },
    "bias": {"logit_bias": {5: 3.0, 7: -math.inf, 9: -2.5, 11: 40.0}, "temperature": 1.1},
    "llama-defaults": {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8},
    "typical": {"typical_p": 0.7, "temperature": 1.2},
    "everything": {
        "top_k": 50,
        "typical_p": 0.9,
        "top_p": 0.9,
        "min_p": 0.02,
        "temperature": 0.7,
        "repeat_penalty": 1.2,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.1,
        "repeat_last_n": 16,
        "logit_bias": {3: 2.0, 4: -1.0},
    },
    "greedy-penalties": {"repeat_penalty": 1.5, "frequency_penalty": 0.5},
    "greedy-typical": {"typical_p": 0.5},
}


@pytest.mark.parametrize("name", CHAINS)
def test_the_chain_is_llama_cpps(name: str) -> None:
    """Random logits over 3000 tokens after a history of repeats among 60 of them, and a draft
    path after it: the distribution (and the greedy choice) is the one llama.cpp's own chain
    leaves after accepting history and path."""
    sp = SamplingParams(**CHAINS[name])
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n = 3000
    changed = 0
    for trial in range(25):
        logits = (rng.standard_normal(n) * 3.0).astype(np.float32)
        logits[:60] += 4.0  # the repeated tokens are the likely ones: penalties matter
        history = rng.integers(0, 60, 120).tolist()
        path = rng.integers(0, 60, trial % 5).tolist()
        s = Sampler(sp, n_vocab=n, n_ctx=4096, history=history)
        ours = s.distribution(logits, path)
        ref = native_distribution(logits, sp, history + path)
        assert np.array_equal(ours > 0, ref > 0), (trial, np.flatnonzero(ours != ref)[:5])
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-7)
        if sp.greedy:
            assert s.choose(logits, path, rng, None) == int(np.argmax(ref))
        else:  # a draw lands on a token the chain keeps
            assert ref[s.choose(logits, path, rng, float(rng.random()))] > 0
        changed += int(np.argmax(ours) != int(np.argmax(logits)))
    if name != "llama-defaults":  # (truncation alone keeps the likeliest token)
        assert changed > 0  # the samplers moved the choice: the comparison is not vacuous


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tm.write_target(str(tmp_path_factory.mktemp("samplers") / "t.gguf"))


@pytest.mark.parametrize(
    "breakers",
    [DRY_BREAKERS, ("\n", "c d", "at", "xyz:"), ("the",)],
    ids=["default", "multi-token", "word"],
)
def test_dry_is_llama_cpps_on_a_real_vocabulary(tiny: str, breakers: tuple[str, ...]) -> None:
    """DRY's sequence breakers are found in the model's vocabulary as llama.cpp finds them
    (tokens holding a breaker, and tokens ending with its start followed by the rest's
    tokens), and its penalties after repetitive text are llama.cpp's."""
    texts = [
        "the cat sat on the mat. the cat sat on the",
        "a b c d a b c d a b c d a b c",
        "x: 1\ny: 2\nx: 1\ny: 2\nx: 1\ny:",
        "at the cat at the cat at the xyz: at the cat at the",
    ]
    rng = np.random.default_rng(3)
    with localspec.load(tiny, draft=False, **EXACT) as eng:
        vocab = parts(eng).target.model.vocab
        penalized = 0
        for allowed, last_n in ((2, 64), (1, 12), (3, -1)):
            sp = SamplingParams(
                temperature=1.0,
                dry_multiplier=0.8,
                dry_base=1.75,
                dry_allowed_length=allowed,
                dry_penalty_last_n=last_n,
                dry_sequence_breakers=breakers,
            )
            for text in texts:
                history = eng.tokenize(text)
                logits = rng.standard_normal(tm.N_VOCAB).astype(np.float32)
                s = Sampler(
                    sp, n_vocab=tm.N_VOCAB, n_ctx=512, history=history,
                    breakers=eng._dry_breakers,
                )  # fmt: skip
                ours = s.logits(logits)
                # llama.cpp's -1 is the context: the native sampler is given the context's size
                ref_sp = SamplingParams(**{**sp.__dict__, "dry_penalty_last_n": 512}) if (
                    last_n == -1
                ) else sp  # fmt: skip
                ref = native_logits(logits, ref_sp, history, vocab)
                np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-5)
                penalized += int(np.any(ours != logits))
    assert penalized >= 6  # repetitions were penalized: the comparison is not vacuous


# --- lossless under speculation ----------------------------------------------------------------

# on the agreeing pair (it cycles through the alphabet, its drafter agrees): settings that
# change its text, so the samplers matter at drafted positions
GREEDY = {
    "penalties": {
        "repeat_penalty": 1.4,
        "presence_penalty": 80.0,
        "frequency_penalty": 0.5,
        "repeat_last_n": 40,  # a letter comes back 26 tokens later
    },
    "dry": {"dry_multiplier": 1.5, "dry_allowed_length": 1, "dry_penalty_last_n": 48},
    "bias": {"logit_bias": {ord("e"): -math.inf, ord("q"): 5.0}},
    "all": {
        "repeat_penalty": 1.2,
        "presence_penalty": 75.0,
        "repeat_last_n": 30,
        "dry_multiplier": 0.9,
        "logit_bias": {ord("k"): -math.inf},
        "typical_p": 0.9,
    },
}
ALPHABET = "abcdefghijklmnopqrstuvwxyzabc"


@pytest.mark.parametrize("name", GREEDY)
@pytest.mark.parametrize(
    "how",
    [{"n_draft": 3}, {"tree": (3, 2, 6)}, {"draft_source": "ngram", "n_draft": 4}],
    ids=["chain", "tree", "ngram"],
)
def test_greedy_with_history_samplers_is_plain_decoding(agree, name: str, how: dict) -> None:
    """EAGLE chains, trees and n-gram drafts under penalties, DRY and logit bias: every token
    is what a plain loop through llama.cpp's own chain picks after the tokens before it (a
    draft position's penalty window holds the drafts before it); drafts were accepted, and
    the settings changed the text."""
    kw = GREEDY[name]
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as eng:
        plain = eng.complete(ALPHABET, max_tokens=64, n_draft=0).tokens
        c = eng.complete(ALPHABET, max_tokens=64, temperature=0.0, **kw, **how)
        assert c.stats.accepted > 0, c.stats.as_dict()
        assert c.tokens != plain
        assert_greedy_lossless(eng, ALPHABET, c, sampling=SamplingParams(**kw))


@pytest.fixture(scope="module")
def warm_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """An agreeing pair with a noisy, small head: at temperature 1 its distribution spreads
    over several tokens, where top-p, typical-p and min-p cut it."""
    return tm.write_agreeing_pair(
        str(tmp_path_factory.mktemp("warm")), head_noise=0.2, head_scale=0.27, name="warm"
    )


# each keeps few tokens per position (top-k or min-p), so the exact distribution of three
# tokens takes a few hundred contexts
SAMPLED = {
    "min_p+penalties": {
        "temperature": 1.0,
        "top_k": 10,
        "min_p": 0.05,
        "repeat_penalty": 1.5,
        "presence_penalty": 0.8,
        "repeat_last_n": 6,
    },
    "typical+top_p": {"temperature": 1.3, "typical_p": 0.8, "top_p": 0.9, "top_k": 12},
    # drafted tokens pulled back at the next positions (the negative control's setting)
    "presence-pull": {"temperature": 1.0, "top_k": 8, "presence_penalty": -3.0, "repeat_last_n": 3},
    "dry+bias": {
        "temperature": 0.9,
        "top_k": 8,
        "dry_multiplier": 2.0,
        "dry_allowed_length": 1,
        "logit_bias": {ord("d"): 2.0},
    },
}


@pytest.mark.parametrize("name", SAMPLED)
@pytest.mark.parametrize("how", [{"n_draft": 2}, {"tree": (2, 2, 4)}], ids=["chain", "tree"])
def test_sampled_with_samplers_keeps_the_distribution(warm_pair, name: str, how: dict) -> None:
    """Three tokens sampled 3000 times under speculation against llama.cpp's own chain one
    context at a time (chi-square, p ~ 0.001): rejection sampling of EAGLE chains and
    multi-candidate trees, with the position's own history at every node."""
    kw = SAMPLED[name]
    target, draft = warm_pair
    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("mnop")
        expected = exact_distribution(eng, prompt, kw)
        assert abs(sum(expected.values()) - 1) < 1e-9
        stat, df, acc = chi2_of_samples(eng, prompt, expected, kw, **how)
    assert acc > 0.05  # drafts were accepted, hundreds (and, df >= 5, the outcomes spread)
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


def test_the_chi_square_catches_a_penalty_window_without_the_path(warm_pair, monkeypatch) -> None:
    """Negative control: judging a draft position with the history before the step only (its
    path left out of the penalty window) is not lossless, and the test says so."""
    # a negative presence penalty favours the tokens just drafted: without the path in the
    # window a drafted position misses that pull
    kw = SAMPLED["presence-pull"]
    real = Sampler.logits

    def no_path(self, row, path=()):
        return real(self, row, ())

    target, draft = warm_pair
    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("mnop")
        expected = exact_distribution(eng, prompt, kw)
        monkeypatch.setattr(Sampler, "logits", no_path)
        stat, df, _ = chi2_of_samples(eng, prompt, expected, kw, tree=(2, 2, 4))
    assert stat > chi2_critical(df), (stat, df)


# --- settings ----------------------------------------------------------------------------------

BAD = [
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"typical_p": 0.0}, "typical_p"),
    ({"repeat_penalty": 0.0}, "repeat_penalty"),
    ({"repeat_penalty": math.nan}, "repeat_penalty"),
    ({"repeat_last_n": -2}, "repeat_last_n"),
    ({"presence_penalty": math.inf}, "presence_penalty"),
    ({"frequency_penalty": "a lot"}, "frequency_penalty"),
    ({"dry_multiplier": -1.0}, "dry_multiplier"),
    ({"dry_base": 0.5}, "dry_base"),
    ({"dry_allowed_length": -1}, "dry_allowed_length"),
    ({"dry_penalty_last_n": -5}, "dry_penalty_last_n"),
    ({"dry_sequence_breakers": ["\n", ""]}, "dry_sequence_breakers"),
    ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {5: math.nan}}, "logit_bias"),
    ({"logit_bias": {5: math.inf}}, "logit_bias"),
    ({"logit_bias": {tm.N_VOCAB + 5: 1.0}}, "logit_bias"),
    ({"top_k": -1}, "top_k"),
    ({"temperature": -0.5}, "temperature"),
]


@pytest.mark.parametrize(("kw", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_settings_get_one_clear_error(tiny: str, kw: dict, param: str) -> None:
    with localspec.load(tiny, draft=False, **EXACT) as eng:
        with pytest.raises(InvalidParameterError) as e:
            eng.complete("abc", max_tokens=4, **kw)
        assert e.value.parameter == param
        assert param in str(e.value)
        assert eng.complete("abc", max_tokens=2).tokens  # the engine goes on


def test_a_window_of_the_whole_context_is_the_contexts_length() -> None:
    """repeat_last_n and dry_penalty_last_n -1 (llama-server's "the context") look back over
    n_ctx tokens: what llama.cpp's chain does given that length."""
    rng = np.random.default_rng(11)
    n, n_ctx = 500, 40
    history = rng.integers(0, 30, 90).tolist()
    logits = (rng.standard_normal(n) * 2).astype(np.float32)
    logits[:30] += 3.0
    whole = SamplingParams(temperature=1.0, repeat_penalty=1.6, repeat_last_n=-1)
    sized = SamplingParams(temperature=1.0, repeat_penalty=1.6, repeat_last_n=n_ctx)
    ours = Sampler(whole, n_vocab=n, n_ctx=n_ctx, history=history).distribution(logits, [3])
    np.testing.assert_allclose(ours, native_distribution(logits, sized, [*history, 3]), atol=1e-7)
    shorter = Sampler(sized, n_vocab=n, n_ctx=n_ctx, history=history[-10:])
    assert not np.allclose(ours, shorter.distribution(logits, [3]))  # the window reaches back


def test_odd_but_valid_settings_stay_finite() -> None:
    """numpy numbers are numbers; every token banned still yields one (llama.cpp's first);
    a tiny temperature is near greedy, never NaN; a huge bias is refused, not overflowed."""
    rng = np.random.default_rng(2)
    logits = rng.standard_normal(50).astype(np.float32)
    sp = SamplingParams(temperature=np.float32(0.7), top_k=np.int64(5), min_p=np.float64(0.1))
    assert sp.temperature == pytest.approx(0.7) and sp.top_k == 5
    banned = SamplingParams(temperature=1.0, logit_bias={t: -math.inf for t in range(50)})
    p = Sampler(banned, n_vocab=50, n_ctx=64).distribution(logits)
    assert np.isfinite(p).all() and p.sum() == pytest.approx(1.0)
    cold = Sampler(SamplingParams(temperature=1e-300), n_vocab=50, n_ctx=64)
    assert cold.choose(logits, (), rng, 0.999) == int(np.argmax(logits))
    assert np.isfinite(cold.distribution(logits)).all()
    for bad in (1e30, 10**400, math.inf, math.nan):
        with pytest.raises(InvalidParameterError, match="logit_bias"):
            SamplingParams(logit_bias={3: bad})


def test_sampling_all_at_once_refuses_single_settings_beside_it(tiny: str) -> None:
    with localspec.load(tiny, draft=False, **EXACT) as eng:
        sp = SamplingParams(temperature=0.0, repeat_penalty=1.3)
        a = eng.complete("abc", max_tokens=8, sampling=sp)
        assert a.tokens == eng.complete("abc", max_tokens=8, repeat_penalty=1.3).tokens
        with pytest.raises(InvalidParameterError, match="min_p given beside sampling="):
            eng.complete("abc", max_tokens=8, sampling=sp, min_p=0.1)


def test_a_text_bias_counts_each_occurrence(tiny: str) -> None:
    """[["text", bias]]: each of the text's tokens, once per occurrence (llama-server)."""
    with localspec.load(tiny, draft=False, **EXACT) as eng:
        toks = eng.tokenize("aa")
        assert len(toks) == 2 and toks[0] == toks[1]
        logits = np.zeros(tm.N_VOCAB, dtype=np.float32)
        from_text = eng._token_bias([("aa", 1.5)])
        assert from_text == [(toks[0], 1.5), (toks[0], 1.5)]
        sp = SamplingParams(temperature=1.0, logit_bias=from_text)
        assert sp.logit_bias == ((toks[0], 3.0),)
        assert Sampler(sp, n_vocab=tm.N_VOCAB, n_ctx=64).logits(logits)[toks[0]] == 3.0


def test_settings_describe_themselves_and_neutral_ones_are_left_out() -> None:
    assert SamplingParams().describe() == "greedy"
    sp = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1)
    assert sp.describe() == (
        "penalties(last 64, repeat 1.1, presence 0, frequency 0), top_k 40, top_p 0.95, "
        "min_p 0.05, temperature 0.8"
    )
    assert not SamplingParams(repeat_penalty=1.3, repeat_last_n=0).penalizes
    assert not SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=0).dries
    assert SamplingParams(logit_bias=[(3, 1.0), (3, 0.5)]).logit_bias == ((3, 1.5),)
