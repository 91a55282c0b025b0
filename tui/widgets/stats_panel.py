"""The live statistics panel: speed, tau, acceptance per draft position, time split, A/B."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

BAR = 16


def bar(fraction: float, width: int = BAR) -> str:
    n = max(0, min(width, round(fraction * width)))
    return "█" * n + "·" * (width - n)


class StatsPanel(Static):
    """Fed with a stats snapshot (Stats.as_dict() plus what the app knows) while replying."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.snapshot: dict[str, Any] = {}

    def show(self, snap: dict[str, Any]) -> None:
        self.snapshot = snap
        self.update(self.render_stats(snap))

    @staticmethod
    def render_stats(s: dict[str, Any]) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column(no_wrap=True)
        mode = s.get("mode", "")
        t.add_row("mode", Text(mode, style="bold"))
        t.add_row("drafter", Text(s.get("drafter", "none"), overflow="ellipsis"))
        t.add_row("k", str(s.get("k", "-")))
        if s.get("shape"):
            t.add_row("shapes", Text(s["shape"], overflow="fold"))
        t.add_row("tokens/s", f"{s.get('tokens_per_s', 0.0):.1f}")
        if s.get("predicted_tokens_per_s"):
            t.add_row("predicted", f"{s['predicted_tokens_per_s']:.1f} (cost model)")
        t.add_row("tau", f"{s.get('tau', 0.0):.2f}")
        t.add_row("accepted", f"{s.get('accepted', 0)} / {s.get('drafted', 0)} drafted")
        rate = s.get("acceptance_rate", 0.0)
        t.add_row("accept %", f"{100 * rate:.0f}%")
        for i, a in enumerate(s.get("acceptance_at", [])[:12]):
            t.add_row(f"  pos {i + 1}", f"{bar(a)} {100 * a:3.0f}%")
        tt, td, tg = s.get("t_target", 0.0), s.get("t_draft", 0.0), s.get("t_glue", 0.0)
        total = tt + td + tg
        if total > 0:
            t.add_row(
                "time",
                f"target {100 * tt / total:.0f}% draft {100 * td / total:.0f}% "
                f"glue {100 * tg / total:.0f}%",
            )
        speedup = s.get("speedup")
        t.add_row("vs plain", f"{speedup:.2f}x" if speedup else "no plain reply yet")
        return t
