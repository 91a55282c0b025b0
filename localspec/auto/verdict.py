"""Auto's explanation: ``Verdict``, why it chose what it chose, in the cost model's own numbers,
said in one unit (a plain step as the user sees it) for people (``reason``, ``brief``) and for
programs (``as_dict``); ``inconsistencies`` checks one; ``break_even`` is the acceptance a chain
needs to pay."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..speculation.tree import TreeShape


@dataclass(frozen=True)
class Verdict:
    """Why auto chose what it chose, in the cost model's own numbers. The break-even is quoted
    for the chain whose required acceptance is lowest here: with the same acceptance a at
    every draft position, a chain of k pays when 1 + a + ... + a^k tokens per step beat plain
    decoding's one token in cost_ratio times its time."""

    shape: TreeShape | None  # the shape auto runs now (None: plain decoding)
    explore: bool  # a probe chosen by the optimistic bound, not by the mean estimates
    expected_speedup: float  # the choice's expected tokens/s over plain decoding's
    expected_tokens: float  # per step of the choice
    chain: int  # the chain length the break-even below is quoted for
    # in plain steps (a plain step's seconds as auto prices it now): a step drafting that
    # chain, and its verify with the step's bookkeeping alone (>= 1, <= cost_ratio); the
    # difference is the drafting
    cost_ratio: float
    verify_ratio: float
    needed: float | None  # acceptance per position that chain needs; None: no acceptance can
    reached: float  # the drafter's first-position acceptance, as auto estimates it
    drafts_seen: float  # first-position drafts behind that estimate (faded with age)
    eagle: bool = True  # an EAGLE drafter takes part
    ngram: str = ""  # the n-gram source's acceptance in words ("": not in use)
    ready_tax: float = 0.0  # a plain step with the drafter fed over one without, less 1
    switch_s: float = 0.0  # seconds that switching the taps adds to the next decode

    def with_sources(self, *, eagle: bool, ngram: str) -> Verdict:
        return replace(self, eagle=eagle, ngram=ngram)

    @property
    def reason(self) -> str:
        """One line for people."""
        seen = (
            f"the drafter's first token is accepted {self.reached:.0%} "
            f"(over {self.drafts_seen:.0f} recent drafts)"
            if self.drafts_seen >= 1
            else "the drafter's acceptance is not measured yet (auto has not drafted)"
        )
        chain = f"a draft of {self.chain} tokens" if self.chain > 1 else "a 1-token draft"
        # the parts as printed add up to the whole as printed
        drafting = max(round(self.cost_ratio, 2) - round(self.verify_ratio, 2), 0.0)
        cost = (
            f"{chain} costs {self.cost_ratio:.2f} plain steps here "
            f"({self.verify_ratio:.2f} verifying {self.chain + 1} tokens "
            f"+ {drafting:.2f} drafting)"
        )
        ngram = f"; {self.ngram}" if self.ngram else ""
        if not self.eagle:
            cost = (
                f"{chain} costs {self.cost_ratio:.2f} plain steps here "
                f"(verifying {self.chain + 1} tokens; n-gram lookups cost little)"
            )
            need = (
                "so no n-gram draft can pay"
                if self.needed is None
                else f"so an n-gram draft pays above {self.needed:.0%} acceptance per position"
            )
            return f"auto drafts from the context's n-grams where they pay: {cost}, {need}{ngram}"
        if self.shape is None:
            need = (
                "so no acceptance can pay"
                if self.needed is None
                else f"so it pays only above {self.needed:.0%} acceptance per position"
            )
            what = "no EAGLE drafts" if self.ngram else "plain decoding"
            ready = (
                f"; keeping the drafter fed costs {self.ready_tax:.0%} a plain step"
                if self.ready_tax >= 0.005
                else ""
            )
            return f"auto runs {what}: {cost}, {need}; {seen}{ngram}{ready}"
        what = "probes with" if self.explore else "drafts"
        return (
            f"auto {what} {self.shape}: expected {self.expected_speedup:.2f}x plain "
            f"({self.expected_tokens:.2f} tokens per step); {cost}; {seen}{ngram}"
        )

    @property
    def brief(self) -> str:
        """The reason in a few words, for narrow places (the chat's side panel)."""
        drafter = f"drafter {self.reached:.0%}" if self.drafts_seen >= 1 else "drafter unmeasured"
        if not self.eagle:
            need = "no draft pays" if self.needed is None else f"drafts need {self.needed:.0%}"
            return (
                f"n-gram only: {self.chain}-token draft costs {self.cost_ratio:.2f} plain "
                f"steps, {need}"
            )
        if self.shape is None:
            need = "no acceptance pays" if self.needed is None else f"needs {self.needed:.0%}"
            return (
                f"plain: {self.chain}-token draft costs {self.cost_ratio:.2f} plain steps, "
                f"{need}; {drafter}"
            )
        return f"{self.shape}: expected {self.expected_speedup:.2f}x plain; {drafter}"

    def as_dict(self) -> dict[str, object]:
        return {
            "choice": str(self.shape) if self.shape is not None else "plain",
            "explore": self.explore,
            "expected_speedup": self.expected_speedup,
            "expected_tokens_per_step": self.expected_tokens,
            "break_even_chain": self.chain,
            "chain_cost_ratio": self.cost_ratio,
            "verify_cost_ratio": self.verify_ratio,
            "needed_acceptance": self.needed,
            "drafter_acceptance": self.reached,
            "drafts_seen": self.drafts_seen,
            "eagle": self.eagle,
            "ngram": self.ngram,
            "ready_tax": self.ready_tax,
            "switch_ms": 1e3 * self.switch_s,
            "reason": self.reason,
            "brief": self.brief,
        }


def inconsistencies(auto: dict[str, Any]) -> list[str]:
    """What is self-contradictory in an explanation (``Verdict.as_dict()``, as the server's
    ``timings.auto`` and bench's JSON carry it): a speedup above the tokens per step, a draft
    cheaper than its own verify, a verify cheaper than a plain step. Empty when consistent."""
    out = []
    speedup, tokens = float(auto["expected_speedup"]), float(auto["expected_tokens_per_step"])
    cost, verify = float(auto["chain_cost_ratio"]), float(auto["verify_cost_ratio"])
    if speedup > tokens * (1 + 1e-9):
        out.append(f"expected speedup {speedup:.3f} above {tokens:.3f} tokens per step")
    if cost < verify * (1 - 1e-9):
        out.append(f"a draft ({cost:.3f} plain steps) cheaper than its verify ({verify:.3f})")
    if verify < 1 - 1e-9:
        out.append(f"a verify ({verify:.3f} plain steps) cheaper than a plain step")
    return out


def break_even(cost_ratio: float, k: int) -> float | None:
    """The acceptance a per position at which 1 + a + ... + a^k equals cost_ratio (None when
    even a = 1 falls short). Newton's method on a^(k+1) - r a + r - 1 (the sum times 1 - a,
    less r (1 - a)), which is convex and falls from r - 1 at a = 0 to the root sought:
    started at 0, it climbs to it without passing it (a few steps; auto's reason solves this
    for every chain length it quotes)."""
    if cost_ratio <= 1.0:
        return 0.0
    if k + 1 < cost_ratio:
        return None
    a = 0.0
    for _ in range(200):
        slope = (k + 1) * a**k - cost_ratio
        if slope >= 0.0:  # the minimum: a double root at 1 (cost_ratio = k + 1)
            break
        step = (a ** (k + 1) - cost_ratio * a + cost_ratio - 1.0) / slope
        a -= step
        if -1e-13 < step < 1e-13:
            break
    return min(a, 1.0)
