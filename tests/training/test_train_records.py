"""Training data from imperfect sources: every kind of unusable record is skipped and counted by
reason, in both modes (generated replies and --no-generate) and every file shape, and what is
used is exactly the part of the record that mode reads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import tinymodels as tm

pytest.importorskip("torch")

from localspec import load  # noqa: E402
from localspec.cli import main  # noqa: E402
from localspec.datasets import records  # noqa: E402
from localspec.errors import LocalspecError  # noqa: E402
from localspec.training import DataReport, FeatureConfig, TrainConfig, train  # noqa: E402
from localspec.training.data import build_features  # noqa: E402
from localspec.training.features import Manifest, load_sequences  # noqa: E402

TAPS = (1, 2, 3)
# like Gemma's and Mistral's templates: no system role, user and assistant must alternate
STRICT = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LONG = "abc defg hij " * 50  # about 600 tokens: longer than a prompt or a sequence may be
U, A, S = "user", "assistant", "system"
GOOD = [[(U, "hello there"), (A, "hi, how can I help")], [(U, "abc de"), (A, "fgh ij")]]
SHAREGPT_ROLE = {U: "human", A: "gpt"}


@dataclass
class Case:
    record: object  # turns as (role, content) pairs, a raw JSON value, or a raw line
    fmt: str  # sharegpt (JSON array), openai (JSON array), jsonl, text
    generate: object  # what the generating mode makes of it: a reason, or the turns it uses
    replies: object  # the same for --no-generate
    strict: bool = False  # on a target whose chat template refuses some conversations
    trimmed: bool = False  # used after dropping leading turns


CASES = {
    "opens with the assistant (ShareGPT)": Case(
        [(A, "lead"), (U, "q one"), (A, "r one")],
        "sharegpt",
        [(U, "q one")],
        [(U, "q one"), (A, "r one")],
        trimmed=True,
    ),
    "opens with the assistant, no reply after": Case(
        [(A, "lead"), (U, "q one")], "jsonl", [(U, "q one")], "no assistant turn", trimmed=True
    ),
    "assistant only": Case([(A, "r")], "sharegpt", "no user turn", "no user turn"),
    "no user turn": Case([(S, "be nice"), (A, "r")], "openai", "no user turn", "no user turn"),
    "empty conversation": Case([], "sharegpt", "no user turn", "no user turn"),
    "no assistant turn": Case([(U, "q one")], "jsonl", [(U, "q one")], "no assistant turn"),
    "empty user turn": Case([(U, "  \n"), (A, "r")], "openai", "empty turn", "empty turn"),
    "empty reply": Case([(U, "q one"), (A, "")], "jsonl", [(U, "q one")], "empty turn"),
    "unknown role": Case(
        [(U, "q one"), ("tool", "t"), (A, "r")], "jsonl", [(U, "q one")], "unknown role"
    ),
    "unknown role before the user": Case(
        [("function", "t"), (S, "sys"), (U, "q one"), (A, "r")],
        "sharegpt",
        [(S, "sys"), (U, "q one")],
        [(S, "sys"), (U, "q one"), (A, "r")],
        trimmed=True,
    ),
    "not a conversation": Case(
        {"prompt": "x"}, "jsonl", "not a conversation", "not a conversation"
    ),
    "a message that is not an object": Case(
        {"messages": ["hi"]}, "openai", "not a conversation", "not a conversation"
    ),
    "not JSON": Case(
        '{"messages": [{"role": "us', "jsonl", "not a conversation", "not a conversation"
    ),
    "template refuses the system role": Case(
        [(S, "sys"), (U, "q one"), (A, "r")],
        "jsonl",
        "template refused",
        "template refused",
        strict=True,
    ),
    "template refuses two user turns": Case(
        [(U, "q one"), (U, "q two"), (A, "r")],
        "jsonl",
        [(U, "q one")],
        "template refused",
        strict=True,
    ),
    "prompt too long": Case([(U, LONG), (A, "r")], "openai", "prompt too long", "prompt too long"),
    "text too short": Case("ab", "text", [(U, "ab")], "too short"),
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    chatml = tm.write_target(str(d / "chatml.gguf"), seed=2)
    strict = tm.write_target(str(d / "strict.gguf"), seed=2, chat_template=STRICT)
    eng = load(chatml, draft=False, n_ctx=512, n_threads=1)
    yield {"chatml": chatml, "strict": strict, "tok": eng.tokenize}
    eng.close()


def _turns(record: object, fmt: str) -> object:
    if not isinstance(record, list):
        return record
    if fmt == "sharegpt":
        return {"conversations": [{"from": SHAREGPT_ROLE.get(r, r), "value": c} for r, c in record]}
    return {"messages": [{"role": r, "content": c} for r, c in record]}


def _write(path: Path, fmt: str, recs: list[object]) -> str:
    """recs in the file shape fmt (GOOD records around the case's record)."""
    if fmt == "text":
        path = path.with_suffix(".txt")
        path.write_text("\n\n".join(str(r) for r in recs) + "\n")
        return str(path)
    objs = [_turns(r, fmt) for r in recs]
    if fmt == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs))
    else:
        path = path.with_suffix(".json")
        path.write_text(json.dumps(objs))
    return str(path)


def _chatml(turns: list[tuple[str, str]], *, open_turn: bool = True) -> str:
    """The tiny targets' template written out: the reference for what must be rendered
    (open_turn: the assistant header a prompt ends with; a finished conversation has none)."""
    body = "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns)
    return body + ("<|im_start|>assistant\n" if open_turn else "")


def _fcfg(generate: bool, **kw) -> FeatureConfig:
    base = dict(taps=TAPS, generate=generate, max_prompt=64, max_new=4, n_parallel=2)
    base.update(max_tokens=20_000)
    base.update(kw)
    return FeatureConfig(**base)


def _run(target: str, data: str, folder: str, generate: bool, **kw) -> Manifest:
    return build_features(target, records(data), folder, _fcfg(generate, **kw), n_threads=1)


def _expected(tok, used: list[list[tuple[str, str]]], generate: bool, text: bool) -> set:
    """(tokens, loss start) of every used record, made from the reference rendering."""
    out = set()
    for turns in used:
        if generate:  # up to the first user turn
            upto = next(i for i, (r, _) in enumerate(turns) if r == U)
            prompt = tok(_chatml(turns[: upto + 1]), parse_special=True)
            out.add((tuple(prompt), len(prompt)))
        elif text:
            out.add((tuple(tok(turns[0][1])), 0))
        else:
            first = next(i for i, (r, _) in enumerate(turns) if r == A)
            head = tok(_chatml(turns[:first]), parse_special=True)
            whole = tok(_chatml(turns, open_turn=False), parse_special=True)
            out.add((tuple(whole), len(head)))
    return out


@pytest.mark.parametrize("generate", [True, False], ids=["generate", "no-generate"])
@pytest.mark.parametrize("name", list(CASES))
def test_unusable_record_is_skipped_and_counted(targets, tmp_path, name, generate):
    case = CASES[name]
    goods: list = ["hello there", "abc de fgh"] if case.fmt == "text" else GOOD
    data = _write(tmp_path / "data", case.fmt, [goods[0], case.record, goods[1]])
    target = targets["strict" if case.strict else "chatml"]
    m = _run(target, data, str(tmp_path / "out"), generate)
    outcome = case.generate if generate else case.replies
    used = [[(U, g)] if isinstance(g, str) else g for g in goods]
    if isinstance(outcome, str):
        want = DataReport(used=2, skipped={outcome: 1})
    else:
        want = DataReport(used=3, trimmed=int(case.trimmed))
        used.append(outcome)
    assert m.report() == want
    assert sorted(m.done) == [0, 1, 2]  # every record is done: a resumed run skips them all
    seqs = load_sequences(str(tmp_path / "out"))
    tok = targets["tok"]
    if generate:  # the prompts, exactly; the target wrote the rest
        got = {(tuple(int(t) for t in s.tokens[: s.loss_start]), s.loss_start) for s in seqs}
    else:  # the data's own text, with the loss from its first reply on
        got = {(tuple(int(t) for t in s.tokens), s.loss_start) for s in seqs}
    assert got == _expected(tok, used, generate, case.fmt == "text")


def test_resumed_run_counts_each_record_once(targets, tmp_path):
    """A run stopped early and resumed reports what one uninterrupted run reports."""
    recs = []
    for i in range(12):
        recs += [[(A, "lead"), (U, f"q {i}"), (A, f"r {i}")], [(U, f"q {i}")], GOOD[i % 2]]
    data = _write(tmp_path / "mixed", "jsonl", recs)
    whole = _run(targets["chatml"], data, str(tmp_path / "whole"), False)
    assert whole.report() == DataReport(used=24, trimmed=12, skipped={"no assistant turn": 12})
    part = str(tmp_path / "part")
    first = _run(targets["chatml"], data, part, False, max_tokens=150, shard_tokens=64)
    assert 0 < first.used < 24
    again = _run(targets["chatml"], data, part, False, shard_tokens=64)
    assert again.report() == whole.report()
    assert again.n_tokens == whole.n_tokens


@pytest.mark.parametrize("generate", [True, False], ids=["generate", "no-generate"])
def test_an_interrupted_run_keeps_its_finished_sequences(targets, tmp_path, generate):
    """Ctrl-C (or kill) while making data writes the finished sequences still waiting for a
    shard, so the work is not lost; resumed, the run ends with what one unbroken run makes."""
    recs = [GOOD[i % 2] for i in range(10)] + [[(U, f"q {i}")] for i in range(10)]
    data = _write(tmp_path / "many", "jsonl", recs)
    whole = _run(targets["chatml"], data, str(tmp_path / "whole"), generate)
    part = str(tmp_path / "part")
    rows: list[int] = []

    def stop_after_3(n: int, report: DataReport) -> None:
        rows.append(n)
        if sum(1 for r in rows if r) == 3:
            raise KeyboardInterrupt

    big = {"shard_tokens": 1 << 30}  # no shard would be written before the end
    with pytest.raises(KeyboardInterrupt):
        build_features(targets["chatml"], records(data), part, _fcfg(generate, **big),
                       n_threads=1, progress=stop_after_3)  # fmt: skip
    kept = Manifest.load(part)
    assert kept is not None and kept.used == 3 and kept.n_tokens == sum(rows)
    assert len(load_sequences(part)) == 3 and kept.complete_for == 0
    again = _run(targets["chatml"], data, part, generate, **big)
    assert again.report() == whole.report()
    assert again.n_tokens == whole.n_tokens
    assert sorted(again.done) == sorted(whole.done)


def test_train_reports_counts_on_progress_log_and_result(targets, tmp_path, capsys):
    recs = [
        GOOD[0],
        [(A, "lead"), (U, "q"), (A, "r")],
        [(U, "q")],
        [],
        GOOD[1],
        [(U, ""), (A, "r")],
    ]
    data = _write(tmp_path / "mixed", "sharegpt", recs)
    logs: list[str] = []
    res = train(
        targets["chatml"],
        [data],
        str(tmp_path / "run"),
        config=TrainConfig(max_steps=1, window=8, batch_tokens=16, draft_vocab=64),
        features=_fcfg(False),
        taps=TAPS,
        log=logs.append,
    )
    want = DataReport(
        used=3, trimmed=1, skipped={"no assistant turn": 1, "no user turn": 1, "empty turn": 1}
    )
    assert res.data == want and res.steps == 1
    line = "data: 3 records used (1 with leading turns dropped), 3 skipped: "
    assert f"{line}1 empty turn, 1 no assistant turn, 1 no user turn" in logs
    bars = capsys.readouterr().err
    assert "features" in bars and str(want) in bars  # the progress line's postfix
    # resuming a finished run reports the same counts, read from the data folder
    res = train(
        targets["chatml"],
        [data],
        str(tmp_path / "run"),
        config=TrainConfig(max_steps=2, window=8, batch_tokens=16, draft_vocab=64),
        features=_fcfg(False),
        taps=TAPS,
        log=logs.append,
        show_progress=False,
    )
    assert res.data == want and res.steps == 2


def test_nothing_usable_is_one_clear_error(targets, tmp_path, capsys):
    data = _write(tmp_path / "bad", "jsonl", [[(U, "q")], [(A, "r")], [(U, "q two")]])
    with pytest.raises(LocalspecError, match="no record .* can be used: 0 records used, 3 skipped"):
        _run(targets["chatml"], data, str(tmp_path / "a"), False)
    out = str(tmp_path / "b")
    rc = main(
        ["train", targets["chatml"], "--data", data, "-o", out, "--no-generate", "--taps", "1,2,3"]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "localspec: error: no record of the training data can be used" in err
    assert "2 no assistant turn, 1 no user turn" in err
    assert not os.path.exists(os.path.join(out, "checkpoint"))
