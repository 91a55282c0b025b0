"""The chat app driven by Textual's Pilot with the tiny GGUF pair: an app on the agreeing
pair, prompts and /commands sent and waited for, what the screen shows, engines slowed down
or made to fail."""

from __future__ import annotations

import time

from textual.geometry import Region

from localspec import EngineConfig, RuntimeOptions
from localspec.errors import GenerationError
from localspec.tui.app import ChatOptions, LocalspecApp
from localspec.tui.store import ChatStore
from localspec.tui.widgets.message import MessageView

from conftest import EXACT

SIZE = (120, 40)


ENGINE_FIELDS = ("target", "draft", "n_draft", "tree", "draft_source", "recalibrate")


def chat_options(target, *, runtime: dict | None = None, **kw) -> ChatOptions:
    """ChatOptions for the tiny models: the engine's fields (target, draft, n_draft, tree,
    draft_source, recalibrate) and its runtime (EXACT numerics, with `runtime`'s changes)
    go into its EngineConfig, the rest to the chat."""
    engine = {k: kw.pop(k) for k in ENGINE_FIELDS if k in kw}
    rt = RuntimeOptions(**{**EXACT, **(runtime or {})})
    return ChatOptions(config=EngineConfig(target=target, runtime=rt, **engine), **kw)


def make_app(agree, tmp_path, store: ChatStore | None = None, **kw) -> LocalspecApp:
    target, _ = agree
    opts = chat_options(
        kw.pop("target", target),
        n_draft=kw.pop("n_draft", 4),
        max_tokens=kw.pop("max_tokens", 30),
        **kw,
    )
    return LocalspecApp(opts, store=store or ChatStore(str(tmp_path / "history.sqlite")))


async def ready(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def say(pilot, text: str) -> None:
    prompt = pilot.app.chat.query_one("#prompt")
    prompt.value = text
    await pilot.press("enter")
    await pilot.app.workers.wait_for_complete()
    for _ in range(200):  # the reply's end is handled after the worker has finished
        await pilot.pause()
        if not pilot.app.generating:
            break


async def open_latest(pilot) -> None:
    """Open the most recent saved conversation from the list (ctrl+o, enter)."""
    await pilot.press("ctrl+o")
    await pilot.pause()
    await pilot.press("enter")
    await pilot.pause()


async def start_long_reply(pilot) -> None:
    """Send a prompt and return once the reply has shown some text."""
    pilot.app.chat.query_one("#prompt").value = "go"
    await pilot.press("enter")
    for _ in range(500):
        await pilot.pause(0.02)
        if replies(pilot.app)[-1].text:
            return
    raise AssertionError("the reply did not start")


def replies(app) -> list[MessageView]:
    return [m for m in app.chat.query(MessageView) if m.role == "assistant"]


def notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


def rendered(widget) -> list[str]:
    """The widget's text as drawn at its current size."""
    w, h = widget.size
    return [strip.text for strip in widget.render_lines(Region(0, 0, w, h))]


def throttle(engine, seconds: float = 0.01) -> None:
    """Slow the engine's chats to about one event per `seconds` (the tiny model is so fast that
    it fills its context before a test can press a key)."""
    real = engine.chat_stream

    def chat(*a, **kw):
        events = real(*a, **kw)

        def slow():
            try:
                for ev in events:
                    time.sleep(seconds)
                    yield ev
            finally:
                events.close()

        return slow()

    engine.chat_stream = chat


def fail_after(engine, n_events: int, error: str, real) -> None:
    """Make the engine's chats (real: the unpatched method) raise GenerationError after
    n_events real events."""

    def chat(*a, **kw):
        events = real(*a, **kw)

        def failing():
            try:
                for i, ev in enumerate(events):
                    if i == n_events:
                        raise GenerationError(error)
                    yield ev
            finally:
                events.close()

        return failing()

    engine.chat_stream = chat


REPLY = "abcdefghijklmnopqrstuvwxyzabcd"  # the agreeing pair's greedy reply to any prompt


async def command(pilot, line: str) -> None:
    """Run a /command and wait for what it started (a reply, a model load) to be handled."""
    await say(pilot, line)
    for _ in range(100):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if not (pilot.app.switching or pilot.app.generating):
            break
    for _ in range(3):
        await pilot.pause()
