"""What a call runs: its Mode (plain decoding, a fixed chain or tree, or auto, and the sources
it may draft from). localspec.rules resolves it from what was asked and what the engine can
draft with; the scheduler and the generation loop carry it out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .drafttree import EAGLE, NGRAM
from .tree import TreeShape


@dataclass(frozen=True)
class Mode:
    """What a call asked for: plain decoding, a fixed chain or tree, or auto; and from which
    sources it may draft."""

    kind: Literal["plain", "chain", "tree", "auto"]
    shape: TreeShape | None = None  # the fixed chain or tree
    sources: frozenset[str] = field(default_factory=lambda: frozenset({EAGLE}))

    def __str__(self) -> str:
        return self.label()

    def label(self, model: str = EAGLE) -> str:
        """As the statistics name it; model: what the model drafter is ("eagle", or "mtp"
        for a target's own MTP head, which drafts in its place)."""
        if self.shape is not None:
            if self.sources == {NGRAM}:
                return f"ngram {self.shape}"
            return str(self.shape) if model == EAGLE else f"{model} {self.shape}"
        if self.kind == "auto" and (self.sources != {EAGLE, NGRAM} or model != EAGLE):
            names = sorted(model if s == EAGLE else s for s in self.sources)
            return f"auto ({', '.join(names)})"
        return self.kind

    @property
    def drafts(self) -> bool:
        return self.kind != "plain"

    @property
    def feeds_drafter(self) -> bool:
        return self.drafts and EAGLE in self.sources

    @property
    def rejection_sampling(self) -> bool:
        """Fixed EAGLE chains sample by rejection sampling (it accepts more; the text for a
        seed then depends on K); trees, even top-1 ones, n-gram drafts and auto accept by the
        target's own position-keyed draws, so their text for a seed never depends on the
        shapes run."""
        return self.kind == "chain" and EAGLE in self.sources
