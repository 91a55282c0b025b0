"""The chat session over a real SQLite file: retries and edits keep versions, switching
browses them, and nothing the user saw is lost while the store refuses writes."""

from __future__ import annotations

import pytest

from localspec.tui.session import ChatSession
from localspec.tui.store import ChatStore, HistoryError, Turn

from helpers.tuistore import locked


def texts(session: ChatSession) -> list[str]:
    return [m["content"] for m in session.history]


def stored(session: ChatSession) -> list[str]:
    assert session.conversation_id is not None
    return [m.content for m in session.store.messages(session.conversation_id)]


def versions(turn: Turn) -> tuple[int, int, int, int]:
    return turn.prompt_version, turn.prompt_versions, turn.reply_version, turn.reply_versions


def chat(tmp_path, n: int = 3, **kw) -> ChatSession:
    session = ChatSession(ChatStore(str(tmp_path / "h.sqlite"), **kw), system="sys")
    for i in range(1, n + 1):
        assert session.add_turn(Turn(f"q{i}", f"a{i}")) is None
    return session


def test_retry_keeps_versions_and_switching_browses_them(tmp_path) -> None:
    session = chat(tmp_path, 2)
    retry = session.messages_for(session.turns[-1].prompt, upto=1)
    assert [m["content"] for m in retry] == ["sys", "q1", "a1", "q2"]
    assert session.add_version("a2 (2)", {"tau": 2.5}) is None
    assert session.add_version("a2 (3)", None) is None
    assert texts(session) == stored(session) == ["q1", "a1", "q2", "a2 (3)"]
    assert versions(session.turns[-1]) == (1, 1, 3, 3)
    turn = session.switch_reply(1, 2)
    assert (turn.reply, turn.stats, versions(turn)) == ("a2 (2)", {"tau": 2.5}, (1, 1, 2, 3))
    assert session.messages_for("q3")[-2:] == [
        {"role": "assistant", "content": "a2 (2)"},
        {"role": "user", "content": "q3"},
    ]
    assert stored(session) == texts(session)  # the store's head moved too
    assert session.add_turn(Turn("q3", "a3")) is None  # continues from version 2
    assert session.switch_reply(1, 1).reply == "a2"
    assert texts(session) == ["q1", "a1", "q2", "a2"]  # version 1 had no continuation
    session.switch_reply(1, 2)
    assert texts(session) == ["q1", "a1", "q2", "a2 (2)", "q3", "a3"]  # its branch is back
    with pytest.raises(HistoryError, match="turn 2 has no reply version 4 \\(it has 3\\)"):
        session.switch_reply(1, 4)
    with pytest.raises(HistoryError, match="no turn 7"):
        session.switch_prompt(6, 1)
    assert texts(session) == ["q1", "a1", "q2", "a2 (2)", "q3", "a3"]  # refusals change nothing


@pytest.mark.parametrize("index", [0, 1, 2])
def test_edit_keeps_the_old_branch(tmp_path, index: int) -> None:
    """Turn 1 (a second root), a middle turn and the last turn: the edit replaces the turn and
    drops what followed from the active branch; switching the prompt back restores it."""
    session = chat(tmp_path, 3)
    sent = session.messages_for("edited", upto=index)
    assert [m["content"] for m in sent] == ["sys", *texts(session)[: 2 * index], "edited"]
    before = list(session.turns)
    assert session.replace_turn(index, Turn("edited", "new answer")) is None
    assert texts(session) == stored(session)
    assert texts(session) == [*texts_of(before[:index]), "edited", "new answer"]
    assert versions(session.turns[index]) == (2, 2, 1, 1)
    assert session.add_turn(Turn("more", "and more")) is None
    old = session.switch_prompt(index, 1)
    assert ids(session.turns) == ids(before)  # the whole old continuation
    assert versions(old) == (1, 2, 1, 1)
    assert session.switch_prompt(index, 2).prompt == "edited"
    assert texts(session)[-4:] == ["edited", "new answer", "more", "and more"]


def ids(turns: list[Turn]) -> list[tuple[int | None, int | None]]:
    return [(t.prompt_id, t.reply_id) for t in turns]


def texts_of(turns: list[Turn]) -> list[str]:
    return [text for t in turns for text in (t.prompt, t.reply)]


def test_reopening_gives_the_same_branch_and_versions(tmp_path) -> None:
    session = chat(tmp_path, 3)
    session.add_version("a3 (2)", None)
    session.replace_turn(1, Turn("q2 edited", "a2 edited"))
    session.add_turn(Turn("q3'", "a3'"))
    session.store.close()
    reopened = ChatSession(ChatStore(str(tmp_path / "h.sqlite")))
    title, turns, index = reopened.open(session.conversation_id)
    assert (title, index, reopened.system) == ("q1", None, "sys")
    assert turns == reopened.turns == session.turns
    assert [versions(t) for t in turns] == [(1, 1, 1, 1), (2, 2, 1, 1), (1, 1, 1, 1)]
    reopened.switch_prompt(1, 1)
    assert texts(reopened) == ["q1", "a1", "q2", "a2", "q3", "a3 (2)"]
    assert versions(reopened.turns[2]) == (1, 1, 2, 2)


def test_opening_a_search_hit_in_an_old_branch_activates_it(tmp_path) -> None:
    session = chat(tmp_path, 3)
    session.replace_turn(1, Turn("q2 edited", "a2 edited"))
    (hit,) = session.store.search("a3")
    reopened = ChatSession(session.store)
    title, turns, index = reopened.open(hit.conversation_id, hit.message_id)
    assert index == 2 and turns[index].reply == "a3"
    assert texts(reopened) == ["q1", "a1", "q2", "a2", "q3", "a3"] == stored(reopened)
    (hit,) = session.store.search("q2 edited")
    assert reopened.open(hit.conversation_id, hit.message_id)[2] == 1
    assert texts(reopened) == ["q1", "a1", "q2 edited", "a2 edited"]
    with pytest.raises(HistoryError, match="no message 99"):
        reopened.open(hit.conversation_id, 99)


def test_refused_writes_are_kept_and_saved_later_as_the_right_tree(tmp_path) -> None:
    """A retry, an edit and a new turn while the file is locked, each hanging from a turn that
    is itself unsaved: the later save writes them in order, with every version in place."""
    path = str(tmp_path / "h.sqlite")
    session = chat(tmp_path, 1, timeout=0.05)
    with locked(path):
        assert isinstance(session.add_turn(Turn("q2", "a2")), HistoryError)
        assert isinstance(session.add_version("a2 (2)", None), HistoryError)
        assert isinstance(session.replace_turn(1, Turn("q2'", "a2'")), HistoryError)
        assert isinstance(session.add_turn(Turn("q3", "a3")), HistoryError)
        assert [(t.prompt, t.reply) for t in session.unsaved] == [
            ("q2", "a2"),
            ("q2", "a2 (2)"),
            ("q2'", "a2'"),
            ("q3", "a3"),
        ]
        assert texts(session) == ["q1", "a1", "q2'", "a2'", "q3", "a3"]
        with pytest.raises(HistoryError, match="locked"):
            session.switch_prompt(1, 1)  # versions need the store: nothing changes
        assert texts(session) == ["q1", "a1", "q2'", "a2'", "q3", "a3"]
        assert stored(session) == ["q1", "a1"]
    assert session.save() is None and session.unsaved == []
    assert stored(session) == texts(session)
    assert [versions(t) for t in session.turns] == [(1, 1, 1, 1), (2, 2, 1, 1), (1, 1, 1, 1)]
    turn = session.switch_prompt(1, 1)
    assert (turn.prompt, turn.reply, versions(turn)) == ("q2", "a2 (2)", (1, 2, 2, 2))
    assert session.switch_reply(1, 1).reply == "a2"
    assert session.switch_prompt(1, 2).prompt == "q2'"
    assert texts(session)[-2:] == ["q3", "a3"]


def test_a_conversation_never_saved_keeps_all_its_versions(tmp_path) -> None:
    """Locked from the first turn: the first save creates the conversation and writes the
    first prompt, its retried reply and its edit (a second root) in the order made."""
    session = chat(tmp_path, 0, timeout=0.05)
    path = str(tmp_path / "h.sqlite")
    with locked(path):
        assert isinstance(session.add_turn(Turn("q1", "a1")), HistoryError)
        assert isinstance(session.add_version("a1 (2)", None), HistoryError)
        assert isinstance(session.replace_turn(0, Turn("q1'", "a1'")), HistoryError)
        assert session.conversation_id is None and len(session.unsaved) == 3
    assert session.add_turn(Turn("q2", "a2")) is None and session.unsaved == []
    assert stored(session) == texts(session) == ["q1'", "a1'", "q2", "a2"]
    (conv,) = session.store.conversations()
    assert (conv.title, conv.system) == ("q1", "sys")
    session.switch_prompt(0, 1)
    assert texts(session) == ["q1", "a1 (2)"] and versions(session.turns[0]) == (1, 2, 2, 2)
    assert session.switch_reply(0, 1).reply == "a1"


def test_reset_starts_over_and_retry_needs_a_turn(tmp_path) -> None:
    session = chat(tmp_path, 1)
    session.reset()
    assert (session.conversation_id, session.turns, session.unsaved) == (None, [], [])
    with pytest.raises(HistoryError, match="no turn 0"):
        session.add_version("nothing to retry", None)
    with pytest.raises(HistoryError, match="no turn 1"):
        session.replace_turn(0, Turn("q", "a"))
    assert session.add_turn(Turn("fresh", "start")) is None
    assert len(session.store.conversations()) == 2
