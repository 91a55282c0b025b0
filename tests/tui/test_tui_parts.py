"""The chat app's small parts on their own: frame pacing, the worker gate, the reply buffer,
the footer and the side panel's layout."""

from __future__ import annotations

import threading

from rich.console import Console

from localspec.tui.frame_budget import FrameBudget
from localspec.tui.reply_buffer import ReplyBuffer
from localspec.tui.summaries import reply_footer
from localspec.tui.thread_gate import ThreadGate
from localspec.tui.widgets.stats_panel import StatsPanel


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_frame_budget_spreads_redraws_by_their_cost() -> None:
    wall, cpu = Clock(), Clock()
    budget = FrameBudget(share=0.1, min_interval=0.05, max_interval=0.5, clock=wall, cpu=cpu)
    assert budget.ready()
    budget.start()
    wall.t += 0.01
    assert not budget.ready()  # the minimum interval
    wall.t += 0.04
    assert budget.ready()  # a cheap redraw: the frame rate is the limit
    budget.start()
    cpu.t += 0.03  # this redraw cost 30 ms of the UI thread
    wall.t += 0.29
    assert not budget.ready()  # 30 ms at 10% of a core is paid after 0.3 s
    wall.t += 0.01
    assert budget.ready()
    budget.start()
    cpu.t += 0.2  # a very costly redraw: the stream still moves every max_interval
    wall.t += 0.49
    assert not budget.ready()
    wall.t += 0.01
    assert budget.ready()


def test_thread_gate_waits_for_workers_inside() -> None:
    gate = ThreadGate()
    inside, release = threading.Event(), threading.Event()

    def worker() -> None:
        assert gate.enter()
        inside.set()
        release.wait(10)
        gate.leave()

    t = threading.Thread(target=worker)
    t.start()
    inside.wait(10)
    assert gate.close(timeout=0.05) is False  # still inside
    assert gate.closed and not gate.enter()  # no new worker may start
    release.set()
    assert gate.close(timeout=10) is True
    t.join()


def test_reply_buffer_hands_over_everything_once() -> None:
    buf = ReplyBuffer()
    buf.put("ab", [(1, "eagle")])
    buf.publish({"generated": 1})
    buf.put("c")
    buf.publish({"generated": 2})
    assert buf.drain() == ([("ab", [(1, "eagle")]), ("c", ())], {"generated": 2})
    assert buf.drain() == ([], None)


def test_footer_shows_reused_and_new_prompt_tokens() -> None:
    s = {"generated": 30, "tokens_per_s": 100.0, "tau": 2.5, "acceptance_rate": 0.5,
         "mode": "auto (cost model)", "prompt_tokens": 52, "cached_tokens": 40,
         "t_prefill": 0.034, "stopped": True}  # fmt: skip
    footer = reply_footer(s)
    assert "prompt 12 new + 40 reused, prefill 0.03 s" in footer and footer.endswith("stopped")
    assert "prompt" not in reply_footer({"generated": 3})  # old saved stats: no such fields


def test_panel_labels_keep_their_width_values_shrink() -> None:
    snap = {"mode": "auto (cost model)", "drafter": "x" * 200, "k": "auto", "tokens_per_s": 1.0,
            "shape": "plain 96%, chain 1 4%", "prompt_tokens": 5, "cached_tokens": 0,
            "t_prefill": 0.1, "t_target": 1.0, "acceptance_at": [0.5], "drafted": 4,
            "accepted": 2, "auto": {"brief": "chain 1: expected 1.10x plain; drafter 50%"},
            "notes": ["n_draft=3 runs plain decoding: speculation off"]}  # fmt: skip
    console = Console(width=39, record=True)
    console.print(StatsPanel.render_stats(snap))
    lines = console.export_text().splitlines()
    for label in ("mode", "drafter", "tokens/s", "why", "note", "accepted", "accept %", "pos 1",
                  "prompt", "prefill", "time", "vs plain"):  # fmt: skip
        assert any(line.lstrip().startswith(label + " ") for line in lines), (label, lines)
    (drafter,) = [line for line in lines if line.startswith("drafter")]
    assert drafter.rstrip().endswith("…")


def test_a_panel_without_drafts_says_so_instead_of_zero_percent() -> None:
    """Plain steps draft nothing: "0% accepted" would read as a broken drafter."""
    console = Console(width=60, record=True)
    console.print(StatsPanel.render_stats({"drafted": 0, "accepted": 0, "acceptance_rate": 0.0}))
    text = console.export_text()
    assert "nothing drafted" in text and "0%" not in text


def test_panel_has_a_row_per_draft_source_in_its_tint() -> None:
    from localspec.tui.tint import tint_styles

    snap = {"mode": "auto (cost model)", "source": "auto (eagle + ngram)", "drafted": 42,
            "accepted": 24, "acceptance_rate": 24 / 42, "tau": 2.5,
            "sources": {"ngram": {"steps": 8, "drafted": 12, "accepted": 9, "tau": 2.125,
                                  "acceptance_rate": 0.75},
                        "eagle": {"steps": 10, "drafted": 30, "accepted": 15, "tau": 2.5,
                                  "acceptance_rate": 0.5}}}  # fmt: skip
    styles = {"eagle": "bold red", "ngram": "bold blue", "eagle+ngram": "bold cyan"}
    console = Console(width=42, record=True)
    console.print(StatsPanel.render_stats(snap, styles))
    lines = console.export_text(clear=False).splitlines()
    assert any(line.startswith("source ") and "auto (eagle + ngram)" in line for line in lines)
    (eagle,) = [line for line in lines if line.startswith("eagle ")]
    (ngram,) = [line for line in lines if line.startswith("ngram ")]
    assert "15/30 (50%), tau 2.50" in eagle and "9/12 (75%), tau 2.12" in ngram
    assert lines.index(eagle) < lines.index(ngram)
    html = console.export_html(inline_styles=True)
    assert "color: #800000" in html and "color: #000080" in html  # red and blue labels
    assert tint_styles()["eagle"] != tint_styles()["ngram"] != tint_styles()["eagle+ngram"]
    plain = Console(width=42, record=True)
    plain.print(StatsPanel.render_stats({"drafted": 0, "sources": {}}))
    assert not any(x.startswith(("eagle ", "ngram ")) for x in plain.export_text().splitlines())


def test_a_clipboard_tool_that_leaves_a_child_behind_is_a_copy(tmp_path, monkeypatch) -> None:
    """xclip and wl-copy fork a child that keeps their output open: the copy is done when the
    tool exits, and waiting for its output would end in a timeout and a false fallback."""
    from localspec.tui.clipboard import copy_text

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "xclip"
    tool.write_text('#!/bin/sh\ncat > "$CLIP_OUT"\n( sleep 5 ) &\nexit 0\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("CLIP_OUT", str(tmp_path / "clip.txt"))
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    sent: list[str] = []
    said = copy_text("print(1)\n", sent.append, "code block 1 of 1")
    assert said == "code block 1 of 1 copied to the clipboard"
    assert (tmp_path / "clip.txt").read_text() == "print(1)\n"
    assert not sent and not (tmp_path / "data").exists()  # no fallback was needed
