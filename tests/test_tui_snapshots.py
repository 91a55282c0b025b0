"""SVG snapshots of the main screens (pytest-textual-snapshot). Refresh them after a deliberate
UI change with: pytest tests/test_tui_snapshots.py --snapshot-update"""

from __future__ import annotations

import shutil

from localspec.errors import GenerationError
from localspec.tui.app import ChatOptions, LocalspecApp
from localspec.tui.store import ChatStore

from conftest import EXACT

SIZE = (110, 34)


def app_for(agree, tmp_path) -> LocalspecApp:
    target, _ = agree
    opts = ChatOptions(target=target, n_draft=4, max_tokens=30, engine_kwargs=dict(EXACT))
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
    opts = ChatOptions(target=target, draft=str(long_draft), n_draft=4, engine_kwargs=dict(EXACT))
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
