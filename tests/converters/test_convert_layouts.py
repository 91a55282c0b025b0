"""Every published drafter layout, reproduced at tiny scale (tests/helpers/published.py): it
converts, its tensors come back up to the dtype's rounding, and its GGUF drafts losslessly; or it
is refused with a message that names the feature llama.cpp cannot run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import localspec
from localspec import CheckpointError
from localspec.converters.convert import convert

from conftest import EXACT, quick_measure
from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless
from helpers.published import KIMI_MLA_CONFIG, TARGET_LAYERS, TARGET_ROPE, gguf_tensors, rounded
from helpers.published import write_published as publish
from helpers.reference import read_tensors

pytest.importorskip("torch")
pytest.importorskip("safetensors")

DEFAULT_TAPS = [2, TARGET_LAYERS // 2, TARGET_LAYERS - 3]
# layout -> what the conversion must find: family, taps, RoPE base, flags, readings measured
EXPECT: dict[str, dict] = {
    "eagle-llama31": {"family": "eagle", "rope": 10000.0},  # no rope_theta: 10000, not 500000
    "eagle-own-embeddings": {"family": "eagle", "rope": TARGET_ROPE},
    "specforge-llama31": {"family": "specforge", "rope": 10000.0},
    # norm_output true: the 3.1 meaning or SpecForge's before PR #879; a random drafter ties,
    # so the current meaning is kept
    "specforge-eagle31": {
        "family": "specforge",
        "rope": 1e6,
        "flags": {"fc_norm": True, "norm_output": True},
        "readings": 2,
    },
    # ids [3, 5, 6]: outputs (TorchSpec's own numbering) or inputs (its vLLM export's +1)
    "torchspec-vllm-export": {
        "family": "torchspec",
        "taps": [4, 6, 7],
        "rope": TARGET_ROPE,
        "flags": {"fc_norm": True, "norm_output": True},
        "readings": 2,
    },
    "angelslim-qwen3": {"family": "angelslim", "rope": 1e6},
    "angelslim-hunyuan": {"family": "angelslim", "rope": 10000.0},
    "speculators-llama31": {
        "family": "speculators",
        "rope": TARGET_ROPE,
        "flags": {"norm_before_residual": True},
    },
    "speculators-norm-before-fc": {
        "family": "speculators",
        "taps": [1, 4, 6],  # vLLM's numbering: inputs, no measurement needed
        "rope": 150000.0,
        "flags": {"norm_before_fc": True},
    },
    # ModelOpt's default ids [1, 3, 4] count outputs in its trainer; measured against inputs
    "modelopt-llama31": {"family": "modelopt", "rope": TARGET_ROPE, "readings": 2},
}
TOLERANCE = {"float16": 2e-3, "bfloat16": 2e-2}  # relative; fc_norm folds two rounded factors


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("layouts")
    shape = tm.TargetShape(n_layer=TARGET_LAYERS, rope_theta=TARGET_ROPE)
    return tm.write_target(str(d / "llama31ish.gguf"), shape)


def quiet(_msg: str) -> None:
    pass


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_published_layout_converts_and_runs_losslessly(target, tmp_path, name) -> None:
    from helpers.published import LAYOUTS

    want = EXPECT[name]
    gg = gguf_tensors(name)
    ck = publish(str(tmp_path / name), name, gg)
    out = str(tmp_path / "out.gguf")
    log: list[str] = []
    res = convert(ck, target, out, outtype="f32", measure_readings=quick_measure(), log=log.append)
    assert res.family == want["family"]
    assert res.taps == want.get("taps", DEFAULT_TAPS)
    flags = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
             "norm_output": False, **want.get("flags", {})}  # fmt: skip
    assert res.flags == flags
    assert len(res.readings) == want.get("readings", 0)
    if res.readings:  # random weights: no reading is measurably better, and it says so
        assert "tie within noise" in res.choice and res.taps == list(res.readings[0].reading.taps)
    assert res.verify is not None and res.verify.passed
    got, meta = read_tensors(out)
    assert meta["eagle3.rope.freq_base"] == pytest.approx(want["rope"])
    assert list(meta["eagle3.target_layers"]) == res.taps
    expected = rounded(gg, name)
    assert set(got) == set(expected)
    rtol = TOLERANCE[LAYOUTS[name].dtype]
    for key, arr in expected.items():
        if arr.dtype == np.int64:
            assert np.array_equal(got[key], arr), key
        else:
            np.testing.assert_allclose(got[key], arr, rtol=rtol, atol=1e-6, err_msg=key)
    with localspec.load(target, draft=out, **EXACT) as eng:
        spec = eng.complete("the quick brown fox", max_tokens=24, n_draft=3)
        assert_greedy_lossless(eng, "the quick brown fox", spec)


def test_layer_tensors_named_layers_0_convert_under_any_architecture(target, tmp_path) -> None:
    """The case that was refused: LlamaForCausalLMEagle3 with layers.0.* (TorchSpec's vLLM
    export, ModelOpt); vLLM and llama.cpp accept either prefix under any architecture."""
    ck = publish(str(tmp_path / "ck"), "torchspec-vllm-export")
    names = json.loads((Path(ck) / "model.safetensors.index.json").read_text())["weight_map"]
    assert "layers.0.hidden_norm.weight" in names and not any("midlayer" in n for n in names)
    res = convert(ck, target, str(tmp_path / "o.gguf"), measure_readings=False, log=quiet)
    assert res.family == "torchspec" and "NOT MEASURED" in res.choice


def test_angelslim_fc_width_decides_not_target_hidden_size(target, tmp_path) -> None:
    log: list[str] = []
    ck = publish(str(tmp_path / "ck"), "angelslim-hunyuan")
    assert json.loads((Path(ck) / "config.json").read_text())["target_hidden_size"] == 128
    convert(ck, target, str(tmp_path / "o.gguf"), log=log.append)
    assert any("whatever target_hidden_size says (128)" in m for m in log)
    # in another layout the same key is taken at its word
    cfg = json.loads((Path(ck) / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    (Path(ck) / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="hidden size 128"):
        convert(ck, target, str(tmp_path / "p.gguf"), log=quiet)


def _refused(ck: str, target: str, out: Path, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        convert(ck, target, str(out), log=quiet)
    assert not out.exists()
    assert not [p for p in os.listdir(out.parent) if p.startswith(".localspec-")]


def _edit(folder: str, change) -> str:
    path = Path(folder) / "config.json"
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))
    return folder


def test_refusals_name_the_feature(target, tmp_path) -> None:
    out = tmp_path / "o.gguf"
    mla = tmp_path / "mla"
    mla.mkdir()
    (mla / "config.json").write_text(json.dumps(KIMI_MLA_CONFIG))
    _refused(str(mla), target, out, "MLA attention .*Eagle3DeepseekV2ForCausalLM")

    def modelopt(sub: str, key: str, value) -> str:
        ck = publish(str(tmp_path / sub), "modelopt-llama31")
        return _edit(ck, lambda c: c["eagle_config"].update({key: value}))

    _refused(modelopt("a", "parallel_draft_step", 3), target, out, "parallel drafting")
    _refused(modelopt("b", "use_last_layernorm", False), target, out, "use_last_layernorm")
    _refused(modelopt("c", "use_mtp_layernorm", True), target, out, "use_mtp_layernorm")
    _refused(modelopt("d", "use_aux_hidden_state", False), target, out, "EAGLE-1 style")
    _refused(modelopt("e", "use_input_layernorm_in_first_layer", False), target, out, "hidden_norm")
    # boundary ids that end at the final hidden state (gpt-oss drafters: [24, 30, 36] of 36)
    _refused(
        modelopt("f", "eagle_aux_hidden_state_layer_ids", [2, 5, TARGET_LAYERS]),
        target,
        out,
        "final hidden state",
    )
    ck = _edit(
        publish(str(tmp_path / "g"), "modelopt-llama31"),
        lambda c: c.update(quantization_config={"quant_method": "modelopt"}),
    )
    _refused(ck, target, out, "quantized")
    ck = _edit(
        publish(str(tmp_path / "h"), "modelopt-llama31"),
        lambda c: c.update(architectures=["LlamaForCausalLMEagle3Deep"]),
    )
    _refused(ck, target, out, "several decoder layers")
    # RedHatAI's *.peagle / *.dflash speculators are other algorithms
    ck = _edit(
        publish(str(tmp_path / "i"), "speculators-llama31"),
        lambda c: c.update(speculators_model_type="dflash", architectures=["DFlashSpeculator"]),
    )
    _refused(ck, target, out, "speculators 'dflash' drafter is not an EAGLE-3")


def test_a_drafter_for_a_hybrid_target_with_an_mtp_head_converts_and_runs(tmp_path) -> None:
    """A published EAGLE-3.1 layout converted for a qwen35 target (gated delta nets, and an
    MTP block after the trunk, which is not one of its layers): the taps fall in the trunk, the
    record names the trunk's layers, and the drafter runs on the target through the graph
    callback, losslessly, beside the target's own head."""
    hybrid = tm.write_qwen35_target(
        str(tmp_path / "q.gguf"), n_layer=TARGET_LAYERS, mtp=True, cycle=8
    )
    ck = publish(str(tmp_path / "ck"), "specforge-eagle31")
    out = str(tmp_path / "q.eagle3.gguf")
    res = convert(ck, hybrid, out, outtype="f32", measure_readings=False, log=quiet)
    assert res.verify is not None and res.verify.passed
    _, meta = read_tensors(out)
    assert meta["localspec.target.block_count"] == TARGET_LAYERS
    with localspec.load(hybrid, draft=out, **EXACT) as eng:
        assert eng.drafting.drafter_kind == "eagle"
        c = eng.complete("the quick brown fox", max_tokens=24, n_draft=3)
        assert eng.last_stats.sources["eagle"].drafted > 0
        assert_greedy_lossless(eng, "the quick brown fox", c)
