"""Speculation statistics, fed by the engine's loop and read by the API, CLI, TUI and bench."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .auto.verdict import Verdict


def tau(accepted: int, steps: int) -> float:
    """Tokens per verify step: the accepted drafts and the target's own token."""
    return (accepted + steps) / steps if steps else 0.0


def rate(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else 0.0


@dataclass
class SourceStats:
    """One draft source's share: steps it drafted in, nodes it proposed, nodes accepted (a
    node two sources proposed counts for both)."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def tau(self) -> float:
        """Accepted tokens per step it drafted in, counting the target's own token."""
        return tau(self.accepted, self.steps)

    @property
    def acceptance_rate(self) -> float:
        return rate(self.accepted, self.drafted)

    def add(self, other: SourceStats) -> None:
        self.steps += other.steps
        self.drafted += other.drafted
        self.accepted += other.accepted

    def as_dict(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "tau": self.tau,
            "acceptance_rate": self.acceptance_rate,
        }

    def summary(self, name: str) -> str:
        return f"{name} {self.accepted}/{self.drafted} over {self.steps} steps, tau {self.tau:.2f}"


@dataclass
class Stats:
    """Counts and times of one generation, or of many added together (``Engine.stats``)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, reused from the previous call's KV caches
    generated: int = 0  # tokens emitted
    steps: int = 0  # target verify decodes (one per speculative step)
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position (0 = first)
    accepted_at: list[int] = field(default_factory=list)
    t_prefill: float = 0.0  # seconds: prompt processing (target and drafter)
    t_calibrate: float = 0.0  # seconds auto spent timing this machine (first call; 0 when cached)
    t_target: float = 0.0  # seconds in target verify decodes
    t_draft: float = 0.0  # seconds in drafter encoder/decoder calls
    t_glue: float = 0.0  # the rest of the decoding loop (sampling, acceptance, bookkeeping)
    # EAGLE drafting (writing the queued pairs, then each draft position): its seconds, the
    # part of them in the drafter's native encodes and decodes, and the positions drafted
    t_eagle: float = 0.0
    t_eagle_native: float = 0.0
    eagle_positions: int = 0
    generations: int = 0
    mode: str = ""  # "auto", "plain", "chain K" or "tree DxK/B" (the setting asked for)
    shapes: dict[str, int] = field(default_factory=dict)  # steps per shape actually run
    # auto: the cost model's expected tokens and seconds, summed over its steps
    predicted_tokens: float = 0.0
    predicted_seconds: float = 0.0  # on auto's cost clock (CPU time of the calling thread)
    predicted_plain_steps: float = 0.0  # the same steps' time in plain steps, as auto priced it
    # auto: why it runs what it runs, in the cost model's numbers (the latest one when summed)
    auto: Verdict | None = None
    # what the call asked for and did not get, and why (one line each)
    notes: list[str] = field(default_factory=list)
    # per draft source ("eagle", "ngram"): its drafted and accepted nodes and steps drafted
    sources: dict[str, SourceStats] = field(default_factory=dict)

    # --- fed by the loop ---------------------------------------------------------------------

    def record_step(
        self, n_drafted: int, n_accepted: int, shape: str = "", depth: int | None = None
    ) -> None:
        """n_drafted: tokens verified besides the target's own (tree nodes); depth: positions
        drafted (a tree's depth, a chain's length; n_drafted when not given)."""
        self.steps += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        if shape:
            self.shapes[shape] = self.shapes.get(shape, 0) + 1
        depth = n_drafted if depth is None else depth
        grow = depth - len(self.drafted_at)
        if grow > 0:
            self.drafted_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for i in range(depth):
            self.drafted_at[i] += 1
        for i in range(n_accepted):
            self.accepted_at[i] += 1

    def record_sources(self, sources: list[set[str]], path: list[int]) -> None:
        """Per source: the nodes it proposed this step and those of them accepted."""
        on_path = set(path)
        for name in {s for node in sources for s in node}:
            st = self.sources.setdefault(name, SourceStats())
            st.steps += 1
            st.drafted += sum(name in node for node in sources)
            st.accepted += sum(name in sources[i] for i in on_path)

    def retract(self, first: int, sources: list[str]) -> None:
        """Un-count the last step's accepted drafts from draft position first on (sources:
        who proposed each token cut, "" for the target's own): the generation ended before
        they were emitted."""
        drafts = [s for s in sources if s]
        if drafts:
            self.accepted -= len(drafts)
            for i in range(first, first + len(drafts)):
                self.accepted_at[i] -= 1
            for s in drafts:
                for name in s.split("+"):
                    self.sources[name].accepted -= 1

    def record_prediction(self, tokens: float, seconds: float, plain: float = 0.0) -> None:
        """One auto step's expectation: tokens, seconds, and a plain step's seconds then."""
        self.predicted_tokens += tokens
        self.predicted_seconds += seconds
        self.predicted_plain_steps += seconds / plain if plain > 0 else 0.0

    def add(self, other: Stats) -> None:
        for name in (
            "prompt_tokens",
            "cached_tokens",
            "generated",
            "steps",
            "drafted",
            "accepted",
            "generations",
            "eagle_positions",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in (
            "t_prefill",
            "t_calibrate",
            "t_target",
            "t_draft",
            "t_glue",
            "t_eagle",
            "t_eagle_native",
            "predicted_tokens",
            "predicted_seconds",
            "predicted_plain_steps",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.auto is not None:
            self.auto = other.auto
        self.notes += [n for n in other.notes if n not in self.notes]
        for name, st in other.sources.items():
            self.sources.setdefault(name, SourceStats()).add(st)
        for shape, n in other.shapes.items():
            self.shapes[shape] = self.shapes.get(shape, 0) + n
        if other.mode:
            self.mode = other.mode if self.mode in ("", other.mode) else "mixed"
        for lst_name in ("drafted_at", "accepted_at"):
            mine, theirs = getattr(self, lst_name), getattr(other, lst_name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v

    # --- derived -----------------------------------------------------------------------------

    @property
    def tau(self) -> float:
        """Mean accepted length per verify step, counting the target's own token (EAGLE's τ)."""
        return tau(self.accepted, self.steps)

    @property
    def acceptance_rate(self) -> float:
        return rate(self.accepted, self.drafted)

    @property
    def acceptance_at(self) -> list[float]:
        """Acceptance rate per draft position: accepted there / drafted there."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    @property
    def t_decode(self) -> float:
        return self.t_target + self.t_draft + self.t_glue

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decoding (prompt processing excluded)."""
        return self.generated / self.t_decode if self.t_decode > 0 else 0.0

    @property
    def predicted_tokens_per_s(self) -> float:
        """The cost model's expected speed for the steps it chose (0 when it chose none)."""
        return self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else 0.0

    @property
    def predicted_speedup(self) -> float:
        """The cost model's expected speed over plain decoding for the steps it chose (tokens
        per plain step's time; 0 when it chose none). Unlike predicted_tokens_per_s, which is
        on auto's cost clock, it compares with measured speed ratios on any machine."""
        if not self.predicted_plain_steps:
            return 0.0
        return self.predicted_tokens / self.predicted_plain_steps

    def shape_summary(self, top: int = 3) -> str:
        """The most used shapes with their share of steps, e.g. 'plain 96%, chain 1 4%'."""
        if not self.steps:
            return ""
        items = sorted(self.shapes.items(), key=lambda kv: -kv[1])[:top]
        return ", ".join(f"{s} {100 * n / self.steps:.0f}%" for s, n in items)

    @property
    def glue_per_step_us(self) -> float:
        return 1e6 * self.t_glue / self.steps if self.steps else 0.0

    @property
    def draft_native_ms(self) -> float:
        """Milliseconds per EAGLE draft position in the drafter's native calls."""
        return 1e3 * self.t_eagle_native / self.eagle_positions if self.eagle_positions else 0.0

    @property
    def draft_host_ms(self) -> float:
        """Milliseconds per EAGLE draft position spent around them (Python, copies, numpy)."""
        if not self.eagle_positions:
            return 0.0
        return 1e3 * max(self.t_eagle - self.t_eagle_native, 0.0) / self.eagle_positions

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated": self.generated,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "tau": self.tau,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_at": self.acceptance_at,
            "tokens_per_s": self.tokens_per_s,
            "t_prefill": self.t_prefill,
            "t_calibrate": self.t_calibrate,
            "t_target": self.t_target,
            "t_draft": self.t_draft,
            "t_glue": self.t_glue,
            "eagle_positions": self.eagle_positions,
            "draft_native_ms_per_position": self.draft_native_ms,
            "draft_host_ms_per_position": self.draft_host_ms,
            "mode": self.mode,
            "shapes": dict(self.shapes),
            "predicted_tokens_per_s": self.predicted_tokens_per_s,
            "predicted_speedup": self.predicted_speedup,
            "auto": self.auto.as_dict() if self.auto is not None else None,
            "notes": list(self.notes),
            "sources": {name: st.as_dict() for name, st in sorted(self.sources.items())},
        }

    def explanation(self) -> str:
        """Why auto ran what it ran (``auto.reason``) and what the call asked for and did not
        get (``notes``), one line each; empty for a fixed mode that honoured everything."""
        lines = [self.auto.reason] if self.auto is not None else []
        return "\n".join(lines + list(self.notes))

    def summary(self) -> str:
        shape = f", {self.mode}: {self.shape_summary()}" if self.mode else ""
        pred = (
            f", auto expected {self.predicted_speedup:.2f}x plain"
            if self.predicted_plain_steps
            else ""
        )
        return (
            f"{self.generated} tokens, {self.tokens_per_s:.1f} tok/s{pred}{shape}, "
            f"tau {self.tau:.2f}, "
            f"acceptance {100 * self.acceptance_rate:.0f}% ({self.accepted}/{self.drafted}), "
            f"time target/draft/glue {self.t_target:.2f}/{self.t_draft:.2f}/{self.t_glue:.2f} s"
        )
