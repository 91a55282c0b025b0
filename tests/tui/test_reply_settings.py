"""The chat's settings for the next replies (tui/reply_settings.py): what a reply runs, and
each change checked by the engine's own rules in the commands' words."""

from __future__ import annotations

import pytest

from localspec import LocalspecError, TreeShape
from localspec.errors import InvalidParameterError
from tui.reply_settings import ReplySettings


def test_what_a_reply_runs_follows_speculation_on_or_off() -> None:
    s = ReplySettings(k=3, source="eagle")
    assert (s.n_draft, s.draft_source, s.mode_text()) == (3, "eagle", "fixed chain k=3")
    off = s.toggled()
    assert (off.n_draft, off.draft_source, off.mode_text()) == (0, "none", "plain decoding")
    assert off.source == "eagle" and off.k == 3  # kept for when it is toggled back
    assert off.toggled() == s
    assert off.source_text(has_drafter=True) == "none (plain decoding)"


def test_the_source_as_the_panel_shows_it() -> None:
    auto = ReplySettings()
    assert auto.source_text(has_drafter=True) == "auto (eagle + ngram)"
    assert auto.source_text(has_drafter=False) == "auto (ngram: no drafter)"
    tree = auto.with_tree("2,2,4")
    assert tree.mode_text() == f"fixed {TreeShape(2, 2, 4)}"
    assert tree.source_text(has_drafter=False) == "auto (no drafter: plain)"
    assert auto.can_draft(False) and auto.can_draft(False, "ngram")
    assert not auto.can_draft(False, "eagle") and auto.can_draft(True, "eagle")


def test_changes_are_checked_copies() -> None:
    s = ReplySettings(tree=TreeShape(2, 2, 4))
    assert s.with_k("5") == ReplySettings(k=5)  # a chain length replaces the tree
    assert s.with_k("auto").k == "auto"
    for bad in ("33", "-1", "x"):
        with pytest.raises(ValueError):
            s.with_k(bad)
    none = s.with_source("none")
    assert none.source == "none" and not none.speculation
    assert none.with_source("auto").speculation
    with pytest.raises(LocalspecError, match="one of auto, eagle, mtp, ngram, none"):
        s.with_source("medusa")
    # the engine's rule, in the commands' words
    with pytest.raises(InvalidParameterError, match=r"^/tree 2,2,4: .*/source ngram takes /k"):
        s.with_source("ngram")
    with pytest.raises(InvalidParameterError, match="/tree 2,2,4"):
        ReplySettings(source="ngram").with_tree("2,2,4")
    assert s.with_temperature("0.7", top_k=0, top_p=1.0).temperature == 0.7
    with pytest.raises(LocalspecError):
        s.with_temperature("-1", top_k=0, top_p=1.0)
    assert s.with_source("auto").for_engine(has_drafter=False).speculation
    assert not s.with_source("eagle").for_engine(has_drafter=False).speculation
