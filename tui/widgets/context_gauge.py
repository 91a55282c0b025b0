"""One line under the prompt: how full the context window is, and who fills it."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

WIDTH = 12  # cells of the bar


class ContextGauge(Static):
    """tokens used / context size, the system prompt's share and the history's, and how many
    old turns the rolling window has left out."""

    def __init__(self, **kw: object) -> None:
        super().__init__("", **kw)  # type: ignore[arg-type]
        self.used = self.n_ctx = self.system = 0
        self.outside = 0  # turns no longer sent (the rolling window dropped them)

    def show(self, used: int, n_ctx: int, system: int, *, outside: int = 0) -> None:
        self.used, self.n_ctx, self.system, self.outside = used, n_ctx, system, outside
        self.update(self.line())

    def line(self) -> Text:
        if self.n_ctx <= 0:
            return Text("context: no model loaded", style="dim")
        used, n, system = self.used, self.n_ctx, min(self.system, self.used)
        cells_sys = round(WIDTH * system / n)
        cells_all = max(cells_sys, min(WIDTH, round(WIDTH * used / n)))
        full = used / n
        style = "bold red" if full >= 0.9 else "bold yellow" if full >= 0.75 else "bold"
        out = Text("context ", style="dim")
        out.append("█" * cells_sys, style="magenta")
        out.append("█" * (cells_all - cells_sys), style="cyan")
        out.append("·" * (WIDTH - cells_all), style="dim")
        out.append(f" {used:,}/{n:,} ({100 * full:.0f}%)", style=style)
        out.append(f" · system {system:,} · history {used - system:,}", style="dim")
        if self.outside:
            s = "s" if self.outside > 1 else ""
            out.append(f" · {self.outside} old turn{s} outside", style="dim italic")
        out.no_wrap, out.overflow = True, "ellipsis"
        return out
