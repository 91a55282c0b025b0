"""The real terminal app, driven by Textual's Pilot with the tiny GGUF pair."""

from __future__ import annotations

import os

import pytest

from localspec.errors import GenerationError, LocalspecError
from localspec.tui.app import ChatOptions, LocalspecApp
from localspec.tui.store import ChatStore
from localspec.tui.widgets.message import MessageView
from localspec.tui.widgets.stats_panel import StatsPanel

from conftest import EXACT

SIZE = (120, 40)


def make_app(agree, tmp_path, **kw) -> LocalspecApp:
    target, _ = agree
    opts = ChatOptions(
        target=target,
        n_draft=4,
        max_tokens=kw.pop("max_tokens", 30),
        engine_kwargs=dict(EXACT),
        **kw,
    )
    return LocalspecApp(opts, store=ChatStore(str(tmp_path / "history.sqlite")))


async def ready(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def say(pilot, text: str) -> None:
    prompt = pilot.app.chat.query_one("#prompt")
    prompt.value = text
    await pilot.press("enter")
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


def replies(app) -> list[MessageView]:
    return [m for m in app.chat.query(MessageView) if m.role == "assistant"]


async def test_prompt_streams_reply_and_updates_stats(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "agree.eagle3.gguf" in str(app.chat.query_one("#status").render())
        await say(pilot, "Hi")
        reply = replies(app)[-1]
        assert reply.text == "abcdefghijklmnopqrstuvwxyzabcd"
        assert any(acc for _, acc in reply.segments)  # tinted segments exist
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["generated"] == 30 and snap["tau"] > 3 and snap["acceptance_at"]
        assert "30 tokens" in reply.footer_text and "tau" in reply.footer_text
    store = ChatStore(str(tmp_path / "history.sqlite"))
    (conv,) = store.conversations()
    msgs = store.messages(conv.id)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == "abcdefghijklmnopqrstuvwxyzabcd" and msgs[1].stats["tau"] > 3


async def test_escape_stops_a_reply_and_keeps_it(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, max_tokens=200_000)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.chat.query_one("#prompt").value = "go"
        await pilot.press("enter")
        for _ in range(100):
            await pilot.pause(0.02)
            if replies(app)[-1].text:
                break
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        await pilot.pause()
        reply = replies(app)[-1]
        assert 0 < len(reply.text) < 200_000
        assert "stopped" in reply.footer_text
        assert not app.generating
        kept = reply.text
    store = ChatStore(str(tmp_path / "history.sqlite"))
    msgs = store.messages(store.conversations()[0].id)
    assert msgs[-1].content == kept


async def test_tint_toggle_and_ab_speculation(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "one")
        reply = replies(app)[-1]
        assert not reply.tint and reply.query_one(".body-md").display  # Markdown by default
        await pilot.press("ctrl+t")
        assert reply.tint and reply.query_one(".body-tinted").display
        assert any(acc for _, acc in reply.segments)
        await pilot.press("ctrl+t")
        assert not reply.tint and reply.query_one(".body-md").display
        await pilot.press("ctrl+b")  # speculation off for the next reply
        await say(pilot, "two")
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["k"] == 0 and snap["drafted"] == 0 and app.last_plain_tps
        await pilot.press("ctrl+b")
        await say(pilot, "three")
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["k"] == 4 and snap["speedup"] > 0
        assert len(app.chat.query_one("#history").taus) == 3


async def test_commands_change_k_temperature_and_system(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/k 2")
        await say(pilot, "/temp 0.5")
        await say(pilot, "/system be brief")
        assert (app.k, app.temperature, app.system) == (2, 0.5, "be brief")
        await say(pilot, "/k 99")
        assert app.k == 2  # refused
        await say(pilot, "hello")
        assert app.chat.query_one(StatsPanel).snapshot["k"] == 2
        await say(pilot, "/rename My chat")
        out = tmp_path / "chat.md"
        await say(pilot, f"/export {out}")
        text = out.read_text()
        assert text.startswith("# My chat") and "be brief" in text and "**assistant**" in text
        await pilot.press("ctrl+n")
        assert app.conversation_id is None and not replies(app)


async def test_reopen_conversation_in_a_fresh_app(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first question")
    app2 = make_app(agree, tmp_path)
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        views = list(app2.chat.query(MessageView))
        assert [v.role for v in views] == ["user", "assistant"]
        assert views[0].text == "first question"
        assert app2.history[-1]["role"] == "assistant"
        await say(pilot, "follow-up")  # continues the same conversation
    store = ChatStore(str(tmp_path / "history.sqlite"))
    assert len(store.conversations()) == 1
    assert len(store.messages(store.conversations()[0].id)) == 4


async def test_rename_and_delete_from_the_list(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "a chat")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        box = app.screen.query_one("#rename-input")
        box.value = "Renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert app.store.conversations()[0].title == "Renamed"
        await pilot.press("d")
        await pilot.pause()
        assert app.store.conversations() == []


async def test_model_load_failure_is_a_notification(tmp_path) -> None:
    def broken(_opts):
        raise LocalspecError("cannot load model /x.gguf: bad magic")

    app = LocalspecApp(
        ChatOptions(target="/x.gguf"),
        engine_factory=broken,
        store=ChatStore(str(tmp_path / "h.sqlite")),
    )
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.engine is None and app.is_running
        assert any("bad magic" in str(n.message) for n in app._notifications)
        await pilot.press("f1")  # still usable
        await pilot.pause()
        assert app.screen.__class__.__name__ == "HelpScreen"


async def test_generation_error_leaves_the_app_usable(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        real_chat = app.engine.chat

        def failing(*a, **kw):
            raise GenerationError("llama_decode failed on the target batch (code 1)")

        app.engine.chat = failing
        await say(pilot, "boom")
        assert any("llama_decode failed" in str(n.message) for n in app._notifications)
        assert not app.generating
        app.engine.chat = real_chat
        await say(pilot, "again")
        assert replies(app)[-1].text.startswith("abc")


async def test_context_full_is_reported(agree, tmp_path) -> None:
    target, _ = agree
    opts = ChatOptions(target=target, max_tokens=5000, engine_kwargs={**EXACT, "n_ctx": 256})
    app = LocalspecApp(opts, store=ChatStore(str(tmp_path / "h.sqlite")))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "fill it")
        assert "context full" in replies(app)[-1].footer_text, [
            str(n.message) for n in app._notifications
        ]
        assert any("context window is full" in str(n.message) for n in app._notifications)


async def test_copy_last_reply(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "copy me")
        await pilot.press("ctrl+y")
        assert app.clipboard == replies(app)[-1].text


def test_store_survives_reopen_and_refuses_garbage(tmp_path) -> None:
    path = tmp_path / "h.sqlite"
    s = ChatStore(str(path))
    cid = s.new_conversation("t")
    s.add_message(cid, "user", "x")
    s.close()
    assert ChatStore(str(path)).messages(cid)[0].content == "x"
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(LocalspecError, match="chat history"):
        ChatStore(str(bad))
    assert bad.read_bytes().startswith(b"not a database")  # nothing overwritten


def test_data_dir_follows_env(tmp_path, monkeypatch) -> None:
    from localspec.tui.store import data_dir

    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "d"))
    assert data_dir() == str(tmp_path / "d")
    monkeypatch.delenv("LOCALSPEC_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == os.path.join(str(tmp_path / "xdg"), "localspec")
