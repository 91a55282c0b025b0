"""The real terminal app, driven by Textual's Pilot with the tiny GGUF pair."""

from __future__ import annotations

import ast
import asyncio
import os
import pathlib
import re
import shutil
import sqlite3
import threading
import time

import gguf
import pytest
from textual.widgets import Markdown

import localspec
from localspec import EngineConfig
from localspec.errors import LocalspecError
from localspec.tui.app import ChatOptions, LocalspecApp, default_engine_factory
from localspec.tui.store import ChatStore
from localspec.tui.widgets.message import MessageView
from localspec.tui.widgets.stats_panel import StatsPanel

from helpers import tinymodels as tm
from helpers.tuiapp import (
    SIZE,
    chat_options,
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

TUI = pathlib.Path(__file__).parent.parent.parent / "tui"


def stored(tmp_path, name: str = "history.sqlite") -> list[dict[str, str]]:
    """Every stored message of the (single) conversation, as chat messages."""
    store = ChatStore(str(tmp_path / name))
    convs = store.conversations()
    if not convs:
        return []
    (conv,) = convs
    return [{"role": m.role, "content": m.content} for m in store.messages(conv.id)]


async def test_prompt_streams_reply_and_updates_stats(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "agree.eagle3.gguf" in str(app.chat.query_one("#status").render())
        await say(pilot, "Hi")
        reply = replies(app)[-1]
        assert reply.text == "abcdefghijklmnopqrstuvwxyzabcd"
        assert reply.query_one(Markdown).source == reply.text  # every piece reached the screen
        assert any(acc for _, acc in reply.segments)  # tinted segments exist
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["generated"] == 30 and snap["tau"] > 3 and snap["acceptance_at"]
        assert "30 tokens" in reply.footer_text and "tau" in reply.footer_text
        history = app.session.history
    msgs = stored(tmp_path)
    assert (
        msgs
        == history
        == [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "abcdefghijklmnopqrstuvwxyzabcd"},
        ]
    )
    store = ChatStore(str(tmp_path / "history.sqlite"))
    assert store.messages(store.conversations()[0].id)[1].stats["tau"] > 3


async def test_prompt_reuse_and_prefill_in_panel_and_footer(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "one")
        await say(pilot, "two")  # the second turn's prompt holds the first: reusable
        snap = app.chat.query_one(StatsPanel).snapshot
        new, reused = snap["prompt_tokens"] - snap["cached_tokens"], snap["cached_tokens"]
        assert snap["prompt_tokens"] > 0 and snap["t_prefill"] > 0
        footer = replies(app)[-1].footer_text
        assert f"prompt {new} new + {reused} reused, prefill {snap['t_prefill']:.2f} s" in footer
        panel = rendered(app.chat.query_one(StatsPanel))
        assert any(
            line.startswith("prompt") and f"{new} new + {reused} reused" in line for line in panel
        )
        assert any(line.startswith("prefill") and f"{snap['t_prefill']:.2f} s" in line
                   for line in panel)  # fmt: skip


async def test_panel_and_stream_refresh_at_a_bounded_rate(agree, tmp_path, monkeypatch) -> None:
    """A long reply: the side panel and the Markdown widget are updated a few times a second,
    not once per step (that made streaming quadratic and slowed the engine)."""
    shows, appends = [], []
    real_show, real_append = StatsPanel.show, Markdown.append
    monkeypatch.setattr(StatsPanel, "show", lambda self, s: (shows.append(1), real_show(self, s)))
    monkeypatch.setattr(
        Markdown, "append", lambda self, t: (appends.append(t), real_append(self, t))[1]
    )
    app = make_app(agree, tmp_path, n_draft=0, max_tokens=900)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await say(pilot, "long")
        seconds = loop.time() - t0
        reply = replies(app)[-1]
        generated = app.chat.query_one(StatsPanel).snapshot["generated"]
        assert generated == 900 and len(reply.text) == 900
        assert reply.query_one(Markdown).source == reply.text
    # snapshots come at 4 Hz and frames at 20 Hz (generous slack for a loaded machine)
    assert len(shows) <= 4 * seconds + 5, (len(shows), seconds)
    assert len(appends) <= 20 * seconds + 5, (len(appends), seconds)
    assert len(appends) < generated / 4  # many steps per append


async def test_escape_stops_a_reply_and_keeps_it(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, max_tokens=200_000)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        throttle(app.engine)
        await start_long_reply(pilot)
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        for _ in range(50):
            await pilot.pause()
            if not app.generating:
                break
        reply = replies(app)[-1]
        assert 0 < len(reply.text) < 200_000
        assert "stopped" in reply.footer_text
        assert not app.generating
        kept, history = reply.text, app.session.history
    assert (
        stored(tmp_path)
        == history
        == [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": kept},
        ]
    )


async def test_quit_mid_reply_waits_for_the_worker(agree, tmp_path) -> None:
    """Quitting while a reply streams stops the generation thread before the engine closes,
    and keeps the partial reply as a stopped turn (memory and store agree)."""
    record: dict[str, object] = {"streaming": False}

    def factory(opts):
        eng = default_engine_factory(opts)
        real_chat, real_close = eng.chat_stream, eng.close

        def chat(*a, **kw):
            events = real_chat(*a, **kw)

            def tracked():
                record["streaming"] = True
                try:
                    for ev in events:
                        # a long decode is in flight while the app quits
                        time.sleep(1.0 if record.get("slow") else 0.01)
                        yield ev
                finally:
                    events.close()
                    record["streaming"] = False

            return tracked()

        def close():
            record["closed_while_streaming"] = record["streaming"]
            if not record["streaming"]:  # closing under a decode could crash the test run
                real_close()

        eng.chat_stream, eng.close = chat, close
        record["engine"] = eng
        return eng

    app = make_app(agree, tmp_path, max_tokens=200_000)
    app.engine_factory = factory
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await start_long_reply(pilot)
        assert app.generating and record["streaming"]
        record["slow"] = True
        await pilot.press("ctrl+q")
    assert record["closed_while_streaming"] is False
    with pytest.raises(LocalspecError, match="closed"):
        record["engine"].tokenize("x")  # type: ignore[attr-defined]
    msgs = stored(tmp_path)
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[1]["content"].startswith("abc")


async def test_quit_while_the_model_loads_closes_it(agree, tmp_path) -> None:
    loaded = []
    gate = threading.Event()

    def slow_factory(opts):
        gate.wait(10)
        loaded.append(default_engine_factory(opts))
        return loaded[-1]

    app = make_app(agree, tmp_path)
    app.engine_factory = slow_factory
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        gate.set()  # the model finishes loading while the app quits
        await pilot.press("ctrl+q")
    assert len(loaded) == 1
    with pytest.raises(LocalspecError, match="closed"):
        loaded[0].tokenize("x")


async def test_tint_toggle_and_ab_speculation(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "one")
        reply = replies(app)[-1]
        assert not reply.tint and reply.query_one(".body-md").display  # Markdown by default
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert reply.tint and reply.query_one(".body-tinted").display
        assert any(acc for _, acc in reply.segments)
        chunks = list(reply.query(".tint-chunk"))
        assert "\n".join(str(c.content) for c in chunks) == reply.text
        await pilot.press("ctrl+t")
        assert not reply.tint and reply.query_one(".body-md").display
        await pilot.press("ctrl+b")  # speculation off for the next reply
        await say(pilot, "two")
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["k"] == 0 and snap["drafted"] == 0 and app.replies.last_plain_tps
        await pilot.press("ctrl+b")
        await say(pilot, "three")
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["k"] == 4 and snap["speedup"] > 0
        assert len(app.chat.query_one("#history").taus) == 3


async def test_tinted_streaming_renders_in_chunks(agree, tmp_path) -> None:
    """Tinted text is split into chunks at line breaks, so a frame redraws only the last
    chunk; together the chunks are the reply, with the accepted spans tinted."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        view = app.chat.add_message("assistant", tint=True)
        await pilot.pause()
        line = "x" * 59 + "\n"
        for i in range(200):  # 12,000 characters, every other piece accepted
            view.append(line, [(len(line), "eagle")] if i % 2 else [])
            if i % 10 == 0:
                view.flush()
        await view.finish()
        await pilot.pause()
        chunks = [c.content for c in view.query(".tint-chunk")]
        assert len(chunks) >= 4
        assert "\n".join(str(c) for c in chunks) == view.text
        style = f"bold {app.current_theme.success}"
        assert any(span.style == style for c in chunks for span in c.spans)


async def test_commands_change_k_temperature_and_system(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/k 2")
        await say(pilot, "/temp 0.5")
        await say(pilot, "/system be brief")
        assert (app.next_reply.k, app.next_reply.temperature, app.session.system) == (
            2,
            0.5,
            "be brief",
        )
        await say(pilot, "/k 99")
        assert app.next_reply.k == 2  # refused
        await say(pilot, "/rename too early")
        assert any("nothing saved yet" in n for n in notes(app))
        await say(pilot, "hello")
        assert app.chat.query_one(StatsPanel).snapshot["k"] == 2
        await say(pilot, "/rename My chat")
        out = tmp_path / "chat.md"
        await say(pilot, f"/export {out}")
        text = out.read_text()
        assert text.startswith("# My chat") and "be brief" in text and "**assistant**" in text
        assert any(f"exported to {out}" in n for n in notes(app))
        await pilot.press("ctrl+n")
        assert app.session.conversation_id is None and not replies(app)


async def test_export_failure_is_reported_not_success(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
        for bad in (tmp_path / "missing" / "x.md", tmp_path):  # no such folder; a folder
            app._notifications.clear()
            await say(pilot, f"/export {bad}")
            assert any("cannot export" in n for n in notes(app)), notes(app)
            assert not any("exported to" in n for n in notes(app))
        assert not (tmp_path / "missing").exists()
        assert not list(tmp_path.glob("*.part"))  # nothing half-written left behind


async def test_reopen_conversation_in_a_fresh_app(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first question")
    app2 = make_app(agree, tmp_path)
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await open_latest(pilot)
        views = list(app2.chat.query(MessageView))
        assert [v.role for v in views] == ["user", "assistant"]
        assert views[0].text == "first question"
        assert "prompt" in views[1].footer_text  # the footer is rebuilt from saved stats
        assert app2.session.history[-1]["role"] == "assistant"
        await say(pilot, "follow-up")  # continues the same conversation
    assert len(ChatStore(str(tmp_path / "history.sqlite")).conversations()) == 1
    assert [m["role"] for m in stored(tmp_path)] == ["user", "assistant"] * 2


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
        ChatOptions(config=EngineConfig(target="/x.gguf")),
        engine_factory=broken,
        store=ChatStore(str(tmp_path / "h.sqlite")),
    )
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.engine is None and app.is_running
        assert any("bad magic" in n for n in notes(app))
        assert app.load_error == "cannot load model /x.gguf: bad magic"
        await pilot.press("f1")  # still usable
        await pilot.pause()
        assert app.screen.__class__.__name__ == "HelpScreen"


async def test_failed_reply_shows_its_error_and_is_not_kept(agree, tmp_path) -> None:
    """The error text appears in the reply area; the failed turn is in neither the history
    nor the store, so the next prompt does not follow an unanswered one."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first")
        real_chat = app.engine.chat_stream
        fail_after(app.engine, 0, "llama_decode failed on the target batch (code 1)", real_chat)
        await say(pilot, "boom")
        failed = replies(app)[-1]
        error = failed.query_one(".reply-error")
        assert error.display and "llama_decode failed" in str(error.render())
        assert failed.has_class("failed") and "not kept" in failed.footer_text
        assert not app.generating
        fail_after(app.engine, 3, "out of memory mid-reply", real_chat)  # after some text
        await say(pilot, "boom again")
        failed = replies(app)[-1]
        assert failed.text and "out of memory mid-reply" in str(
            failed.query_one(".reply-error").render()
        )
        app.engine.chat_stream = real_chat
        await say(pilot, "again")
        assert replies(app)[-1].text.startswith("abc")
        history = app.session.history
    assert stored(tmp_path) == history
    assert [m["content"] for m in history if m["role"] == "user"] == ["first", "again"]


async def test_chat_template_fallback_is_said(tmp_path) -> None:
    """A model without a chat template chats through ChatML; the status line says so, and
    the note is kept for stderr."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_chat_template", lambda self, t: None)
        target, _ = tm.write_agreeing_pair(str(tmp_path), name="bare")
    app = make_app((target, None), tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        status = str(app.chat.query_one("#status").render())
        assert "bare.gguf has no chat template: using ChatML" in status
        assert app.exit_notes == [app.engine.chat_template_note] and app.exit_notes[0]
        await say(pilot, "Hi")
        assert replies(app)[-1].text.startswith("abc")


def test_cli_prints_the_template_note_on_stderr(tmp_path, monkeypatch, capsys) -> None:
    from localspec import cli

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_chat_template", lambda self, t: None)
        target, _ = tm.write_agreeing_pair(str(tmp_path), name="bare")

    def headless(self) -> None:  # the real app, without a terminal: load, then quit
        async def go() -> None:
            async with self.run_test(size=SIZE) as pilot:
                await ready(pilot)

        asyncio.run(go())

    monkeypatch.setattr(LocalspecApp, "run", headless)
    monkeypatch.setattr(cli.chat, "stdin_is_terminal", lambda: True)  # pytest's stdin is not one
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    assert cli.main(["chat", target, "--no-draft", "-t", "2"]) == 0
    err = capsys.readouterr().err
    assert f"localspec: {target} has no chat template: using ChatML" in err


async def test_store_errors_keep_the_conversation_in_memory(agree, tmp_path) -> None:
    """A locked database (another connection holds a write transaction): the reply is kept
    in memory, the user is told, and the next save writes every pending turn."""
    path = str(tmp_path / "history.sqlite")
    app = make_app(agree, tmp_path, store=ChatStore(path, timeout=0.1))
    other = sqlite3.connect(path, isolation_level=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "saved")
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE conversations SET title = 'held'")
        await say(pilot, "while locked")
        assert app.is_running and not app.generating
        assert any("locked" in n and "kept in memory" in n for n in notes(app)), notes(app)
        assert len(app.session.history) == 4 and len(app.session.unsaved) == 1
        await say(pilot, "/system still locked")  # a command's store error is shown too
        assert any("cannot set the system prompt" in n for n in notes(app))
        other.execute("ROLLBACK")
        await say(pilot, "after")
        assert app.session.unsaved == []
        history = app.session.history
    other.close()
    assert stored(tmp_path) == history
    assert [m["content"] for m in history if m["role"] == "user"] == [
        "saved",
        "while locked",
        "after",
    ]


@pytest.mark.parametrize("how", ["read-only", "full"])
async def test_read_only_or_full_database_does_not_crash(agree, tmp_path, how) -> None:
    app = make_app(agree, tmp_path, runtime={"n_ctx": 2048})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "one")
        if how == "read-only":  # as root a file mode would not stop writes; SQLite's does
            app.store.db.execute("PRAGMA query_only = ON")
        else:
            pages = app.store.db.execute("PRAGMA page_count").fetchone()[0]
            app.store.db.execute(f"PRAGMA max_page_count = {pages}")
        await say(pilot, "two" + " the" * 1500)  # 6,000 characters: needs new pages
        why = "readonly" if how == "read-only" else "full"
        assert any(why in n for n in notes(app)), notes(app)
        await say(pilot, "/rename New title")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("d")  # delete from the list: refused, shown
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.is_running
        if how == "full" and not app.store.conversations():
            # at its page limit a delete needs no new page: it went through, and the open
            # conversation (the deleted one) was closed with it
            assert app.session.conversation_id is None and not app.session.history
            return
        assert len(app.session.history) == 4 and len(app.session.unsaved) == 1
        if how == "read-only":  # (with the file at its page limit these need no new page)
            assert app.store.conversations()  # the delete was refused
            assert any("cannot delete" in n for n in notes(app))
            assert any("cannot rename" in n for n in notes(app))


# beside localspec's exports, the app may take the request rules every front-end shares
# (the chat's commands refuse what the engine would, in their own words)
SHARED_RULES = {"localspec.rules": {"Spelling", "check_source_shape"}}


def test_tui_uses_only_the_public_api() -> None:
    """The app imports only names `localspec` exports (and the shared request rules), and
    does not reach into the drafter."""
    for path in TUI.rglob("*.py"):
        source = path.read_text()
        assert not re.search(r"\.spec\b", source), path
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == "localspec":
                    allowed = (
                        set(localspec.__all__)
                        if node.module == "localspec"
                        else SHARED_RULES.get(node.module)
                    )
                    assert allowed is not None, (path, node.module)
                    for alias in node.names:
                        assert alias.name in allowed, (path, node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("localspec."), (path, alias.name)


async def test_side_panel_labels_never_truncate(agree, tmp_path) -> None:
    target, draft = agree
    long_draft = tmp_path / ("agree-drafter-" + "with-a-very-long-descriptive-name-" * 3 + ".gguf")
    shutil.copy(draft, long_draft)
    for width in (150, 170):
        app = make_app(agree, tmp_path, draft=str(long_draft))
        async with app.run_test(size=(width, 50)) as pilot:
            await ready(pilot)
            await say(pilot, "Hi")
            lines = rendered(app.chat.query_one(StatsPanel))
        drafted = any("drafted" in line and "nothing" not in line for line in lines)
        for label in ("mode", "drafter", "tokens/s", "accepted", "prompt", "prefill",
                      "time", "vs plain", *(("tau", "accept %") if drafted else ())):  # fmt: skip
            assert any(line.startswith(label + " ") for line in lines), (width, label, lines)
        (drafter,) = [line for line in lines if line.startswith("drafter ")]
        assert "agree-drafter-with" in drafter and drafter.rstrip().endswith("…")


async def test_context_full_is_reported(agree, tmp_path) -> None:
    target, _ = agree
    opts = chat_options(target, max_tokens=5000, runtime={"n_ctx": 256})
    app = LocalspecApp(opts, store=ChatStore(str(tmp_path / "h.sqlite")))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "fill it")
        assert "context full" in replies(app)[-1].footer_text, notes(app)
        assert any("context window is full" in n for n in notes(app))


async def test_copy_last_reply(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "copy me")
        await pilot.press("ctrl+y")
        assert app.clipboard == replies(app)[-1].text


def test_data_dir_follows_env(tmp_path, monkeypatch) -> None:
    from localspec.tui.store import data_dir

    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "d"))
    assert data_dir() == str(tmp_path / "d")
    monkeypatch.delenv("LOCALSPEC_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == os.path.join(str(tmp_path / "xdg"), "localspec")


async def test_panel_says_why_auto_runs_what_it_runs(agree, tmp_path) -> None:
    """Auto's reason, in its cost model's numbers, reaches the side panel; plain replies say
    that nothing was drafted rather than "0% accepted"."""
    app = make_app(agree, tmp_path, n_draft="auto")
    async with app.run_test(size=(170, 50)) as pilot:
        await ready(pilot)
        await say(pilot, "Hi")
        snap = app.chat.query_one(StatsPanel).snapshot
        lines = rendered(app.chat.query_one(StatsPanel))
    auto = snap["auto"]
    assert auto is not None and auto["brief"].split(":")[0] in ("plain", auto["choice"])
    (why,) = [line for line in lines if line.startswith("why ")]
    assert auto["brief"][:20] in why
    # no drafter and no n-gram drafts (--no-draft): the app runs k=0 itself, nothing to note
    app = make_app(agree, tmp_path, draft=False, draft_source="none")
    async with app.run_test(size=(170, 50)) as pilot:
        await ready(pilot)
        await say(pilot, "Hi")
        lines = rendered(app.chat.query_one(StatsPanel))
    assert not any(line.startswith(("note ", "why ")) for line in lines), lines
    assert any("nothing drafted (plain steps)" in line for line in lines), lines


ALPHABET = "abcdefghijklmnopqrstuvwxyz"


async def test_source_command_drafts_from_the_ngram_index(agree, tmp_path) -> None:
    """/source ngram: the next replies draft from the context only; the panel says so and
    counts the n-gram source's drafts; the tinted reply shows them in the n-gram tint."""
    app = make_app(agree, tmp_path, n_draft="auto", max_tokens=60)
    async with app.run_test(size=(170, 50)) as pilot:
        await ready(pilot)
        await say(pilot, "/source ngram")
        assert app.next_reply.source == "ngram" and app.next_reply.speculation
        assert any("draft source ngram" in n for n in notes(app))
        await pilot.press("ctrl+t")
        await say(pilot, ALPHABET)
        reply = replies(app)[-1]
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["draft_source"] == "ngram" and set(snap["sources"]) == {"ngram"}
        assert snap["sources"]["ngram"]["accepted"] > 0
        lines = rendered(app.chat.query_one(StatsPanel))
        assert any(line.startswith("source ") and "ngram" in line for line in lines), lines
        (row,) = [line for line in lines if line.startswith("ngram ")]
        assert "tau" in row and f"/{snap['sources']['ngram']['drafted']} " in row
        assert {src for _, src in reply.segments} <= {"", "ngram"}
        assert any(src == "ngram" for _, src in reply.segments)
        ngram_style = f"bold {app.current_theme.accent}"
        spans = [span for c in reply.query(".tint-chunk") for span in c.content.spans]
        assert any(span.style == ngram_style for span in spans)
        assert not any(span.style == f"bold {app.current_theme.success}" for span in spans)
        assert app.chat.query_one(StatsPanel).snapshot["source"] == "ngram"


async def test_source_none_eagle_and_bad_values(agree, tmp_path) -> None:
    app = make_app(agree, tmp_path, n_draft="auto", max_tokens=10)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "/source none")
        assert app.next_reply.source == "none" and not app.next_reply.speculation
        await pilot.press("ctrl+b")  # nothing to turn on: says how
        assert any("/source" in n for n in notes(app)), notes(app)
        assert not app.next_reply.speculation
        await say(pilot, "plain")
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["k"] == 0 and snap["drafted"] == 0 and snap["sources"] == {}
        await say(pilot, "/source eagle")
        assert app.next_reply.source == "eagle" and app.next_reply.speculation
        await say(pilot, "eagle only")
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["draft_source"] == "eagle" and set(snap["sources"]) <= {"eagle"}
        app._notifications.clear()
        await say(pilot, "/source both")
        assert app.next_reply.source == "eagle"  # refused
        assert any("bad value for /source" in n and "auto, eagle, mtp, ngram, none" in n
                   for n in notes(app)), notes(app)  # fmt: skip
        await say(pilot, "/tree 3,2,5")
        await say(pilot, "/source ngram")  # a fixed tree is the drafter's: refused
        assert app.next_reply.source == "eagle"
        assert any("/tree 3,2,5: fixed trees are drafted by the EAGLE drafter; /source ngram "
                   "takes /k" in n for n in notes(app)), notes(app)  # fmt: skip
        await say(pilot, "/k auto")
        await say(pilot, "/source ngram")
        await say(pilot, "/tree 3,2,5")
        assert app.next_reply.tree is None and app.next_reply.source == "ngram"


async def test_without_a_drafter_auto_drafts_from_the_context(agree, tmp_path) -> None:
    """draft=False loads no drafter; auto still drafts from the n-gram index, and ctrl+b
    turns that off and on (only --no-draft, i.e. draft_source none, means plain)."""
    app = make_app(agree, tmp_path, draft=False, n_draft="auto", max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.next_reply.speculation and "n-gram drafts only" in str(
            app.chat.query_one("#status").render()
        )
        await say(pilot, ALPHABET)
        snap = app.chat.query_one(StatsPanel).snapshot
        assert snap["drafter"] == "none" and set(snap["sources"]) == {"ngram"}
        await pilot.press("ctrl+b")
        assert not app.next_reply.speculation
        await say(pilot, "/source eagle")  # nothing to draft with
        assert any("no drafter loaded" in n for n in notes(app)), notes(app)


async def test_tint_tells_sources_apart(agree, tmp_path) -> None:
    """EAGLE, n-gram and both-proposed drafts get three tints; the target's tokens none; the
    help screen shows the legend."""
    app = make_app(agree, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        view = app.chat.add_message("assistant", tint=True)
        await pilot.pause()
        view.append("abcdefg", [(2, "eagle"), (3, "ngram")])
        view.append("hij", [(1, "eagle+ngram")])
        await view.finish()
        await pilot.pause()
        assert view.segments == [("ab", "eagle"), ("cde", "ngram"), ("fg", ""),
                                 ("h", "eagle+ngram"), ("ij", "")]  # fmt: skip
        theme = app.current_theme
        (chunk,) = [c.content for c in view.query(".tint-chunk")]
        styles = {str(chunk)[s.start : s.end]: s.style for s in chunk.spans}
        assert styles == {"ab": f"bold {theme.success}", "cde": f"bold {theme.accent}",
                          "h": f"bold {theme.primary}"}  # fmt: skip
        await pilot.press("f1")
        await pilot.pause()
        hint = str(app.screen.query_one(".hint").content)
        assert "EAGLE drafter" in hint and "n-gram index" in hint and "both" in hint
        help_text = "\n".join(line for s in app.screen.query("Static") for line in rendered(s))
        assert "/source S" in help_text and "ngram (the context" in help_text


def test_draft_spans_group_leading_drafts_by_source() -> None:
    from localspec import Event
    from localspec.tui.generation import draft_spans

    class Letters:  # one character per token
        def detokenize(self, tokens):
            return "".join(chr(97 + t) for t in tokens)

    ev = Event("abcdef", [0, 1, 2, 3, 4, 5], [True] * 5 + [False], None,
               ["ngram", "ngram", "eagle", "eagle+ngram", "eagle+ngram", ""])  # fmt: skip
    assert draft_spans(Letters(), ev) == [(2, "ngram"), (1, "eagle"), (2, "eagle+ngram")]
    plain = Event("a", [0], [False], None, [""])
    assert draft_spans(Letters(), plain) == []
    cut = Event("ab", [0, 1], [True, True], "length", ["eagle", "eagle"])  # no target token
    assert draft_spans(Letters(), cut) == [(2, "eagle")]
