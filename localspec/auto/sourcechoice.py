"""Auto's choice among draft sources for one step: plain decoding, the EAGLE plan (a chain or
a tree, from costmodel.CostModel), an n-gram chain or tree, or a merged tree of both.

An n-gram proposal comes with the length of the context it matched. Its acceptance is learned
per match-length bucket and draft position: a(b, d) = P(position d accepted | positions before
it accepted), from decayed counts with a prior, each position shrunk towards the one before (deep
positions are seen rarely). A chain of L then expects sum_{j<=L} prod_{d<j} a(b, d) accepted
tokens. Alternative continuations (other tokens that followed the same n-gram) ride as extra
branches under the root, worth their learned hit rate when the main one is rejected at once.
Costs are the cost model's measured verify curve, the EAGLE drafter's measured costs, and the
n-gram lookup and per-step bookkeeping, measured. As for EAGLE shapes: never a choice predicted
slower than plain, and never a verify batch larger than one measured.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

import numpy as np

from ..speculation.sources.ngram import ALT_LEN, NGramOffer
from ..speculation.tree import MAX_TREE_NODES
from .costmodel import CostModel, Plan
from .estimators import WINDOW, FadingCounts, Recent, shrunk

# match-length buckets: a match of m tokens falls in the last bucket whose bound is <= m
MATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
MAX_NGRAM_DEPTH = 32  # the longest n-gram draft considered
PRIOR_WEIGHT = 2.0
# priors per bucket, from SmolLM2's greedy replies (12 copy-heavy requests and 12 MT-Bench
# questions, every offer drafted): first-position acceptance rose from 0.2-0.3 after a 1-token
# match to 0.95+ after 16 or more; a later position, given the ones before were accepted, from
# 0.6 to 0.95+. Two pseudo-observations: a few drafts replace them.
_PRIOR_A0 = np.array([0.25, 0.45, 0.55, 0.65, 0.7, 0.7, 0.75, 0.9, 0.95, 0.95, 0.95])
_PRIOR_DEEPER = np.array([0.6, 0.7, 0.8, 0.85, 0.85, 0.85, 0.9, 0.95, 0.97, 0.97, 0.97])
EXPLORE_Z = 1.0  # optimism of the bound that decides n-gram probes
_PRIOR_ALT = 0.15  # prior hit rate of an alternative branch when the main one missed


def bucket(match_len: int) -> int:
    return max(0, bisect.bisect_right(MATCH_BUCKETS, match_len) - 1)


@dataclass(frozen=True)
class Choice:
    """One step's plan: the EAGLE shape and/or the n-gram draft, with what it should yield."""

    eagle: Plan  # the EAGLE part (shape None: no EAGLE drafts)
    ngram: int = 0  # tokens of the main n-gram continuation drafted (0: none)
    ngram_alts: int = 0  # alternative n-gram branches (ALT_LEN tokens each at most)
    tokens: float = 1.0  # expected tokens emitted
    seconds: float = 0.0  # expected time
    explore: bool = False  # an n-gram probe chosen by the optimistic bound, not the mean

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def drafts(self) -> bool:
        return self.eagle.shape is not None or self.ngram > 0

    @property
    def nodes(self) -> int:
        s = self.eagle.shape
        eagle = 0 if s is None else (s.depth if s.is_chain else s.budget)
        return eagle + self.ngram + self.ngram_alts * ALT_LEN

    @property
    def label(self) -> str:
        parts = []
        if self.ngram:
            parts.append("ngram tree" if self.ngram_alts else "ngram")
        if self.eagle.shape is not None:
            parts.append(str(self.eagle.shape))
        return " + ".join(parts) or "plain"


class NGramAcceptance:
    """Faded counts of n-gram drafts per match bucket and position."""

    def __init__(self) -> None:
        nb = len(MATCH_BUCKETS)
        # alt: (main missed at once with alternatives drafted, hits)
        self.evidence = FadingCounts(
            drafted=(nb, MAX_NGRAM_DEPTH), accepted=(nb, MAX_NGRAM_DEPTH), alt=(nb, 2)
        )
        self.drafted = self.evidence["drafted"]
        self.accepted = self.evidence["accepted"]
        self.alt = self.evidence["alt"]

    @property
    def version(self) -> int:  # changes with every observation
        return self.evidence.version

    def observe(self, b: int, drafted: int, accepted: int) -> None:
        """A main continuation of `drafted` tokens, of which the first `accepted` were."""
        n = min(drafted, MAX_NGRAM_DEPTH)
        self.drafted[b, : min(accepted + 1, n)] += 1
        self.accepted[b, : min(accepted, n)] += 1
        self.evidence.observed()

    def observe_alt(self, b: int, hit: bool) -> None:
        self.alt[b] += (1.0, float(hit))
        self.evidence.observed()

    def advance(self, tokens: int) -> None:
        self.evidence.advance(tokens)

    def rates(self, b: int, *, optimistic: bool = False) -> np.ndarray:
        """a(b, d) for every position d; optimistic: the first position's upper confidence
        bound instead of its mean."""
        out = np.empty(MAX_NGRAM_DEPTH)
        prior = _PRIOR_A0[b]
        for d in range(MAX_NGRAM_DEPTH):
            n = self.drafted[b, d] + PRIOR_WEIGHT
            a = float(shrunk(self.accepted[b, d], self.drafted[b, d], prior, PRIOR_WEIGHT))
            if d == 0 and optimistic:  # the prior counts double here: no wild first probes
                a = min(1.0, a + EXPLORE_Z * math.sqrt(a * (1 - a) / (n + PRIOR_WEIGHT)))
            out[d] = a
            # deeper positions are seen less often: each leans on the one before it
            prior = _PRIOR_DEEPER[b] if d == 0 else a
        return out

    def alt_rate(self, b: int) -> float:
        tries, hits = self.alt[b]
        return float(shrunk(hits, tries, _PRIOR_ALT, PRIOR_WEIGHT))

    def first_rate(self) -> tuple[float, float]:
        """First-position acceptance over all buckets, and the drafts behind it."""
        n = float(self.drafted[:, 0].sum())
        return (float(self.accepted[:, 0].sum()) / n if n else 0.0), n


class SourceChoice:
    """Picks each step's sources and shapes from the cost model's costs and learned acceptance."""

    def __init__(self, cost: CostModel, *, max_nodes: int = MAX_TREE_NODES) -> None:
        self.cost = cost
        self.ngram = NGramAcceptance()
        self.max_nodes = max_nodes
        self.build = Recent(20e-6, WINDOW)  # seconds to build an n-gram draft into the tree
        self.glue = Recent(80e-6, WINDOW)  # per n-gram step

    def choose(self, eagle: Plan, offer: NGramOffer | None, budget: int) -> Choice:
        """The best of plain, the EAGLE plan, an n-gram chain or tree and the merged tree.
        When nothing pays on the mean estimates, an optimistic bound on the offer's first-
        position acceptance may still draft it (a probe), so a bucket whose estimate fell
        after a few unlucky drafts is tried again rather than never (the bound narrows as
        its drafts are counted and widens as they fade)."""
        c = self.cost
        plain = Choice(Plan(None, 1.0, c.step_time(None)), 0, 0, 1.0, c.step_time(None))
        best = plain
        if eagle.shape is not None and eagle.tokens_per_s > plain.tokens_per_s:
            best = Choice(eagle, 0, 0, eagle.tokens, eagle.seconds)
        if offer is None or budget < 1:
            return best
        b = bucket(offer.match_len)
        found = self._search(eagle, offer, budget, self.ngram.rates(b), self.ngram.alt_rate(b))
        if found.tokens_per_s > best.tokens_per_s:
            return found
        if best.drafts:
            return best
        hopeful = self.ngram.rates(b, optimistic=True)
        probe = self._search(Plan(None, 1.0, 0.0), offer, budget, hopeful, 0.0)
        if probe.ngram and probe.tokens_per_s > plain.tokens_per_s:
            return replace(probe, explore=True)
        return plain

    def _search(
        self, eagle: Plan, offer: NGramOffer, budget: int, a: np.ndarray, alt_rate: float
    ) -> Choice:
        """The best n-gram chain, n-gram tree and merged tree for acceptance rates a (the
        first candidate that beats nothing: a Choice of 0 tokens/s)."""
        c = self.cost
        none = Choice(Plan(None, 1.0, 0.0), 0, 0, 0.0, 1.0)
        # never past a measured verify size or the budget (which holds the cells left);
        # branches need the target's tree capacity, chains do not
        measured = c.verify.max_measured - 1
        chain_cap = min(measured, MAX_NGRAM_DEPTH, budget)
        tree_cap = min(self.max_nodes, measured, budget)
        longest = min(offer.length, chain_cap)
        if longest < 1:
            return none
        verify = c.verify.table(c.verify.max_measured)  # t(0..measured), cached
        gain = np.cumsum(np.cumprod(a))[:longest]  # expected accepted tokens, chain of L
        lengths = np.arange(1, longest + 1)
        plain = c.step_time(None)
        eagle_nodes, eagle_depth, eagle_leaves = 0, 0, 0
        if eagle.shape is not None:
            s = eagle.shape
            eagle_nodes = s.depth if s.is_chain else s.budget
            eagle_depth = s.depth
            eagle_leaves = 1 if s.is_chain else s.budget - s.depth + 1
        alt_value = (1 - a[0]) * alt_rate * float(1.0 + np.cumprod(a[1:ALT_LEN]).sum())
        best = none
        for alts in range(0, min(offer.alternatives, 2) + 1):
            tokens = 1.0 + gain + alts * alt_value
            nodes = lengths + alts * ALT_LEN
            # rows of the verify: the root and the nodes, or on a recurrent target each
            # branch apart (a chain is verified in the history's own sequence)
            deep = np.maximum(lengths, ALT_LEN if alts else 0)
            rows = nodes + 1 if alts == 0 else c.tree_rows(nodes, deep, 1 + alts)
            ok = (nodes <= (chain_cap if alts == 0 else tree_cap)) & (rows > 0)
            ok &= rows <= measured + 1
            if ok.any():
                # verify and bookkeeping, never cheaper than a plain step; then the build
                at = np.where(ok, rows, 0)
                seconds = np.maximum(verify[at] + self.glue.value, plain)
                seconds = seconds + self.build.value
                i = int(np.argmax(np.where(ok, tokens / seconds, 0.0)))
                if tokens[i] / seconds[i] > best.tokens_per_s:
                    best = Choice(
                        none.eagle, int(lengths[i]), alts, float(tokens[i]), float(seconds[i])
                    )
            if eagle.shape is None:
                continue
            # the EAGLE draft beside it: worth its accepted tokens when the n-gram's first token
            # is rejected (independence assumed); its drafting costs what it costs alone
            both = nodes + eagle_nodes
            rows = c.tree_rows(both, np.maximum(deep, eagle_depth), 1 + alts + eagle_leaves)
            ok = (both <= tree_cap) & (rows > 0) & (rows <= measured + 1)
            if not ok.any():
                continue
            assert eagle.shape is not None
            t_eagle = c.drafting(eagle.shape)
            m_tokens = tokens + (1 - a[0]) * (eagle.tokens - 1.0)
            m_verify = np.maximum(verify[np.where(ok, rows, 0)] + self.glue.value, plain)
            m_seconds = m_verify + self.build.value + t_eagle
            i = int(np.argmax(np.where(ok, m_tokens / m_seconds, 0.0)))
            if m_tokens[i] / m_seconds[i] > best.tokens_per_s:
                best = Choice(eagle, int(lengths[i]), alts, float(m_tokens[i]), float(m_seconds[i]))
        return best

    def observe(
        self,
        offer: NGramOffer | None,
        drafted: int,
        accepted: int,
        alts: int,
        alt_hit: bool,
        *,
        t_build: float | None,
        t_glue: float | None,
        emitted: int,
    ) -> None:
        """A step's n-gram outcome: main continuation drafted/accepted, alternatives tried."""
        if offer is not None and drafted > 0:
            b = bucket(offer.match_len)
            self.ngram.observe(b, drafted, accepted)
            if alts and accepted == 0:
                self.ngram.observe_alt(b, alt_hit)
        if t_build is not None:
            self.build.update(t_build)
        if t_glue is not None:
            self.glue.update(t_glue)
        self.ngram.advance(emitted)

    def describe(self) -> str:
        """One line on the n-gram source, for auto's reason."""
        rate, n = self.ngram.first_rate()
        if n < 1:
            return "n-gram drafts: none yet"
        return f"n-gram drafts: first token accepted {rate:.0%} (over {n:.0f} recent drafts)"
