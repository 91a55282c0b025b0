"""Candidate indexes for the n-gram draft source, measured side by side
(localspec/speculation/sources/ngram_index.py).

The stream: Python standard library sources cut into word, punctuation and whitespace tokens,
each distinct piece mapped to a random id below 150k (as a BPE vocabulary would), a stretch of
300 uniformly random ids after each file (text that never repeats), and one file read again
with a few edits (an agent re-reading what it changed), to --tokens tokens (32768).

Candidates (each gives the same answers as NGramIndex.lookup, except (b)):

  (a)  NGramIndex: a lazy suffix trie of depth max_n in one dict (n-grams seen
       once held as a bare position, records only for repeated ones), undo stack for truncate;
  (a0) every n-gram 1..max_n with a follower held in one dict (a bare position when seen once,
       else a record of its followers): the plain design, no truncate;
  (b)  an online suffix automaton (dict of transitions per state): longest earlier match of
       any length and one occurrence of it; no follower counts, no truncate;
  (c)  numpy: the stream in an int32 array, each lookup filters the positions where the last
       1, 2, ... max_n tokens occur (vectorised scans) and groups the followers.

For each it prints the cost of appending (microseconds per token: the whole stream in one
call, and one call per token as generation does), of a lookup of the stream's end (max_len 32,
one branch, over the last quarter of the stream, so at 24k-32k tokens) and the memory held at
the end (tracemalloc: everything allocated while building it, still held), also for as many
uniformly random tokens ("novel": text that never repeats). Timings are the
best of --repeat runs (the machine may be shared). It then checks (a) and (c) agree on every
lookup timed, compares (a)'s nbytes with tracemalloc, and measures the draft quality of
max_n 4..32: speculative decoding of the stream itself with (a) as the only draft source
(tokens per step, as greedy verification would accept them), with (a)'s cost at that max_n.

    python benchmarks/bench_ngram_index.py [--tokens 32768] [--repeat 3] [--max-n 8]
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import re
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from localspec.speculation.sources.ngram_index import MAX_MATCH, Continuation, NGramIndex  # noqa: E402

VOCAB = 150_000
FILES = [
    "argparse.py",
    "textwrap.py",
    "json/decoder.py",
    "json/encoder.py",
    "dataclasses.py",
    "csv.py",
    "configparser.py",
    "typing.py",
    "pathlib.py",
    "functools.py",
    "inspect.py",
]

# ---------------------------------------------------------------------------------------------
# the stream


def make_stream(n_tokens: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    ids: dict[str, int] = {}
    stdlib = os.path.dirname(os.__file__)

    def tokenize(text: str) -> list[int]:
        out = []
        for piece in re.findall(r"\w+|[^\w\s]|\s+", text):
            if piece not in ids:
                ids[piece] = rng.randrange(VOCAB)
            out.append(ids[piece])
        return out

    files = []
    for name in FILES:
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            files.append(tokenize(f.read()))
    stream: list[int] = []
    for i, toks in enumerate(files):
        stream += toks[:6000]
        stream += [rng.randrange(VOCAB) for _ in range(300)]
        if i == 2:  # re-read the first file, edited in a few places
            again = list(files[0][:3000])
            for _ in range(10):
                again[rng.randrange(len(again))] = rng.randrange(VOCAB)
            stream += again
        if len(stream) >= n_tokens:
            break
    return stream[:n_tokens]


# ---------------------------------------------------------------------------------------------
# (a0) every n-gram held

_POS_MASK = (1 << 32) - 1
_ONE = 1 << 32


class EveryGram:
    """Every n-gram (n = 1..max_n) that has a follower: a bare position while seen once, else a
    record [followers with a follower, best follower, its packed count|position, followers]."""

    def __init__(self, max_n: int = 8) -> None:
        self.max_n = max_n
        self.t: list[int] = []
        self.d: dict[int, Any] = {}
        self.keys: list[int] = []  # keys of the n-grams ending at the end, n = 1..

    def extend(self, tokens: Sequence[int]) -> None:
        t, d = self.t, self.d
        for x in tokens:
            pos = len(t)
            for key in self.keys:  # each n-gram ending at pos gets the follower x
                v = d.get(key)
                if v is None:
                    d[key] = pos
                    continue
                if type(v) is int:
                    y = t[v]
                    v = d[key] = [1, y, _ONE | v, None]
                best = v[1]
                if best == x:
                    nv = ((v[2] >> 32) + 1) << 32 | pos
                    v[2] = nv
                    if v[3] is not None:
                        v[3][x] = nv
                else:
                    kids = v[3]
                    if kids is None:
                        kids = v[3] = {best: v[2]}
                    old = kids.get(x)
                    nv = _ONE | pos if old is None else ((old >> 32) + 1) << 32 | pos
                    kids[x] = nv
                    if nv >> 32 >= v[2] >> 32:
                        v[1], v[2] = x, nv
                v[0] += 1
            t.append(x)
            d1 = x + 1
            self.keys = [d1] + [k << 24 | d1 for k in self.keys[: self.max_n - 1]]

    def lookup(self, max_len: int, branches: int = 1) -> list[Continuation]:
        t, d = self.t, self.d
        for n in range(len(self.keys), 0, -1):
            v = d.get(self.keys[n - 1])
            if v is None:
                continue
            if type(v) is int:
                found, total = [_ONE | v], 1
            else:
                kids = v[3]
                if branches == 1 or kids is None:
                    found = [v[2]]
                else:
                    found = heapq.nlargest(branches, kids.values())
                total = v[0]
            out = []
            for packed in found:
                e = packed & _POS_MASK
                m = n
                while m < min(MAX_MATCH, e) and t[e - 1 - m] == t[-1 - m]:
                    m += 1
                out.append(Continuation(tuple(t[e : e + max_len]), m, packed >> 32, total))
            return out
        return []


# ---------------------------------------------------------------------------------------------
# (b) suffix automaton


class SuffixAutomaton:
    """Online suffix automaton; each state keeps the end of the occurrence that created it."""

    def __init__(self) -> None:
        self.t: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.len = [0]
        self.pos = [0]
        self.last = 0

    def extend(self, tokens: Sequence[int]) -> None:
        nxt, link, ln, pos = self.next, self.link, self.len, self.pos
        for x in tokens:
            self.t.append(x)
            cur = len(ln)
            nxt.append({})
            ln.append(ln[self.last] + 1)
            link.append(0)
            pos.append(len(self.t))
            p = self.last
            while p != -1 and x not in nxt[p]:
                nxt[p][x] = cur
                p = link[p]
            if p != -1:
                q = nxt[p][x]
                if ln[p] + 1 == ln[q]:
                    link[cur] = q
                else:
                    clone = len(ln)
                    nxt.append(dict(nxt[q]))
                    ln.append(ln[p] + 1)
                    link.append(link[q])
                    pos.append(pos[q])
                    while p != -1 and nxt[p].get(x) == q:
                        nxt[p][x] = clone
                        p = link[p]
                    link[q] = link[cur] = clone
            self.last = cur

    def lookup(self, max_len: int, branches: int = 1) -> list[Continuation]:
        s = self.link[self.last]  # the longest suffix that also occurred earlier
        if s <= 0:
            return []
        e = self.pos[s]
        cont = tuple(self.t[e : e + max_len])
        return [Continuation(cont, min(self.len[s], MAX_MATCH), 1, 1)] if cont else []


# ---------------------------------------------------------------------------------------------
# (c) numpy scans


class NumpyScan:
    """The stream in a growing int32 array; every lookup scans it."""

    def __init__(self, max_n: int = 8) -> None:
        self.max_n = max_n
        self.a = np.zeros(1024, dtype=np.int32)
        self.n = 0

    def extend(self, tokens: Sequence[int]) -> None:
        need = self.n + len(tokens)
        if need > len(self.a):
            self.a = np.concatenate([self.a, np.zeros(max(need, 2 * len(self.a)), np.int32)])
        self.a[self.n : need] = tokens
        self.n = need

    def lookup(self, max_len: int, branches: int = 1) -> list[Continuation]:
        a, size = self.a, self.n
        if size < 2:
            return []
        ends = np.flatnonzero(a[: size - 1] == a[size - 1]) + 1  # earlier ends, with a follower
        if ends.size == 0:
            return []
        n = 1
        while n < self.max_n and n < size:
            ok = ends[ends > n]
            ok = ok[a[ok - n - 1] == a[size - n - 1]]
            if ok.size == 0:
                break
            ends, n = ok, n + 1
        follow = a[ends]
        kinds, inverse, counts = np.unique(follow, return_inverse=True, return_counts=True)
        latest = np.zeros(kinds.size, dtype=np.int64)
        np.maximum.at(latest, inverse, ends)
        rank = np.argsort(-(counts.astype(np.int64) << 32 | latest))[:branches]
        out = []
        t = a[:size]
        for g in rank:
            e = int(latest[g])
            m = n
            while m < min(MAX_MATCH, e) and t[e - 1 - m] == t[size - 1 - m]:
                m += 1
            cont = tuple(int(v) for v in t[e : e + max_len])
            out.append(Continuation(cont, m, int(counts[g]), int(ends.size)))
        return out


# ---------------------------------------------------------------------------------------------
# measurement


def best_of(repeat: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeat))


def measure(
    name: str, make: Callable[[], Any], stream: list[int], repeat: int
) -> tuple[str, float, float, float, float, float, list[list[Continuation]]]:
    def bulk() -> float:
        idx = make()
        t0 = time.perf_counter()
        idx.extend(stream)
        return (time.perf_counter() - t0) / len(stream) * 1e6

    def single() -> float:
        idx = make()
        t0 = time.perf_counter()
        for x in stream:
            idx.extend((x,))
        return (time.perf_counter() - t0) / len(stream) * 1e6

    answers: list[list[Continuation]] = []

    def lookups() -> float:
        idx = make()
        start = len(stream) * 3 // 4
        idx.extend(stream[:start])
        answers.clear()
        spent = 0.0
        for p in range(start, len(stream), 8):
            idx.extend(stream[p : p + 8])
            t0 = time.perf_counter()
            found = idx.lookup(32)
            spent += time.perf_counter() - t0
            answers.append(found)
        return spent / len(answers) * 1e6

    extend_us = best_of(repeat, bulk)
    single_us = best_of(repeat, single)
    lookup_us = best_of(repeat, lookups)
    rng = random.Random(1)
    novel = [rng.randrange(VOCAB) for _ in stream]
    return (
        name,
        extend_us,
        single_us,
        lookup_us,
        held_mb(make, stream),
        held_mb(make, novel),
        answers,
    )


def held_mb(make: Callable[[], Any], stream: list[int]) -> float:
    """MB that building the index over the stream allocates and keeps (tracemalloc)."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    idx = make()
    idx.extend(stream)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del idx
    return held / 1e6


def quality(
    stream: list[int], max_n: int, repeat: int
) -> tuple[float, float, float, float, float, float]:
    """Speculative decoding of the stream with (a) as the only draft source, a 32-token draft
    of the top continuation each step, greedy acceptance (the stream is the target's output):
    the steps with a draft, the drafts whose first token is right, tokens per step. Then, a
    draft at every position: the mean tokens of it the stream repeats. And the index's append
    cost (us/token) and memory (MB by nbytes) at this max_n."""
    idx = NGramIndex(max_n=max_n)

    def bulk() -> float:
        idx.clear()
        t0 = time.perf_counter()
        idx.extend(stream)
        return (time.perf_counter() - t0) / len(stream) * 1e6

    extend_us = best_of(repeat, bulk)
    mb = idx.nbytes / 1e6
    idx.clear()
    p = steps = drafted = hits = 0
    while p < len(stream):
        found = idx.lookup(32)
        k = 0
        if found:
            drafted += 1
            k = agree(found[0].tokens, stream[p : p + 32])
            hits += k > 0
        idx.extend(stream[p : p + k + 1])  # the accepted tokens and the target's own
        p += k + 1
        steps += 1
    idx.clear()
    every = 0
    for p, x in enumerate(stream):
        idx.extend((x,))
        found = idx.lookup(32)
        every += agree(found[0].tokens, stream[p + 1 : p + 33]) if found else 0
    tau = len(stream) / steps
    return drafted / steps, hits / max(drafted, 1), tau, every / len(stream), extend_us, mb


def agree(a: Sequence[int], b: Sequence[int]) -> int:
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-n", type=int, default=8)
    ap.add_argument("--skip-quality", action="store_true")
    args = ap.parse_args()
    stream = make_stream(args.tokens)
    print(f"stream: {len(stream)} tokens, {len(set(stream))} distinct; max_n {args.max_n}")
    n = args.max_n
    candidates: list[tuple[str, Callable[[], Any]]] = [
        ("(a) lazy n-gram trie (ngram_index.py)", lambda: NGramIndex(max_n=n)),
        ("(a0) every n-gram held", lambda: EveryGram(max_n=n)),
        ("(b) suffix automaton", SuffixAutomaton),
        ("(c) numpy scan", lambda: NumpyScan(max_n=n)),
    ]
    head = f"{'candidate':34} {'extend us/tok':>13} {'(1/call)':>9} {'lookup us':>10}"
    print(f"{head} {'MB':>6} {'novel':>6}")
    results = {}
    for name, make in candidates:
        row = measure(name, make, stream, args.repeat)
        results[name[:4].strip()] = row[6]
        print(f"{name:34} {row[1]:13.2f} {row[2]:9.2f} {row[3]:10.1f} {row[4]:6.1f} {row[5]:6.1f}")
    same = results["(a)"] == results["(c)"] == results["(a0)"]
    print(f"(a), (a0) and (c) agree on all {len(results['(a)'])} lookups: {same}")

    idx = NGramIndex(max_n=n)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    idx.extend(stream)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(
        f"(a) nbytes {idx.nbytes / 1e6:.1f} MB vs tracemalloc {held / 1e6:.1f} MB; "
        f"{held / len(stream):.0f} bytes/token"
    )
    t0 = time.perf_counter()
    for _ in range(200):
        idx.lookup(32, branches=4)
    print(f"(a) lookup with 4 branches at the end: {(time.perf_counter() - t0) / 200 * 1e6:.1f} us")
    t0 = time.perf_counter()
    q = stream[-MAX_MATCH:]
    for _ in range(200):
        idx.lookup(32, query=q)
    print(f"(a) lookup of a query (64 tokens): {(time.perf_counter() - t0) / 200 * 1e6:.1f} us")
    t0 = time.perf_counter()
    idx.truncate(len(stream) - 2000)
    dt = (time.perf_counter() - t0) / 2000 * 1e6
    print(f"(a) truncate: {dt:.1f} us per token removed")

    if not args.skip_quality:
        print("(a) by max_n: speculative decoding of the stream, 32-token drafts, greedy;")
        print("'every': a draft at every position, mean tokens the stream repeats")
        cols = f"{'drafted':>8} {'1st hit':>8} {'tok/step':>8} {'every':>6} {'us/tok':>7}"
        print(f"{'max_n':>5} {cols} {'MB':>6}")
        for m in (4, 8, 12, 16, 32):
            share, hit, tau, every, us, mb = quality(stream, m, args.repeat)
            print(f"{m:5} {share:8.1%} {hit:8.1%} {tau:8.2f} {every:6.2f} {us:7.2f} {mb:6.1f}")


if __name__ == "__main__":
    main()
