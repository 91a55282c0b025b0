"""End to end on the real SmolLM2-135M-Instruct GGUF with a random matching drafter."""

from __future__ import annotations

import pytest

import localspec
from localspec.files import discovery
from localspec.lowlevel import parts
from localspec.speculation.specstate import RESTART_AFTER

from helpers import tinymodels as tm
from helpers.greedy import QUANT_MARGIN, assert_greedy_lossless, replay_plain_greedy
from helpers.realmodels import smollm2_path

pytestmark = pytest.mark.smollm2


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = smollm2_path()
    d = tmp_path_factory.mktemp("smol")
    return target, tm.random_drafter_for(target, str(d / "smol.eagle3.gguf"))


@pytest.mark.parametrize("k", [2, 5])
def test_speculative_greedy_is_plain_greedy_200_tokens(pair, k) -> None:
    target, draft = pair
    with localspec.load(target, draft=draft, n_threads=2, n_ctx=2048) as eng:
        msgs = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
        prompt, _ = eng.format_chat(msgs)
        kw = {"parse_special": True, "add_special": False}
        spec = eng.complete(prompt, max_tokens=200, n_draft=k, **kw)
        assert len(spec.tokens) == 200 and spec.stats.drafted > 0
        assert_greedy_lossless(eng, prompt, spec, margin=QUANT_MARGIN, **kw)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_chat_is_llama_cpp_pythons_greedy(pair, flash_attn) -> None:
    """Speculative chat output, and llama-cpp-python's own greedy generator on the same file
    with the same attention kernel, are both plain greedy decoding up to near-ties (on an AMD
    EPYC without flash attention they differ at token 7 by a rounding-level tie)."""
    from llama_cpp import Llama

    target, draft = pair
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    opts = {"n_threads": 2, "n_ctx": 2048, "flash_attn": flash_attn}
    with localspec.load(target, draft=draft, **opts) as eng:
        prompt, _ = eng.format_chat(msgs)
        ours = eng.complete(prompt, max_tokens=60, n_draft=3, parse_special=True, add_special=False)
        prompt_tokens = eng.tokenize(prompt, add_special=False, parse_special=True)
        llm = Llama(target, n_ctx=2048, n_threads=2, verbose=False, flash_attn=flash_attn)
        theirs = []
        for tok in llm.generate(prompt_tokens, temp=0.0, top_k=1, reset=True):
            if parts(eng).eog[tok] or len(theirs) == 60:
                break
            theirs.append(tok)
        llm.close()
        assert len(ours.tokens) > 5 and len(theirs) > 5
        replay_plain_greedy(eng, prompt_tokens, ours.tokens, margin=QUANT_MARGIN)
        replay_plain_greedy(eng, prompt_tokens, theirs, margin=QUANT_MARGIN)


def test_default_pair_ships_a_trained_drafter_that_is_lossless_and_accepts() -> None:
    """With no model argument the engine pairs SmolLM2 with the drafter shipped in the package;
    it is lossless on real prompts and accepts far more than a random drafter (tau ~1.0)."""
    smollm2_path()
    with localspec.load(n_threads=2, n_ctx=2048) as eng:
        assert parts(eng).drafter is not None
        assert eng.draft_path == discovery.bundled_drafter(eng.target_path)
        assert eng.draft_variant == "EAGLE-3.1"
        assert eng.draft_window == 512  # the window it was trained over, from its GGUF
        accepted = steps = 0
        for q in ("Explain how a refrigerator works.", "Write a haiku about autumn."):
            prompt, _ = eng.format_chat([{"role": "user", "content": q}])
            kw = {"parse_special": True, "add_special": False}
            spec = eng.complete(prompt, n_draft=5, max_tokens=96, **kw)
            assert_greedy_lossless(eng, prompt, spec, margin=QUANT_MARGIN, **kw)
            accepted += spec.stats.accepted
            steps += spec.stats.steps
        assert (accepted + steps) / steps > 1.3


def test_default_pair_trees_and_auto_are_plain_greedy() -> None:
    """Draft trees and auto on the real quantized target give plain greedy's tokens, up to
    near-ties (beyond 256 cache cells llama.cpp's CPU flash attention sums a lone query's keys
    in a split-KV kernel and a verify batch's in another: docs/benchmarks.md)."""
    smollm2_path()
    with localspec.load(n_threads=2, n_ctx=2048) as eng:
        tok_kw = {"parse_special": True, "add_special": False}
        taus = []
        long_q = "Tell me a long story about a dragon who learns to bake bread. " * 12
        for q in ("Explain how a refrigerator works.", "Write a haiku about autumn.", long_q):
            prompt, _ = eng.format_chat([{"role": "user", "content": q}])
            for mode in ({"tree": (3, 2, 4)}, {"tree": (4, 4, 12)}, {}):  # {}: auto
                c = eng.complete(prompt, max_tokens=120, **mode, **tok_kw)
                assert_greedy_lossless(eng, prompt, c, margin=QUANT_MARGIN, **tok_kw)
                if mode:
                    taus.append(c.stats.tau)
        assert max(taus) > 1.5  # the shipped drafter's trees are accepted


def test_a_multi_turn_chat_reuses_the_cache_and_stays_plain_greedy() -> None:
    """Four turns on the default pair (auto), each reusing the previous turn's cache: every
    reply is plain greedy for its own prompt (up to near-ties: reused rows were computed by
    one-token decodes, a fresh prefill computes them in a batch), and equals a fresh engine's
    reply unless such a tie was met."""
    smollm2_path()
    msgs: list[dict[str, str]] = []
    kw = {"parse_special": True, "add_special": False}
    turns = ["Name three rivers.", "Which is the longest?", "Where does it start?", "Thanks!"]
    held = 0  # positions the warm engine's cache holds after a turn
    with (
        localspec.load(n_threads=2, n_ctx=2048) as warm,
        localspec.load(n_threads=2, n_ctx=2048) as cold,
    ):
        for i, turn in enumerate(turns):
            msgs.append({"role": "user", "content": turn})
            prompt, _ = warm.format_chat(msgs)
            got = warm.complete(prompt, max_tokens=60, **kw)
            if i:
                # the history is reused, less at most RESTART_AFTER positions the target decodes
                # again for a drafter that auto left dormant over the last reply (how many
                # depends on this machine's timings: auto's choices follow its clock)
                assert got.stats.cached_tokens >= held - RESTART_AFTER, (held, got.stats)
            held = got.stats.prompt_tokens + len(got.tokens) - 1  # what the cache holds
            cold.reset()
            want = cold.complete(prompt, max_tokens=60, **kw)
            # the replay runs on the other engine: replaying empties an engine's cache
            ties = assert_greedy_lossless(cold, prompt, got, margin=QUANT_MARGIN, **kw).ties
            if got.tokens != want.tokens:
                assert (
                    ties
                    or assert_greedy_lossless(cold, prompt, want, margin=QUANT_MARGIN, **kw).ties
                )
            msgs.append({"role": "assistant", "content": got.text})
