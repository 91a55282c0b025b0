"""Speculative sampling keeps the target's output distribution exactly (statistical test)."""

from __future__ import annotations

import itertools
import math

import numpy as np

import localspec
from localspec.speculation import verify
from localspec.speculation.sampling import SamplingParams, probs

from conftest import EXACT
from helpers.chisquare import chi2_critical, chi2_of_samples, exact_distribution

# min-p judges the logits before the temperature (llama.cpp's order): this head's logits lie
# tens apart, so a cut 45 below the likeliest keeps 1 to ~24 tokens per position
SP_MIN_P = {"temperature": 15.0, "min_p": math.exp(-45.0)}


def test_speculative_sampling_matches_target_distribution(noisy_pair) -> None:
    target, draft = noisy_pair
    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt)
        assert abs(sum(expected.values()) - 1) < 1e-9
        stat, df, acc = chi2_of_samples(eng, prompt, expected)
    # both paths ran: drafts were accepted and rejected
    assert 0.2 < acc / 2 < 0.95, acc
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


def test_speculative_sampling_with_min_p_matches_target_distribution(noisy_pair) -> None:
    """Rejection sampling with a cut: drafter and target distributions are both cut by
    min_p before the acceptance test and the residual."""
    target, draft = noisy_pair
    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt, SP_MIN_P)
        assert abs(sum(expected.values()) - 1) < 1e-9
        stat, df, acc = chi2_of_samples(eng, prompt, expected, SP_MIN_P)
    assert 0.2 < acc / 2 < 0.95, acc
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


def test_tree_sampling_matches_target_distribution(noisy_pair) -> None:
    """Multi-candidate acceptance over a draft tree (top-k children per node) is lossless too."""
    target, draft = noisy_pair
    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt)
        stat, df, acc = chi2_of_samples(eng, prompt, expected, tree=(2, 2, 4))
    # drafts were accepted (often at a second-choice child) and rejected
    assert 0.2 < acc / 2 < 0.95, acc
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


def test_the_check_catches_a_biased_tree_walk(noisy_pair, monkeypatch) -> None:
    """Negative control: descending into the first child whatever the target draws is not
    lossless, and the test says so."""
    from localspec.speculation import step as step_mod

    walk = step_mod.walk

    def biased(tree, logits, sp, draws, pos):
        out = walk(tree, logits, sp, draws, pos)
        if not out.path and tree.tokens:  # rejected at the root: take the first child anyway
            out.path, out.y = [0], out.y
        return out

    target, draft = noisy_pair
    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt)
        monkeypatch.setattr(step_mod, "walk", biased)
        stat, df, _ = chi2_of_samples(eng, prompt, expected, tree=(2, 2, 4))
    assert stat > chi2_critical(df), (stat, df)


def test_the_check_catches_a_biased_sampler(noisy_pair, monkeypatch) -> None:
    """Negative control: accepting every draft is not lossless, and the test says so."""
    target, draft = noisy_pair

    def accept_all(p, d, q, draws):
        return d, True

    with localspec.load(target, draft=draft, **EXACT) as eng:
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt)
        monkeypatch.setattr(verify, "_rejection", accept_all)
        stat, df, _ = chi2_of_samples(eng, prompt, expected)
    assert stat > chi2_critical(df), (stat, df)


def test_plain_sampling_is_seeded_and_reproducible(models) -> None:
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        a = eng.complete("hello", max_tokens=30, temperature=0.8, top_p=0.9, seed=42).tokens
        b = eng.complete("hello", max_tokens=30, temperature=0.8, top_p=0.9, seed=42).tokens
        c = eng.complete("hello", max_tokens=30, temperature=0.8, top_p=0.9, seed=43).tokens
    assert a == b
    assert a != c


def test_probs_filters() -> None:
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0])
    p = probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.count_nonzero(p) == 2 and p[0] > p[1] > 0
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert np.count_nonzero(p) == 1
    full = np.exp(logits - logits.max())
    full /= full.sum()
    np.testing.assert_allclose(probs(logits, SamplingParams(temperature=1.0)), full)
    assert list(itertools.islice(np.nonzero(probs(logits, SamplingParams(1.0, 0, 0.9)))[0], 5)) == [
        0,
        1,
        2,
    ]


def test_a_seed_gives_plains_text_in_auto_and_tree_modes(noisy_pair) -> None:
    """Tokens are drawn with position-keyed uniforms: auto and trees reproduce plain sampling's
    text for the same seed exactly (whatever steps the cost model scheduled)."""
    target, draft = noisy_pair
    kw = {"max_tokens": 60, "temperature": 1.5, "top_p": 0.95}
    with localspec.load(target, draft=draft, **EXACT) as eng:
        for seed in range(5):
            plain = eng.complete("abc", n_draft=0, seed=seed, **kw)
            assert eng.complete("abc", seed=seed, **kw).tokens == plain.tokens
            tree = eng.complete("abc", tree=(3, 2, 5), seed=seed, **kw)
            assert tree.tokens == plain.tokens and tree.stats.accepted > 0
        other = eng.complete("abc", n_draft=0, seed=99, **kw)
    assert other.tokens != plain.tokens
