"""Settling what a config leaves open by measurement: the converted drafter drafts for its
target under each reading (tap numbering, flag meaning) and the reading the target accepts most
is kept. Readings differ only in GGUF metadata, so one file is rewritten in place between runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .eagle3_gguf import set_reading
from .formats import Reading

# short chat requests of different kinds; the reply is the target's own (greedy), as at run time
PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for staying healthy.",
    "Summarise the history of the printing press.",
)


@dataclass
class MeasureConfig:
    prompts: Sequence[str] = PROMPTS  # user messages, rendered with the target's chat template
    n_draft: int = 4  # a fixed chain: every reading drafts the same number of positions
    max_tokens: int = 48
    n_threads: int | None = None


@dataclass
class Measured:
    reading: Reading
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    accepted_at: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    def summary(self) -> str:
        at = " ".join(f"{100 * a:.0f}%" for a in self.accepted_at)
        return (
            f"acceptance {100 * self.rate:.1f}% ({self.accepted}/{self.drafted} drafts), "
            f"tau {self.tau:.2f}, per position {at}"
        )


def measure(
    gguf_path: str,
    target: str,
    candidates: Sequence[Reading],
    cfg: MeasureConfig | None = None,
    log: Callable[[str], None] = print,
) -> list[Measured]:
    """Greedy chains of cfg.n_draft on every prompt, once per reading; the file is left in the
    last reading's state."""
    from localspec.engine import load

    cfg = cfg or MeasureConfig()
    out = []
    for i, r in enumerate(candidates, 1):
        set_reading(gguf_path, r.taps, r.flag_dict)
        m = Measured(r)
        drafted_at = [0] * cfg.n_draft
        accepted_at = [0] * cfg.n_draft
        with load(
            target, draft=gguf_path, n_draft=cfg.n_draft, n_threads=cfg.n_threads, n_ctx=1024
        ) as eng:
            for p in cfg.prompts:
                for _ in eng.chat_stream(
                    [{"role": "user", "content": p}], max_tokens=cfg.max_tokens
                ):
                    pass
                st = eng.last_stats
                m.drafted += st.drafted
                m.accepted += st.accepted
                m.steps += st.steps
                for j, (d, a) in enumerate(zip(st.drafted_at, st.accepted_at, strict=True)):
                    drafted_at[j] += d
                    accepted_at[j] += a
        m.accepted_at = [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at, strict=True)]
        log(f"  reading {i}: taps {list(r.taps)} ({r.why}): {m.summary()}")
        out.append(m)
    return out


def noise(a: Measured, b: Measured) -> float:
    """How far apart two acceptance rates may be by chance: two standard errors of their
    difference (drafts taken as independent), at least one point."""
    var = sum(m.rate * (1 - m.rate) / max(m.drafted, 1) for m in (a, b))
    return max(0.01, 2.0 * math.sqrt(var))


def choose(measured: Sequence[Measured]) -> tuple[Measured, str]:
    """The reading with the highest acceptance; among readings within noise of the best, the
    first (the layout's convention). Returns it and a sentence saying why."""
    best = max(measured, key=lambda m: m.rate)
    tied = [m for m in measured if best.rate - m.rate <= noise(best, m)]
    idx = {id(m): i for i, m in enumerate(measured, 1)}
    if len(tied) > 1:
        kept = tied[0]
        names = ", ".join(str(idx[id(m)]) for m in tied)
        which = (
            "the layout's convention"
            if kept is measured[0]
            else "the first of them in the layout's order of preference"
        )
        return kept, (
            f"readings {names} tie within noise ({100 * best.rate:.1f}% best); kept reading "
            f"{idx[id(kept)]}, {which}: {kept.reading.why}. A drafter this weak on these "
            "prompts cannot tell them apart; check with --check-acceptance on your own "
            "prompts, or pass --taps / the flag options"
        )
    second = max((m for m in measured if m is not best), key=lambda m: m.rate)
    return best, (
        f"chose reading {idx[id(best)]} ({best.reading.why}): "
        f"{100 * best.rate:.1f}% against {100 * second.rate:.1f}% for the next "
        f"(reading {idx[id(second)]}), a margin of {100 * (best.rate - second.rate):.1f} points "
        f"where noise allows {100 * noise(best, second):.1f}"
    )
