"""The live statistics panel: speed, tau, acceptance per draft position and per draft source,
prompt reuse, A/B."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ..summaries import prompt_summary
from ..tint import tint_styles

BAR = 16


def bar(fraction: float, width: int = BAR) -> str:
    n = max(0, min(width, round(fraction * width)))
    return "█" * n + "·" * (width - n)


class StatsPanel(Static):
    """Fed with a stats snapshot (Stats.as_dict() plus what the app knows) while replying;
    the app refreshes it a few times a second, not per token."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.snapshot: dict[str, Any] = {}

    def show(self, snap: dict[str, Any]) -> None:
        self.snapshot = snap
        self.update(self.render_stats(snap, tint_styles(self.app.current_theme)))

    @staticmethod
    def render_stats(s: dict[str, Any], styles: dict[str, str] | None = None) -> Table:
        """The panel's rows; styles: each draft source's tint (its label in the per-source
        rows is drawn in it, so the panel is the tint's legend too)."""
        styles = styles or tint_styles()
        rows: list[tuple[str | Text, str | Text]] = [
            ("mode", Text(s.get("mode", ""), style="bold")),
            ("drafter", s.get("drafter", "none")),
            ("k", str(s.get("k", "-"))),
        ]
        if s.get("source"):
            rows.append(("source", s["source"]))
        if s.get("shape"):
            rows.append(("shapes", Text(s["shape"], overflow="fold")))
        rows.append(("tokens/s", f"{s.get('tokens_per_s', 0.0):.1f}"))
        if s.get("predicted_speedup"):
            rows.append(("expected", f"{s['predicted_speedup']:.2f}x plain (auto)"))
        auto = s.get("auto")
        if auto:  # why auto runs what it runs, in its cost model's numbers
            rows.append(("why", Text(auto["brief"], overflow="fold")))
        rows += [("note", Text(n, overflow="fold")) for n in s.get("notes", [])]
        if s.get("drafted"):
            rows += [
                ("tau", f"{s.get('tau', 0.0):.2f}"),
                ("accepted", f"{s.get('accepted', 0)} / {s['drafted']} drafted"),
                ("accept %", f"{100 * s.get('acceptance_rate', 0.0):.0f}%"),
            ]
        else:  # "0% accepted" would read as a broken drafter: nothing was drafted
            rows.append(
                ("accepted", "nothing drafted" + (" (plain steps)" if s.get("steps") else ""))
            )
        for name, x in sorted((s.get("sources") or {}).items()):  # who drafted, in its tint
            rows.append(
                (
                    Text(name, style=styles.get(name, "")),
                    f"{x['accepted']}/{x['drafted']} ({100 * x['acceptance_rate']:.0f}%), "
                    f"tau {x['tau']:.2f}",
                )
            )
        for i, a in enumerate(s.get("acceptance_at", [])[:12]):
            rows.append((f"  pos {i + 1}", f"{bar(a)} {100 * a:3.0f}%"))
        if s.get("ttft") is not None:
            rows.append(("1st token", f"{s['ttft']:.2f} s"))
        if s.get("restored"):
            rows.append(("reopened", f"{s['restored']} tokens of KV state from disk"))
        if "prompt_tokens" in s:
            rows.append(("prompt", prompt_summary(s)))
            rows.append(("prefill", f"{s.get('t_prefill', 0.0):.2f} s"))
        tt, td, tg = s.get("t_target", 0.0), s.get("t_draft", 0.0), s.get("t_glue", 0.0)
        total = tt + td + tg
        if total > 0:
            rows.append(
                (
                    "time",
                    f"target {100 * tt / total:.0f}% draft {100 * td / total:.0f}% "
                    f"glue {100 * tg / total:.0f}%",
                )
            )
        speedup = s.get("speedup")
        rows.append(("vs plain", f"{speedup:.2f}x" if speedup else "no plain reply yet"))
        # labels keep their width; a value too long for the panel ends in an ellipsis
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True, min_width=max(len(label) for label, _ in rows))
        t.add_column(ratio=1)
        for label, value in rows:
            if isinstance(value, str):
                value = Text(value)
            if isinstance(label, str):
                label = Text(label)
            if value.overflow != "fold":
                value.overflow, value.no_wrap = "ellipsis", True
            t.add_row(label, value)
        return t
