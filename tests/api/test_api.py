"""The public API: events, text, stop conditions, chat, propose, statistics, discovery."""

from __future__ import annotations

import shutil

import pytest

import localspec
from localspec.lowlevel import parts

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless


@pytest.fixture(scope="module")
def eng(models):
    with localspec.load(models["target"], draft=models["draft31"], **EXACT) as e:
        yield e


def test_events_carry_text_tokens_and_acceptance(agree) -> None:
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as e:
        evs = list(e.complete_stream("abc", max_tokens=40, n_draft=4))
    assert evs[-1].finish_reason == "length"
    assert all(len(ev.tokens) == len(ev.accepted) for ev in evs)
    tokens = [t for ev in evs for t in ev.tokens]
    assert len(tokens) == 40
    assert "".join(ev.text for ev in evs) == e_text(tokens)
    assert any(len(ev.tokens) > 1 for ev in evs)  # several tokens per step
    assert any(a for ev in evs for a in ev.accepted)


def e_text(tokens: list[int]) -> str:
    return bytes(tokens).decode()  # byte tokens below 256 are the bytes themselves


def test_utf8_never_split(eng) -> None:
    # The byte-level vocabulary emits multi-byte characters one byte per token: if an event
    # split a character, its pieces would decode to U+FFFD and the joined text would differ.
    prompt = list("é€😀".encode())
    for seed in range(5):
        evs = list(eng.complete_stream(prompt * 2, max_tokens=150, temperature=1.5, seed=seed))
        tokens = [t for ev in evs for t in ev.tokens]
        whole = eng.detokenize(tokens)
        assert "".join(ev.text for ev in evs) == whole


def test_multibyte_characters_arrive_whole(agree) -> None:
    # tokens 0xC3 0xA9 ('é') split across two events must come out as one character
    from localspec.text.textstream import TextStream

    ts = TextStream([])
    assert not ts.feed(b"\xc3")
    assert ts.take(final=False) == ""
    ts.feed(b"\xa9x")
    assert ts.take(final=False) == "éx"


def test_stop_string_cuts_text(agree) -> None:
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as e:
        c = e.complete("abc", max_tokens=100, stop=["ghi"])
        assert c.finish_reason == "stop"
        assert c.text == "def"
        c = e.complete("abc", max_tokens=100, stop="zab", n_draft=0)
        assert c.text == "defghijklmnopqrstuvwxy"


def test_stop_string_ending_inside_a_multi_token_step(agree) -> None:
    # the prompt's step emits "d"; the first speculative step accepts all 6 drafts (e..j) and
    # adds k: "ghi" completes at its fifth token, so the step's last two tokens are dropped
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as e:
        evs = list(e.complete_stream("abc", max_tokens=100, stop="ghi", n_draft=6))
        st = e.last_stats
    assert [ev.tokens for ev in evs] == [[ord("d")], list(b"efghi")]
    assert evs[-1].finish_reason == "stop" and evs[-1].accepted == [True] * 5
    assert "".join(ev.text for ev in evs) == "def"
    # the step accepted all 6 drafts, but "j" was never emitted: only emitted drafts count
    assert st.steps == 1 and st.drafted == 6 and st.accepted == 5
    assert st.accepted_at == [1, 1, 1, 1, 1, 0] and st.generated == 6


@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_eos_ends_generation(tmp_path, k) -> None:
    # a bigram target (and drafter) whose 'g' is followed by end-of-text
    target, draft = tm.write_agreeing_pair(str(tmp_path), eos_after=ord("g"))
    with localspec.load(target, draft=draft, **EXACT) as e:
        c = e.complete("abc", max_tokens=50, n_draft=k)
        assert c.finish_reason == "eos"
        assert c.text == "defg"
        assert tm.EOS not in c.tokens


def test_context_full_ends_cleanly(models) -> None:
    with localspec.load(models["target"], draft=models["draft"], **{**EXACT, "n_ctx": 64}) as e:
        c = e.complete("hello", max_tokens=500, n_draft=4)
        assert c.finish_reason == "context_full"
        assert_greedy_lossless(e, "hello", c)
        # the context fills up, and the target's prediction after its last position is emitted too
        assert len(e.tokenize("hello")) + len(c.tokens) == parts(e).target.n_ctx + 1


def test_max_tokens_zero_and_one(eng) -> None:
    assert eng.complete("hi", max_tokens=0).tokens == []
    assert len(eng.complete("hi", max_tokens=1).tokens) == 1


def test_chat_uses_gguf_template(eng) -> None:
    prompt, stops = eng.format_chat([{"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    evs = list(eng.chat_stream([{"role": "user", "content": "Hi"}], max_tokens=20))
    assert evs[-1].finish_reason in ("length", "eos", "stop")
    assert "<|im_start|>" not in "".join(ev.text for ev in evs)
    # chat returns the whole reply, as complete does; the streamed events add up to it (both
    # plain from an empty cache, so the two computed the same batches)
    msgs = [{"role": "user", "content": "Hi"}]
    eng.reset()
    evs = list(eng.chat_stream(msgs, max_tokens=20, n_draft=0))
    eng.reset()
    reply = eng.chat(msgs, max_tokens=20, n_draft=0)
    assert isinstance(reply, localspec.Completion)
    assert reply.text == "".join(ev.text for ev in evs)
    assert reply.tokens == [t for ev in evs for t in ev.tokens]
    assert reply.finish_reason == evs[-1].finish_reason and reply.stats is eng.last_stats


def test_propose_matches_manual_draft(agree) -> None:
    target, draft = agree
    with localspec.load(target, draft=draft, **EXACT) as e:
        # the target says 'd' after "abc"; the drafter continues e f g h
        assert e.propose("abc", k=4) == [*b"efgh"]


def test_stats_cumulate(models) -> None:
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as e:
        evs_a = list(e.complete_stream("hello", max_tokens=30, n_draft=3))
        a = e.last_stats
        evs_b = list(e.complete_stream("world", max_tokens=20, n_draft=3))
        b = e.last_stats
        s = e.stats
        assert s.generations == 2
        assert s.generated == a.generated + b.generated == 50
        assert s.steps == a.steps + b.steps
        # every step drafts k = 3, except that none drafts past max_tokens
        assert a.drafted == _drafted(evs_a, 3, 30) and b.drafted == _drafted(evs_b, 3, 20)
        assert s.drafted == a.drafted + b.drafted and s.accepted == a.accepted + b.accepted
        assert s.accepted == sum(sum(ev.accepted) for ev in evs_a + evs_b)
        assert len(s.acceptance_at) == 3
        assert s.tau == pytest.approx((s.accepted + s.steps) / s.steps)
        assert s.t_target > 0 and s.t_draft > 0 and s.t_glue > 0
        assert a.tokens_per_s > 0


def _drafted(evs, k: int, max_tokens: int) -> int:
    """Drafts a run must have made: each step after the prompt's drafts min(k, tokens left - 1)
    (events: the prompt's token, then one per step)."""
    done, drafted = len(evs[0].tokens), 0
    for ev in evs[1:]:
        drafted += min(k, max_tokens - done - 1)
        done += len(ev.tokens)
    return drafted


def test_drafter_found_next_to_target(models, tmp_path) -> None:
    t = str(tmp_path / "m.gguf")
    shutil.copy(models["target"], t)
    with localspec.load(t, **EXACT) as e:
        assert parts(e).drafter is None and "no drafter" in e.drafter_note
    shutil.copy(models["draft"], str(tmp_path / "m.eagle3.gguf"))
    with localspec.load(t, **EXACT) as e:
        assert e.draft_path == str(tmp_path / "m.eagle3.gguf")
    with localspec.load(t, draft=False, **EXACT) as e:
        assert parts(e).drafter is None


def test_recorded_drafter_found_by_header(models, tmp_path) -> None:
    t = str(tmp_path / "m.gguf")
    shutil.copy(models["target"], t)
    shutil.copy(models["draft31"], str(tmp_path / "some-drafter.gguf"))
    with localspec.load(t, **EXACT) as e:
        assert e.draft_path == str(tmp_path / "some-drafter.gguf")
        assert "EAGLE-3.1" in e.drafter_note


def test_sibling_drafters_for_another_target_are_passed_over(models, tmp_path) -> None:
    """A drafter recorded for another model of the same family (same tokenizer, another layer
    count: a Qwen3-8B drafter beside Qwen3-1.7B) is never picked, by any name."""
    t = str(tmp_path / "m.gguf")
    shutil.copy(models["target"], t)
    bigger = tm.TargetShape(n_layer=6)
    other = tm.write_target(str(tmp_path / "elsewhere.bin"), bigger)
    tm.write_drafter(str(tmp_path / "another-model.eagle3.gguf"), other, target=bigger)
    with localspec.load(t, **EXACT) as e:
        assert parts(e).drafter is None
        assert "another-model.eagle3.gguf" in e.drafter_note and "layers 6" in e.drafter_note
    shutil.copy(str(tmp_path / "another-model.eagle3.gguf"), str(tmp_path / "m.eagle3.gguf"))
    with localspec.load(t, **EXACT) as e:  # even under the target's own drafter name
        assert parts(e).drafter is None and "m.eagle3.gguf (drafter" in e.drafter_note
    shutil.copy(models["draft31"], str(tmp_path / "the-right-one.gguf"))
    with localspec.load(t, **EXACT) as e:
        assert e.draft_path == str(tmp_path / "the-right-one.gguf")
        assert "passed over" in e.drafter_note


def test_close_is_idempotent(models) -> None:
    e = localspec.load(models["target"], draft=models["draft"], **EXACT)
    e.close()
    e.close()
    for call in (
        lambda: e.complete("hi"),
        lambda: e.chat_stream([{"role": "user", "content": "x"}]),
        lambda: e.detokenize([104, 105]),
        lambda: e.tokenize("hi"),
        e.reset,
    ):
        with pytest.raises(localspec.LocalspecError, match="closed"):
            call()


def test_a_10_kb_chat_template_is_read_whole(tmp_path) -> None:
    """Chat templates were cut at 4095 bytes (a fixed metadata buffer): Qwen3's, gpt-oss's and
    Llama 3.1's with tools are longer."""
    padding = "{# " + "x" * 10_000 + " #}"
    template = padding + tm.CHATML + "{# the end #}"
    t = tm.write_target(str(tmp_path / "long.gguf"), chat_template=template)
    with localspec.load(t, draft=False, **EXACT) as e:
        assert len(parts(e).target.model.meta("tokenizer.chat_template")) == len(template.encode())
        assert parts(e).target.model.chat_template() == template
        prompt, _ = e.format_chat([{"role": "user", "content": "Hi"}])
        assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        assert e.chat_template_note == ""


def test_a_model_without_a_chat_template_chats_in_chatml(tmp_path) -> None:
    t = tm.write_target(str(tmp_path / "bare.gguf"), chat_template="")
    with localspec.load(t, draft=False, **EXACT) as e:
        assert "no chat template" in e.chat_template_note and "ChatML" in e.chat_template_note
        prompt, stops = e.format_chat([{"role": "user", "content": "Hi"}])
        assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        assert "<|im_end|>" in stops
        assert e.complete(prompt, max_tokens=3, parse_special=True).finish_reason == "length"
        with pytest.raises(localspec.InvalidParameterError, match="role"):
            e.format_chat([{"role": "wizard", "content": "Hi"}])


def test_dir_lists_the_lazily_imported_names() -> None:
    """load, Engine and the other names imported on first use are in dir(localspec)."""
    names = dir(localspec)
    assert set(localspec.__all__) <= set(names)
    assert {"load", "Engine", "SamplingParams", "TreeShape", "convert"} <= set(names)
    assert names == sorted(names)


@pytest.mark.parametrize("source", ["ngram", "none"])
def test_a_source_without_eagle_loads_no_drafter(agree, source) -> None:
    """draft_source ngram or none looks for no drafter beside the target; a call that asks
    for EAGLE drafts then runs plain and its notes say no drafter is loaded; switching one in
    is refused by name. A drafter named by path is still loaded (calls may ask for eagle)."""
    target, draft = agree
    with localspec.load(target, draft_source=source, **EXACT) as e:
        assert e.draft_path is None
        assert e.drafter_note.startswith(f"no EAGLE drafter loaded (draft source {source}")
        st = e.complete("abc", max_tokens=4, draft_source="eagle").stats
        assert st.mode == "plain" and st.drafted == 0
        assert st.notes == [f"draft_source=eagle runs plain decoding: {e.drafter_note}"]
        st = e.complete("abc", max_tokens=4, draft_source="eagle", n_draft=3).stats
        assert st.notes == [f"n_draft=3 runs plain decoding: {e.drafter_note}"]
        with pytest.raises(localspec.LocalspecError, match="loaded without one .no EAGLE"):
            e.use_drafter(draft)
    with localspec.load(target, draft=draft, draft_source="ngram", **EXACT) as e:
        assert e.draft_path == draft
        assert e.complete("abc", max_tokens=8, draft_source="eagle", n_draft=3).stats.drafted


def test_a_context_below_llamas_smallest_is_honoured(agree) -> None:
    """n_ctx=10: llama.cpp allocates 256 cells, but no call runs past the 10 asked for."""
    target, draft = agree
    with localspec.load(target, draft=draft, **{**EXACT, "n_ctx": 10}) as e:
        assert e.n_ctx == 10
        for k in (0, 3, "auto"):
            c = e.complete("abc", max_tokens=50, n_draft=k)
            assert c.finish_reason == "context_full"
            assert len(e.tokenize("abc")) + len(c.tokens) == 10 + 1, k
        with pytest.raises(localspec.ContextFullError):
            e.complete("abcdefghijklmnop")
