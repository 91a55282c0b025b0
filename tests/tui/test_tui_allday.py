"""The chat for all-day use, driven by Textual's Pilot with the tiny GGUF pair: retry and its
versions, edit and its branches, the context gauge and the rolling window, time to first token,
copying code blocks, full-text search, multi-line input, reopening with the KV state saved on
disk, and switching models."""

from __future__ import annotations

import os

from textual.widgets import Markdown, OptionList

from localspec.text.context_fit import count_tokens
from localspec.tui.app import LocalspecApp
from localspec.tui.store import ChatStore, Turn
from localspec.tui.widgets.context_gauge import ContextGauge
from localspec.tui.widgets.message import MessageView
from localspec.tui.widgets.stats_panel import StatsPanel

from helpers.tuiapp import (
    REPLY,
    SIZE,
    chat_options,
    command,
    make_app,
    notes,
    open_latest,
    ready,
    rendered,
    replies,
    say,
)


def users(app) -> list[MessageView]:
    return [m for m in app.chat.query(MessageView) if m.role == "user" and m.display]


def shown(app) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in app.chat.query(MessageView) if m.display]


async def test_retry_keeps_the_old_reply_as_a_version(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first")
        await say(pilot, "second")
        first_stats = app.session.turns[-1].stats
        await pilot.press("ctrl+b")  # the retry decodes plainly: an A/B on the same prompt
        await pilot.press("ctrl+r")
        await say(pilot, "")  # waits for the reply to end
        turns = app.session.turns
        assert [t.prompt for t in turns] == ["first", "second"]
        assert (turns[-1].reply_version, turns[-1].reply_versions) == (2, 2)
        assert turns[-1].stats["k"] == 0 and first_stats["k"] == 4
        assert "version 2/2" in replies(app)[-1].footer_text
        assert [r for r, _ in shown(app)] == ["user", "assistant"] * 2  # replaced, not added
        await pilot.press("f2")  # back to the speculative version
        await pilot.pause()
        assert app.session.turns[-1].reply_version == 1
        assert "version 1/2" in replies(app)[-1].footer_text
        assert app.session.turns[-1].stats["k"] == 4
        await command(pilot, "/retry")  # a third version, from version 1's prompt
        await say(pilot, "")
        assert app.session.turns[-1].reply_versions == 3
        cid = app.session.conversation_id
    store = ChatStore(str(tmp_path / "history.sqlite"))
    prompt_id = store.path(cid)[-2].id
    versions = [m for m in store.siblings(store.path(cid)[-1].id)]
    assert len(versions) == 3 and all(m.parent_id == prompt_id for m in versions)


async def test_edit_replaces_a_turn_and_keeps_the_old_branch(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("one", "two", "three"):
            await say(pilot, text)
        await command(pilot, "/edit 2")
        assert app.chat.prompt.value == "two" and app.editing == 1
        await say(pilot, "two, rephrased")
        assert [t.prompt for t in app.session.turns] == ["one", "two, rephrased"]
        assert shown(app) == [("user", "one"), ("assistant", REPLY),
                              ("user", "two, rephrased"), ("assistant", REPLY)]  # fmt: skip
        assert "edit 2/2" in users(app)[-1].footer_text
        # the prompt cache was reused up to the edit: turn 1 was not prefilled again
        snap = app.chat.query_one(StatsPanel).snapshot
        turn1 = [{"role": "user", "content": "one"}, {"role": "assistant", "content": REPLY}]
        # (less the few tokens where the formatted first turn meets what follows it)
        assert snap["cached_tokens"] >= count_tokens(app.engine, turn1) - 5
        await command(pilot, "/branch 2")  # the old branch, with the turn that followed it
        assert [t.prompt for t in app.session.turns] == ["one", "two", "three"]
        assert [m.text for m in users(app)] == ["one", "two", "three"]
        await command(pilot, "/branch 2 2")
        assert [t.prompt for t in app.session.turns] == ["one", "two, rephrased"]
        # editing the first turn, then cancelling another edit with esc
        await command(pilot, "/edit 1")
        await say(pilot, "zero")
        assert [t.prompt for t in app.session.turns] == ["zero"]
        await command(pilot, "/edit 1")
        await pilot.press("escape")
        assert app.editing is None and app.chat.prompt.value == ""
        await command(pilot, "/edit 7")
        assert any("no user turn 7" in n for n in notes(app))


async def test_gauge_overflow_notice_and_ttft(agree, tmp_path) -> None:
    """A small context: many turns go on past the window; the gauge counts what is sent."""
    target, _ = agree
    opts = chat_options(target, n_draft=4, max_tokens=30, runtime={"n_ctx": 256})
    app = LocalspecApp(opts, store=ChatStore(str(tmp_path / "h.sqlite")))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        gauge = app.chat.query_one(ContextGauge)
        assert gauge.n_ctx == app.engine.n_ctx and gauge.used >= 0
        await command(pilot, "/system be brief")
        assert gauge.system > 0
        seen = []
        for i in range(12):
            await say(pilot, f"turn {i} " + "word " * 10)
            assert not replies(app)[-1].error_text
            seen.append(gauge.used)
            assert gauge.used <= gauge.n_ctx
            assert "/" in str(gauge.line()) and "system" in str(gauge.line())
        assert len(app.session.turns) == 12  # nothing lost: all turns shown and saved
        notices = [str(n.render()) for n in app.chat.query(".notice")]
        assert notices and "oldest turn" in notices[0] and "context window" in notices[0]
        assert app.replies.outside > 0 and "outside" in str(gauge.line())
        footer = replies(app)[-1].footer_text
        assert "first token" in footer
        assert any(line.startswith("1st token") for line in
                   rendered(app.chat.query_one(StatsPanel)))  # fmt: skip


async def test_stop_policy_keeps_todays_behaviour(agree, tmp_path) -> None:
    target, _ = agree
    opts = chat_options(
        target, n_draft=4, max_tokens=30, context_overflow="stop", runtime={"n_ctx": 256}
    )
    app = LocalspecApp(opts, store=ChatStore(str(tmp_path / "h.sqlite")))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for i in range(12):
            await say(pilot, f"turn {i} " + "word " * 10)
        assert not app.chat.query(".notice")
        assert any(r.error_text or "context full" in r.footer_text for r in replies(app))


async def test_copy_code_blocks_falls_back_to_a_file(agree, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path))
    for var in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))  # no clipboard tool
    store = ChatStore(str(tmp_path / "history.sqlite"))
    reply = "Two ways:\n\n```python\nprint('one')\n```\n\nor\n\n```sh\necho two\n```\n"
    store.add_turns(None, [Turn("show code", reply)], title="code")
    app = make_app(agree, tmp_path, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await open_latest(pilot)
        await command(pilot, "/copy 1")
        assert app.clipboard == "print('one')\n"
        saved = tmp_path / "localspec-clipboard.txt"
        assert saved.read_text() == "print('one')\n"
        assert any(str(saved) in n for n in notes(app))
        await pilot.press("ctrl+g")  # the last block
        assert app.clipboard == "echo two\n" == saved.read_text()
        await command(pilot, "/copy 3")
        assert any("2 code blocks" in n for n in notes(app))


async def test_search_opens_the_hit(agree, tmp_path) -> None:
    store = ChatStore(str(tmp_path / "history.sqlite"))
    filler = [Turn(f"question {i}", f"answer {i}") for i in range(30)]
    needle = Turn("where is the zeppelin hangar?", "In Friedrichshafen.")
    store.add_turns(None, [*filler[:20], needle, *filler[20:]], title="long chat")
    store.add_turns(None, [Turn("other", "nothing to see")], title="other chat")
    app = make_app(agree, tmp_path, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await command(pilot, "/search zeppelin")
        ol = app.screen.query_one(OptionList)
        assert ol.option_count == 1
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.session.conversation_id is not None
        found = [v for v in app.chat.query(MessageView) if v.has_class("found")]
        assert [v.text for v in found] == ["where is the zeppelin hangar?"]
        conv = app.chat.conversation
        assert conv.scroll_y > 0 and found[0].region.y - conv.region.y < conv.size.height
        # the history screen searches too: / focuses its search box
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("slash")
        for ch in "friedrichshafen":
            await pilot.press(ch)
        await pilot.pause()
        assert app.screen.query_one(OptionList).option_count == 1
        await pilot.press("escape")  # clears the search first
        await pilot.pause()
        assert app.screen.query_one(OptionList).option_count == 2  # the conversations
        await pilot.press("escape")


async def test_multiline_prompt_keeps_its_lines(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        prompt = app.chat.prompt
        for ch in "ab":
            await pilot.press(ch)
        await pilot.press("ctrl+j")
        await pilot.press("c")
        assert prompt.value == "ab\nc"
        from textual.events import Paste

        app.post_message(Paste("\nline two\nline three"))  # as a terminal delivers it
        await pilot.pause()
        await pilot.press("enter")
        await say(pilot, "")
        assert app.session.turns[-1].prompt == "ab\nc\nline two\nline three"
        assert users(app)[-1].text == "ab\nc\nline two\nline three"
        await say(pilot, "    indented()\n    code()\n")  # a pasted block keeps its indent
        assert app.session.turns[-1].prompt == "    indented()\n    code()"
        (para,) = users(app)[-2].query_one(Markdown).query("MarkdownParagraph")
        shown_lines = rendered(para)
        assert [ln.strip() for ln in shown_lines if ln.strip()] == ["ab", "c", "line two",
                                                                     "line three"]  # fmt: skip
        assert prompt.value == ""


async def test_keys_typed_in_a_burst_stay_in_order(agree, tmp_path) -> None:
    """A terminal multiplexer or a fast typist delivers a line and its return at once: enter
    sends what was typed before it, and what follows starts the next prompt."""
    from textual.events import Key

    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for key, char in [("h", "h"), ("i", "i"), ("enter", "\r"), ("n", "n"), ("o", "o")]:
            app.post_message(Key(key, char))  # all queued before any is handled
        for _ in range(200):
            await pilot.pause()
            if app.session.turns and not app.generating:
                break
        assert [t.prompt for t in app.session.turns] == ["hi"]
        assert app.chat.prompt.value == "no"
        app.replies.generating = True  # as during a reply: a prompt waits for it, queued
        app.chat.prompt.value = "wait"
        await pilot.press("enter")
        assert app.chat.prompt.value == "" and app.replies.queued == ["wait"]
        app.replies.unqueue("test")  # given back whole
        assert app.chat.prompt.value == "wait" and not app.replies.queued
        app.replies.generating = False


async def test_reopening_restores_the_kv_state(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first " * 20)
        await say(pilot, "second " * 20)
    states = list((tmp_path / "cache" / "sessions").glob("*"))
    assert states and all(p.stat().st_size > 0 for p in states)
    app2 = make_app(agree, tmp_path)
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await open_latest(pilot)
        await say(pilot, "third")
        snap = app2.session.turns[-1].stats
        assert snap["restored"] > 0 and snap["cached_tokens"] >= snap["restored"] - 1
        assert snap["cached_tokens"] > 0.85 * snap["prompt_tokens"]
        assert "restored from disk" in replies(app2)[-1].footer_text
        assert replies(app2)[-1].text == REPLY


async def test_session_cache_size_zero_keeps_nothing(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, session_cache_bytes=0)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
    assert not list((tmp_path / "cache").glob("sessions/*"))


async def test_model_switch_and_a_failed_one(agree, models, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "before")
        old = app.engine
        await command(pilot, f"/model {tmp_path / 'missing.gguf'}")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.engine is old and not app.switching and not app.chat.prompt.disabled
        assert any("Model switch failed" in str(n.title) for n in app._notifications)
        await command(pilot, f"/model {models['target']}")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.engine is not old and app.engine.target_path == models["target"]
        assert os.path.basename(models["target"]) in str(app.chat.query_one("#status").render())
        await say(pilot, "after")  # the conversation goes on with the new model
        assert [t.prompt for t in app.session.turns] == ["before", "after"]
        assert not replies(app)[-1].error_text


async def test_an_edit_ends_when_its_turn_leaves_the_screen(agree, tmp_path) -> None:
    """/edit, then another branch shown without that turn: the edit ends and what is sent next
    is a new turn; an edit of an earlier turn survives f2."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        for text in ("one", "two", "three"):
            await say(pilot, text)
        await command(pilot, "/edit 1")
        await say(pilot, "uno")
        await command(pilot, "/branch 1 1")  # the old branch: three turns again
        await command(pilot, "/edit 3")
        assert app.editing == 2
        await command(pilot, "/branch 1 2")  # one turn: turn 3 is gone
        assert app.editing is None
        await say(pilot, "dos")
        assert [t.prompt for t in app.session.turns] == ["uno", "dos"]
        assert not app.generating and replies(app)[-1].text == REPLY
        await pilot.press("ctrl+r")
        await say(pilot, "")
        await command(pilot, "/edit 1")
        await pilot.press("f2")  # another version of the last reply: turn 1 stays
        await pilot.pause()
        assert app.editing == 0 and app.chat.prompt.value == "uno"


async def test_a_conversation_opened_and_left_keeps_its_saved_state(agree, tmp_path) -> None:
    """Opening a conversation only to read it must not save another conversation's caches
    under its name: the next reopening still restores its own state."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first " * 20)
        await say(pilot, "second " * 20)
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "another conversation")  # the caches now hold this one
        await pilot.press("ctrl+o")  # newest first: the older conversation is second
        await pilot.pause()
        await pilot.press("down", "enter")  # the older one, read and left
        await pilot.pause()
        assert app.session.turns[0].prompt.startswith("first")
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.session.turns[0].prompt.startswith("first")
        await say(pilot, "third")
        snap = app.session.turns[-1].stats
        assert snap["restored"] > 0 and snap["cached_tokens"] > 0.85 * snap["prompt_tokens"]


async def test_after_a_failed_load_model_loads_one(agree, models, tmp_path) -> None:
    app = make_app(agree, tmp_path, target=str(tmp_path / "missing.gguf"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.engine is None and not app.chat.prompt.disabled
        await say(pilot, "hello")  # no model: refused, given back
        assert app.chat.prompt.value == "hello" and not app.session.turns
        app.chat.prompt.value = ""
        await command(pilot, f"/model {models['target']}")
        assert app.engine is not None and app.engine.target_path == models["target"]
        await say(pilot, "hello")
        assert len(app.session.turns) == 1


async def test_a_retry_samples_a_new_version_as_the_model_recommends(tmp_path) -> None:
    """The chat samples as the model's GGUF recommends (general.sampling.*) unless told
    otherwise: a retry gives another reply, not the same one again; /temp 0 is greedy, and
    then a retry repeats the reply."""
    from helpers import tinymodels as tm

    warm = tm.write_target(
        str(tmp_path / "warm.gguf"),
        kv={"general.sampling.temp": 2.0, "general.sampling.top_k": 0,
            "general.sampling.top_p": 1.0, "general.sampling.min_p": 0.0},
    )  # fmt: skip
    app = make_app((warm, None), tmp_path, draft=False, n_draft="auto", max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
        first = app.session.turns[-1].reply
        await pilot.press("ctrl+r")
        await say(pilot, "")
        assert app.session.turns[-1].reply_versions == 2
        assert app.session.turns[-1].reply != first
        await command(pilot, "/temp 0")
        await say(pilot, "again")
        greedy = app.session.turns[-1].reply
        await pilot.press("ctrl+r")
        await say(pilot, "")
        assert app.session.turns[-1].reply == greedy
