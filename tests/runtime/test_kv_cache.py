"""Quantized KV caches need flash attention (issue 21): refused before anything is loaded
without it, run with it on or left to llama.cpp, and a context llama.cpp refuses says why."""

from __future__ import annotations

import pytest

import localspec

from helpers import tinymodels as tm


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
