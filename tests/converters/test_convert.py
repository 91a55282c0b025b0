"""Conversion of every checkpoint family and flag set, checked tensor by tensor and by running."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import localspec
from localspec import CheckpointError, InvalidParameterError
from localspec.converters.convert import convert

from conftest import EXACT, quick_measure
from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless
from helpers.hfcheckpoints import write_checkpoint
from helpers.reference import read_tensors

pytest.importorskip("torch")
pytest.importorskip("safetensors")

CASES = [
    ("eagle", {}),
    ("eagle", {"draft_vocab": 96, "llama3_rope": True}),
    ("specforge", {"fc_norm": True, "norm_output": True}),
    ("specforge", {"norm_before_fc": True, "own_embeddings": True}),
    ("speculators", {"norm_before_residual": True, "norm_output": True}),
    (
        "speculators",
        {"fc_norm": True, "norm_output": True, "norm_before_residual": True, "draft_vocab": 80},
    ),
]


def quiet(_msg: str) -> None:
    pass


def edit_config(folder: str, change) -> None:
    path = Path(folder) / "config.json"
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("family,flags", CASES, ids=lambda c: str(c))
def test_convert_reproduces_tensors_and_runs_losslessly(models, tmp_path, family, flags) -> None:
    ds = tm.DrafterShape(**flags)
    gg = tm.drafter_tensors(ds, 64, seed=5)
    ck = write_checkpoint(
        str(tmp_path / "ck"), family, ds, gg, shards=2 if family == "specforge" else 1
    )
    out = str(tmp_path / "out.gguf")
    res = convert(
        ck, models["target"], out, outtype="f32", measure_readings=quick_measure(), log=quiet
    )
    assert res.family == family
    assert res.taps == [2, 2, 1] or res.taps == [2, 4 // 2, 4 - 3]
    got, meta = read_tensors(out)
    assert set(got) == set(gg)
    for name, want in gg.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)
    assert bool(meta.get("localspec.eagle3.fc_norm", False)) == ds.fc_norm
    assert bool(meta.get("localspec.eagle3.norm_output", False)) == ds.norm_output
    assert bool(meta["eagle3.norm_before_residual"]) == ds.norm_before_residual
    with localspec.load(models["target"], draft=out, **EXACT) as eng:
        spec = eng.complete("the quick brown fox", max_tokens=40, n_draft=3)
        assert_greedy_lossless(eng, "the quick brown fox", spec)


def test_speculators_defaults_norm_before_residual(models, tmp_path) -> None:
    ds = tm.DrafterShape(norm_before_residual=True)
    ck = write_checkpoint(str(tmp_path / "ck"), "speculators", ds, tm.drafter_tensors(ds, 64))
    edit_config(ck, lambda c: c.pop("norm_before_residual"))  # absent means true here
    res = convert(
        ck, models["target"], str(tmp_path / "o.gguf"), measure_readings=quick_measure(), log=quiet
    )
    # speculators' default (false) or vLLM's (true): measured; random weights tie, vLLM's kept
    assert len(res.readings) == 2 and "tie" in res.choice
    assert res.flags["norm_before_residual"] is True


def test_tap_conventions(models, tmp_path) -> None:
    ds = tm.DrafterShape()
    gg = tm.drafter_tensors(ds, 64)
    sf = write_checkpoint(str(tmp_path / "sf"), "specforge", ds, gg, taps=[0, 1, 2])
    res = convert(
        sf, models["target"], str(tmp_path / "a.gguf"), measure_readings=quick_measure(), log=quiet
    )
    assert res.taps == [1, 2, 3]  # SpecForge counts outputs (the other reading was measured)
    assert [list(m.reading.taps) for m in res.readings] == [[1, 2, 3], [0, 1, 2]]
    sp = write_checkpoint(str(tmp_path / "sp"), "speculators", ds, gg, taps=[1, 2, 3])
    assert convert(sp, models["target"], str(tmp_path / "b.gguf"), log=quiet).taps == [1, 2, 3]
    res = convert(sp, models["target"], str(tmp_path / "c.gguf"), taps=[0, 1, 3], log=quiet)
    assert res.taps == [0, 1, 3]
    with pytest.raises(InvalidParameterError, match="0..3"):
        convert(sp, models["target"], str(tmp_path / "d.gguf"), taps=[1, 2, 4], log=quiet)
    assert not os.path.exists(tmp_path / "d.gguf")


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0", "q4_0", "q4_k_m"])
def test_outtypes_keep_norms_and_d2t_exact(models, tmp_path, outtype) -> None:
    ds = tm.DrafterShape(draft_vocab=96, fc_norm=True, norm_output=True)
    gg = tm.drafter_tensors(ds, 64, seed=2)
    ck = write_checkpoint(str(tmp_path / "ck"), "specforge", ds, gg)
    out = str(tmp_path / f"{outtype}.gguf")
    convert(ck, models["target"], out, outtype=outtype, measure_readings=quick_measure(), log=quiet)
    from gguf import GGUFReader

    r = GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["d2t"] == "I64" and types["output_norm.weight"] == "F32"
    d2t = next(t for t in r.tensors if t.name == "d2t")
    assert np.array_equal(np.array(d2t.data), gg["d2t"])
    with localspec.load(models["target"], draft=out, **EXACT) as eng:
        assert_greedy_lossless(
            eng, "hello world", eng.complete("hello world", max_tokens=30, n_draft=4)
        )


def test_bad_checkpoints_leave_no_output(models, tmp_path) -> None:
    ds = tm.DrafterShape()
    gg = tm.drafter_tensors(ds, 64)
    out = tmp_path / "o.gguf"

    def fails(folder: str, match: str) -> None:
        with pytest.raises(CheckpointError, match=match):
            convert(folder, models["target"], str(out), log=quiet)
        assert not out.exists()
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".localspec-")]

    fails(str(tmp_path / "nothing"), "neither a folder nor a repo id")
    ck = write_checkpoint(str(tmp_path / "a"), "eagle", ds, gg)
    os.remove(os.path.join(ck, "config.json"))
    fails(ck, "no config.json")
    ck = write_checkpoint(str(tmp_path / "b"), "eagle", ds, gg)
    (Path(ck) / "config.json").write_text("{not json")
    fails(ck, "not valid JSON")
    ck = write_checkpoint(str(tmp_path / "c"), "eagle", ds, gg)
    edit_config(ck, lambda c: c.update(architectures=["MistralForCausalLM"]))
    fails(ck, "unknown drafter architecture")
    ck = write_checkpoint(str(tmp_path / "d"), "eagle", ds, gg)
    w = Path(ck) / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    fails(ck, "cannot read")
    bad = dict(gg)
    bad["blk.0.ffn_up.weight"] = bad["blk.0.ffn_up.weight"][:, :32]
    fails(write_checkpoint(str(tmp_path / "e"), "eagle", ds, bad), "shape")
    missing = dict(gg)
    del missing["blk.0.attn_norm_2.weight"]
    fails(write_checkpoint(str(tmp_path / "f"), "eagle", ds, missing), "lacks tensor")
    ds_v = tm.DrafterShape(draft_vocab=96)
    g2 = tm.drafter_tensors(ds_v, 64)
    g2["d2t"] = g2["d2t"].copy()
    g2["d2t"][5] = g2["d2t"][4]
    fails(write_checkpoint(str(tmp_path / "g"), "eagle", ds_v, g2), "same target token")
    g3 = tm.drafter_tensors(ds_v, 64)
    g3["d2t"] = g3["d2t"] + 10_000
    fails(write_checkpoint(str(tmp_path / "h"), "eagle", ds_v, g3), "outside")
    g4 = tm.drafter_tensors(ds_v, 64)
    del g4["d2t"]
    fails(write_checkpoint(str(tmp_path / "i"), "eagle", ds_v, g4), "no d2t")


def test_unsupported_features_are_named(models, tmp_path) -> None:
    ds = tm.DrafterShape()
    gg = tm.drafter_tensors(ds, 64)
    ck = write_checkpoint(str(tmp_path / "a"), "speculators", ds, gg)
    edit_config(ck, lambda c: c["transformer_layer_config"].update(num_hidden_layers=2))
    with pytest.raises(CheckpointError, match="2 decoder layers"):
        convert(ck, models["target"], str(tmp_path / "o.gguf"), log=quiet)
    ck = write_checkpoint(str(tmp_path / "b"), "eagle", ds, gg)
    edit_config(ck, lambda c: c.update(kv_lora_rank=512))
    with pytest.raises(CheckpointError, match="MLA"):
        convert(ck, models["target"], str(tmp_path / "o.gguf"), log=quiet)


def test_existing_output_needs_force(models, tmp_path) -> None:
    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(InvalidParameterError, match="--force"):
        convert(ck, models["target"], str(out), log=quiet)
    assert out.read_bytes() == b"keep me"
    convert(ck, models["target"], str(out), force=True, log=quiet)
    assert out.read_bytes()[:4] == b"GGUF"


def test_unwritable_output(models, tmp_path) -> None:
    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    with pytest.raises(InvalidParameterError, match="cannot write"):
        convert(ck, models["target"], str(tmp_path / "no" / "such" / "dir" / "o.gguf"), log=quiet)


def test_llama3_rope_factors_bands() -> None:
    from localspec.converters.formats import llama3_rope_factors

    # Llama-3.1's published scaling: high frequencies kept, low ones divided by 8
    f = llama3_rope_factors(
        {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        500000.0,
        128,
    )
    assert len(f) == 64 and f[0] == 1.0 and f[-1] == 8.0
    assert all(a <= b for a, b in zip(f, f[1:], strict=False))
    assert any(1.0 < x < 8.0 for x in f)  # the interpolated band exists


def test_verify_catches_a_broken_conversion(models, tmp_path, monkeypatch) -> None:
    """--verify is not a formality: a classic converter bug makes it fail, writing nothing."""
    from localspec.converters import convert as conv

    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    out = tmp_path / "o.gguf"
    monkeypatch.setattr(conv, "permute_qk", lambda w, n_head: w)  # forgets the RoPE permute
    with pytest.raises(CheckpointError, match="disagrees"):
        convert(ck, models["target"], str(out), outtype="f32", log=quiet)
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".localspec-")]


def test_verify_catches_a_lost_31_flag(models, tmp_path, monkeypatch) -> None:
    from localspec.converters import eagle3_gguf

    ds = tm.DrafterShape(norm_output=True)
    ck = write_checkpoint(str(tmp_path / "ck"), "speculators", ds, tm.drafter_tensors(ds, 64))
    real = eagle3_gguf.write_eagle3_gguf

    def drop_flag(path, cfg, tensors, target, **kw):
        cfg.norm_output = False  # the classic silent loss
        return real(path, cfg, tensors, target, **kw)

    monkeypatch.setattr("localspec.converters.convert.write_eagle3_gguf", drop_flag)
    with pytest.raises(CheckpointError, match="disagrees"):
        convert(ck, models["target"], str(tmp_path / "o.gguf"), outtype="f32", log=quiet)


def test_verify_report_and_acceptance(models, tmp_path) -> None:
    ds = tm.DrafterShape(fc_norm=True, norm_output=True)
    ck = write_checkpoint(str(tmp_path / "ck"), "specforge", ds, tm.drafter_tensors(ds, 64))
    res = convert(
        ck,
        models["target"],
        str(tmp_path / "o.gguf"),
        outtype="f16",
        check_acceptance=True,
        measure_readings=quick_measure(),
        log=quiet,
    )
    assert res.verify is not None and res.verify.passed
    assert res.verify.top1 >= 0.97 and res.verify.rows > 50
    assert res.acceptance is not None and res.acceptance.drafted > 0
    assert res.acceptance.generations == 4


def test_repo_id_from_the_hub_cache_offline(models, tmp_path, monkeypatch) -> None:
    """A repo id resolves through huggingface-hub's own cache (offline: no network here)."""
    import shutil

    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    cache = tmp_path / "hub"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = cache / "models--someorg--tiny-eagle3" / "snapshots" / rev
    shutil.copytree(ck, snap)
    (cache / "models--someorg--tiny-eagle3" / "refs").mkdir()
    (cache / "models--someorg--tiny-eagle3" / "refs" / "main").write_text(rev)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    res = convert("someorg/tiny-eagle3", models["target"], str(tmp_path / "o.gguf"), log=quiet)
    assert res.family == "eagle" and (tmp_path / "o.gguf").exists()
    with pytest.raises(CheckpointError, match="cannot fetch someorg/missing"):
        convert("someorg/missing", models["target"], str(tmp_path / "p.gguf"), log=quiet)


def test_output_gets_the_usual_file_mode(models, tmp_path) -> None:
    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    out = tmp_path / "o.gguf"
    old = os.umask(0o022)
    try:
        convert(ck, models["target"], str(out), log=quiet)
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o644


def test_qk_norm_drafter_is_refused(models, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "speculators", ds, tm.drafter_tensors(ds, 64))
    path = os.path.join(ck, "model.safetensors")
    t = load_file(path)
    t["layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(t, path)
    with pytest.raises(CheckpointError, match="q/k norms"):
        localspec.convert(ck, models["target"], str(tmp_path / "o.gguf"), log=quiet)
    assert not (tmp_path / "o.gguf").exists()
