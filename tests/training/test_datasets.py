"""Training text sources and benchmark prompt sets."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from localspec import datasets as D
from localspec.errors import LocalspecError


def test_sharegpt_shape_and_truncated_tail(tmp_path) -> None:
    recs = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}],
        },
        {
            "id": "b",
            "conversations": [
                {"from": "system", "value": "Be kind."},
                {"from": "human", "value": "Q"},
                {"from": "gpt", "value": "A"},
            ],
        },
    ]
    text = json.dumps(recs)
    p = tmp_path / "sg.json"
    p.write_text(text[:-1] + ', {"id": "c", "conversations": [{"from": "hu')  # cut mid-record
    convs = list(D.load_conversations(str(p)))
    assert convs == [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"},
        ],
    ]


def test_openai_jsonl_and_gzip(tmp_path) -> None:
    lines = [
        {
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"a{i}"},
            ]
        }
        for i in range(3)
    ]
    p = tmp_path / "oa.jsonl.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("\n".join(json.dumps(x) for x in lines))
    convs = list(D.load_conversations(str(p)))
    assert len(convs) == 3 and convs[2][1] == {"role": "assistant", "content": "a2"}


def test_plain_text(tmp_path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("First paragraph.\n\nSecond one\nstill second.\n\n\n")
    assert [c[0]["content"] for c in D.load_conversations(str(p))] == [
        "First paragraph.",
        "Second one\nstill second.",
    ]


def test_bad_files(tmp_path) -> None:
    with pytest.raises(LocalspecError, match="no such data file"):
        list(D.load_conversations(str(tmp_path / "x.json")))
    p = tmp_path / "n.json"
    p.write_text('{"not": "an array"}')
    with pytest.raises(LocalspecError, match="expected a JSON array"):
        list(D.load_conversations(str(p)))
    p.write_text('[{"foo": 1}]')
    with pytest.raises(LocalspecError, match="no conversations"):
        list(D.load_conversations(str(p)))
    q = tmp_path / "p.jsonl"
    q.write_text('{"prompt": "a"}\n{"turns": ["b", "c"]}\n')
    assert D.jsonl_prompts(str(q)) == [["a"], ["b", "c"]]
    q.write_text('{"nope": 1}\n')
    with pytest.raises(LocalspecError, match=":1:"):
        D.jsonl_prompts(str(q))


def test_prompt_sets_from_packages() -> None:
    try:
        mt = D.mtbench_questions()
        he = D.humaneval_prompts()
    except LocalspecError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the prompt-set packages: {exc}")
        pytest.skip(str(exc))
    assert len(mt) == 80 and all(len(q) == 2 for q in mt)
    assert len(he) == 164 and he[0].lstrip().startswith(("from", "def", "import"))


def test_sharegpt_package_parses_record_by_record() -> None:
    try:
        path = D.sharegpt_path()
    except LocalspecError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the prompt-set packages: {exc}")
        pytest.skip(str(exc))
    n = sum(1 for _ in D.load_conversations(path))
    assert n > 15_000


def test_every_record_is_read_and_judged_per_mode(tmp_path) -> None:
    """read_records yields every record (so each can be counted), and `usable` keeps what a
    mode reads: the prompt when the target replies, the conversation when its replies train."""
    lines = [
        {"conversations": [{"from": "gpt", "value": "lead"}, {"from": "human", "value": "q"}]},
        "not json",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                        {"type": "text", "text": "b"},
                    ],
                },
                {"role": "assistant", "content": None, "tool_calls": []},
            ]
        },
        {"messages": [{"role": "Tool", "content": "t"}]},
    ]
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    recs = list(D.read_records(str(p)))
    assert [r.chat for r in recs] == [True, False, True, True]
    assert recs[2].turns == [
        {"role": "user", "content": "ab"},  # OpenAI's content parts: the text ones
        {"role": "assistant", "content": ""},  # a tool call carries no text
    ]
    assert recs[3].turns == [{"role": "tool", "content": "t"}]  # kept, to be named and counted
    assert D.usable(recs[0], replies=False) == ([{"role": "user", "content": "q"}], True)
    for replies, reason in ((False, D.NOT_CHAT), (True, D.NOT_CHAT)):
        with pytest.raises(D.Unusable, match=reason):
            D.usable(recs[1], replies=replies)
    with pytest.raises(D.Unusable, match=D.NO_ASSISTANT):
        D.usable(recs[0], replies=True)
    assert D.usable(recs[2], replies=False) == ([{"role": "user", "content": "ab"}], False)
    with pytest.raises(D.Unusable, match=D.EMPTY_TURN):
        D.usable(recs[2], replies=True)
    with pytest.raises(D.Unusable, match=D.NO_USER):
        D.usable(recs[3], replies=False)
    # the conversations view (benchmarks) keeps known turns only, and passes over the rest
    assert list(D.load_conversations(str(p))) == [
        [{"role": "assistant", "content": "lead"}, {"role": "user", "content": "q"}],
        [{"role": "user", "content": "ab"}, {"role": "assistant", "content": ""}],
    ]
