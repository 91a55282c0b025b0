"""Short texts made from a reply's statistics snapshot: the reply footer, the prompt reuse."""

from __future__ import annotations

from typing import Any


def prompt_summary(s: dict[str, Any]) -> str:
    """Prompt tokens split into processed and reused from the cache: '12 new + 40 reused'."""
    total, cached = s.get("prompt_tokens", 0), s.get("cached_tokens", 0)
    return f"{total - cached} new + {cached} reused"


def reply_footer(s: dict[str, Any]) -> str:
    """One line under a reply; also rebuilt from the stats saved with a reopened reply."""
    parts = [
        f"{s.get('generated', 0)} tokens",
        f"{s.get('tokens_per_s', 0.0):.1f} tok/s",
        f"tau {s.get('tau', 0.0):.2f}",
        f"{100 * s.get('acceptance_rate', 0.0):.0f}% accepted",
        s.get("mode", ""),
    ]
    if "prompt_tokens" in s:
        parts.append(f"prompt {prompt_summary(s)}, prefill {s.get('t_prefill', 0.0):.2f} s")
    if s.get("stopped"):
        parts.append("stopped")
    elif s.get("finish_reason") == "context_full":
        parts.append("context full")
    return " · ".join(p for p in parts if p)
