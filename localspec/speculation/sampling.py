"""Token choice from logits, with llama.cpp's samplers and in llama.cpp's order, so settings
carry over: logit bias, then the repetition penalties (repeat, presence, frequency) and DRY,
which read the tokens before the position, then top-k, typical-p, top-p, min-p and the
temperature, then greedy choice (temperature 0) or a draw.

``Sampler`` is one generation's: it holds the tokens so far (the prompt included, as
llama-server feeds them to its samplers) and applies the chain to a row of logits given the
draft path's tokens after them, so every position of a draft tree is judged with its own
history: the distribution there is exactly plain decoding's. ``probs`` is the same chain
without history (bias and penalties left out): the drafter's q for sampled EAGLE chains, which
rejection sampling needs only to be a distribution it drew from.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..options import DRY_BREAKERS, LLAMA_SAMPLING

__all__ = [
    "DRY_BREAKERS",
    "Draws",
    "DryBreakers",
    "Sampler",
    "SamplingParams",
    "probs",
    "sample",
    "sample_at",
]
DRY_MAX_CHARS, DRY_MAX_TAIL = 40, 20  # llama.cpp clamps a breaker, and its tail's tokens
_FLOAT_MAX_LOG = 88.7228391  # ln(FLT_MAX): DRY's exponent is clamped below overflow
MAX_WINDOW = 1 << 24  # the longest penalty or DRY window (-1, the context, is shorter)
MAX_BREAKERS = 64  # DRY sequence breakers (each scans the vocabulary once per model)
MAX_BIAS = 1e6  # a logit bias's magnitude (-inf bans): beyond it float32 logits overflow


def _number(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    x = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):  # an integer beyond any float: x stays nan
            x = float(value)
    if not (math.isfinite(x) and (lo < x if lo_open else lo <= x) and x <= hi):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise InvalidParameterError(f"{name} must be in {bound}, got {value!r}", parameter=name)
    return x


def _integer(name: str, value: Any, lo: int, hi: int) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not (ok and lo <= int(value) <= hi):
        raise InvalidParameterError(
            f"{name} must be an integer in [{lo}, {hi}], got {value!r}", parameter=name
        )
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next token is chosen. Names and defaults are llama-server's request
    fields; each sampler's neutral value leaves it out (only temperature 0, greedy, differs
    from llama.cpp's defaults: those come from the model or the command line)."""

    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no limit
    top_p: float = 1.0
    min_p: float = 0.0  # keep tokens at least min_p times as likely as the likeliest
    typical_p: float = 1.0
    repeat_penalty: float = 1.0  # a repeated token's logit: divided (> 0) or multiplied (<= 0)
    repeat_last_n: int = 64  # the penalties' window of tokens before the position; -1: context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0  # DRY ("don't repeat yourself"); 0 leaves it out
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # -1: the whole context
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    # added to a token's logit before everything else; -inf bans it
    logit_bias: tuple[tuple[int, float], ...] = field(default=())

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "temperature", _number("temperature", self.temperature, 0.0, 100.0))
        k = self.top_k
        if not (isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 0):
            raise InvalidParameterError(f"top_k must be an integer >= 0, got {k!r}", "top_k")
        set_(self, "top_k", int(k))
        set_(self, "top_p", _number("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        set_(self, "min_p", _number("min_p", self.min_p, 0.0, 1.0))
        set_(self, "typical_p", _number("typical_p", self.typical_p, 0.0, 1.0, lo_open=True))
        set_(
            self,
            "repeat_penalty",
            _number("repeat_penalty", self.repeat_penalty, 0.0, 100.0, lo_open=True),
        )
        n = _integer("repeat_last_n", self.repeat_last_n, -1, MAX_WINDOW)
        set_(self, "repeat_last_n", n)
        for name in ("presence_penalty", "frequency_penalty"):
            set_(self, name, _number(name, getattr(self, name), -100.0, 100.0))
        set_(self, "dry_multiplier", _number("dry_multiplier", self.dry_multiplier, 0.0, 100.0))
        set_(self, "dry_base", _number("dry_base", self.dry_base, 1.0, 100.0))
        n = _integer("dry_allowed_length", self.dry_allowed_length, 0, MAX_WINDOW)
        set_(self, "dry_allowed_length", n)
        n = _integer("dry_penalty_last_n", self.dry_penalty_last_n, -1, MAX_WINDOW)
        set_(self, "dry_penalty_last_n", n)
        breakers = self.dry_sequence_breakers
        if (
            isinstance(breakers, str)
            or not all(isinstance(b, str) and b for b in breakers)
            or len(breakers) > MAX_BREAKERS
        ):
            raise InvalidParameterError(
                f"dry_sequence_breakers must be a list of at most {MAX_BREAKERS} non-empty "
                f"strings, got {breakers!r}",
                parameter="dry_sequence_breakers",
            )
        set_(self, "dry_sequence_breakers", tuple(breakers))
        set_(self, "logit_bias", _bias_pairs(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalizes(self) -> bool:
        """The repetition penalties take part (llama.cpp leaves them out when neutral)."""
        neutral = (
            self.repeat_penalty == 1.0
            and self.presence_penalty == 0.0
            and self.frequency_penalty == 0.0
        )
        return self.repeat_last_n != 0 and not neutral

    @property
    def dries(self) -> bool:
        """DRY takes part."""
        return self.dry_multiplier > 0.0 and self.dry_penalty_last_n != 0

    @property
    def history_free(self) -> bool:
        """No sampler reads the tokens before the position."""
        return not (self.penalizes or self.dries)

    def describe(self) -> str:
        """The samplers in use, in order, as a short line (for statistics and bench)."""
        if self.greedy and self.history_free and not self.logit_bias and self.typical_p == 1:
            return "greedy"
        parts = []
        if self.logit_bias:
            parts.append(f"logit_bias({len(self.logit_bias)})")
        if self.penalizes:
            parts.append(
                f"penalties(last {self.repeat_last_n}, repeat {self.repeat_penalty:g}, "
                f"presence {self.presence_penalty:g}, frequency {self.frequency_penalty:g})"
            )
        if self.dries:
            parts.append(
                f"dry({self.dry_multiplier:g}, base {self.dry_base:g}, "
                f"allowed {self.dry_allowed_length}, last {self.dry_penalty_last_n})"
            )
        if self.top_k:
            parts.append(f"top_k {self.top_k}")
        if self.typical_p < 1:
            parts.append(f"typical_p {self.typical_p:g}")
        if self.top_p < 1:
            parts.append(f"top_p {self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"min_p {self.min_p:g}")
        parts.append("greedy" if self.greedy else f"temperature {self.temperature:g}")
        return ", ".join(parts)


def bias_items(bias: Any) -> list[tuple[Any, Any]]:
    """A logit bias's (token, bias) pairs, given as a mapping or as pairs (unchecked)."""
    items = bias.items() if isinstance(bias, Mapping) else bias
    try:
        return [(t, b) for t, b in items]
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"logit_bias must map token ids to numbers, got {bias!r}", parameter="logit_bias"
        ) from None


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs from a mapping or pairs; a token named twice adds up (as
    llama.cpp's logit_bias sampler does)."""
    out: dict[int, float] = {}
    for t, b in bias_items(bias):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            raise InvalidParameterError(
                f"logit_bias keys must be token ids (integers >= 0), got {t!r}",
                parameter="logit_bias",
            )
        if isinstance(b, numbers.Real) and not isinstance(b, bool) and b == -math.inf:
            value = -math.inf
        else:
            try:
                value = _number("logit_bias", b, -MAX_BIAS, MAX_BIAS)
            except InvalidParameterError:
                raise InvalidParameterError(
                    f"logit_bias values must be numbers in [-{MAX_BIAS:g}, {MAX_BIAS:g}] or -inf "
                    f"(bans the token), got {b!r} for token {t}",
                    parameter="logit_bias",
                ) from None
        out[int(t)] = out.get(int(t), 0.0) + value
    return tuple(sorted(out.items()))


# --- the chain -------------------------------------------------------------------------------


def _truncate(x: np.ndarray, sp: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """top-k, typical-p, top-p and min-p, in llama.cpp's order, on logits x (after bias and
    penalties): the surviving token ids, ascending, and their logits (float64). Sorting is
    done only where a sampler needs an order, and then on the fewest tokens that decide it
    (a whole vocabulary of 150k tokens sorts in tens of milliseconds)."""
    n = x.size
    if 0 < sp.top_k < n:
        ids = np.sort(np.argpartition(-x, sp.top_k - 1)[: sp.top_k])
    else:
        ids = np.flatnonzero(x > -np.inf)
        if ids.size == 0:  # every token banned: llama.cpp still picks one (the first)
            return np.zeros(1, dtype=np.int64), np.zeros(1)
    lg = x[ids].astype(np.float64)
    if sp.typical_p < 1.0 and ids.size > 1:
        p = _softmax(lg)
        seen = p > 0
        surprise = np.full(p.size, np.inf)
        surprise[seen] = -np.log(p[seen])
        entropy = float(np.sum(p[seen] * surprise[seen]))
        by = np.argsort(np.abs(surprise - entropy), kind="stable")
        cum = np.cumsum(p[by])
        keep = int(np.searchsorted(cum, sp.typical_p, side="right")) + 1
        kept = np.sort(by[: min(keep, by.size)])
        ids, lg = ids[kept], lg[kept]
    if sp.top_p < 1.0 and ids.size > 1:
        kept = _nucleus(_softmax(lg), sp.top_p)
        ids, lg = ids[kept], lg[kept]
    if sp.min_p > 0.0 and ids.size > 1:
        kept = lg >= lg.max() + math.log(sp.min_p)
        ids, lg = ids[kept], lg[kept]
    return ids, lg


NUCLEUS_FIRST = 256  # the likeliest tokens top-p sorts first (llama.cpp's heuristic too)


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The positions top-p keeps, ascending: the likeliest first (lower positions first on a
    tie) until their mass reaches top_p. Sorts the NUCLEUS_FIRST likeliest, then 16 times as
    many while they fall short, the whole only at last."""
    width = NUCLEUS_FIRST
    while True:
        if width * 4 >= p.size:
            order = np.argsort(-p, kind="stable")  # p's positions ascend: ties stay in order
            break
        top = np.argpartition(-p, width - 1)[:width]
        top = top[np.lexsort((top, -p[top]))]
        if float(np.sum(p[top])) >= top_p:
            order = top
            break
        width *= 16
    cum = np.cumsum(p[order])
    keep = int(np.searchsorted(cum, top_p, side="left")) + 1
    return np.sort(order[:keep])


def _softmax(lg: np.ndarray) -> np.ndarray:
    e = np.exp(lg - lg.max())
    return e / e.sum()


def _final(x: np.ndarray, sp: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The surviving ids, ascending, and their probabilities after the temperature (greedy:
    the likeliest survivor alone, the lowest id on a tie)."""
    ids, lg = _truncate(x, sp)
    if sp.greedy:
        return ids[int(np.argmax(lg)) : int(np.argmax(lg)) + 1], np.ones(1)
    return ids, _tempered(lg, sp.temperature)


def _tempered(lg: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(lg / temperature), shifted first so that no temperature overflows it."""
    with np.errstate(over="ignore"):  # a tiny temperature: -inf below the likeliest, exp 0
        e = np.exp((lg - lg.max()) / temperature)
    return e / e.sum()


def _untruncated(sp: SamplingParams, n: int) -> bool:
    """A draw from the whole vocabulary: no sampler cuts it (the fast path)."""
    return (
        not sp.greedy
        and not 0 < sp.top_k < n
        and sp.typical_p == 1.0
        and sp.top_p == 1.0
        and sp.min_p == 0.0
    )


def _full(n: int, ids: np.ndarray, p: np.ndarray) -> np.ndarray:
    out = np.zeros(n)
    out[ids] = p
    return out


def probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """The distribution over the vocabulary (float64, sums to 1) of the history-free part of
    the chain (logit bias included); greedy: all mass on the likeliest survivor."""
    x = np.asarray(logits, dtype=np.float32)
    if sp.logit_bias:
        x = x.copy()
        _add_bias(x, sp.logit_bias)
    if _untruncated(sp, x.size) and x.max() > -np.inf:
        return _tempered(x.astype(np.float64), sp.temperature)
    ids, p = _final(x, sp)
    return _full(x.size, ids, p)


def _add_bias(x: np.ndarray, bias: tuple[tuple[int, float], ...]) -> None:
    for t, b in bias:
        if t < x.size:
            x[t] += np.float32(b)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    # inverse-CDF draw; searchsorted on the cumulative sum is exact and fast
    return sample_at(p, rng.random())


def sample_at(p: np.ndarray, u: float) -> int:
    """The inverse-CDF draw for a given uniform u in [0, 1)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), p.size - 1))


# --- one generation's sampler ----------------------------------------------------------------


class Sampler:
    """The chain with one generation's history: ``tokens`` (the prompt, then every token
    chosen) and, per call, the draft path's tokens after them."""

    def __init__(
        self,
        sp: SamplingParams,
        *,
        n_vocab: int,
        n_ctx: int,
        history: Sequence[int] = (),
        breakers: Callable[[tuple[str, ...]], DryBreakers] | None = None,
    ) -> None:
        """breakers: the vocabulary's DRY sequence breakers for a list of strings (needed
        only when DRY takes part; the engine caches them per model)."""
        self.sp = sp
        self.n_vocab = n_vocab
        for t, _ in sp.logit_bias:
            if t >= n_vocab:
                raise InvalidParameterError(
                    f"logit_bias names token {t}, outside this model's vocabulary "
                    f"(0..{n_vocab - 1})",
                    parameter="logit_bias",
                )
        self.tokens = list(history)
        self.pen_n = n_ctx if sp.repeat_last_n == -1 else sp.repeat_last_n
        self.dry_n = n_ctx if sp.dry_penalty_last_n == -1 else sp.dry_penalty_last_n
        self.dry: DryBreakers | None = None
        if sp.dries:
            if breakers is None:
                raise InvalidParameterError("DRY needs the model's vocabulary", "dry_multiplier")
            self.dry = breakers(sp.dry_sequence_breakers)
        # no sampler changes a logit before the truncation: plain argmax and probs apply
        self.simple = sp.history_free and not sp.logit_bias

    def push(self, tokens: Sequence[int]) -> None:
        """Tokens chosen (emitted or not: they are in the context the next position reads)."""
        self.tokens.extend(tokens)

    def logits(self, row: np.ndarray, path: Sequence[int] = ()) -> np.ndarray:
        """The row after logit bias, the penalties and DRY, for the position after the
        history and path (float32, a copy where anything changed)."""
        x = np.asarray(row, dtype=np.float32)
        if self.simple:
            return x
        x = x.copy()
        sp = self.sp
        if sp.logit_bias:
            _add_bias(x, sp.logit_bias)
        if sp.penalizes:
            window = self._window(path, self.pen_n)
            counts = Counter(window)
            ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
            ids_ok = ids < x.size
            ids, n = ids[ids_ok], n[ids_ok]
            v = x[ids]
            rp = np.float32(sp.repeat_penalty)
            v = np.where(v <= 0, v * rp, v / rp)
            v -= n * np.float32(sp.frequency_penalty) + np.float32(sp.presence_penalty)
            x[ids] = v
        if self.dry is not None:
            window = self._window(path, self.dry_n)
            for t, pen in self.dry.penalties(window, sp).items():
                if t < x.size:
                    x[t] -= np.float32(pen)
        return x

    def _window(self, path: Sequence[int], n: int) -> list[int]:
        if n <= len(path):
            return list(path[len(path) - n :])
        return self.tokens[max(len(self.tokens) - (n - len(path)), 0) :] + list(path)

    def choose(
        self, row: np.ndarray, path: Sequence[int], rng: np.random.Generator, u: float | None
    ) -> int:
        """The token at the position after history + path: the likeliest survivor (greedy) or
        a draw (with the position's uniform u when given)."""
        sp = self.sp
        x = self.logits(row, path)
        if sp.greedy and sp.typical_p == 1.0:  # top-k, top-p and min-p keep the likeliest
            return int(np.argmax(x))
        v = rng.random() if u is None else u
        if _untruncated(sp, x.size) and x.max() > -np.inf:
            return sample_at(_tempered(x.astype(np.float64), sp.temperature), v)
        ids, p = _final(x, sp)
        if sp.greedy:
            return int(ids[0])
        c = np.cumsum(p)  # inverse CDF in id order: the whole vocabulary's draw, zeros left out
        return int(ids[min(int(np.searchsorted(c, v * c[-1], side="right")), ids.size - 1)])

    def distribution(self, row: np.ndarray, path: Sequence[int] = ()) -> np.ndarray:
        """The distribution over the vocabulary at that position (float64, sums to 1)."""
        x = self.logits(row, path)
        if _untruncated(self.sp, x.size) and x.max() > -np.inf:
            return _tempered(x.astype(np.float64), self.sp.temperature)
        ids, p = _final(x, self.sp)
        return _full(x.size, ids, p)


# --- DRY ---------------------------------------------------------------------------------------


class DryBreakers:
    """DRY's sequence breakers as tokens, as llama.cpp prepares them: every token whose text
    holds a breaker ends repetitions on its own; a token whose text ends with a breaker's
    beginning does so followed by the tokens of the breaker's rest (at most DRY_MAX_TAIL)."""

    def __init__(self, heads: dict[int, list[tuple[int, ...]]]) -> None:
        self.heads = heads  # head token -> tails ((): the token alone breaks)
        self.single = {t for t, tails in heads.items() if () in tails}

    @classmethod
    def build(
        cls,
        strings: Sequence[str],
        texts: Sequence[bytes],
        tokenize: Callable[[bytes], list[int]],
    ) -> DryBreakers:
        """texts: every token's text, specials rendered (llama.cpp detokenizes with special
        on); tokenize: a breaker's rest to tokens (no specials added or parsed)."""
        heads: dict[int, list[tuple[int, ...]]] = {}
        for s in strings:
            b = s.encode("utf-8")[:DRY_MAX_CHARS]
            if not b:
                continue
            first = b[:1]
            for tok, word in enumerate(texts):
                if b in word:
                    heads.setdefault(tok, []).append(())
                    continue
                pos = word.find(first)
                while pos != -1:
                    rest = len(word) - pos
                    if rest < len(b) and word[pos:] == b[:rest]:
                        tail = tuple(tokenize(b[rest:])[:DRY_MAX_TAIL])
                        tails = heads.setdefault(tok, [])
                        if tail not in tails:
                            tails.append(tail)
                    pos = word.find(first, pos + 1)
        return cls(heads)

    def penalties(self, window: list[int], sp: SamplingParams) -> dict[int, float]:
        """token -> what DRY subtracts from its logit after these tokens (llama.cpp's
        algorithm: the longest repeated suffix each token would extend, limited by the last
        sequence breaker, penalized past dry_allowed_length)."""
        n = len(window)
        allowed = sp.dry_allowed_length
        if n <= allowed:
            return {}
        rev = window[::-1]  # rev[i]: the token i places from the end
        # the repetition may not reach past the last breaker
        limit = n
        for i, tok in enumerate(rev):
            tails = self.heads.get(tok)
            if tails is None:
                continue
            longest = -1
            for tail in tails:
                if longest < len(tail) <= i and all(
                    tail[o] == rev[i - o - 1] for o in range(len(tail))
                ):
                    longest = len(tail)
            if longest >= 0:
                limit = i - longest
                break
        if limit < allowed:
            return {}
        z = _z_function(rev)  # z[k]: how far rev[k:] repeats rev from its start
        worst: dict[int, int] = {}
        for k in range(1, n):
            length = min(z[k], limit)
            if length >= allowed:
                tok = rev[k - 1]  # what followed that earlier occurrence
                if worst.get(tok, -1) < length:
                    worst[tok] = length
        max_exp = int(_FLOAT_MAX_LOG / math.log(sp.dry_base)) if sp.dry_base > 1.000001 else 0
        out = {}
        for tok, length in worst.items():
            if tok in self.single:
                continue
            e = length - allowed
            if max_exp > 0 and e > max_exp:
                e = max_exp
            # as llama.cpp computes it: float factors, pow in double, the product as a float
            base = float(np.float32(sp.dry_base))
            out[tok] = float(np.float32(float(np.float32(sp.dry_multiplier)) * base**e))
        return out


def _z_function(s: list[int]) -> list[int]:
    """z[k] = the length of the longest common prefix of s and s[k:] (z[0] = len(s)); O(n)."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    lo = hi = 0
    for k in range(1, n):
        if k < hi:
            z[k] = min(hi - k, z[k - lo])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > hi:
            lo, hi = k, k + z[k]
    return z


# --- randomness ------------------------------------------------------------------------------


class Draws:
    """The randomness of one generation. Tokens are drawn from the target's distribution by
    inverse CDF with a uniform keyed by the token's position, so plain decoding, auto and
    draft trees turn a seed into the same text however the steps were scheduled; ``rng`` feeds
    the rest (rejection sampling of fixed chains, whose output depends on k)."""

    def __init__(self, seed: int | None, base: int) -> None:
        root = np.random.SeedSequence(seed)
        pos_seq, rest = root.spawn(2)
        self._pos_rng = np.random.default_rng(pos_seq)
        self.rng = np.random.default_rng(rest)
        self.base = base  # position of the first generated token
        self._u = np.empty(0)

    def at(self, pos: int) -> float:
        i = pos - self.base
        while i >= self._u.size:
            self._u = np.concatenate([self._u, self._pos_rng.random(max(256, self._u.size))])
        return float(self._u[i])


# --- the model's recommendation ------------------------------------------------------------------

# the GGUF keys llama.cpp reads a model's recommendation from, and what each sets here
GGUF_SAMPLING: dict[str, tuple[str, type]] = {
    "general.sampling.temp": ("temperature", float),
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.penalty_last_n": ("repeat_last_n", int),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
}
# values llama.cpp reads as "this sampler off" (or greedy), and their neutral value here
_OFF: dict[str, Callable[[Any], Any]] = {
    "top_k": lambda v: max(v, 0),  # <= 0: the whole vocabulary
    "temperature": lambda v: max(v, 0.0),  # < 0: greedy
    "top_p": lambda v: min(v, 1.0),  # >= 1: off
    "min_p": lambda v: max(v, 0.0),  # <= 0: off
}
# llama.cpp's default order, as general.sampling.sequence names it
DEFAULT_SEQUENCE = "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"


def recommended(meta: Callable[[str], str | None]) -> tuple[SamplingParams, dict[str, str]]:
    """The sampling a model recommends in its GGUF (general.sampling.*, read as llama.cpp
    reads them), llama.cpp's defaults for what it leaves out; and a note per key that was not
    taken (a value out of range, or a sampler localspec does not offer), by key."""
    values = dict(LLAMA_SAMPLING)  # llama.cpp's defaults, where the model is silent
    notes: dict[str, str] = {}
    for key, (name, kind) in GGUF_SAMPLING.items():
        raw = meta(key)
        if raw is None:
            continue
        try:
            value: Any = kind(float(raw)) if kind is int else float(raw)
            # what llama.cpp reads as "off" is off here too
            value = _OFF.get(name, lambda v: v)(value)
            SamplingParams(**{**values, name: value})  # in range?
        except (ValueError, ArithmeticError, InvalidParameterError):
            notes[key] = f"{key} = {raw!r} is not a usable {name}: {values[name]} instead"
            continue
        values[name] = value
    for key in ("general.sampling.mirostat", "general.sampling.xtc_probability"):
        raw = meta(key)
        try:
            on = raw is not None and float(raw) != 0.0
        except ValueError:
            on = False  # llama.cpp reads no number there: the sampler stays off
        if on:
            notes[key] = f"{key} = {raw} is a sampler localspec does not offer: left out"
    raw = meta("general.sampling.sequence")
    if raw is not None and raw.strip() and raw.strip() != DEFAULT_SEQUENCE:
        notes["general.sampling.sequence"] = (
            f"general.sampling.sequence {raw!r} differs from llama.cpp's order, the one "
            "localspec runs"
        )
    return SamplingParams(**values), notes
