"""A small chart of tau and tokens/s across the replies of this session."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline


class HistoryChart(Vertical):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.taus: list[float] = []
        self.speeds: list[float] = []

    def compose(self) -> ComposeResult:
        yield Label("tau per reply", classes="chart-label", id="tau-label")
        yield Sparkline([], id="tau-line")
        yield Label("tokens/s per reply", classes="chart-label", id="tps-label")
        yield Sparkline([], id="tps-line")

    def add(self, tau: float, tokens_per_s: float) -> None:
        self.taus.append(tau)
        self.speeds.append(tokens_per_s)
        self.query_one("#tau-line", Sparkline).data = list(self.taus)
        self.query_one("#tps-line", Sparkline).data = list(self.speeds)
        self.query_one("#tau-label", Label).update(f"tau per reply (last {tau:.2f})")
        self.query_one("#tps-label", Label).update(f"tokens/s per reply (last {tokens_per_s:.1f})")
