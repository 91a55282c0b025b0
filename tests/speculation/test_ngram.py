"""The n-gram index (localspec.speculation.sources.ngram_index) against a brute-force
reference: scan the whole stream for the longest earlier match, group its occurrences by the
next token, and so on."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Sequence

import pytest

from localspec.errors import InvalidParameterError
from localspec.speculation.sources.ngram_index import (
    INDEXING,
    MAX_MATCH,
    SEPARATOR,
    Continuation,
    NGramIndex,
    SessionStore,
)


def reference(
    stream: Sequence[int],
    max_n: int,
    max_len: int,
    branches: int = 1,
    query: Sequence[int] | None = None,
) -> list[Continuation]:
    """The specification, literally: O(stream * max_n) per lookup."""
    t = list(stream)
    q = t if query is None else list(query)
    for n in range(min(max_n, len(q)), 0, -1):
        suffix = q[len(q) - n :]
        if min(suffix) < 0:
            continue
        # occurrences ending at e with a following real token; for the stream's own end
        # e < len(t), so the end itself never counts
        ends = [e for e in range(n, len(t)) if t[e - n : e] == suffix and t[e] >= 0]
        if not ends:
            continue
        groups: dict[int, list[int]] = {}
        for e in ends:
            groups.setdefault(t[e], []).append(e)
        ranked = sorted(groups.values(), key=lambda es: (len(es), max(es)), reverse=True)
        out = []
        for es in ranked[:branches]:
            e = max(es)
            cont = t[e : e + max_len]
            if SEPARATOR in cont:
                cont = cont[: cont.index(SEPARATOR)]
            match = max(
                m
                for m in range(min(MAX_MATCH, e, len(q)) + 1)
                if t[e - m : e] == q[len(q) - m :] and SEPARATOR not in t[e - m : e]
            )
            out.append(Continuation(tuple(cont), match, len(es), len(ends)))
        return out
    return []


def random_stream(rng: random.Random, n: int, vocab: int, seps: float = 0.0) -> list[int]:
    """Random tokens over a small vocabulary, with copied stretches (long matches) and, with
    probability `seps` per stretch, a separator."""
    out: list[int] = []
    while len(out) < n:
        if rng.random() < seps:
            out.append(SEPARATOR)
        elif out and rng.random() < 0.3:
            a = rng.randrange(len(out))
            out.extend(out[a : a + rng.randint(1, 20)])
        else:
            out.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 10)))
    return out[:n]


def check_all(idx: NGramIndex, rng: random.Random, queries: int = 3) -> None:
    """The stream's own end and a few queries, several max_len/branches, against the reference."""
    t = list(idx.tokens)
    for branches in (1, 2, 4):
        max_len = rng.choice((1, 3, 32))
        assert idx.lookup(max_len, branches) == reference(t, idx.max_n, max_len, branches)
    for _ in range(queries):
        if t and rng.random() < 0.7:  # a piece of the stream, maybe with a changed end
            a = rng.randrange(len(t))
            query = t[a : a + rng.randint(1, 12)]
            if rng.random() < 0.3:
                query[-1] = rng.randrange(6)
        else:
            query = [rng.randrange(6) for _ in range(rng.randint(1, 10))]
        branches = rng.choice((1, 3))
        got = idx.lookup(8, branches, query=query)
        assert got == reference(t, idx.max_n, 8, branches, query)


@pytest.mark.parametrize("indexing", INDEXING)
@pytest.mark.parametrize("seed", range(24))
def test_every_prefix_matches_reference(seed: int, indexing: str) -> None:
    """The trie (eager), scans of the stream (never) and the two mixed (auto: chunks of 1-40
    tokens, so some lookups scan and some catch the trie up) answer as the reference does."""
    rng = random.Random(seed)
    vocab = (2, 3, 5, 12)[seed % 4]
    max_n = (1, 2, 4, 8)[(seed // 4) % 4]
    idx = NGramIndex(max_n=max_n, indexing=indexing)
    stream = random_stream(
        rng, 90 if indexing != "auto" else 400, vocab, seps=0.1 if seed % 2 else 0.0
    )
    i = 0
    while i < len(stream):
        step = 1 if indexing != "auto" else rng.choice((1, 2, 5, 40))
        idx.extend(stream[i : i + step])
        i += step
        check_all(idx, rng, queries=1)
    assert list(idx.tokens) == stream


@pytest.mark.parametrize("indexing", INDEXING)
def test_long_stream_lookups_match_reference(indexing: str) -> None:
    """Matches beyond max_n (backward extension up to MAX_MATCH) and many followers."""
    rng = random.Random(7)
    base = [rng.randrange(1000) for _ in range(300)]  # no repeats of its own
    stream = base + base[:150] + random_stream(rng, 200, 4) + base[20:120]
    idx = NGramIndex(max_n=4, indexing=indexing)
    idx.extend(stream)
    got = idx.lookup(32, 3)
    assert got == reference(stream, 4, 32, 3)
    assert got[0].match_len == MAX_MATCH  # 100 tokens repeat: capped
    for _ in range(40):
        check_all(idx, rng)


@pytest.mark.parametrize("indexing", ["eager", "auto"])
@pytest.mark.parametrize("seed", range(12))
def test_truncate_then_extend_equals_fresh(seed: int, indexing: str) -> None:
    rng = random.Random(100 + seed)
    max_n = (2, 3, 8)[seed % 3]
    idx = NGramIndex(max_n=max_n, indexing=indexing)
    seps = 0.1 if seed % 2 else 0.0
    stream = random_stream(rng, 150, (2, 4, 9)[seed % 3], seps)
    idx.extend(stream)
    for _ in range(6):
        cut = rng.randrange(len(stream) + 1)
        idx.truncate(cut)  # undone append by append, or rebuilt when the cut is deep
        stream = stream[:cut] + random_stream(rng, rng.randint(0, 60), 5, seps)
        idx.extend(stream[cut:])
        if indexing == "auto":  # cut inside the trie or past it, then a lookup or two
            check_all(idx, rng)
            idx.catch_up()
        fresh = NGramIndex(max_n=max_n, indexing="eager")
        fresh.extend(stream)
        assert list(idx.tokens) == stream
        # undo restores the exact state, not just equal answers
        assert idx._d == fresh._d and idx._undo == fresh._undo
        counts = (idx._recs, idx._kids, idx._kid_dicts, idx._key_bytes)
        assert counts == (fresh._recs, fresh._kids, fresh._kid_dicts, fresh._key_bytes)
        check_all(idx, rng)
        for q in range(1, len(stream), 7):
            assert idx.lookup(5, 2, query=stream[:q]) == fresh.lookup(5, 2, query=stream[:q])


@pytest.mark.parametrize("seed", range(4))
def test_truncate_one_at_a_time_to_empty(seed: int) -> None:
    rng = random.Random(seed)
    stream = random_stream(rng, 120, 3, seps=0.15 if seed % 2 else 0.0)
    idx = NGramIndex(max_n=5, indexing="eager")
    idx.extend(stream)
    for n in range(len(stream) - 1, -1, -1):
        idx.truncate(n)
        fresh = NGramIndex(max_n=5, indexing="eager")
        fresh.extend(stream[:n])
        assert idx._d == fresh._d and idx._undo == fresh._undo
        assert idx.lookup(6, 3) == reference(stream[:n], 5, 6, 3)
    assert len(idx) == 0 and idx.lookup(4) == []
    idx.truncate(5)  # longer than the stream: nothing happens
    with pytest.raises(InvalidParameterError):
        idx.truncate(-1)


@pytest.mark.parametrize("capacity", [1, 7, 40, 64])
def test_capacity_keeps_the_newest_tail(capacity: int) -> None:
    rng = random.Random(capacity)
    idx = NGramIndex(max_n=4, capacity=capacity, indexing="eager")
    stream: list[int] = []
    for _ in range(25):
        chunk = random_stream(rng, rng.randint(1, 30), 4, seps=0.05)
        stream += chunk
        idx.extend(chunk)
        kept = list(idx.tokens)
        assert 0 < len(kept) <= capacity
        assert kept == stream[len(stream) - len(kept) :]
        assert len(kept) >= min(len(stream), capacity // 2)  # drops no more than half
        fresh = NGramIndex(max_n=4, indexing="eager")
        fresh.extend(kept)
        assert idx._d == fresh._d
        check_all(idx, rng)


def test_branches_order_counts_and_totals() -> None:
    a, b, x, y, z = 1, 2, 10, 11, 12
    # "a b" followed by x twice, y once (most recently), z once (earlier than y)
    stream = [a, b, x, 5, a, b, z, 6, a, b, x, 7, a, b, y, 8, a, b]
    idx = NGramIndex(max_n=4)
    idx.extend(stream)
    got = idx.lookup(3, branches=5)
    assert [c.tokens for c in got] == [(x, 7, a), (y, 8, a), (z, 6, a)]
    assert [c.count for c in got] == [2, 1, 1]
    assert {c.total for c in got} == {4}
    assert [c.match_len for c in got] == [2, 2, 2]
    assert idx.lookup(3) == got[:1]
    # a longer match wins over a more frequent shorter one
    idx.extend([x, 5, a, b])
    got = idx.lookup(2, branches=3)
    assert got[0] == Continuation((z, 6), 6, 1, 1)  # "a b x 5 a b" once, then z
    assert got == reference(idx.tokens, 4, 2, 3)


def test_trivial_self_match_never_counts() -> None:
    idx = NGramIndex()
    idx.extend([1, 2, 3, 4])
    assert idx.lookup(8) == []  # the end matches only itself
    idx.extend([1])
    assert idx.lookup(8) == [Continuation((2, 3, 4, 1), 1, 1, 1)]
    idx.clear()
    idx.extend([7, 7, 7, 7])  # overlapping earlier occurrences do count
    assert idx.lookup(8) == [Continuation((7,), 3, 1, 1)]
    assert NGramIndex().lookup(4) == []
    assert idx.lookup(4, query=[]) == []
    assert idx.lookup(4, query=[8, 9]) == []


def test_max_len_respected() -> None:
    rng = random.Random(11)
    stream = random_stream(rng, 400, 3)
    idx = NGramIndex(max_n=6)
    idx.extend(stream)
    for max_len in (1, 2, 5, 17, 64):
        for c in idx.lookup(max_len, 3) + idx.lookup(max_len, 3, query=stream[:50]):
            assert 1 <= len(c.tokens) <= max_len
        assert idx.lookup(max_len, 3) == reference(stream, 6, max_len, 3)


def test_session_store_never_crosses_a_separator() -> None:
    store = SessionStore(capacity=1000, max_n=4)
    store.add([1, 2, 3])
    store.add([4, 5, 6])
    assert list(store.tokens) == [1, 2, 3, SEPARATOR, 4, 5, 6, SEPARATOR]
    assert store.lookup([3, 4], 8) == [Continuation((5, 6), 1, 1, 1)]  # "3 4" spans contexts
    assert store.lookup([2], 8) == [Continuation((3,), 1, 1, 1)]  # stops at the separator
    assert store.lookup([3], 8) == []  # 3 ends its context: nothing followed it
    assert store.lookup([6], 8) == []
    assert store.lookup([9, 1, 2], 8) == [Continuation((3,), 2, 1, 1)]
    assert store.lookup([SEPARATOR, 4], 8)[0].match_len == 1  # a separator matches nothing
    store.clear()
    assert len(store) == 0 and store.lookup([1], 4) == []


@pytest.mark.parametrize("seed", range(8))
def test_session_store_matches_reference(seed: int) -> None:
    rng = random.Random(500 + seed)
    store = SessionStore(capacity=10_000, max_n=3)
    for _ in range(8):
        store.add(random_stream(rng, rng.randint(1, 40), 3))
    stream = list(store.tokens)
    for _ in range(60):
        query = random_stream(rng, rng.randint(1, 12), 3)
        got = store.lookup(query, 6, branches=2)
        assert got == reference(stream, 3, 6, 2, query)
        for c in got:
            assert SEPARATOR not in c.tokens and c.tokens


def test_session_store_keeps_a_quarter_and_evicts() -> None:
    store = SessionStore(capacity=100, max_n=4)
    store.add(list(range(1000, 1300)))
    assert list(store.tokens) == [*range(1275, 1300), SEPARATOR]  # capacity // 4 of it
    for i in range(10):
        store.add(list(range(i * 30, i * 30 + 30)))
    assert len(store) <= 100
    assert list(store.tokens)[-26:] == [*range(275, 300), SEPARATOR]
    assert store.lookup([276, 277], 3) == [Continuation((278, 279, 280), 2, 1, 1)]
    assert store.lookup([1280], 3) == []  # evicted


def test_nbytes_grows_and_is_bounded() -> None:
    rng = random.Random(5)
    idx = NGramIndex(max_n=8, indexing="eager")
    capped = NGramIndex(max_n=8, capacity=2000, indexing="eager")
    sizes, capped_sizes = [], []
    for _ in range(10):
        chunk = random_stream(rng, 1000, 500)
        idx.extend(chunk)
        capped.extend(chunk)
        sizes.append(idx.nbytes)
        capped_sizes.append(capped.nbytes)
    assert all(a < b for a, b in zip(sizes, sizes[1:], strict=False))
    assert max(capped_sizes) < sizes[2] < sizes[-1] / 2
    assert len(capped) <= 2000


@pytest.mark.parametrize("indexing", ["eager", "auto"])
def test_nbytes_is_honest(indexing: str) -> None:
    """nbytes against what tracemalloc sees the index allocate (auto: the stream waits for a
    lookup to catch the trie up)."""
    rng = random.Random(9)
    for vocab in (50, 5000):
        stream = random_stream(rng, 4000, vocab)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            idx = NGramIndex(indexing=indexing)
            idx.extend(stream)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert 0.85 < idx.nbytes / held < 1.25, (vocab, idx.nbytes, held)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidParameterError):
        NGramIndex(max_n=0)
    with pytest.raises(InvalidParameterError):
        NGramIndex(max_n=MAX_MATCH + 1)
    with pytest.raises(InvalidParameterError):
        NGramIndex(capacity=0)
    with pytest.raises(InvalidParameterError, match="indexing must be one of"):
        NGramIndex(indexing="lazy")
    idx = NGramIndex()
    with pytest.raises(InvalidParameterError):
        idx.extend([1, -2])
    with pytest.raises(InvalidParameterError):
        idx.extend([1 << 24])
    assert len(idx) == 0  # a bad token leaves the index as it was
    idx.extend([1, 2, 1])
    with pytest.raises(InvalidParameterError):
        idx.lookup(0)
    with pytest.raises(InvalidParameterError):
        idx.lookup(4, branches=0)
    with pytest.raises(TypeError):
        idx.tokens[0] = 5  # type: ignore[index]
    assert idx.tokens[-1] == 1 and idx.tokens[:2] == [1, 2]
