"""SVG snapshots of the main screens (pytest-textual-snapshot). Refresh them after a deliberate
UI change with: pytest tests/tui/test_tui_snapshots.py --snapshot-update"""

from __future__ import annotations

import shutil
import time

from localspec.errors import GenerationError
from localspec.tui.app import LocalspecApp
from localspec.tui.store import ChatStore, Turn

from helpers.tuiapp import chat_options

SIZE = (110, 34)


def app_for(agree, tmp_path) -> LocalspecApp:
    target, _ = agree
    opts = chat_options(target, n_draft=4, max_tokens=30)
    return LocalspecApp(opts, store=ChatStore(str(tmp_path / "h.sqlite")))


async def loaded(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    pilot.app.chat.query_one("#prompt").blur()  # no blinking cursor in the picture
    await pilot.pause()


def test_main_screen_idle(agree, tmp_path, snap_compare) -> None:
    assert snap_compare(app_for(agree, tmp_path), terminal_size=SIZE, run_before=loaded)


def test_help_screen(agree, tmp_path, snap_compare) -> None:
    async def help_open(pilot) -> None:
        await loaded(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app_for(agree, tmp_path), terminal_size=SIZE, run_before=help_open)


def test_light_theme_stays_readable(agree, tmp_path, snap_compare) -> None:
    async def light(pilot) -> None:
        await loaded(pilot)
        pilot.app.theme = "textual-light"
        await pilot.pause()

    assert snap_compare(app_for(agree, tmp_path), terminal_size=SIZE, run_before=light)


def test_long_drafter_name_keeps_the_labels(agree, tmp_path, snap_compare) -> None:
    target, draft = agree
    long_draft = tmp_path / ("agree-drafter-" + "with-a-very-long-descriptive-name-" * 3 + ".gguf")
    shutil.copy(draft, long_draft)
    opts = chat_options(target, draft=str(long_draft), n_draft=4)
    app = LocalspecApp(opts, store=ChatStore(str(tmp_path / "h.sqlite")))
    assert snap_compare(app, terminal_size=(150, 34), run_before=loaded)


def test_failed_reply_shows_its_error(agree, tmp_path, snap_compare) -> None:
    async def fail(pilot) -> None:
        await loaded(pilot)

        def failing(*a, **kw):
            raise GenerationError("llama_decode failed on the target batch (code 1)")

        pilot.app.engine.chat_stream = failing
        prompt = pilot.app.chat.query_one("#prompt")
        prompt.value = "Hi"
        prompt.focus()
        await pilot.press("enter")
        await pilot.app.workers.wait_for_complete()
        for _ in range(50):
            await pilot.pause()
            if not pilot.app.generating:
                break
        prompt.blur()
        await pilot.pause()

    assert snap_compare(app_for(agree, tmp_path), terminal_size=SIZE, run_before=fail)


STATS = {  # fixed statistics, so that the pictures do not depend on this machine's speed
    "generated": 30, "tokens_per_s": 120.0, "tau": 3.2, "acceptance_rate": 0.74,
    "mode": "auto (cost model)", "k": "auto", "ttft": 0.08, "prompt_tokens": 90,
    "cached_tokens": 60, "t_prefill": 0.02,
}  # fmt: skip


def stored_conversation(tmp_path) -> ChatStore:
    """Three turns; the second was edited once and the last reply retried once."""
    store = ChatStore(str(tmp_path / "h.sqlite"))
    turns = [Turn("What is speculative decoding?", "A drafter guesses, the target checks.",
                  STATS),
             Turn("Show it in Python", "```python\nprint(1)\n```", STATS)]  # fmt: skip
    cid = store.add_turns(None, turns, title="speculation")
    store.add_turns(cid, [Turn("Show it in Rust", "```rust\nfn main() {}\n```", STATS)],
                    after=store.path(cid)[1].id)  # fmt: skip
    store.add_turns(cid, [Turn("And the zeppelin?", "It floats.", STATS)])
    store.add_reply(cid, store.path(cid)[-2].id, "It floats, slowly.", dict(STATS, k=0))
    with store.db:  # a fixed date in the lists (shown in local time: the tests run in UTC)
        store.db.execute("UPDATE conversations SET updated = 1764072000, created = 1764072000")
    return store


def test_conversation_with_versions_edits_and_the_gauge(agree, tmp_path, snap_compare) -> None:
    async def opened(pilot) -> None:
        await loaded(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        await pilot.app.run_action("version(-1)")  # f2: the first version of the last reply
        pilot.app.chat.add_notice("2 oldest turns left the context window (rolling): the model "
                                  "no longer sees them")  # fmt: skip
        pilot.app.run_command("/edit 2")
        pilot.app.chat.prompt.value = "Show it in Rust,\nwith comments"
        await pilot.pause()
        pilot.app.chat.prompt.blur()
        pilot.app.clear_notifications()
        await pilot.pause()

    target, _ = agree
    opts = chat_options(target, n_draft=4, max_tokens=30)
    app = LocalspecApp(opts, store=stored_conversation(tmp_path))
    assert snap_compare(app, terminal_size=(110, 44), run_before=opened)


def test_search_screen(agree, tmp_path, snap_compare, monkeypatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()

    async def searched(pilot) -> None:
        await loaded(pilot)
        pilot.app.run_command("/search zeppelin")
        await pilot.pause()

    target, _ = agree
    opts = chat_options(target, n_draft=4, max_tokens=30)
    app = LocalspecApp(opts, store=stored_conversation(tmp_path))
    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=searched)
    finally:
        monkeypatch.undo()
        time.tzset()
