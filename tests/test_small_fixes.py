"""Issue 21: a character cut by the end of generation, quantized KV caches without flash
attention, bench prompt files that do not exist, `localspec chat` without a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import localspec
from localspec.bench import load_prompt_set
from localspec.cli import main
from localspec.text.textstream import TextStream, decode_text

import tinymodels as tm

# --- UTF-8 at the end of generation ----------------------------------------------------------

SNAKE = "🐍".encode()  # F0 9F 90 8D


def _stream(pieces: list[bytes], stops: list[str] | None = None) -> tuple[str, str]:
    """What a generation shows: the text taken after each piece, then the final take."""
    ts = TextStream(stops or [])
    shown = ""
    for p in pieces:
        ts.feed(p)
        shown += ts.take(final=False)
    return shown, ts.take(final=True)


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_character_cut_at_the_end_is_dropped(cut: int) -> None:
    shown, last = _stream([b"ok ", SNAKE, *[SNAKE[i : i + 1] for i in range(cut)]])
    assert shown + last == "ok 🐍"
    for lead in (b"\xc3", b"\xe6\x97", b"\xe0", b"\xed\x9f", b"\xf4\x8f"):  # all could complete
        assert "".join(_stream([b"a", lead])) == "a"


def test_malformed_bytes_still_read_as_replacement_characters() -> None:
    # generated U+FFFD, a lone continuation byte, a lead cut short by ASCII: all in the middle
    middle = [b"\xef\xbf\xbd", b"\x80", b"\xe6", b"A"]
    assert "".join(_stream(middle)) == "\ufffd\ufffd\ufffdA"
    # at the end, bytes no continuation makes valid are malformed, not cut: still U+FFFD
    assert "".join(_stream([b"a", b"\x80"])) == "a\ufffd"
    assert "".join(_stream([b"a", b"\xff"])) == "a\ufffd"
    assert "".join(_stream([b"a", b"\xed\xa0"])) == "a\ufffd\ufffd"  # an encoded surrogate
    assert "".join(_stream([b"a", b"\xf4\x90"])) == "a\ufffd\ufffd"  # past U+10FFFF


def test_decode_text_is_what_the_events_add_up_to() -> None:
    data = b"ok " + SNAKE + b"\x80" + "日".encode() + SNAKE[:3]
    assert decode_text(data) == "".join(_stream([data[i : i + 1] for i in range(len(data))]))
    assert decode_text(data) == "ok 🐍\ufffd日"


def test_a_stop_string_and_a_held_back_tail_are_unchanged() -> None:
    assert "".join(_stream([b"ab", b"<", SNAKE[:1]], stops=["<end>"])) == "ab<"
    ts = TextStream(["<end>"])
    assert ts.feed(b"x" + SNAKE + b"<end>" + SNAKE[:2])
    assert ts.take(final=False) == "x🐍"


def _write_bigram_target(path: str, chain: bytes) -> str:
    """A target that says ``chain`` byte by byte after chain[-1], and then again: one-hot
    embeddings, layers that add nothing, a head mapping each byte to the next (the agreeing
    pair's counter with another successor table). The bytes of ``chain`` must differ."""
    assert len(set(chain)) == len(chain)
    d = tm.AGREE_EMBD
    head = np.zeros((tm.N_VOCAB, d), dtype=np.float32)
    for a, b in zip(chain[-1:] + chain[:-1], chain, strict=True):
        head[b, a] = 4.0  # byte tokens come first in the vocabulary, in byte order
    ts = tm.TargetShape(n_embd=d, n_layer=2, n_head=4, n_head_kv=4, n_ff=32)
    weights = {"token_embd.weight": np.eye(tm.N_VOCAB, d, dtype=np.float32), "output.weight": head}
    for i in range(ts.n_layer):
        weights[f"blk.{i}.attn_output.weight"] = np.zeros((d, d), dtype=np.float32)
        weights[f"blk.{i}.ffn_down.weight"] = np.zeros((d, ts.n_ff), dtype=np.float32)
    return tm.write_target(path, ts, weights=weights)


# 日 (E6 97 A5), a lone continuation byte, a lead cut short by "A", 🎉 (F0 9F 8E 89), "x"
CHAIN = "日".encode() + b"\x80\xe5A" + "🎉".encode() + b"x"
CYCLE = "日\ufffd\ufffdA🎉x"  # its text: the malformed bytes in the middle read as U+FFFD
# the text of CHAIN's first r bytes: a character they cut is dropped, malformed bytes are not
PARTIAL = (
    ["", "", "", "日", "日\ufffd", "日\ufffd"] + ["日\ufffd\ufffdA"] * 4 + ["日\ufffd\ufffdA🎉"]
)


def _text_of(n_tokens: int) -> str:
    return CYCLE * (n_tokens // len(CHAIN)) + PARTIAL[n_tokens % len(CHAIN)]


@pytest.fixture(scope="module")
def bigram(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write_bigram_target(str(tmp_path_factory.mktemp("bigram") / "bigram.gguf"), CHAIN)


def test_max_tokens_never_ends_in_half_a_character(bigram: str) -> None:
    """Each token of the tiny target is one byte, so max_tokens cuts characters anywhere."""
    with localspec.load(bigram, draft=False, n_threads=1, n_ctx=256) as eng:
        for n in range(1, 2 * len(CHAIN) + 1):
            out = eng.complete("x", max_tokens=n)
            assert bytes(out.tokens) == (CHAIN * 2)[:n]  # the cut tokens are still there
            assert (out.text, out.finish_reason) == (_text_of(n), "length"), n
            events = list(eng.complete_stream("x", max_tokens=n))
            assert "".join(ev.text for ev in events) == out.text


def test_a_full_context_never_ends_in_half_a_character(bigram: str) -> None:
    with localspec.load(bigram, draft=False, n_threads=1, n_ctx=256) as eng:
        out = eng.complete("xx", max_tokens=1000)  # a 2-token prompt: the end cuts 日 (E6 97)
    assert out.finish_reason == "context_full"
    assert bytes(out.tokens).decode("utf-8", "replace").endswith("\ufffd"), "no cut here"
    assert out.text == _text_of(len(out.tokens))


@pytest.mark.smollm2
def test_smollm2_reply_cut_by_max_tokens_has_no_replacement_character() -> None:
    """The report: this prompt makes SmolLM2 write emoji, 3 tokens each; 16 tokens cut one.
    The text is llama-cpp-python's for the same tokens (it drops undecodable bytes)."""
    from llama_cpp import Llama
    from test_smollm2 import smollm2_path

    path = smollm2_path()
    with localspec.load(path, draft=False, n_threads=2, n_ctx=512) as eng:
        out = eng.complete("日本語で答えて: 🎉🐍", max_tokens=16)
    raw = Llama(path, vocab_only=True, verbose=False).detokenize(out.tokens)
    assert raw.decode("utf-8", "replace").endswith("\ufffd"), "no cut here: pick another prompt"
    assert out.text == raw.decode("utf-8", "ignore") and "\ufffd" not in out.text


# --- quantized KV caches need flash attention ------------------------------------------------


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_kv_without_flash_attention_is_refused_before_loading(
    tmp_path, kv_type: str
) -> None:
    # a missing file: the options are checked before anything is read
    missing = str(tmp_path / "missing.gguf")
    with pytest.raises(localspec.InvalidParameterError, match="flash attention"):
        localspec.load(missing, kv_type=kv_type, flash_attn=False)
    with pytest.raises(localspec.InvalidParameterError, match=f"kv_type {kv_type}"):
        localspec.load(missing, kv_type=kv_type, flash_attn="off")
    with pytest.raises(localspec.ModelFileError):  # the other settings pass the check
        localspec.load(missing, kv_type=kv_type, flash_attn="auto")
    with pytest.raises(localspec.ModelFileError):
        localspec.load(missing, kv_type="f16", flash_attn=False)


@pytest.mark.parametrize("flash_attn", [None, True])
def test_quantized_kv_runs_with_flash_attention_on_or_auto(tmp_path, flash_attn) -> None:
    """llama.cpp turns flash attention on for a quantized V cache when left to decide; its
    blocks of 32 need a head dimension they divide (288 / 9 heads, target and drafter)."""
    shape = tm.TargetShape(n_embd=tm.AGREE_EMBD, n_layer=3, n_head=9, n_head_kv=9, n_ff=32)
    target, draft = tm.write_agreeing_pair(str(tmp_path), shape=shape)
    opts = {"kv_type": "q8_0", "flash_attn": flash_attn, "n_threads": 1, "n_ctx": 256}
    with localspec.load(target, draft=draft, n_draft=3, **opts) as eng:
        out = eng.complete("abc", max_tokens=8)
        assert out.text == "defghijk" and out.stats.accepted > 0


def test_a_context_llama_cpp_refuses_says_why(models) -> None:
    """The tiny target's heads are 16 wide, which q8_0's blocks of 32 do not divide: the
    error carries llama.cpp's own reason, not just "no context"."""
    with pytest.raises(localspec.LocalspecError, match="does not divide n_embd_head_k=16"):
        localspec.load(models["target"], draft=False, kv_type="q8_0", flash_attn="on")


def test_cli_quantized_kv_without_flash_attention(models, capsys) -> None:
    for cmd in (["generate", "-p", "x", "-n", "1"], ["chat"]):
        argv = [cmd[0], models["target"], "--kv-type", "q4_0", "--flash-attn", "off", *cmd[1:]]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("localspec: error: kv_type q4_0 quantizes the V cache")
        assert "flash attention" in err and err.count("\n") == 1


# --- bench prompt files ------------------------------------------------------------------------


def test_bench_prompt_set_that_is_not_there(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for spec in ("missing.jsonl", "prompts/missing", str(tmp_path / "a.jsonl")):
        with pytest.raises(localspec.LocalspecError, match=f"^no such file: {re.escape(spec)}$"):
            load_prompt_set(spec, None)
    with pytest.raises(localspec.LocalspecError, match="mtbench, humaneval, long, short"):
        load_prompt_set("mtbnech", None)
    (tmp_path / "folder").mkdir()
    with pytest.raises(localspec.LocalspecError, match="is a folder"):
        load_prompt_set("folder", None)
    assert main(["bench", "--prompts", "missing.jsonl", "-n", "4"]) == 1
    assert capsys.readouterr().err == "localspec: error: no such file: missing.jsonl\n"


def test_bench_prompt_file_format(tmp_path) -> None:
    """The format README and docs/benchmarks.md describe: "prompt" or "turns" per line."""
    path = tmp_path / "mine.jsonl"
    recs = [{"prompt": "Name three rivers."}, {"turns": ["Write a haiku.", "Now in French."]}]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    prompts = load_prompt_set(str(path), None)
    assert [(p.id, p.turns) for p in prompts] == [
        ("mine.jsonl-0", ["Name three rivers."]),
        ("mine.jsonl-1", ["Write a haiku.", "Now in French."]),
    ]
    assert len(load_prompt_set(str(path), 1)) == 1
    for bad, why in (('["a list"]', "expected an object"), ('{"turns": "one"}', "strings")):
        path.write_text(bad + "\n")
        with pytest.raises(localspec.LocalspecError, match=f"mine.jsonl:1: .*{why}"):
            load_prompt_set(str(path), None)


# --- chat needs a terminal ---------------------------------------------------------------------


@pytest.mark.parametrize("stdin", ["devnull", "pipe"])
def test_chat_without_a_terminal_says_so(models, tmp_path, stdin: str) -> None:
    """Refused after the arguments are checked, before the app starts (it would wait for
    keys forever); the timeout catches an app that started anyway."""
    run = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "chat", models["target"], "--no-draft"],
        stdin=subprocess.DEVNULL if stdin == "devnull" else None,
        input="hello\n" if stdin == "pipe" else None,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOCALSPEC_DATA_DIR": str(tmp_path)},
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("localspec: error: localspec chat needs a terminal")
    assert "standard input is not a TTY" in run.stderr and "localspec generate" in run.stderr
    assert run.stderr.count("\n") == 1 and run.stdout == ""
