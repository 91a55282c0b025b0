"""UTF-8 at the end of generation (issue 21): a character cut by max_tokens or a full context
is dropped, never shown as a replacement character; malformed bytes still read as U+FFFD."""

from __future__ import annotations

import numpy as np
import pytest

import localspec
from localspec.text.textstream import TextStream, decode_text

from helpers import tinymodels as tm

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

    from helpers.realmodels import smollm2_path

    path = smollm2_path()
    with localspec.load(path, draft=False, n_threads=2, n_ctx=512) as eng:
        out = eng.complete("日本語で答えて: 🎉🐍", max_tokens=16)
    raw = Llama(path, vocab_only=True, verbose=False).detokenize(out.tokens)
    assert raw.decode("utf-8", "replace").endswith("\ufffd"), "no cut here: pick another prompt"
    assert out.text == raw.decode("utf-8", "ignore") and "\ufffd" not in out.text
