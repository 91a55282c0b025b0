"""Short texts made from a reply's statistics snapshot: the reply footer, the prompt reuse,
a prompt's edits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import Turn


def prompt_summary(s: dict[str, Any]) -> str:
    """Prompt tokens split into processed and reused from the cache: '12 new + 40 reused'."""
    total, cached = s.get("prompt_tokens", 0), s.get("cached_tokens", 0)
    return f"{total - cached} new + {cached} reused"


def prompt_footer(turn: Turn) -> str:
    """Under a prompt that was edited: which edit this is (/branch N switches)."""
    if turn.prompt_versions <= 1:
        return ""
    return f"edit {turn.prompt_version}/{turn.prompt_versions}"


def reply_footer(s: dict[str, Any], turn: Turn | None = None, *, last: bool = False) -> str:
    """One line under a reply; also rebuilt from the stats saved with a reopened reply. turn:
    the reply's versions (retries), shown when there are several (last: the keys that step
    through them, which act on the last reply)."""
    parts = [
        f"{s.get('generated', 0)} tokens",
        f"{s.get('tokens_per_s', 0.0):.1f} tok/s",
        f"tau {s.get('tau', 0.0):.2f}",
        f"{100 * s.get('acceptance_rate', 0.0):.0f}% accepted",
        s.get("mode", ""),
    ]
    if s.get("ttft") is not None:
        parts.append(f"first token {s['ttft']:.2f} s")
    if s.get("restored"):
        parts.append(f"KV state of {s['restored']} tokens restored from disk")
    if "prompt_tokens" in s:
        parts.append(f"prompt {prompt_summary(s)}, prefill {s.get('t_prefill', 0.0):.2f} s")
    if s.get("calibration_s"):
        parts.append(f"timed this machine first ({s['calibration_s']:.1f} s, once)")
    if s.get("stopped"):
        parts.append("stopped")
    elif s.get("finish_reason") == "context_full":
        parts.append("context full")
    elif s.get("finish_reason") == "length":  # cut by max tokens (-n), not ended by the model
        parts.append("length")
    if turn is not None and turn.reply_versions > 1:
        keys = " (f2/f3)" if last else ""
        parts.append(f"version {turn.reply_version}/{turn.reply_versions}{keys}")
    return " · ".join(p for p in parts if p)
