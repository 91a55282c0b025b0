"""The copy-heavy prompt set (`localspec bench --prompts copy`): shipped, loadable, all four kinds,
and small enough that history, prompt and reply fit a 4k context."""

from __future__ import annotations

import importlib.resources
import json

import pytest

import localspec
from localspec import bench

KINDS = ("code-", "text-", "json-", "chat-")
MAX_PROMPT_TOKENS = 3000  # measured turn plus history, estimated high at 3.5 characters a token


def test_copy_set_ships_with_the_package() -> None:
    # package-data in pyproject.toml puts localspec/data/*.jsonl into the wheel
    res = importlib.resources.files("localspec") / "data" / bench.COPY_SET
    assert res.is_file()
    lines = [ln for ln in res.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert all(isinstance(json.loads(ln), dict) for ln in lines)


def test_copy_set_loads_by_name() -> None:
    assert "copy" in bench.NAMED_SETS
    prompts = bench.load_prompt_set("copy", None)
    assert len(prompts) >= 12
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids)
    for kind in KINDS:
        assert sum(i.startswith(kind) for i in ids) >= 3, kind
    assert all(i.startswith(KINDS) for i in ids)
    assert [p.id for p in bench.load_prompt_set("copy", 2)] == ids[:2]


def test_copy_set_prompts_fit_the_context() -> None:
    for p in bench.load_prompt_set("copy", None):
        assert p.turns and all(t.strip() for t in p.turns), p.id
        chars = sum(len(m["content"]) for m in p.history) + sum(len(t) for t in p.turns)
        assert chars / 3.5 <= MAX_PROMPT_TOKENS, p.id


def test_chat_records_carry_an_earlier_answer() -> None:
    chats = [p for p in bench.load_prompt_set("copy", None) if p.id.startswith("chat-")]
    for p in chats:
        roles = [m["role"] for m in p.history]
        assert roles[-1] == "assistant" and "user" in roles, p.id
        assert len(p.history[-1]["content"]) > 400, p.id  # a long answer to be repeated
    others = [p for p in bench.load_prompt_set("copy", None) if not p.id.startswith("chat-")]
    assert all(not p.history for p in others)


def test_bench_records_read_history_and_ids() -> None:
    text = "\n".join(
        [
            json.dumps({"id": "a", "prompt": "again, shorter"}),
            "",
            json.dumps(
                {
                    "history": [
                        {"role": "user", "content": "q"},
                        {"role": "assistant", "content": "long answer"},
                    ],
                    "turns": ["repeat it", "and once more"],
                }
            ),
        ]
    )
    a, b = bench.bench_records(text, "src.jsonl")
    assert (a.id, a.turns, a.history) == ("a", ["again, shorter"], [])
    assert b.id == "src.jsonl-1" and b.turns == ["repeat it", "and once more"]
    assert [m["role"] for m in b.history] == ["user", "assistant"]
    for bad, why in (
        ('{"prompt": "x", "history": [{"role": "bot", "content": "y"}]}', "history"),
        ('{"prompt": "x", "history": "y"}', "history"),
        ('{"turns": [1]}', "strings"),
        ("[1]", "expected an object"),
        ("{oops", "not JSON"),
    ):
        with pytest.raises(localspec.LocalspecError, match=f"^src.jsonl:1: .*{why}"):
            bench.bench_records(bad, "src.jsonl")


def test_wide_copy_set_loads_by_name_with_two_turn_edits() -> None:
    assert "copy-wide" in bench.NAMED_SETS
    prompts = bench.load_prompt_set("copy-wide", None)
    assert len(prompts) >= 16
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids)
    for kind in ("short-", "mid-", "long-", "multi-"):
        assert sum(i.startswith(kind) for i in ids) >= 4, kind
    multi = [p for p in prompts if p.id.startswith("multi-")]
    assert all(len(p.turns) == 2 for p in multi)  # the second turn edits the model's own answer
    for p in prompts:
        assert p.turns and all(t.strip() for t in p.turns), p.id
        assert sum(len(t) for t in p.turns) / 3.5 <= MAX_PROMPT_TOKENS, p.id
