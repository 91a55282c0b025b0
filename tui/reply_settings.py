"""How the next replies are made: the draft shape and source, speculation on or off, the
temperature. One immutable value the app holds as a reactive attribute (`next_reply`): the
slash commands and ctrl+b replace it with a checked copy, and the app's watcher redraws what
shows it (the subtitle, the idle statistics panel). A reply takes the value current when it
starts, so a command typed while it streams changes the next one only."""

from __future__ import annotations

from dataclasses import dataclass, replace

from localspec import DRAFT_SOURCES, MAX_DRAFT, LocalspecError, SamplingParams, TreeShape
from localspec.rules import Spelling, check_source_shape

# the engine's rules (localspec.rules) name what was asked for as it is typed here
COMMAND_SPELLING = Spelling(
    n_draft="/k {}",
    tree="/tree {0.depth},{0.top_k},{0.budget}",
    draft_source="/source {}",
    n_draft_name="/k",
    no_drafts="/source none",
)


@dataclass(frozen=True)
class ReplySettings:
    k: int | str = "auto"  # "auto" or a fixed chain length
    tree: TreeShape | None = None  # a fixed tree overrides k
    source: str = "auto"  # where drafts come from while speculation is on (none: off)
    speculation: bool = True  # ctrl+b: plain decoding for a live A/B, the rest kept
    temperature: float | None = None  # None: the model's recommendation

    # --- what a reply runs ---------------------------------------------------------------------

    @property
    def n_draft(self) -> int | str:
        """The reply's n_draft: 0 (plain decoding) while speculation is off."""
        return self.k if self.speculation else 0

    @property
    def draft_source(self) -> str:
        """The reply's draft source: none while it decodes plainly."""
        return self.source if self.n_draft != 0 else "none"

    def can_draft(self, has_drafter: bool | str, source: str | None = None) -> bool:
        """Whether an engine (with or without a model drafter) has something to draft from for
        source (default: this one): the n-gram index always, the EAGLE drafter or the target's
        MTP head when that is what it loaded. has_drafter: the drafter's kind ("eagle",
        "mtp", "" for none; True means "eagle")."""
        source = source or self.source
        return source in ("auto", "ngram") or (
            source in ("eagle", "mtp") and (drafter_kind(has_drafter) == source)
        )

    def mode_text(self) -> str:
        """The reply's mode as the panel shows it."""
        k = self.n_draft
        if k == 0:
            return "plain decoding"
        if self.tree is not None:
            return f"fixed {self.tree}"
        return "auto (cost model)" if k == "auto" else f"fixed chain k={k}"

    def source_text(self, has_drafter: bool | str) -> str:
        """The draft source as the panel shows it: auto with what it drafts from."""
        k, source = self.n_draft, self.draft_source
        if k == 0 or source == "none":
            return "none (plain decoding)"
        if source != "auto":
            return source
        kind = drafter_kind(has_drafter)
        if k != "auto" or self.tree is not None:  # fixed shapes are the drafter's
            return f"auto ({kind}: fixed shape)" if kind else "auto (no drafter: plain)"
        return f"auto ({kind} + ngram)" if kind else "auto (ngram: no drafter)"

    # --- changed copies, each checked by the engine's own rules -------------------------------

    def with_k(self, text: str) -> ReplySettings:
        """/k auto|N: a chain length (or auto) replaces a fixed tree. ValueError when bad."""
        k: int | str = "auto" if text == "auto" else int(text)
        if k != "auto" and not 0 <= int(k) <= MAX_DRAFT:
            raise ValueError(text)
        return replace(self, k=k, tree=None)

    def with_tree(self, text: str) -> ReplySettings:
        """/tree DEPTH,TOP_K,BUDGET: a fixed tree, refused for n-gram drafts."""
        tree = TreeShape.parse(text)
        check_source_shape(self.source, tree, COMMAND_SPELLING)
        return replace(self, tree=tree)

    def with_source(self, source: str) -> ReplySettings:
        """/source auto|eagle|ngram|none: none turns speculation off, the others on."""
        if source not in DRAFT_SOURCES:
            raise LocalspecError(f"one of {', '.join(DRAFT_SOURCES)}")
        check_source_shape(source, self.tree, COMMAND_SPELLING)
        return replace(self, source=source, speculation=source != "none")

    def with_temperature(self, text: str, top_k: int | None, top_p: float | None) -> ReplySettings:
        """/temp T, checked with the sampler's own rule (top_k and top_p as the chat runs);
        /temp model: the model's recommendation again."""
        if text.strip() == "model":
            return replace(self, temperature=None)
        t = float(text)
        SamplingParams(t, top_k or 0, 1.0 if top_p is None else top_p)
        return replace(self, temperature=t)

    def toggled(self) -> ReplySettings:
        """ctrl+b: speculation off or on for the next reply."""
        return replace(self, speculation=not self.speculation)

    def for_engine(self, has_drafter: bool | str) -> ReplySettings:
        """A newly loaded engine: speculation on where it has something to draft from."""
        return replace(self, speculation=self.source != "none" and self.can_draft(has_drafter))


def drafter_kind(has_drafter: bool | str) -> str:
    """An engine's model drafter as the settings name it: "eagle", "mtp" or "" (none); a bool
    says whether an EAGLE drafter is loaded."""
    if isinstance(has_drafter, str):
        return has_drafter
    return "eagle" if has_drafter else ""
