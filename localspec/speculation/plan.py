"""One step's intent, from the plan to the draft: ``StepPlan``. The scheduler (auto's, or a
fixed mode's) fills in what to draft and whether to feed the drafter; the generation loop adds
the n-gram lookup's proposal and how the EAGLE chain draws; the state applies the feeding and
drafts exactly that (specstate.SpecState.draft)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .sampling import SamplingParams
from .sources.ngram import NGramProposal
from .tree import TreeShape

if TYPE_CHECKING:
    from ..auto.sourcechoice import Choice


@dataclass(frozen=True)
class StepPlan:
    eagle: TreeShape | None = None  # the EAGLE drafter's shape (None: it does not draft)
    ngram: int = 0  # n-gram tokens of the main continuation (0: none)
    ngram_alts: int = 0  # alternative n-gram branches
    choice: Choice | None = None  # auto: what the cost model expects of this step
    wake: bool = False  # feed the drafter again from this step (taps on, its cache restarts)
    sleep: bool = False  # stop feeding the drafter (taps off): no EAGLE drafting can pay
    quiet: bool = False  # auto, its drafter asleep: a plain step that needed no planning
    learn: bool = True  # the cost model learns from this step's costs
    # added by the generation loop before the step runs
    proposal: NGramProposal | None = None  # the n-gram lookup's continuations
    sampled: SamplingParams | None = None  # draw the EAGLE chain from q (rejection sampling)
    ranks: bool = True  # keep the EAGLE drafter's scores at every node (auto learns from them)

    @property
    def label(self) -> str:
        if self.choice is not None:
            return self.choice.label if (self.eagle or self.ngram) else "plain"
        if self.ngram:
            return "ngram"
        return "plain" if self.eagle is None else str(self.eagle)
