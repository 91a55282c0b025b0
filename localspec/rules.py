"""The request rules every front-end shares: what a call runs (its Mode, resolved by one pure
rule, draft_mode, from what was asked and what the engine can draft with), what an engine
loads, and the notes and errors they give. The engine, the command line, the chat and the
server all call them, each naming the parameters its user typed (Spelling): the API's
keywords, the command's flags or the chat's commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import InvalidParameterError
from .speculation.drafttree import EAGLE, NGRAM
from .speculation.mode import Mode
from .speculation.tree import TreeShape

if TYPE_CHECKING:
    from .options import DraftSource, NDraft


@dataclass(frozen=True)
class Spelling:
    """How the notes and errors of the rules below name what was asked for."""

    n_draft: str = "n_draft={}"  # a fixed chain length
    tree: str = "{}"  # a fixed tree, formatted with its TreeShape ("tree 2x2/4")
    draft_source: str = "draft_source={}"
    n_draft_name: str = "n_draft"  # the chain-length parameter itself
    no_drafts: str = "draft_source=none"  # how plain decoding by choice was asked for


API_SPELLING = Spelling()


@dataclass(frozen=True)
class Drafting:
    """What an engine can draft with: the facts draft_mode reads."""

    can_draft: bool  # False: recurrent layers, whose state cannot be cut back
    has_drafter: bool  # a model drafter is loaded (an EAGLE drafter, or the target's MTP head)
    drafter_note: str  # which drafter, or why there is none
    architecture: str
    max_tree: int  # nodes one verify batch holds
    max_top_k: int  # the widest frontier the drafter's batch holds
    no_draft_note: str = ""  # when it cannot draft: why (else the recurrent layers are named)
    tree_note: str = ""  # when it verifies chains only (a recurrent target): why
    drafter_kind: str = "eagle"  # the loaded model drafter: "eagle", or "mtp" (the target's head)


def loads_drafter(draft: Any, draft_source: DraftSource) -> bool:
    """Whether an engine looks for an EAGLE drafter: a drafter named by path is loaded (a call
    may still draft from it), one found next to the target only for the sources that draft
    from it (auto, eagle); draft=False loads none."""
    if draft is False:
        return False
    return draft is not None or draft_source in ("auto", "eagle")


def loads_mtp(draft: Any, draft_source: DraftSource, *, usable: bool, eagle_beside: bool) -> bool:
    """Whether an engine loads its target's MTP head to draft with (usable: the header says
    it can draft): asked for (mtp), or auto's model drafter where no EAGLE drafter was named
    and none lies next to the target (eagle_beside: one does, and is preferred)."""
    if not usable:
        return False
    if draft_source == "mtp":
        return True
    return draft_source == "auto" and draft is None and not eagle_beside


def no_drafter_note(draft: Any, draft_source: DraftSource) -> str:
    """Why an engine that looked for no drafter has none (loads_drafter False)."""
    if draft is False:
        return "no EAGLE drafter (draft=False)"
    if draft_source == "mtp":
        return "no EAGLE drafter loaded (draft source mtp drafts with the target's own head)"
    what = "drafts from the context only" if draft_source == "ngram" else "is plain decoding"
    return f"no EAGLE drafter loaded (draft source {draft_source} {what})"


def check_source_shape(source: str, shape: TreeShape | None, spelling: Spelling) -> None:
    """n-gram drafts are chains: a fixed tree with draft source ngram is refused."""
    if source == "ngram" and shape is not None and not shape.is_chain:
        raise InvalidParameterError(
            f"{spelling.tree.format(shape)}: fixed trees are drafted by the EAGLE drafter; "
            f"{spelling.draft_source.format('ngram')} takes {spelling.n_draft_name} "
            "(a chain length, or auto)",
            parameter="tree",
        )


def draft_mode(
    k: NDraft,
    shape: TreeShape | None,
    source: str,  # a DraftSource, checked by the caller
    facts: Drafting,
    *,
    both_given: bool = False,
    spelling: Spelling = API_SPELLING,
) -> tuple[Mode, list[str]]:
    """The Mode a request runs (k: the chain length or auto; shape: a fixed tree or chain;
    source: where drafts come from), and a note for each part of it that cannot be honoured
    (plain decoding where drafts were asked for). InvalidParameterError for what no engine
    can run (a fixed tree from the n-gram index, a tree larger than the engine holds)."""
    fixed = k not in (0, "auto")  # auto and 0 ask for nothing a drafter must give
    asked = (
        spelling.tree.format(shape)
        if shape is not None
        else (spelling.n_draft.format(k) if fixed else "")
    )
    notes: list[str] = []
    if source == "none":
        if asked:
            notes.append(f"{asked} runs plain decoding: {spelling.no_drafts} drafts nothing")
        return Mode("plain"), notes
    if not facts.can_draft:
        if asked or source != "auto":
            notes.append(
                f"{facts.no_draft_note}: plain decoding"
                if facts.no_draft_note
                else f"{facts.architecture} has recurrent layers, whose state cannot be cut "
                "back after a rejected draft: plain decoding"
            )
        return Mode("plain"), notes
    if source == "ngram":
        check_source_shape(source, shape, spelling)
        ngram = frozenset({NGRAM})
        if shape is not None:
            return Mode("chain", shape, ngram), notes
        if k == "auto":
            return Mode("auto", None, ngram), notes
        return (Mode("chain", TreeShape(k, 1, k), ngram) if k else Mode("plain")), notes
    if source in ("eagle", "mtp") and facts.has_drafter and facts.drafter_kind != source:
        other = "the target's own MTP head" if facts.drafter_kind == "mtp" else "an EAGLE drafter"
        notes.append(
            f"{spelling.draft_source.format(source)} runs plain decoding: this engine drafts "
            f"with {other} ({facts.drafter_note})"
        )
        return Mode("plain"), notes
    if not facts.has_drafter:
        if asked:  # no drafter: plain decoding, whatever was asked
            notes.append(f"{asked} runs plain decoding: {facts.drafter_note}")
            return Mode("plain"), notes
        if source in ("eagle", "mtp"):
            if k == "auto":
                notes.append(
                    f"{spelling.draft_source.format(source)} runs plain decoding: "
                    f"{facts.drafter_note}"
                )
            return Mode("plain"), notes
        return (Mode("auto", None, frozenset({NGRAM})) if k == "auto" else Mode("plain")), notes
    if shape is not None:
        if shape.top_k > max(1, facts.max_top_k) or (
            not shape.is_chain and shape.budget > facts.max_tree
        ):
            if facts.tree_note and not facts.max_tree:
                raise InvalidParameterError(
                    f"{spelling.tree.format(shape)} cannot run: {facts.architecture} verifies "
                    f"chains only here ({facts.tree_note})",
                    parameter="tree",
                )
            raise InvalidParameterError(
                f"{spelling.tree.format(shape)} does not fit this engine: at most "
                f"{facts.max_tree} nodes (n_batch - 2) and top_k {facts.max_top_k} "
                "((draft_batch - 1) // 2)",
                parameter="tree",
            )
        if both_given:
            notes.append(
                f"both {spelling.n_draft.format(k)} and {spelling.tree.format(shape)} were "
                "given: the tree runs"
            )
        # even a top-1 tree accepts by the target's own draws
        return Mode("tree", shape), notes
    if k == "auto":
        sources = {EAGLE, NGRAM} if source == "auto" else {EAGLE}
        return Mode("auto", None, frozenset(sources)), notes
    return (Mode("chain", TreeShape(k, 1, k)) if k else Mode("plain")), notes
