"""Engine.use_drafter: several drafters take turns on one loaded target, each lossless, each
drafting its own drafts, switched back without loading again; a drafter that cannot pair is
refused in one error and the previous one works on."""

from __future__ import annotations

import shutil

import pytest

import localspec
from localspec import load
from localspec.lowlevel import parts

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless

PROMPT = "abc"


@pytest.fixture(scope="module")
def drafters(agree, tmp_path_factory) -> dict[str, str]:
    """For the agreeing target: its own drafter (agrees everywhere), one that breaks the
    alphabet after 'h', and a random one tapping other layers (1, 2, 3 instead of 0, 1, 2)."""
    d = tmp_path_factory.mktemp("drafters")
    _, half = tm.write_agreeing_pair(str(d), break_at=ord("h"), name="half")
    other = tm.random_drafter_for(agree[0], str(d / "taps123.gguf"), taps=(1, 2, 3))
    return {"agree": agree[1], "half": half, "taps": other}


def test_drafters_take_turns_on_one_target(agree, drafters) -> None:
    with load(agree[0], draft=agree[1], **EXACT) as eng:
        target = parts(eng).target
        plain = eng.complete(PROMPT, max_tokens=24, n_draft=0).tokens
        chains, tau = {}, {}
        loaded = {"agree": parts(eng).drafter}
        for name in ("half", "taps", "agree", "half", "agree"):
            eng.use_drafter(drafters[name])
            assert eng.draft_path == drafters[name] and drafters[name] in eng.drafter_note
            assert eng.cached_tokens == 0  # a switch empties the caches
            assert target.taps == ((1, 2, 3) if name == "taps" else (0, 1, 2))
            # switching back finds the drafter loaded before
            assert loaded.setdefault(name, parts(eng).drafter) is parts(eng).drafter
            out = eng.complete(PROMPT, max_tokens=24, n_draft=3)
            assert out.tokens == plain
            assert out.stats.drafted > 0
            tau.setdefault(name, out.stats.tau)
            assert out.stats.tau == tau[name]  # the same drafter drafts the same again
            chain = eng.propose(PROMPT, k=6)
            assert chains.setdefault(name, chain) == chain
            assert_greedy_lossless(eng, PROMPT, out)
        # the drafts are the active drafter's: the agreeing one continues the alphabet, the
        # broken one leaves it after 'h', the random one is rarely accepted
        assert eng.detokenize(chains["agree"]) == "efghij"
        assert eng.detokenize(chains["half"])[:5] == "efghi" and chains["half"] != chains["agree"]
        assert tau["agree"] > tau["half"] > tau["taps"]
        # the drafter at work: nothing to do, the caches stay as they are
        eng.complete(PROMPT, max_tokens=4, n_draft=3)
        cached = eng.cached_tokens
        eng.use_drafter(drafters["agree"])
        assert cached > 0 and eng.cached_tokens == cached


def test_a_drafter_that_cannot_pair_is_refused_and_the_previous_one_works_on(
    agree, models, tmp_path
) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    bad = (
        (models["draft"], "hidden size"),  # made for the other tiny target
        (models["target"], "not an EAGLE-3 drafter"),
        (str(text), "not a GGUF file"),
        (str(tmp_path / "missing.gguf"), "no such file"),
    )
    with load(agree[0], draft=agree[1], **EXACT) as eng:
        want = eng.complete(PROMPT, max_tokens=16, n_draft=3)
        for path, msg in bad:
            with pytest.raises(localspec.LocalspecError, match=msg):
                eng.use_drafter(path)
            assert eng.draft_path == agree[1]
            again = eng.complete(PROMPT, max_tokens=16, n_draft=3)
            assert again.tokens == want.tokens and again.stats.tau == want.stats.tau
    with (
        load(agree[0], draft=False, **EXACT) as eng,
        pytest.raises(localspec.LocalspecError, match="draft=False"),
    ):
        eng.use_drafter(agree[1])


def test_an_engine_without_a_drafter_takes_one(agree, drafters, tmp_path) -> None:
    lonely = str(tmp_path / "lonely.gguf")  # no drafter beside it
    shutil.copy(agree[0], lonely)
    with load(lonely, **EXACT) as eng:
        assert eng.draft_path is None
        plain = eng.complete(PROMPT, max_tokens=16, n_draft=0).tokens
        eng.use_drafter(drafters["agree"])
        out = eng.complete(PROMPT, max_tokens=16, n_draft=3)
        assert out.tokens == plain and out.stats.tau > 3.5
        tree = eng.complete(PROMPT, max_tokens=16, tree="3,2,5")  # trees fit too
        assert tree.tokens == plain and tree.stats.tau > 2.0
        eng.use_drafter(drafters["taps"])
        assert eng.complete(PROMPT, max_tokens=16, n_draft=3).tokens == plain
