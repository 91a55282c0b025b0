"""A conversation that never runs out of context: the oldest turns give way to the new one.

Policies: ``rolling`` (the default) drops the oldest turns when the prompt and a reserve for the
reply would not fit the context; ``stop`` sends the conversation as it is (a prompt over the
context fails with ContextFullError, a reply that reaches the end stops with "context_full").

What is kept: the leading system messages and the new turn (from the last user message on).
What goes: whole turns from the oldest, a turn being a user message and what follows it up to
the next user message, so the kept history never opens with an assistant message (strict
templates refuse that).

Reserve: a reply gets ``min(max_tokens, n_ctx // 4)`` tokens (at least 1) of room; the prompt
may take the rest, the budget.

Hysteresis: every drop changes the prompt's start, and the prompt cache then reuses nothing of
it, so dropping the fewest turns each time would re-prefill the whole window at every turn
once it is full. Drops happen instead at cut points a quarter of the budget apart, counted from
the conversation's first turn: a drop frees about a quarter of the budget, and the turns after
it keep the same first turn (and the cache its prefix) until they have filled that room. The cut
points depend only on the turns themselves, so a client that sends the whole history every time
(the server's, and the chat's) and one that keeps only the fitted history both get a stable
prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from ..errors import ContextFullError, InvalidParameterError, LocalspecError

OVERFLOW_POLICIES = ("rolling", "stop")

Message = dict[str, str]


@dataclass(frozen=True)
class ContextUse:
    """How much of the context a conversation takes, as the chat template formats it."""

    used: int  # tokens of the formatted messages (with the assistant's opening, as sent)
    n_ctx: int
    system: int  # tokens of the leading system messages formatted alone (0 without one)
    history: int  # used - system: the turns

    @property
    def free(self) -> int:
        return max(0, self.n_ctx - self.used)

    @property
    def share(self) -> float:
        """The part of the context used, 0 to 1."""
        return min(1.0, self.used / self.n_ctx) if self.n_ctx > 0 else 0.0


@dataclass(frozen=True)
class Fitted:
    """The messages to send, how many of the oldest turns were dropped, and their context use."""

    messages: list[Message]
    dropped_turns: int
    use: ContextUse


def check_overflow_policy(policy: str) -> str:
    if policy not in OVERFLOW_POLICIES:
        raise InvalidParameterError(
            f"context overflow policy must be one of {', '.join(OVERFLOW_POLICIES)}, got {policy!r}"
        )
    return policy


def reply_reserve(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the reply: min(max_tokens, n_ctx // 4), at least 1."""
    return max(1, min(max_tokens, n_ctx // 4))


def count_tokens(engine: Any, messages: Sequence[Message]) -> int:
    """Prompt tokens of a conversation, formatted and tokenized as Engine.chat_stream does."""
    prompt, _ = engine.format_chat(messages)
    return len(engine.tokenize(prompt, add_special=False, parse_special=True))


def context_use(engine: Any, messages: Sequence[Message]) -> ContextUse:
    return _use(engine, _checked(messages), count_tokens(engine, messages))


def fit_messages(
    engine: Any, messages: Sequence[Message], *, max_tokens: int, policy: str = "rolling"
) -> Fitted:
    """The conversation to send so that the prompt and the reply's reserve fit the context.

    rolling: the oldest turns are dropped (see the module's notes) when the prompt is over the
    budget; ContextFullError when the system prompt and the new turn alone do not fit the
    context at all (when they fit but leave less than the reserve, the reply gets what is
    left). stop: the messages as they are."""
    check_overflow_policy(policy)
    msgs = _checked(messages)
    n_ctx = engine.n_ctx
    used = count_tokens(engine, msgs)
    budget = n_ctx - reply_reserve(n_ctx, max_tokens)
    if policy == "stop" or used <= budget:
        return Fitted(list(msgs), 0, _use(engine, msgs, used))
    head, turns, tail = split_turns(msgs)

    def kept(drop: int) -> list[Message]:
        return [*head, *(m for turn in turns[drop:] for m in turn), *tail]

    size: dict[int, int] = {0: used}  # prompt tokens by turns dropped
    least = size[len(turns)] = size.get(len(turns)) or count_tokens(engine, kept(len(turns)))
    if least >= n_ctx:
        raise ContextFullError(
            f"the system prompt and the last message alone take {least} tokens and the "
            f"context holds {n_ctx}: at least {least + 1} are needed to reply"
        )
    weights = _turn_weights(engine, turns)
    cuts = _cut_points(weights, max(1, budget // 4))

    def fits(i: int) -> bool:
        drop = cuts[i]
        if drop not in size:
            size[drop] = count_tokens(engine, kept(drop))
        return size[drop] <= budget

    # where the weights, scaled to the exact sizes of both ends, put the first cut that fits
    total = [0, *accumulate(weights)]
    scale = (used - least) / max(1, total[-1])
    guess = next(
        (i for i, c in enumerate(cuts) if least + scale * (total[-1] - total[c]) <= budget),
        len(cuts) - 1,
    )
    i = _first_fitting(len(cuts), fits, guess)
    drop = cuts[i]
    out = kept(drop)
    return Fitted(out, drop, _use(engine, out, size[drop]))


def split_turns(
    messages: Sequence[Message],
) -> tuple[list[Message], list[list[Message]], list[Message]]:
    """(leading system messages, droppable turns oldest first, the new turn). The new turn
    runs from the last user message to the end; each droppable turn but the first starts with
    a user message (the first holds whatever came before the first user message)."""
    n_head = 0
    while n_head < len(messages) and messages[n_head]["role"] == "system":
        n_head += 1
    body = list(messages[n_head:])
    users = [i for i, m in enumerate(body) if m["role"] == "user"]
    if not users:  # nothing marks a turn: nothing can be dropped safely
        return list(messages[:n_head]), [], body
    turns: list[list[Message]] = []
    for m in body[: users[-1]]:
        if m["role"] == "user" or not turns:
            turns.append([])
        turns[-1].append(m)
    return list(messages[:n_head]), turns, body[users[-1] :]


def _turn_weights(engine: Any, turns: list[list[Message]]) -> list[int]:
    """Each turn's size for placing the cut points: its contents' tokens plus what the
    template adds around one more message. Estimates, but fixed by the turn alone, so the cut
    points of a conversation stay where they are as it grows."""
    user, reply = {"role": "user", "content": ""}, {"role": "assistant", "content": ""}
    try:  # a user-assistant pair: templates that want roles to alternate accept it
        frame = (count_tokens(engine, [user, reply, user]) - count_tokens(engine, [user])) // 2
    except LocalspecError:  # weights only place the cut points: contents alone will do
        frame = 0
    tok = engine.tokenize
    return [
        sum(len(tok(m["content"], add_special=False, parse_special=True)) + frame for m in turn)
        for turn in turns
    ]


def _cut_points(weights: list[int], quantum: int) -> list[int]:
    """Turn counts to drop at: 0, then each time the turns since the last cut weigh at least
    quantum, and finally all of them."""
    cuts = [0]
    acc = 0
    for i, w in enumerate(weights, 1):
        acc += w
        if acc >= quantum or i == len(weights):
            cuts.append(i)
            acc = 0
    return cuts


def _first_fitting(n_cuts: int, fits: Callable[[int], bool], guess: int) -> int:
    """The index of the first cut that fits (the last one when none does; cut 0 is known not
    to): a binary search, as the prompt shrinks with every turn dropped, that tries the guess
    and its neighbours first (two counts when the guess is right or off by one)."""
    lo, hi = 1, n_cuts - 1
    tries = [guess, guess - 1, guess + 1]
    while lo < hi:
        mid = next((t for t in tries if lo <= t < hi), (lo + hi) // 2)
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    fits(hi)  # measured either way: the caller reads its size
    return hi


def _checked(messages: Sequence[Message]) -> list[Message]:
    # imported here: the chat template loads llama.cpp, which the CLI's --help need not
    from .chat_template import check_messages

    return check_messages(messages)


def _use(engine: Any, messages: Sequence[Message], used: int) -> ContextUse:
    head: list[Message] = []
    for m in messages:
        if m["role"] != "system":
            break
        head.append(m)
    system = 0
    if head:
        try:
            system = min(used, count_tokens(engine, head))
        except LocalspecError:  # a template that wants a user turn: the contents alone
            tok = engine.tokenize
            system = min(
                used,
                sum(len(tok(m["content"], add_special=False, parse_special=True)) for m in head),
            )
    return ContextUse(used, engine.n_ctx, system, used - system)
