"""Conversations that never run out of context (localspec.text.context_fit), on a real tiny GGUF."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import localspec
from localspec.errors import ContextFullError, InvalidParameterError
from localspec.text.context_fit import (
    OVERFLOW_POLICIES,
    check_overflow_policy,
    context_use,
    count_tokens,
    fit_messages,
    reply_reserve,
    split_turns,
)

N_CTX = 512
SYSTEM = {"role": "system", "content": "You answer briefly."}
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


@pytest.fixture(scope="module")
def eng(models) -> Iterator[localspec.Engine]:
    with localspec.load(
        models["target"], draft=False, n_ctx=N_CTX, n_threads=1, kv_type="f32"
    ) as e:
        assert e.n_ctx == N_CTX
        yield e


def text(i: int, n: int) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))


def conversation(turns: int, *, system: bool = True, words: int = 8) -> list[dict[str, str]]:
    msgs = [dict(SYSTEM)] if system else []
    for i in range(turns):
        msgs += [
            {"role": "user", "content": f"question {i}: {text(i, words)}"},
            {"role": "assistant", "content": f"answer {i}: {text(i + 1, words)}"},
        ]
    return [*msgs, {"role": "user", "content": "and now?"}]


def tokens_of(eng: Any, msgs: list[dict[str, str]]) -> int:
    prompt, _ = eng.format_chat(msgs)
    return len(eng.tokenize(prompt, add_special=False, parse_special=True))


def test_a_conversation_with_room_is_sent_unchanged(eng) -> None:
    msgs = conversation(3)
    f = fit_messages(eng, msgs, max_tokens=64)
    assert f.messages == msgs and f.dropped_turns == 0
    assert f.use.used == tokens_of(eng, msgs) and f.use.n_ctx == N_CTX


def test_rolling_drops_the_oldest_turns_and_keeps_the_system_prompt(eng) -> None:
    msgs = conversation(40)
    assert tokens_of(eng, msgs) > 2 * N_CTX
    f = fit_messages(eng, msgs, max_tokens=64)
    out = f.messages
    assert f.dropped_turns > 0
    assert out[0] == SYSTEM and out[1]["role"] == "user"
    # what is kept is the conversation's end: the oldest pairs went, in order
    assert out[1:] == msgs[1 + 2 * f.dropped_turns :]
    assert out[-1] == msgs[-1]
    assert f.use.used == tokens_of(eng, out)
    assert f.use.used + reply_reserve(N_CTX, 64) <= N_CTX
    # and the engine takes it: a reply with its reserve of room ends by length, not the context
    done = eng.chat(out, max_tokens=64, temperature=0)
    assert done.finish_reason in ("length", "eos")


def test_the_reserve_is_a_quarter_of_the_context_at_most() -> None:
    assert reply_reserve(512, 64) == 64
    assert reply_reserve(512, 4096) == 128
    assert reply_reserve(2, 10) == 1  # never nothing


def test_drops_keep_the_same_first_turn_for_the_turns_after_them(eng) -> None:
    """Hysteresis: a drop frees about a quarter of the budget, so the turns after it keep the
    same first turn (and the prompt cache its prefix), whether the client sends the whole
    history each time (a server's client) or keeps the fitted one (the chat)."""
    budget = N_CTX - reply_reserve(N_CTX, 32)
    whole = [dict(SYSTEM)]
    kept = [dict(SYSTEM)]
    seen_whole: list[int] = []
    firsts: list[str] = []
    for i in range(60):
        ask = {"role": "user", "content": f"q{i} {text(i, 2)}"}
        f = fit_messages(eng, [*whole, ask], max_tokens=32)
        seen_whole.append(f.dropped_turns)
        if f.dropped_turns and (len(seen_whole) < 2 or seen_whole[-2] != f.dropped_turns):
            assert f.use.used <= 0.85 * budget, "a drop leaves room for the next turns"
        g = fit_messages(eng, [*kept, ask], max_tokens=32)
        firsts.append(g.messages[1]["content"])
        reply = {"role": "assistant", "content": f"a{i} {text(i, 3)}"}
        whole += [ask, reply]
        kept = [*g.messages, reply]
    assert seen_whole == sorted(seen_whole), "turns once dropped stay dropped"
    overflowing = [d for d in seen_whole if d]
    changes = sum(1 for a, b in zip(seen_whole[:-1], seen_whole[1:], strict=True) if a != b)
    # without hysteresis every overflowing turn would drop one more: here each drop lasts
    assert len(overflowing) > 20 and changes <= len(overflowing) // 2, seen_whole
    kept_changes = sum(1 for a, b in zip(firsts[:-1], firsts[1:], strict=True) if a != b)
    assert 0 < kept_changes <= len(overflowing) // 2, firsts


def test_cut_points_depend_on_the_turns_not_on_the_length_of_what_follows(eng) -> None:
    """Resending the same history with more turns after it drops at the same places, until a
    cut no longer fits: the whole-history client's prefix is stable."""
    base = conversation(20, words=3)
    a = fit_messages(eng, base, max_tokens=32)
    longer = [*base[:-1], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "?"}]
    b = fit_messages(eng, longer, max_tokens=32)
    assert a.dropped_turns > 0 and b.dropped_turns == a.dropped_turns
    assert b.messages[: len(a.messages) - 1] == a.messages[:-1]


def test_a_message_too_long_for_the_context_is_one_clear_error(eng) -> None:
    long_ask = {"role": "user", "content": "xy" * N_CTX}
    for msgs in ([long_ask], [*conversation(10)[:-1], long_ask]):
        with pytest.raises(ContextFullError) as e:
            fit_messages(eng, msgs, max_tokens=16)
        message = str(e.value)
        assert "the system prompt and the last message alone take" in message
        assert f"context holds {N_CTX}" in message


def test_a_new_message_over_the_reserve_still_gets_the_rest_of_the_context(eng) -> None:
    """The system prompt and the new message fit the context but leave less than the reserve:
    sent with every older turn dropped; the reply gets what is left."""
    ask = {"role": "user", "content": "x" * (N_CTX - 60)}
    msgs = [*conversation(5)[:-1], ask]
    f = fit_messages(eng, msgs, max_tokens=200)
    assert f.messages == [SYSTEM, ask] and f.dropped_turns == 5
    assert reply_reserve(N_CTX, 200) > N_CTX - f.use.used > 0


def test_stop_sends_the_conversation_as_it_is(eng) -> None:
    msgs = conversation(40)
    f = fit_messages(eng, msgs, max_tokens=64, policy="stop")
    assert f.messages == msgs and f.dropped_turns == 0 and f.use.used > N_CTX
    with pytest.raises(ContextFullError):  # and the engine refuses it, as it always did
        eng.chat_stream(f.messages, max_tokens=8)


def test_policy_names_are_checked() -> None:
    assert OVERFLOW_POLICIES == ("rolling", "stop")
    assert check_overflow_policy("stop") == "stop"
    with pytest.raises(InvalidParameterError, match="one of rolling, stop, got 'drop'"):
        check_overflow_policy("drop")


def test_odd_orders_keep_leading_system_messages_and_never_open_with_the_assistant(eng) -> None:
    filler = text(0, 30)
    msgs = [
        {"role": "system", "content": "first system"},
        {"role": "system", "content": "second system"},
        {"role": "assistant", "content": "hello first " + filler},
        {"role": "user", "content": "u1 " + filler},
        {"role": "user", "content": "u2 " + filler},
        {"role": "assistant", "content": "a2 " + filler},
        {"role": "system", "content": "a system note mid-way " + filler},
        {"role": "assistant", "content": "a2b " + filler},
        {"role": "user", "content": "u3 " + filler},
        {"role": "assistant", "content": "a3 " + filler},
        {"role": "user", "content": "u4"},
    ]
    head, turns, tail = split_turns(msgs)
    assert head == msgs[:2] and tail == msgs[-1:]
    assert [[m["content"][:3] for m in t] for t in turns] == [
        ["hel"],
        ["u1 "],
        ["u2 ", "a2 ", "a s", "a2b"],
        ["u3 ", "a3 "],
    ]
    for max_tokens in (16, 128, 256):
        f = fit_messages(eng, msgs, max_tokens=max_tokens)
        out = f.messages
        assert out[:2] == msgs[:2] and out[-1] == msgs[-1]
        assert f.dropped_turns > 0 and out[2]["role"] == "user"
        assert f.use.used + reply_reserve(N_CTX, max_tokens) <= N_CTX
    # a conversation that ends with an assistant message keeps its last user message with it
    ends = [*msgs[:-1], {"role": "user", "content": "u4"}, {"role": "assistant", "content": "a"}]
    assert split_turns(ends)[2] == ends[-2:]
    # no user message at all: nothing marks a turn, so nothing is dropped
    lonely = [SYSTEM, {"role": "assistant", "content": "x" * (N_CTX - 100)}]
    assert split_turns(lonely) == ([SYSTEM], [], lonely[1:])
    assert fit_messages(eng, lonely, max_tokens=200).messages == lonely


def test_context_use_adds_up(eng) -> None:
    msgs = conversation(4)
    use = context_use(eng, msgs)
    assert use.used == tokens_of(eng, msgs) == count_tokens(eng, msgs)
    assert use.system == tokens_of(eng, [SYSTEM]) > 0
    assert use.system + use.history == use.used and use.n_ctx == N_CTX
    assert use.free == N_CTX - use.used and use.share == pytest.approx(use.used / N_CTX)
    bare = context_use(eng, conversation(4, system=False))
    assert bare.system == 0 and bare.history == bare.used
    f = fit_messages(eng, conversation(40), max_tokens=64)
    assert f.use == context_use(eng, f.messages)


class CountingEngine:
    """The engine, counting the tokens it tokenizes."""

    def __init__(self, eng: Any) -> None:
        self._eng = eng
        self.tokens = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._eng, name)

    def tokenize(self, text: str, **kw: Any) -> list[int]:
        out = self._eng.tokenize(text, **kw)
        self.tokens += len(out)
        return out


def test_fitting_tokenizes_a_few_times_the_conversation_not_once_per_turn(eng) -> None:
    msgs = conversation(80)
    whole = tokens_of(eng, msgs)
    assert whole > 4000
    counting = CountingEngine(eng)
    f = fit_messages(counting, msgs, max_tokens=64)
    assert f.dropped_turns > 60
    # the whole once, each message once (for the cut points), then a few fitted prompts
    assert counting.tokens < 2.5 * whole, (counting.tokens, whole)


class Alternating:
    """The tiny engine behind a chat template that, like Gemma's or Mistral's, refuses two
    messages of the same role in a row (a template error, as the engine reports it)."""

    def __init__(self, eng: Any) -> None:
        self.eng, self.n_ctx, self.tokenize = eng, eng.n_ctx, eng.tokenize

    def format_chat(self, messages: list[dict[str, str]]) -> tuple[str, list[str]]:
        roles = [m["role"] for m in messages if m["role"] != "system"]
        if any(a == b for a, b in zip(roles, roles[1:], strict=False)):
            raise localspec.LocalspecError("the chat template failed: roles must alternate")
        return self.eng.format_chat(messages)


def test_strict_templates_get_their_turns_dropped_too(eng) -> None:
    strict = Alternating(eng)
    msgs = conversation(30)
    f = fit_messages(strict, msgs, max_tokens=64)
    assert f.dropped_turns > 0 and f.use.used <= N_CTX - 64
    assert f.messages[0] == SYSTEM and f.messages[1]["role"] == "user"
    assert f.messages == fit_messages(eng, msgs, max_tokens=64).messages
