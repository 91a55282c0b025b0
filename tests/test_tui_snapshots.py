"""SVG snapshots of the main screens (pytest-textual-snapshot). Refresh them after a deliberate
UI change with: pytest tests/test_tui_snapshots.py --snapshot-update"""

from __future__ import annotations

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
