"""Bad files, mismatched pairs and absurd parameters raise localspec's errors, never crash."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import localspec
from localspec import (
    InvalidParameterError,
    LocalspecError,
    ModelFileError,
    PairMismatchError,
    UnsupportedModelError,
)
from localspec.lowlevel import parts

from conftest import EXACT
from helpers import tinymodels as tm


def test_missing_target(tmp_path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        localspec.load(str(tmp_path / "nope.gguf"), draft=False)


def test_not_a_gguf(tmp_path) -> None:
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelFileError, match="not a GGUF"):
        localspec.load(str(p), draft=False)


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.01])
def test_truncated_target(models, tmp_path, keep) -> None:
    src = models["target"]
    p = tmp_path / "cut.gguf"
    data = Path(src).read_bytes()
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelFileError):
        localspec.load(str(p), draft=False)


def test_truncated_drafter(models, tmp_path) -> None:
    data = Path(models["draft"]).read_bytes()
    p = tmp_path / "cut.eagle3.gguf"
    p.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelFileError, match="truncated"):
        localspec.load(models["target"], draft=str(p))


def test_drafter_is_not_eagle3(models) -> None:
    with pytest.raises(UnsupportedModelError, match="not an EAGLE-3 drafter"):
        localspec.load(models["target"], draft=models["target"])


def test_a_drafter_on_a_recurrent_target_loaded_for_plain_decoding_is_refused(tmp_path) -> None:
    # a mamba GGUF loaded for plain decoding takes no checkpoints of its state, so no drafter
    # can feed on it (with any other source it drafts: tests/runtime/test_hybrid.py)
    t = tm.write_mamba_target(str(tmp_path / "m.gguf"))
    d = tm.write_drafter(str(tmp_path / "m.eagle3.gguf"), t)
    with pytest.raises(UnsupportedModelError, match="recurrent.*loaded for plain decoding"):
        localspec.load(t, draft=d, draft_source="none")
    # without a drafter the same file still runs as a plain target
    with localspec.load(t, draft=False, draft_source="none", **EXACT) as eng:
        assert len(eng.complete("hi", max_tokens=5).tokens) == 5


def test_a_target_without_staged_inputs_is_tapped_through_its_graph(tmp_path) -> None:
    # qwen2 has no staged layer inputs (asking for them aborts): its graph serves every tap,
    # and a tap outside its layers is refused before anything native
    t = tm.write_target(
        str(tmp_path / "q2.gguf"), tm.TargetShape(arch="qwen2"), weights=_qwen2_biases()
    )
    deep = tm.write_drafter(str(tmp_path / "deep.gguf"), t, tm.DrafterShape(taps=(1, 2, 4)))
    with pytest.raises(PairMismatchError, match="layer 4"):
        localspec.load(t, draft=deep, **EXACT)
    zero = tm.write_drafter(str(tmp_path / "zero.gguf"), t, tm.DrafterShape(taps=(0, 1, 2)))
    with localspec.load(t, draft=zero, **EXACT) as eng:
        assert parts(eng).target.tap_route == "graph callback"
        assert len(eng.complete("hi", max_tokens=5, n_draft=2).tokens) == 5


def _qwen2_biases() -> dict:
    import numpy as np

    s = tm.TargetShape()
    hd = s.n_embd // s.n_head
    out = {}
    for i in range(s.n_layer):
        out[f"blk.{i}.attn_q.bias"] = np.zeros(s.n_head * hd, dtype=np.float32)
        out[f"blk.{i}.attn_k.bias"] = np.zeros(s.n_head_kv * hd, dtype=np.float32)
        out[f"blk.{i}.attn_v.bias"] = np.zeros(s.n_head_kv * hd, dtype=np.float32)
    return out


def test_hidden_size_mismatch(models, tmp_path) -> None:
    other = tm.write_target(str(tmp_path / "wide.gguf"), tm.TargetShape(n_embd=96))
    d = tm.write_drafter(
        str(tmp_path / "wide.eagle3.gguf"),
        other,
        tm.DrafterShape(n_embd=96),
        target=tm.TargetShape(n_embd=96),
    )
    with pytest.raises(PairMismatchError, match="hidden size"):
        localspec.load(models["target"], draft=d)


def test_width_mismatch_while_borrowing_embeddings(models, tmp_path) -> None:
    # a drafter narrower than the target that borrows the target's embeddings: SIGABRT in C++
    d = tm.write_drafter(
        str(tmp_path / "narrow.gguf"), models["target"], tm.DrafterShape(n_embd=32, n_ff=64)
    )
    with pytest.raises(PairMismatchError, match="borrows"):
        localspec.load(models["target"], draft=d)


def test_taps_outside_target(models, tmp_path) -> None:
    d = tm.write_drafter(
        str(tmp_path / "deep.gguf"), models["target"], tm.DrafterShape(taps=(1, 2, 9))
    )
    with pytest.raises(PairMismatchError, match="layer 9"):
        localspec.load(models["target"], draft=d)


def test_different_tokenizer(models, tmp_path) -> None:
    d = tm.write_drafter(str(tmp_path / "d.gguf"), models["target"])
    # same vocabulary size, different token texts: swap the tokens "a" and "b"
    other = str(tmp_path / "other.gguf")
    shutil.copy(models["target"], other)
    data = bytearray(Path(other).read_bytes())
    one = b"\x01" + b"\x00" * 7
    i = data.find(one + b"a" + one + b"b")
    assert i > 0
    data[i + 8] = ord("b")
    data[i + 17] = ord("a")
    Path(other).write_bytes(bytes(data))
    with pytest.raises(PairMismatchError, match="tokenizer"):
        localspec.load(other, draft=d)


def test_absurd_parameters(models) -> None:
    with pytest.raises(InvalidParameterError):
        localspec.load(models["target"], draft=models["draft"], n_draft=1000)
    with pytest.raises(InvalidParameterError):
        localspec.load(models["target"], draft=models["draft"], n_threads=0)
    with pytest.raises(InvalidParameterError):
        localspec.load(models["target"], draft=models["draft"], kv_type="f7")
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        for kw in (
            {"temperature": -1.0},
            {"temperature": float("nan")},
            {"top_p": 0.0},
            {"top_k": -3},
            {"max_tokens": -5},
            {"n_draft": 99},
            {"seed": -1},
            {"stop": [""]},
        ):
            with pytest.raises(InvalidParameterError):
                eng.complete("hi", **kw)
        with pytest.raises(InvalidParameterError):
            eng.complete("")
        with pytest.raises(InvalidParameterError):
            eng.complete([10**9])
        with pytest.raises(LocalspecError):
            eng.chat([])


def test_prompt_longer_than_context(models) -> None:
    small = {**EXACT, "n_ctx": 64}
    with (
        localspec.load(models["target"], draft=models["draft"], **small) as eng,
        pytest.raises(localspec.ContextFullError),
    ):
        eng.complete("word " * 200)


def test_contexts_smaller_than_the_batch_run(models) -> None:
    """llama.cpp caps its batch at the n_ctx asked for and rounds n_ctx up to 256: a context of
    32 (below the 64 sequences a draft tree takes) and a 220-token prompt in a context of 200
    (rounded to 256, above the capped batch) once aborted the process. The context used is
    the one asked for (a 180-token prompt and 16 tokens fit 200)."""
    with localspec.load(models["target"], draft=models["draft"], **{**EXACT, "n_ctx": 32}) as eng:
        assert eng.n_ctx == 32
        assert len(eng.complete("hello", max_tokens=8, n_draft=3).tokens) == 8
    prompt = [int(t) for t in np.random.default_rng(0).integers(10, 200, 180)]
    replies = []
    for n_ctx in (200, 1024):
        with localspec.load(models["target"], draft=False, **{**EXACT, "n_ctx": n_ctx}) as eng:
            replies.append(eng.complete(prompt, max_tokens=16).tokens)
    assert len(replies[0]) == 16 and replies[0] == replies[1]


def test_a_bad_drafter_norm_fails_before_any_model_is_loaded(models, tmp_path, monkeypatch) -> None:
    """norm_output needs output_norm.weight in F32/F16: checked before llama.cpp loads the
    drafter, so nothing is left loaded (it leaked a model and context when checked after)."""
    from localspec.runtime import drafter as drafter_mod

    ds = tm.DrafterShape(norm_output=True)
    t = tm.drafter_tensors(ds, 64)
    t["output_norm.weight"] = t["output_norm.weight"].astype(np.float64)  # an F64 norm
    path = tm.write_drafter(str(tmp_path / "d.gguf"), models["target"], ds, tensors=t)
    loaded = []
    real = drafter_mod.N.NativeModel

    def counting(path_, **kw):
        loaded.append(path_)
        return real(path_, **kw)

    monkeypatch.setattr(drafter_mod.N, "NativeModel", counting)
    with pytest.raises(ModelFileError, match="output_norm"):
        localspec.load(models["target"], draft=path, **EXACT)
    assert path not in loaded


def test_a_drafter_given_as_the_target_says_what_it_is(models, tmp_path) -> None:
    """An EAGLE-3 drafter where the target belongs (`localspec chat x.eagle3.gguf`) once failed
    with llama.cpp's "cannot create a context": it must say the file is a drafter, which target
    it records, and how to pass both, through the API and the real command line alike."""
    import subprocess
    import sys

    drafter = models["draft"]
    with pytest.raises(UnsupportedModelError) as caught:
        localspec.load(drafter)
    msg = str(caught.value)
    assert "is an EAGLE-3 drafter, not a target" in msg
    assert "'llama' target with 4 layers, hidden size 64 and 269 tokens" in msg  # its record
    # tiny.eagle3.gguf beside tiny.gguf: the pairing convention names the target to pass
    assert f"Its target is probably {models['target']}" in msg
    assert f"localspec chat {models['target']} --draft {drafter}" in msg
    assert f"--draft {drafter}" in msg and f"draft='{drafter}'" in msg
    run = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "generate", drafter, "-p", "hi", "-n", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1  # one line
    assert "is an EAGLE-3 drafter, not a target" in run.stderr and "--draft" in run.stderr
    # a drafter written without the record (llama.cpp's converter) says it has none
    bare = tm.write_drafter(str(tmp_path / "bare.gguf"), models["target"], localspec_keys=False)
    with pytest.raises(UnsupportedModelError, match="does not record which target") as caught:
        localspec.load(bare, draft=False)
    assert "TARGET.gguf --draft" in str(caught.value)  # nothing to name: a placeholder
    # the name `localspec convert` writes ("EAGLE drafter (family) for X.gguf") is quoted
    shipped = os.path.join(os.path.dirname(localspec.__file__), "models")
    (name,) = [f for f in os.listdir(shipped) if f.endswith(".eagle3.gguf")]
    with pytest.raises(UnsupportedModelError) as caught:
        localspec.load(os.path.join(shipped, name), draft=False)
    assert f"for {name.removesuffix('.eagle3.gguf')}.gguf" in str(caught.value)
