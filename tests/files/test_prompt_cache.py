"""Prefix reuse across calls: each call keeps what the caches hold of its prompt and gives what
a freshly started engine gives (tokens, seeded samples, acceptance)."""

from __future__ import annotations

import pytest

import localspec
from localspec.lowlevel import parts

from conftest import EXACT
from helpers.greedy import F32_MARGIN, replay_plain_greedy

SYSTEM = {"role": "system", "content": "You are terse."}
TURNS = ["Tell me about the sea.", "And the mountains?", "Which is older?", "Why?"]


@pytest.fixture(scope="module")
def pair(models):
    """One engine that keeps its cache, one that is reset before every call (a fresh start)."""
    with (
        localspec.load(models["target"], draft=models["draft31"], **EXACT) as warm,
        localspec.load(models["target"], draft=models["draft31"], **EXACT) as cold,
    ):
        yield warm, cold


def fresh(cold, messages, **kw):
    cold.reset()
    return cold.complete(cold.format_chat(messages)[0], add_special=False, parse_special=True,
                         **kw)  # fmt: skip


def check_same(warm, prompt_ids: list[int], got, want) -> None:
    """Equal to the fresh engine's output, or (where this CPU rounds a reused one-token row and
    a fresh batch row differently) both plain greedy up to near-ties."""
    if got.tokens != want.tokens:
        assert replay_plain_greedy(warm, prompt_ids, got.tokens, margin=F32_MARGIN).ties
        replay_plain_greedy(warm, prompt_ids, want.tokens, margin=F32_MARGIN)


def chat(warm, messages, **kw):
    prompt, _ = warm.format_chat(messages)
    ids = warm.tokenize(prompt, add_special=False, parse_special=True)
    c = warm.complete(prompt, add_special=False, parse_special=True, **kw)
    return ids, c


@pytest.mark.parametrize(
    "mode",
    [{"n_draft": 0}, {"n_draft": 1}, {"n_draft": 5}, {"tree": (4, 3, 12)}, {}],
    ids=["plain", "chain1", "chain5", "tree", "auto"],
)
def test_a_conversation_reuses_each_turn_and_equals_a_fresh_engine(pair, mode) -> None:
    warm, cold = pair
    warm.reset()
    msgs = [SYSTEM]
    prev_prompt = 0
    for i, turn in enumerate(TURNS):
        msgs.append({"role": "user", "content": turn})
        ids, got = chat(warm, msgs, max_tokens=40, **mode)
        want = fresh(cold, msgs, max_tokens=40, **mode)
        check_same(warm, ids, got, want)
        if i == 0:
            assert got.stats.cached_tokens == 0
        else:  # at least the previous prompt (the random model's reply may not re-tokenize
            # alike: its bytes are not always valid UTF-8)
            assert got.stats.cached_tokens >= prev_prompt, (got.stats.cached_tokens, prev_prompt)
            assert got.stats.prompt_tokens == len(ids)
        msgs.append({"role": "assistant", "content": got.text})
        prev_prompt = len(ids)
        assert want.stats.cached_tokens == 0


def test_seeded_sampling_equals_a_fresh_engine_turn_after_turn(pair) -> None:
    warm, cold = pair
    warm.reset()
    msgs = [SYSTEM]
    for turn in TURNS[:3]:
        msgs.append({"role": "user", "content": turn})
        for mode in ({"n_draft": 3}, {"tree": (3, 2, 5)}, {}):
            kw = {"max_tokens": 30, "temperature": 0.9, "top_p": 0.95, "seed": 11, **mode}
            _, got = chat(warm, msgs, **kw)
            assert got.tokens == fresh(cold, msgs, **kw).tokens
        msgs.append({"role": "assistant", "content": got.text})


def test_acceptance_equals_a_fresh_engines_on_an_agreeing_pair(agree) -> None:
    """A drafter whose cache disagreed with the target's would accept less than a fresh one."""
    target, draft = agree
    with (
        localspec.load(target, draft=draft, **EXACT) as warm,
        localspec.load(target, draft=draft, **EXACT) as cold,
    ):
        msgs: list[dict[str, str]] = []
        covered = 0
        for turn in ("abc", "klm", "uvw"):
            msgs.append({"role": "user", "content": turn})
            for i, mode in enumerate(({"n_draft": 4}, {"tree": (4, 2, 8)})):
                ids, got = chat(warm, msgs, max_tokens=50, **mode)
                if i == 0:  # after the plain turn: up to where the drafter's pairs reach
                    assert got.stats.cached_tokens == covered > 0 or turn == "abc"
                else:  # the same prompt again: all of it but its last token
                    assert got.stats.cached_tokens == len(ids) - 1
                want = fresh(cold, msgs, max_tokens=50, **mode)
                assert got.tokens == want.tokens
                assert (got.stats.accepted, got.stats.drafted) == (
                    want.stats.accepted,
                    want.stats.drafted,
                )
            # a plain turn in between (the A/B toggle): the next drafting turn decodes the
            # positions it left without taps again, so the drafter is whole
            ids, plain = chat(warm, msgs, max_tokens=50, n_draft=0)
            msgs.append({"role": "assistant", "content": plain.text})
            assert plain.stats.cached_tokens == len(ids) - 1
            covered = parts(warm).drafter.next_pos
            assert covered == len(ids) - 1 < parts(warm).target.n


def test_edit_regenerate_and_prefix_prompts(pair) -> None:
    warm, cold = pair
    warm.reset()
    base = [SYSTEM, {"role": "user", "content": "Tell me about the sea."}]
    ids, first = chat(warm, base, max_tokens=30, n_draft=3)
    # regenerate: the same prompt again keeps all but its last token
    ids2, again = chat(warm, base, max_tokens=30, n_draft=3)
    assert ids2 == ids and again.stats.cached_tokens == len(ids) - 1
    check_same(warm, ids, again, first)
    # edit the user turn near its end: reuse up to the first differing token
    edited = [SYSTEM, {"role": "user", "content": "Tell me about the sky."}]
    ids3, got = chat(warm, edited, max_tokens=30, n_draft=3)
    common = next(i for i, (a, b) in enumerate(zip(ids, ids3, strict=False)) if a != b)
    assert 0 < got.stats.cached_tokens <= common
    check_same(warm, ids3, got, fresh(cold, edited, max_tokens=30, n_draft=3))
    # another system prompt: nothing past the template's opening tokens is reused
    other = [{"role": "system", "content": "Be verbose."}, base[1]]
    ids4, got = chat(warm, other, max_tokens=30, n_draft=3)
    opening = next(i for i, (a, b) in enumerate(zip(ids3, ids4, strict=False)) if a != b)
    assert got.stats.cached_tokens <= opening
    check_same(warm, ids4, got, fresh(cold, other, max_tokens=30, n_draft=3))
    # a prompt that is a prefix of the cache
    short = ids4[: len(ids4) // 2]
    got = warm.complete(short, max_tokens=20, n_draft=3)
    assert got.stats.cached_tokens == len(short) - 1
    cold.reset()
    check_same(warm, short, got, cold.complete(short, max_tokens=20, n_draft=3))


def test_stopped_failed_and_full_calls_leave_a_usable_cache(pair, models) -> None:
    warm, cold = pair
    warm.reset()
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    # stopped after two events (Esc in the chat): the tokens emitted so far are cached
    events = warm.chat_stream(msgs, max_tokens=60, n_draft=4)
    shown = [next(events), next(events)]
    events.close()
    text = "".join(ev.text for ev in shown)
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]
    ids, got = chat(warm, msgs, max_tokens=30, n_draft=4)
    assert got.stats.cached_tokens > 0
    check_same(warm, ids, got, fresh(cold, msgs, max_tokens=30, n_draft=4))
    # a context that filled up: the next call with a shorter prompt reuses its prefix
    with localspec.load(models["target"], draft=models["draft"], **{**EXACT, "n_ctx": 256}) as e:
        full = e.complete("hello there", max_tokens=1000, n_draft=4)
        assert full.finish_reason == "context_full"
        nxt = e.complete("hello there, again", max_tokens=20, n_draft=4)
        assert nxt.stats.cached_tokens > 0
        replay_plain_greedy(e, e.tokenize("hello there, again"), nxt.tokens, margin=F32_MARGIN)


def test_a_failed_step_empties_the_caches(pair, monkeypatch) -> None:
    from localspec.errors import GenerationError
    from localspec.runtime.target import Target

    warm, _ = pair
    warm.reset()
    warm.complete("the quick brown fox", max_tokens=10, n_draft=2)
    decode = Target.decode
    calls = {"n": 0}

    def flaky(self, tokens, *, all_logits):
        calls["n"] += 1
        if calls["n"] == 3:
            raise GenerationError("llama_decode failed (simulated)")
        return decode(self, tokens, all_logits=all_logits)

    monkeypatch.setattr(Target, "decode", flaky)
    with pytest.raises(GenerationError):
        warm.complete("the quick brown fox jumps", max_tokens=10, n_draft=2)
    monkeypatch.setattr(Target, "decode", decode)
    assert parts(warm).target.n == 0  # nothing half-written is trusted
    got = warm.complete("the quick brown fox jumps", max_tokens=10, n_draft=2)
    assert got.stats.cached_tokens == 0
    replay_plain_greedy(warm, warm.tokenize("the quick brown fox jumps"), got.tokens,
                        margin=F32_MARGIN)  # fmt: skip


def test_reset_and_superseded_calls(pair) -> None:
    warm, _ = pair
    warm.complete("hello", max_tokens=5)
    warm.reset()
    assert warm.complete("hello", max_tokens=5).stats.cached_tokens == 0
    first = warm.complete_stream("hello", max_tokens=50, n_draft=2)
    next(first)
    second = warm.complete("hello world", max_tokens=5, n_draft=2)  # supersedes the first
    assert second.stats.cached_tokens > 0
    with pytest.raises(localspec.GenerationError, match="superseded"):
        next(first)
    # reset() empties the history under a live generation: it must stop, not go on without it
    third = warm.complete_stream("hello", max_tokens=50, n_draft=2)
    next(third)
    warm.reset()
    with pytest.raises(localspec.GenerationError, match="superseded"):
        next(third)


def test_after_auto_wakes_the_next_call_drafts_as_a_fresh_engine(pair) -> None:
    """Auto wakes mid-generation by restarting the drafter's cache at the current position
    (SpecState.wake); a next call with a fixed shape must not reuse that cache with its hole
    before the restart (auto restarts it at the reuse point instead: see the next test). This
    drafter's attention is live, so a hole changes its drafts."""
    warm, cold = pair
    warm.reset()
    p1 = warm.tokenize("the quick brown fox jumps over the lazy dog and more words here")
    done = warm.complete(p1, max_tokens=20, n_draft=3)
    parts(warm).state.wake()  # what waking does
    prompt = p1 + done.tokens + warm.tokenize(" again", add_special=False)
    got = warm.propose(prompt, k=6)
    cold.reset()
    assert got == cold.propose(prompt, k=6)
    assert parts(warm).drafter.start == 0


def test_the_drafter_cache_mirrors_the_targets(pair) -> None:
    warm, _ = pair
    warm.reset()
    msgs = [SYSTEM]
    for turn in TURNS[:3]:
        msgs.append({"role": "user", "content": turn})
        _, got = chat(warm, msgs, max_tokens=25, n_draft=4)
        # fed every step: one queued or written pair per target position
        assert parts(warm).drafter.next_pos == parts(warm).target.n
        msgs.append({"role": "assistant", "content": got.text})
