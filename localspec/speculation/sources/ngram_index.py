"""Indexes over token streams for drafter-free drafting (prompt lookup, SuffixDecoding-style):
"the stream ends with some suffix; where did that suffix occur earlier, and what followed it?"

Structure (the winner of benchmarks/bench_ngram_index.py; numbers below): one dict from an
n-gram (n = 1..max_n, an exact int key, no hashing collisions) to what is known about the
positions where it ends. It is a suffix trie of depth max_n over the stream, read from the end,
with its leaves kept lazily:

* an n-gram seen once is held as a bare int, the position where it ends (its follower, if any,
  is read from the stream), and the longer n-grams ending there are not held at all: they too
  occur only there, so a lookup that reaches the bare int finds them by direct comparison;
* an n-gram seen twice or more is held as a small list record: its count, its first position,
  how many occurrences have a following token, and the best follower (count, latest position)
  inline, plus a dict of all followers only once it has two different ones. When it is first
  seen twice, the (n+1)-gram at its first occurrence is added (as a bare int), which keeps the
  rule "an (n+1)-gram is held wherever its last n tokens occur twice or more".

Appending a token walks the n-grams ending at the new end (while they repeat, at most max_n)
and updates the followers of those ending just before it: O(max_n) per token, and O(1) for
novel text (the walk stops at the first new n-gram). The records of the n-grams at the
stream's end are kept, so a lookup of the stream's own end costs O(max_n) list reads plus
the continuation (max_len tokens) and the backward comparison (up to MAX_MATCH tokens); a
lookup of another query costs max_n dict probes more. The best follower is maintained as it
changes, so one branch never scans followers; more branches take the best of the followers
of the matched n-gram (heapq.nlargest: they are few for the long n-grams where it matters).
Every change an append makes is either recomputed from the stream or pushed on an undo stack
(8 bytes per follower update), so truncate() undoes appends newest first, O(max_n) each.

Measured (python benchmarks/bench_ngram_index.py: 32768 tokens of standard-library Python
source as word/punctuation/whitespace tokens mapped to ids < 150k, a 300-token random stretch
after each file and one file re-read with edits; CPython 3.11 on a shared 2-core machine, so
timings are ranges over runs; lookup = the stream's end at 24k-32k tokens, max_len 32, one
branch; MB = tracemalloc at 32k, on that stream / on 32k uniformly random ids, "novel"):

  candidate                            extend us/token   lookup us     MB   novel MB
  (a)  lazy n-gram trie (this module)      3.5 - 3.9      2.5 - 2.7    14.4      5.0
  (a0) every n-gram held (no truncate)     3.1 - 5.8      3.1 - 3.7    18.9     23.2
  (b)  suffix automaton                    0.6 - 1.1      1.1 - 1.4    16.2     13.8
  (c)  numpy scan per lookup                  0.01         58 - 98      0.1      0.1

(a), (a0) and (c) return identical answers on every lookup timed. (a) meets the targets with
room: extend well under 10 us (4.3-4.5 us per one-token extend() call, as generation appends),
lookup well under 50 us (a 64-token query: ~4 us; 4 branches: ~2 us; truncate: 5-7 us per
token removed), memory a few MB against a KV cache of 750-900 MB at 32k. (a0) is as fast but
holds every n-gram of every position, 4.6x (a)'s memory on novel text. (b) appends 3-5x faster
and finds matches of any length, but has no cheap undo for truncate (one append can rewrite
many transitions), no follower counts or latest occurrence without walking its suffix links
on every append (O(depth), not O(max_n)), and a dict per state. (c) is tiny and appends for
free but every lookup scans the stream: O(stream), ~60-100 us at 32k and growing.

Tokens join the trie lazily (indexing="auto"): extend() only appends them to the stream, and
a lookup either scans the stream (numpy finds the query's last token; its occurrences are
narrowed one token back at a time: 30-120 us whatever is waiting) or first indexes what waits
and reads the trie, whichever is cheaper counting the scans since the trie last caught up (rent
or buy: never more than twice the cheaper). A prompt of a few thousand tokens then costs its
first lookups a scan each instead of 2-5 us a token before the first step, and a call whose
lookups rest (auto, nothing paying) never indexes its prompt at all. Both ways give the same
answers (tests/speculation/test_ngram.py checks both against a brute-force reference).

max_n = 8. llama.cpp's lookup uses n-grams of 1..4; in code, short n-grams recur with several
followers ("self.", "return ", indentation), and the longest match picks the occurrence whose
follower is drafted. Drafting 32 tokens at every position of the benchmark stream, the tokens
the stream then repeats average 3.36 (max_n 4), 4.43 (8), 4.76 (12), 4.97 (16), 5.36 (32),
while append cost and memory grow about linearly with max_n (~2.7, 3.8, 5-8, 6-9, 9-14 us;
8.9, 15.3, 19.2, 25.5, 39.8 MB): 8 is the knee. (Simulated speculative decoding of the same
stream gives 2.01-2.04 tokens per step for every max_n: on it, the first draft after a miss
matters more than the context length.) Beyond max_n the backward comparison still reports the
real match length (up to MAX_MATCH), which is what the acceptance model scores.

Memory per token (tracemalloc, max_n 8): 250-450 bytes on text with repeats (the benchmark's
stream: 440, 14.4 MB at 32k), ~150 on novel text, ~900 on the worst we measured, 16k tokens
of novel text repeated verbatim (30 MB at 32k: every repeated position holds ~max_n records of
~300 bytes). An append adds at most max_n records, so memory is O(max_n) per token. With
`capacity` the index holds at most `capacity` tokens: past it, it keeps the newest half and
rebuilds (amortised O(max_n) per token; one rebuild of 32k tokens takes ~0.15 s), so memory is
bounded by capacity times the above. `nbytes` is an O(1) estimate: sys.getsizeof of the list,
dict and undo stack plus counts of keys, records, followers and positions times their
sys.getsizeof; it reads 2-25% above tracemalloc (15.3 vs 14.4 MB on the benchmark's stream;
most over on periodic text, whose position ints are mostly not held).
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ...errors import InvalidParameterError

MAX_MATCH = 64  # longest match length reported (the backward comparison stops there)
SEPARATOR = -1  # the one negative token: ends a context; never matched, never drafted
TOKEN_BITS = 24  # each token is one digit of an n-gram's key (ids 0 .. 2**24 - 2)
TOKEN_LIMIT = (1 << TOKEN_BITS) - 1
DEFAULT_MAX_N = 8
INDEXING = ("auto", "eager", "never")
# What a lookup costs by scanning (fixed, and per token of the stream) and what indexing a
# token costs, in microseconds; only their ratios matter. Measured on this 2-core machine
# (CPython 3.11, numpy 2; the stream of benchmarks/bench_ngram_index.py, 300-16k tokens): a
# scan 32 us at 300-500 tokens, 66-116 us at 8-16k (p90 52-210); indexing 2.3-5 us a token.
SCAN_FIXED, SCAN_PER_TOKEN, INDEX_PER_TOKEN = 30.0, 0.006, 4.0
SCAN_FEW = 48  # occurrences narrowed in Python below this many (numpy above)

# A follower is packed into one int: count << 32 | position (the latest n-gram end it
# followed), so max() of packed values orders by count, ties by most recent.
_POS = 32
_POS_MASK = (1 << _POS) - 1
_ONE = 1 << _POS
# undo entries pack the follower's previous position + 1 (0: it was new) and the previous
# best follower + 1 (0: none)
_UNDO_SHIFT = 25
_UNDO_MASK = (1 << _UNDO_SHIFT) - 1

# record fields (a list, mutated in place)
_CNT, _FIRST, _TOT, _BEST, _BESTV, _KIDS = range(6)


@dataclass(frozen=True)
class Continuation:
    tokens: tuple[int, ...]  # what followed the match at the chosen occurrence (<= max_len)
    match_len: int  # tokens of the query's end matched there (capped at MAX_MATCH)
    count: int  # earlier occurrences of the matched n-gram followed by tokens[0]
    total: int  # earlier occurrences of the matched n-gram that have a next token


class _TokensView(Sequence[int]):
    """A read-only live view of an index's stream (slices are copies)."""

    __slots__ = ("_t",)

    def __init__(self, t: list[int]) -> None:
        self._t = t

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self._t[i]

    def __len__(self) -> int:
        return len(self._t)

    def __iter__(self) -> Iterator[int]:
        return iter(self._t)

    def __repr__(self) -> str:
        return f"_TokensView({self._t!r})"


# per-object sizes for nbytes (sys.getsizeof on this interpreter)
_REC_BYTES = sys.getsizeof([0] * 6) + sys.getsizeof(_ONE | _POS_MASK)  # a record + its packed
_POS_BYTES = sys.getsizeof(_POS_MASK)  # a position int (one per position)
_KIDS_BYTES = sys.getsizeof({0: 0, 1: 1})  # a followers dict (it grows in steps)
_KID_BYTES = sys.getsizeof(_ONE | _POS_MASK) + 24  # a packed follower + its dict entry


class NGramIndex:
    """An index over one token stream: the continuations of its end (or of a query) found at
    earlier occurrences of its longest suffix of up to max_n tokens (see the module docstring).

    Tokens are ids in 0 .. TOKEN_LIMIT - 1; SEPARATOR (-1) may be appended to end a context: no
    n-gram spans it, continuations stop before it. With `capacity`, once the stream would
    exceed it the oldest tokens are forgotten (the newest capacity // 2 are kept and indexed
    afresh, at once or lazily as `indexing` says), so positions restart from the kept tail.
    """

    def __init__(
        self, *, max_n: int = DEFAULT_MAX_N, capacity: int | None = None, indexing: str = "auto"
    ) -> None:
        """indexing: "auto" (tokens join the trie when a lookup comes where that is cheaper
        than scanning the stream again: see lookup), "eager" (at once, as they arrive) or
        "never" (every lookup scans; for tests and benchmarks)."""
        if indexing not in INDEXING:
            raise InvalidParameterError(f"indexing must be one of {', '.join(INDEXING)}")
        if not 1 <= max_n <= MAX_MATCH:
            raise InvalidParameterError(f"max_n must be in 1..{MAX_MATCH}, got {max_n}")
        if capacity is not None and capacity < 1:
            raise InvalidParameterError(f"capacity must be positive or None, got {capacity}")
        self._max_n = max_n
        self._capacity = capacity
        self._shift = [TOKEN_BITS * k for k in range(max_n + 1)]
        # sys.getsizeof of an n-gram's key, by n
        self._key_size = [0] + [
            sys.getsizeof(1 << (TOKEN_BITS * k - 1)) for k in range(1, max_n + 2)
        ]
        self._t: list[int] = []
        self._view = _TokensView(self._t)
        self._d: dict[int, Any] = {}  # n-gram key -> position (seen once) or record
        self._undo = array("q")  # one entry per follower update, newest last
        self._end: list[list[Any]] = []  # records of the n-grams ending at the end, n = 1..
        self._recs = 0  # records held (for nbytes)
        self._kids = 0  # followers held in followers dicts
        self._kid_dicts = 0
        self._key_bytes = 0  # sys.getsizeof of the keys held
        self._indexing = indexing
        self._done = 0  # the stream's first tokens that the trie holds; the rest wait
        self._scanned = 0.0  # scans' cost since the trie last caught up (SCAN_* units)
        self._arr = np.empty(0, dtype=np.int32)  # the stream's first _arr_n tokens (scans)
        self._arr_n = 0

    @property
    def max_n(self) -> int:
        return self._max_n

    @property
    def capacity(self) -> int | None:
        return self._capacity

    def __len__(self) -> int:
        return len(self._t)

    @property
    def tokens(self) -> Sequence[int]:
        """The stream (a read-only live view)."""
        return self._view

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens: O(max_n) each (amortised, with eviction under a capacity)."""
        toks = [int(x) for x in tokens]
        for x in toks:
            if not (0 <= x < TOKEN_LIMIT or x == SEPARATOR):
                raise InvalidParameterError(f"token id {x} out of range 0..{TOKEN_LIMIT - 1}")
        cap = self._capacity
        i = 0
        while i < len(toks):
            room = len(toks) - i if cap is None else cap - len(self._t)
            if room <= 0:
                assert cap is not None
                self._rebuild(self._t[len(self._t) - cap // 2 :])
                continue
            if self._indexing == "eager":
                self._append(toks[i : i + room])
            else:
                self._t.extend(toks[i : i + room])
            i += room

    def truncate(self, n: int) -> None:
        """Forget positions >= n: undo the newest appends one by one, O(removed * max_n), or
        rebuild from the kept prefix when that is cheaper."""
        if n < 0:
            raise InvalidParameterError(f"truncate length must be >= 0, got {n}")
        removed = len(self._t) - n
        if removed <= 0:
            return
        self._arr_n = min(self._arr_n, n)
        self._scanned = 0.0  # the scans counted were of a longer stream
        if n >= self._done:  # not in the trie yet
            del self._t[n:]
            return
        del self._t[self._done :]
        removed = self._done - n
        if n < removed:
            self._rebuild(self._t[:n])
            return
        for _ in range(removed):
            self._pop()
        self._done = n

    def clear(self) -> None:
        self._t.clear()  # the same list: the view stays live
        self._d = {}
        self._undo = array("q")
        self._end = []
        self._recs = self._kids = self._kid_dicts = self._key_bytes = 0
        self._done = self._arr_n = 0
        self._scanned = 0.0
        self._arr = np.empty(0, dtype=np.int32)

    def _rebuild(self, keep: list[int]) -> None:
        self.clear()
        if self._indexing == "eager":
            self._append(keep)
        else:
            self._t.extend(keep)

    def catch_up(self) -> None:
        """Index the tokens that wait (the trie then holds the whole stream)."""
        if self._done < len(self._t):
            pending = self._t[self._done :]
            del self._t[self._done :]
            self._append(pending)
        self._scanned = 0.0

    def _use_trie(self, size: int) -> bool:
        """Whether this lookup reads the trie (catching it up first) or scans the stream: the
        trie once indexing what waits costs less than the scans since it last caught up and
        this one (rent or buy: never more than twice the cheaper of the two)."""
        if self._indexing == "never":
            return False
        waiting = size - self._done
        if waiting == 0:
            return True
        scan = SCAN_FIXED + SCAN_PER_TOKEN * size
        if self._scanned + scan >= INDEX_PER_TOKEN * waiting:
            self.catch_up()
            return True
        self._scanned += scan
        return False

    def _array(self) -> np.ndarray:
        """The stream as int32 (kept between scans, extended by what joined since)."""
        t, n = self._t, len(self._t)
        if self._arr_n < n:
            if len(self._arr) < n:
                grown = np.empty(max(n, 2 * len(self._arr), 1024), dtype=np.int32)
                grown[: self._arr_n] = self._arr[: self._arr_n]
                self._arr = grown
            self._arr[self._arr_n : n] = t[self._arr_n : n]
            self._arr_n = n
        return self._arr[:n]

    def _append(self, toks: list[int]) -> None:
        """Append tokens (validated, within capacity): for each, update the followers of the
        n-grams ending before it, then walk the n-grams ending after it. The hot loop: record
        fields are indexed by literals (0 count, 1 first, 2 with a follower, 3 best follower,
        4 its packed value, 5 followers dict) and constants held in locals."""
        t, d, shift, undo = self._t, self._d, self._shift, self._undo
        push = undo.append
        max_n = self._max_n
        one, mask = _ONE, _POS_MASK
        key_size = self._key_size
        key_bytes = 0
        chain = self._end
        for x in toks:
            pos = len(t)  # the n-grams before x end here
            t.append(x)
            if x < 0:  # a separator: no follower, no n-gram ends after it
                chain = []
                continue
            for rec in chain:
                best = rec[3]
                if best == x:  # the usual case: the best follower again
                    bv = rec[4]
                    push(((bv & mask) + 1) << 25 | (best + 1))
                    nv = ((bv >> 32) + 1) << 32 | pos
                    rec[4] = nv
                    kids = rec[5]
                    if kids is not None:
                        kids[x] = nv
                elif best < 0:  # the first follower
                    push(0)
                    rec[3] = x
                    rec[4] = one | pos
                else:
                    kids = rec[5]
                    if kids is None:
                        kids = rec[5] = {best: rec[4]}
                        self._kid_dicts += 1
                        self._kids += 1
                    old = kids.get(x)
                    if old is None:
                        push(best + 1)
                        nv = one | pos
                        self._kids += 1
                    else:
                        push(((old & mask) + 1) << 25 | (best + 1))
                        nv = ((old >> 32) + 1) << 32 | pos
                    kids[x] = nv
                    # nv is the most recent: it wins unless another follower is more frequent
                    if nv >> 32 >= rec[4] >> 32:
                        rec[3] = x
                        rec[4] = nv
                rec[2] += 1

            end = pos + 1  # the n-grams after x end here
            chain = []
            key = 0
            for k in range(1, (max_n if max_n < end else end) + 1):
                tk = t[end - k]
                if tk < 0:
                    break
                key |= (tk + 1) << shift[k - 1]
                v = d.get(key)
                if v is None:  # new: held as its position; longer n-grams here are new too
                    d[key] = end
                    key_bytes += key_size[k]
                    break
                if type(v) is int:  # seen once, at v: now a record, the (k+1)-gram at v held
                    q = v
                    y = t[q]
                    v = [2, q, 1, y, one | q, None] if y >= 0 else [2, q, 0, -1, 0, None]
                    d[key] = v
                    self._recs += 1
                    if k < max_n and q > k:
                        tq = t[q - k - 1]
                        if tq >= 0:
                            d[key | (tq + 1) << shift[k]] = q
                            key_bytes += key_size[k + 1]
                else:
                    v[0] += 1
                chain.append(v)
        self._end = chain
        self._key_bytes += key_bytes
        self._done = len(t)

    def _records_at(self, end: int) -> list[list[Any]]:
        """The records of the n-grams ending at `end` (n = 1.. while they are records)."""
        t, d, shift = self._t, self._d, self._shift
        out: list[list[Any]] = []
        key = 0
        for k in range(1, min(self._max_n, end) + 1):
            tk = t[end - k]
            if tk < 0:
                break
            key |= (tk + 1) << shift[k - 1]
            v = d.get(key)
            if type(v) is not list:
                break
            out.append(v)
        return out

    def _pop(self) -> None:
        """Undo the newest append exactly (the state becomes what it was before it)."""
        t, d, shift = self._t, self._d, self._shift
        end = len(t)
        x = t[end - 1]
        if x >= 0:
            # the n-grams ending at `end`: newest occurrence removed, longest first
            recs: list[tuple[int, int, list[Any]]] = []
            key = 0
            for k in range(1, min(self._max_n, end) + 1):
                tk = t[end - k]
                if tk < 0:
                    break
                key |= (tk + 1) << shift[k - 1]
                v = d[key]
                if type(v) is int:  # new at `end`
                    del d[key]
                    self._key_bytes -= self._key_size[k]
                    break
                recs.append((k, key, v))
            for k, key, rec in reversed(recs):
                if rec[_CNT] > 2:
                    rec[_CNT] -= 1
                    continue
                q = rec[_FIRST]  # back to one occurrence: the first
                d[key] = q
                self._recs -= 1
                if k < self._max_n and q > k:
                    tq = t[q - k - 1]
                    if tq >= 0:
                        del d[key | (tq + 1) << shift[k]]
                        self._key_bytes -= self._key_size[k + 1]
            # the followers of the n-grams ending before x, newest update first
            chain = self._records_at(end - 1)
            undo = self._undo
            for rec in reversed(chain):
                u = undo.pop()
                old_pos = (u >> _UNDO_SHIFT) - 1
                old_best = (u & _UNDO_MASK) - 1
                rec[_TOT] -= 1
                kids = rec[_KIDS]
                if old_best < 0:  # x was its first follower
                    rec[_BEST] = -1
                    rec[_BESTV] = 0
                elif kids is None:  # x was, and stays, its only follower
                    rec[_BESTV] = ((rec[_BESTV] >> _POS) - 1) << _POS | old_pos
                else:
                    if old_pos < 0:
                        del kids[x]
                        self._kids -= 1
                    else:
                        kids[x] = ((kids[x] >> _POS) - 1) << _POS | old_pos
                    rec[_BEST] = old_best
                    rec[_BESTV] = kids[old_best]
                    if len(kids) == 1:  # the dict was made by this update
                        rec[_KIDS] = None
                        self._kids -= 1
                        self._kid_dicts -= 1
        else:
            chain = self._records_at(end - 1)
        t.pop()
        self._end = chain

    def lookup(
        self, max_len: int, branches: int = 1, query: Sequence[int] | None = None
    ) -> list[Continuation]:
        """Continuations of the query's end (default: the stream's own end, matched against
        earlier occurrences only), best first. The longest n <= max_n whose last n tokens
        occurred with a following token decides; its occurrences are grouped by that token,
        the groups ordered by count, ties by most recent; each of the first `branches` groups
        gives the continuation at its most recent occurrence (up to max_len tokens, not past
        the stream's end or a separator) and the match length there (up to MAX_MATCH)."""
        if max_len < 1:
            raise InvalidParameterError(f"max_len must be >= 1, got {max_len}")
        if branches < 1:
            raise InvalidParameterError(f"branches must be >= 1, got {branches}")
        t = self._t
        size = len(t)
        if not self._use_trie(size):
            return self._scan(max_len, branches, query)
        rec: list[Any] | None = None
        single = -1  # the one occurrence, when the longest n-gram matched was seen once
        if query is None:
            q: Sequence[int] = t
            chain = self._end
            n = len(chain)
            while n and chain[n - 1][_TOT] == 0:  # no follower: neither have longer ones
                n -= 1
            if n == 0:
                return []
            rec = chain[n - 1]
        else:
            q = list(query[-MAX_MATCH:])
            d, shift = self._d, self._shift
            n = 0
            key = 0
            for k in range(1, min(self._max_n, len(q)) + 1):
                tk = int(q[-k])
                if not 0 <= tk < TOKEN_LIMIT:
                    break
                key |= (tk + 1) << shift[k - 1]
                v = d.get(key)
                if v is None:
                    break
                if type(v) is int:  # seen once: longer n-grams can only match there
                    if v < size and t[v] >= 0:
                        single, n = v, k
                    break
                if v[_TOT] == 0:
                    break
                rec, n = v, k
            if n == 0:
                return []
        if single >= 0:
            found = [_ONE | single]
            total = 1
        else:
            assert rec is not None
            kids = rec[_KIDS]
            if branches == 1 or kids is None:
                found = [rec[_BESTV]]
            else:
                found = heapq.nlargest(branches, kids.values())
            total = rec[_TOT]
        return self._continuations(found, n, q, max_len, total)

    def _continuations(
        self, found: list[int], n: int, q: Sequence[int], max_len: int, total: int
    ) -> list[Continuation]:
        """The continuation at each packed follower's latest end (up to max_len tokens, not
        past a separator) and how far back the query matches there (from its n matched)."""
        t = self._t
        out = []
        for packed in found:
            e = packed & _POS_MASK
            cont = t[e : e + max_len]
            if SEPARATOR in cont:
                del cont[cont.index(SEPARATOR) :]
            # the last n tokens match at e; compare further back, not across a separator
            m = n
            stop = min(MAX_MATCH, e, len(q))
            while m < stop and t[e - 1 - m] == q[-1 - m] and t[e - 1 - m] >= 0:
                m += 1
            out.append(Continuation(tuple(cont), m, packed >> _POS, total))
        return out

    def _scan(self, max_len: int, branches: int, query: Sequence[int] | None) -> list[Continuation]:
        """lookup's answer found by scanning the stream instead of the trie: the occurrences
        of the query's last token with a real token after them (numpy), narrowed one token
        further back at a time while some remain (up to max_n), grouped by the token after."""
        a = self._array()
        t = self._t
        size = len(t)
        q: Sequence[int] = t if query is None else [int(v) for v in query[-MAX_MATCH:]]
        if size < 2 or len(q) == 0 or not 0 <= q[-1] < TOKEN_LIMIT:
            return []
        found = np.flatnonzero(a[: size - 1] == q[-1]) + 1  # e: the n-gram ends before t[e]
        found = found[a[found] >= 0]
        n = 1
        # many occurrences (a common token): narrowed by numpy while they stay many
        while found.size > SCAN_FEW and n < min(self._max_n, len(q)):
            x = q[-1 - n]
            if not 0 <= x < TOKEN_LIMIT:
                break
            ok = found[found > n]
            ok = ok[a[ok - 1 - n] == x]
            if ok.size == 0:
                break
            found, n = ok, n + 1
        ends = found.tolist()
        if not ends:
            return []
        while n < min(self._max_n, len(q)):
            x = q[-1 - n]
            if not 0 <= x < TOKEN_LIMIT:
                break
            ok = [e for e in ends if e > n and t[e - 1 - n] == x]
            if not ok:
                break
            ends, n = ok, n + 1
        groups: dict[int, int] = {}  # follower -> count << _POS | latest end
        for e in ends:  # ascending: the latest end is written last
            groups[t[e]] = ((groups.get(t[e], 0) >> _POS) + 1) << _POS | e
        top = heapq.nlargest(branches, groups.values()) if branches > 1 else [max(groups.values())]
        return self._continuations(top, n, q, max_len, len(ends))

    @property
    def nbytes(self) -> int:
        """Estimated bytes held, O(1): sys.getsizeof of the stream's list, the dict and the
        undo stack, plus the keys, records, followers and position ints held (counted as they
        are made and dropped) times their sys.getsizeof. The token ints are not counted: the
        caller's own stream holds the same objects (ids below 257 are shared by CPython)."""
        size = sys.getsizeof(self._t) + sys.getsizeof(self._d) + sys.getsizeof(self._undo)
        size += self._arr.nbytes
        size += self._key_bytes + self._done * _POS_BYTES + self._recs * _REC_BYTES
        return size + self._kid_dicts * _KIDS_BYTES + self._kids * _KID_BYTES


class SessionStore:
    """Bounded memory of the session's other generations: an NGramIndex over finished contexts
    (each added with a separator so no match crosses two of them), oldest evicted past
    `capacity` tokens."""

    def __init__(self, capacity: int = 65536, max_n: int = DEFAULT_MAX_N) -> None:
        if capacity < 4:
            raise InvalidParameterError(f"capacity must be >= 4, got {capacity}")
        self._index = NGramIndex(max_n=max_n, capacity=capacity)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def tokens(self) -> Sequence[int]:
        return self._index.tokens

    def add(self, tokens: Sequence[int]) -> None:
        """A finished generation's context (its last capacity // 4 tokens at most)."""
        assert self._index.capacity is not None
        keep = list(tokens[max(0, len(tokens) - self._index.capacity // 4) :])
        if keep:
            self._index.extend([*keep, SEPARATOR])

    def lookup(self, query: Sequence[int], max_len: int, branches: int = 1) -> list[Continuation]:
        """Continuations of `query`'s end (its last MAX_MATCH tokens suffice)."""
        return self._index.lookup(max_len, branches, query=query)

    @property
    def nbytes(self) -> int:
        return self._index.nbytes

    def clear(self) -> None:
        self._index.clear()
