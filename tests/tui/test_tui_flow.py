"""The chat's flow, driven by Textual's Pilot with the tiny GGUF pair: prompts queued while a
reply streams, the statistics panel (hidden with f4, remembered, fitted to narrow terminals),
the KV state saved for the branch on screen and restored only when it pays, the `length`
marker, and the first auto reply timing the machine visibly."""

from __future__ import annotations

import json
import threading

from localspec.tui.saved_states import RESTORE_SHARE, pays
from localspec.tui.settings import FILENAME, ChatSettings
from localspec.tui.widgets.message import MessageView
from localspec.tui.widgets.stats_panel import StatsPanel

from helpers.tuiapp import (
    REPLY,
    SIZE,
    command,
    fail_after,
    make_app,
    notes,
    open_latest,
    ready,
    rendered,
    replies,
    say,
    start_long_reply,
    throttle,
)


async def until_idle(pilot, turns: int) -> None:
    app = pilot.app
    for _ in range(3000):
        await pilot.pause(0.01)
        if len(app.session.turns) >= turns and not app.generating and not app.replies.queued:
            break
    await app.workers.wait_for_complete()
    await pilot.pause()


# --- prompts sent while a reply streams ------------------------------------------------------


def hold_after_first_event(engine) -> threading.Event:
    """The engine's chats stop after their first event until the returned event is set: the
    test queues its prompts while the reply is certainly still streaming, however fast the
    tiny pair drafts (deep accepted chains end a reply in a few steps)."""
    release = threading.Event()
    real = engine.chat_stream

    def chat(*a, **kw):
        events = real(*a, **kw)

        def held():
            try:
                for i, ev in enumerate(events):
                    if i == 1:
                        release.wait(timeout=30)
                    yield ev
            finally:
                events.close()

        return held()

    engine.chat_stream = chat
    return release


async def test_enter_while_a_reply_streams_queues_the_prompt(agree, tmp_path) -> None:
    """The second prompt is shown as queued, never joined to the first, and sent on its own
    when the reply ends."""
    app = make_app(agree, tmp_path, max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        throttle(app.engine, 0.05)
        release = hold_after_first_event(app.engine)
        await start_long_reply(pilot)  # "go"
        for text in ("second queued?", "third"):
            app.chat.prompt.value = text
            await pilot.press("enter")
        await pilot.pause()
        line = app.chat.query_one("#queued")
        assert app.replies.queued == ["second queued?", "third"] and app.chat.prompt.value == ""
        shown = "\n".join(rendered(line))
        assert line.display and "queued: second queued?" in shown and "queued: third" in shown
        assert app.generating  # still the first reply
        release.set()
        await until_idle(pilot, 3)
        prompts = ["go", "second queued?", "third"]  # one at a time, in order
        assert [t.prompt for t in app.session.turns] == prompts
        assert [m.text for m in app.chat.query(MessageView) if m.role == "user"] == prompts
        assert not app.replies.queued and not line.display
        assert all(r.text and not r.error_text for r in replies(app))


async def test_a_command_while_a_reply_streams_changes_the_next_reply_only(agree, tmp_path) -> None:
    """/tree typed mid-reply: the reply in progress keeps the mode it started with, on its
    panel and in its saved statistics; the next reply runs the tree."""
    app = make_app(agree, tmp_path, max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        throttle(app.engine, 0.05)
        release = hold_after_first_event(app.engine)
        await start_long_reply(pilot)
        app.chat.prompt.value = "/tree 2,2,4"  # a command runs at once, not queued
        await pilot.press("enter")
        assert app.generating and app.next_reply.tree is not None
        release.set()
        await until_idle(pilot, 1)
        assert app.session.turns[0].stats["mode"] == "fixed chain k=4"
        assert app.chat.query_one(StatsPanel).snapshot["mode"] == "fixed chain k=4"
        await say(pilot, "again")
        assert app.session.turns[1].stats["mode"] == "fixed tree 2x2/4"


async def test_escape_stops_the_reply_and_returns_the_queued_prompt(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, max_tokens=200_000)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        throttle(app.engine)
        release = hold_after_first_event(app.engine)
        await start_long_reply(pilot)
        app.chat.prompt.value = "later"
        await pilot.press("enter")
        app.chat.prompt.value = "typed since"
        await pilot.press("escape")
        release.set()
        await pilot.pause()
        assert not app.replies.queued and not app.chat.query_one("#queued").display
        assert app.chat.prompt.value == "later\ntyped since"  # its own line, first
        await until_idle(pilot, 1)
        assert [t.prompt for t in app.session.turns] == ["go"]  # nothing was sent
        assert "stopped" in replies(app)[-1].footer_text
        assert app.chat.prompt.value == "later\ntyped since"


async def test_a_failed_reply_returns_the_queued_prompt(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        throttle(app.engine, 0.05)
        fail_after(app.engine, 8, "boom", app.engine.chat_stream)
        release = hold_after_first_event(app.engine)
        await start_long_reply(pilot)
        app.chat.prompt.value = "after"
        await pilot.press("enter")
        assert app.replies.queued == ["after"]
        release.set()
        await until_idle(pilot, 0)
        assert not app.session.turns and replies(app)[-1].error_text
        assert app.chat.prompt.value == "after" and not app.replies.queued
        assert any("the reply failed" in n for n in notes(app))


# --- the statistics panel --------------------------------------------------------------------


def widths(app) -> tuple[int, int]:
    side = app.chat.query_one("#side")
    column = app.chat.query_one("#chat-column")
    return column.outer_size.width, side.outer_size.width if side.display else 0


async def test_panel_hides_with_f4_remembered_and_fits_narrow_terminals(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=(60, 30)) as pilot:
        await ready(pilot)
        assert widths(app) == (60, 0)  # hidden by itself: the conversation keeps the width
        await pilot.resize_terminal(90, 30)
        await pilot.pause()
        chat, side = widths(app)
        assert side == 30 and chat == 60  # narrower
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        assert widths(app) == (SIZE[0] - 42, 42)
        await pilot.press("f4")
        await pilot.pause()
        assert widths(app) == (SIZE[0], 0)
        assert any(key == "f4" for key, _ in app.KEY_HELP)
        assert any(b.key == "f4" and b.description == "Panel" for b in app.BINDINGS)
    assert json.loads((tmp_path / FILENAME).read_text())["stats_panel"] is False
    app = make_app(agree, tmp_path)  # the next run remembers
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert widths(app) == (SIZE[0], 0)
        await pilot.press("f4")
        await pilot.pause()
        assert widths(app) == (SIZE[0] - 42, 42)
        await pilot.resize_terminal(60, 30)
        await pilot.pause()
        assert widths(app) == (60, 0)
        await pilot.press("f4")  # off, then on again: still too narrow, and it says so
        await pilot.press("f4")
        await pilot.pause()
        assert widths(app) == (60, 0)
        assert "narrower than 70 columns" in notes(app)[-1]
    assert ChatSettings.beside(str(tmp_path / "history.sqlite")).get("stats_panel") is True


def test_settings_survive_a_broken_or_unwritable_file(tmp_path) -> None:
    (tmp_path / FILENAME).write_text("{not json")
    settings = ChatSettings.beside(str(tmp_path / "history.sqlite"))
    assert settings.get("stats_panel", True) is True
    assert settings.set("stats_panel", False) is None
    assert ChatSettings.beside(str(tmp_path / "h.sqlite")).get("stats_panel") is False
    blocked = tmp_path / "file"
    blocked.write_text("")
    why = ChatSettings(str(blocked / FILENAME)).set("stats_panel", False)
    assert why and "not remembered" in why


# --- the KV state of the branch on screen ----------------------------------------------------


def test_restore_pays_only_for_a_long_enough_shared_prefix() -> None:
    assert not pays(23, 680)  # issue 48's case
    assert pays(600, 680) and pays(int(RESTORE_SHARE * 680), 680)
    assert not pays(5, 6)  # too little to be worth a file read


async def test_the_other_branchs_saved_state_is_not_restored(agree, tmp_path) -> None:
    """Issue 48: a branch replied to, another one shown (/branch 1), the conversation reopened
    and continued: the saved state holds the branch not shown, so it is not restored."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first " * 20)
        await say(pilot, "second " * 20)
        await command(pilot, "/edit 1")
        await say(pilot, "uno " * 20)  # the caches hold this branch: it is shown, and saved
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await open_latest(pilot)
        assert [t.prompt for t in app.session.turns] == [("uno " * 20).strip()]
        cid = app.session.conversation_id
        assert app.memory.states.info(cid) is not None
        assert app.memory.states.info(cid).text.endswith(REPLY)  # type: ignore[union-attr]
        await command(pilot, "/branch 1")  # the first branch, two turns
        assert len(app.session.turns) == 2
        await say(pilot, "third")
        snap = app.session.turns[-1].stats
        assert not snap.get("restored")  # 680-for-23 was issue 48
        assert "restored from disk" not in replies(app)[-1].footer_text
        assert replies(app)[-1].text == REPLY


async def test_the_state_of_the_branch_on_screen_is_kept_and_restored(agree, tmp_path) -> None:
    """A reopened conversation, another branch replied to (its state would not pay for that
    prompt: not restored), the first branch shown again and the app quit: the state kept is
    the first branch's, and the next reopening restores it."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first " * 20)
        await say(pilot, "second " * 20)
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await open_latest(pilot)
        await command(pilot, "/edit 1")
        await say(pilot, "uno " * 20)
        assert not app.session.turns[-1].stats.get("restored")  # shares only the template's start
        await command(pilot, "/branch 1")  # the caches hold "uno": the screen the first branch
        cid = app.session.conversation_id
    info = app.memory.states.info(cid)
    assert info is not None and "second" in info.text and "uno" not in info.text
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await open_latest(pilot)
        assert [t.prompt for t in app.session.turns] == [("first " * 20).strip(),
                                                         ("second " * 20).strip()]  # fmt: skip
        await say(pilot, "third")
        snap = app.session.turns[-1].stats
        assert snap["restored"] > 0 and snap["cached_tokens"] > 0.85 * snap["prompt_tokens"]
        assert "restored from disk" in replies(app)[-1].footer_text
        assert replies(app)[-1].text == REPLY


# --- reply markers and calibration -----------------------------------------------------------


async def test_a_reply_cut_by_max_tokens_says_length(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, max_tokens=10)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
        footer = replies(app)[-1].footer_text
        assert footer.endswith(" · length") and "stopped" not in footer


async def test_the_first_auto_reply_shows_the_machine_being_timed(
    agree, tmp_path, monkeypatch
) -> None:
    """A fresh cache dir (conftest): the first auto reply times the machine, and its empty
    reply box says so with the progress; the second reply does not time it again."""
    shown: list[str] = []
    real = MessageView.set_footer
    monkeypatch.setattr(
        MessageView, "set_footer", lambda self, text: (shown.append(text), real(self, text))[1]
    )
    app = make_app(agree, tmp_path, n_draft="auto")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.engine.calibration_pending
        await say(pilot, "hello")
        timing = [t for t in shown if t.startswith("timing this machine (once)… ")]
        assert timing and timing[0].endswith(" 0%") and timing[-1].endswith("100%"), (
            shown,
            replies(app)[-1].error_text,
        )
        percents = [int(t.rsplit(" ", 1)[1].rstrip("%")) for t in timing]
        assert percents == sorted(percents)
        footer = replies(app)[-1].footer_text
        assert "timing this machine" not in footer and "timed this machine first" in footer
        assert replies(app)[-1].text == REPLY
        assert not app.engine.calibration_pending
        shown.clear()
        await say(pilot, "again")
        assert not any("timing this machine" in t for t in shown)
        assert "timed this machine" not in replies(app)[-1].footer_text
