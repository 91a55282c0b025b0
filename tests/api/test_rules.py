"""The shared request rules (localspec/rules.py): what a combination of drafting
options runs and what an engine loads, named in the caller's words."""

from __future__ import annotations

import pytest

from localspec.errors import InvalidParameterError
from localspec.rules import (
    API_SPELLING,
    Drafting,
    Spelling,
    check_source_shape,
    draft_mode,
    loads_drafter,
    no_drafter_note,
)
from localspec.speculation.tree import TreeShape

CLI = Spelling("-k {}", "--tree {0.depth},{0.top_k},{0.budget}", "--draft-source {}", "-k",
               "--no-draft")  # fmt: skip


def facts(drafter: bool = True, can_draft: bool = True) -> Drafting:
    note = "EAGLE-3 drafter d.gguf" if drafter else "no drafter found next to t.gguf"
    return Drafting(can_draft, drafter, note, "llama", max_tree=30, max_top_k=8)


def test_a_fixed_chain_with_no_drafts_runs_plain_and_says_so() -> None:
    """Draft source none (--no-draft) with -k 3 or a tree: plain decoding, and a note as
    without a drafter (the README's promise); auto and 0 ask for nothing: no note."""
    for drafter in (True, False):
        mode, notes = draft_mode(3, None, "none", facts(drafter))
        assert mode.kind == "plain"
        assert notes == ["n_draft=3 runs plain decoding: draft_source=none drafts nothing"]
        _, notes = draft_mode(3, None, "none", facts(drafter), spelling=CLI)
        assert notes == ["-k 3 runs plain decoding: --no-draft drafts nothing"]
    _, notes = draft_mode("auto", TreeShape(2, 2, 4), "none", facts(), spelling=CLI)
    assert notes == ["--tree 2,2,4 runs plain decoding: --no-draft drafts nothing"]
    for k in ("auto", 0):
        mode, notes = draft_mode(k, None, "none", facts())
        assert mode.kind == "plain" and notes == []


def test_the_rules_without_a_drafter_and_with_one() -> None:
    mode, notes = draft_mode(3, None, "auto", facts(drafter=False), spelling=CLI)
    assert mode.kind == "plain"
    assert notes == ["-k 3 runs plain decoding: no drafter found next to t.gguf"]
    mode, notes = draft_mode("auto", None, "eagle", facts(drafter=False))
    assert mode.kind == "plain" and notes[0].startswith("draft_source=eagle runs plain")
    mode, notes = draft_mode("auto", None, "auto", facts(drafter=False))
    assert mode.kind == "auto" and mode.sources == {"ngram"} and notes == []
    mode, notes = draft_mode(3, TreeShape(2, 2, 4), "auto", facts(), both_given=True)
    assert mode.kind == "tree"
    assert notes == ["both n_draft=3 and tree 2x2/4 were given: the tree runs"]
    mode, _ = draft_mode(4, None, "ngram", facts(drafter=False))
    assert mode.kind == "chain" and mode.sources == {"ngram"}
    mode, notes = draft_mode(3, None, "auto", facts(can_draft=False))
    assert mode.kind == "plain" and "recurrent layers" in notes[0]


def test_ngram_trees_are_refused_in_the_callers_words() -> None:
    tree = TreeShape(3, 2, 5)
    want = "^--tree 3,2,5: .* --draft-source ngram takes -k"
    with pytest.raises(InvalidParameterError, match=want):
        check_source_shape("ngram", tree, CLI)
    with pytest.raises(InvalidParameterError, match="draft_source=ngram takes n_draft") as exc:
        draft_mode("auto", tree, "ngram", facts())
    assert exc.value.parameter == "tree"
    check_source_shape("ngram", TreeShape(3, 1, 3), API_SPELLING)  # a chain is fine
    check_source_shape("eagle", tree, API_SPELLING)


def test_what_an_engine_loads_follows_its_draft_source() -> None:
    """A drafter beside the target is looked for only when the source drafts from it; one
    named by path is loaded (a call may ask for eagle); draft=False loads none."""
    assert loads_drafter(None, "auto") and loads_drafter(None, "eagle")
    assert not loads_drafter(None, "ngram") and not loads_drafter(None, "none")
    assert loads_drafter("d.gguf", "ngram")
    assert not loads_drafter(False, "auto")
    assert "no EAGLE drafter loaded" in no_drafter_note(None, "ngram")
    assert "context only" in no_drafter_note(None, "ngram")
    assert no_drafter_note(False, "auto") == "no EAGLE drafter (draft=False)"
