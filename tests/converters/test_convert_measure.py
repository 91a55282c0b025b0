"""`localspec convert` settles what a config leaves open by measurement, on drafters trained
with `localspec train` and re-labelled the ways other tools label them: the tap numbering of
TorchSpec's exports and the old SpecForge meaning of norm_output. The right reading must win by
a clear margin; given values skip the measurement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import localspec
from localspec.cli import main
from localspec.converters.convert import convert
from localspec.converters.formats import Reading
from localspec.converters.measure import MeasureConfig, Measured, choose, noise

from conftest import EXACT
from helpers.greedy import assert_greedy_lossless
from helpers.trained import TAPS, letter_prompts

pytest.importorskip("torch")


def measuring() -> MeasureConfig:
    # held-out requests like the training data's, rendered with the target's chat template
    return MeasureConfig(prompts=letter_prompts(6, seed=1), n_draft=4, max_tokens=24, n_threads=1)


def relabel(src: str, dst: Path, change, *, layer_prefix: str | None = None) -> str:
    """A copy of a localspec checkpoint with its config changed as another tool writes it (the
    "localspec" record that makes it unambiguous is dropped)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["localspec"]
    change(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    if layer_prefix:
        from safetensors.torch import load_file, save_file

        path = str(dst / "model.safetensors")
        t = load_file(path)
        save_file({k.replace("midlayer.", layer_prefix): v for k, v in t.items()}, path)
    return str(dst)


def shift_ids(cfg: dict) -> None:
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [t + 1 for t in ids]


def torchspec(cfg: dict) -> None:
    cfg["_torchspec_version"] = "0.1.0"


def margin(res) -> float:  # the chosen reading's lead over the best other one
    rates = sorted((m.rate for m in res.readings), reverse=True)
    return rates[0] - rates[1]


def lossless(target: str, draft: str) -> None:
    with localspec.load(target, draft=draft, **{**EXACT, "n_threads": 1}) as eng:
        for p in letter_prompts(3, seed=2):
            prompt, _ = eng.format_chat([{"role": "user", "content": p}])
            kw = {"add_special": False, "parse_special": True}
            spec = eng.complete(prompt, max_tokens=24, n_draft=4, **kw)
            assert_greedy_lossless(eng, prompt, spec, **kw)


def test_tap_offset_of_a_vllm_export_is_measured(trained_relay, tmp_path) -> None:
    """TorchSpec's vLLM export adds 1 to the ids: the EAGLE-3.1 drafter trained on inputs
    (1, 2, 3) now says [1, 2, 3] under TorchSpec's own output numbering, which would tap
    (2, 3, 4). Measurement must find that inputs (1, 2, 3) are what the target accepts."""
    ck = relabel(
        trained_relay["eagle3.1"],
        tmp_path / "ck",
        lambda c: (shift_ids(c), torchspec(c)),
        layer_prefix="layers.0.",
    )
    log: list[str] = []
    out = str(tmp_path / "o.gguf")
    res = convert(ck, trained_relay["target"], out, measure_readings=measuring(), log=log.append)
    assert [list(m.reading.taps) for m in res.readings] == [[2, 3, 4], [1, 2, 3]]
    assert res.taps == list(TAPS) and "as inputs of layers" in res.taps_source
    best, other = res.readings[1], res.readings[0]
    assert margin(res) > 0.3 and margin(res) > 3 * noise(best, other)
    assert sum("reading " in m and "acceptance" in m for m in log) == 2  # every reading printed
    assert any(m.startswith("chose reading 2") for m in log)
    assert res.verify is not None and res.verify.passed
    lossless(trained_relay["target"], out)


def test_tap_offset_of_a_native_torchspec_checkpoint_is_measured(trained_relay, tmp_path) -> None:
    """The same drafter with TorchSpec's own (output) numbering: now +1 must win."""
    ck = relabel(trained_relay["eagle3.1"], tmp_path / "ck", torchspec)
    res = convert(
        ck, trained_relay["target"], str(tmp_path / "o.gguf"), measure_readings=measuring(),
        check=False, log=lambda m: None,
    )  # fmt: skip
    assert [list(m.reading.taps) for m in res.readings] == [[1, 2, 3], [0, 1, 2]]
    assert res.taps == list(TAPS) and "outputs of layers, +1" in res.taps_source
    assert margin(res) > 0.3


def test_old_specforge_norm_output_on_a_plain_eagle3_drafter(trained_relay, tmp_path) -> None:
    """A plain EAGLE-3 drafter labelled norm_output: true, as SpecForge before its PR #879
    wrote it (there it only meant "norm before the head"). Read as EAGLE-3.1's post-norm
    feedback it fails past the first draft; measurement must keep plain EAGLE-3."""
    ck = relabel(trained_relay["eagle3"], tmp_path / "ck", lambda c: c.update(norm_output=True))
    log: list[str] = []
    out = str(tmp_path / "o.gguf")
    res = convert(
        ck, trained_relay["target"], out, measure_readings=measuring(), check=False,
        log=log.append,
    )  # fmt: skip
    assert res.family == "specforge"
    # both meanings under both tap numberings (SpecForge's ids could be an export's)
    assert len(res.readings) == 4
    assert res.flags["norm_output"] is False and res.taps == list(TAPS)
    assert "before PR #879" in res.taps_source
    assert margin(res) > 0.2
    by_meaning = {
        m.reading.flag_dict["norm_output"]: m for m in res.readings if m.reading.taps == TAPS
    }
    plain, post = by_meaning[False], by_meaning[True]
    assert plain.rate - post.rate > 3 * noise(plain, post)
    # the first draft is the same under both meanings; the feedback decides the rest
    assert abs(plain.accepted_at[0] - post.accepted_at[0]) < 0.15
    assert post.accepted_at[1] < plain.accepted_at[1] - 0.3
    lossless(trained_relay["target"], out)


def test_an_eagle31_drafter_keeps_the_31_meaning(trained_relay, tmp_path) -> None:
    """The other direction: a SpecForge-labelled EAGLE-3.1 drafter must keep post-norm feedback
    (the measurement does not simply favour plain EAGLE-3)."""
    ck = relabel(trained_relay["eagle3.1"], tmp_path / "ck", lambda c: None)
    res = convert(
        ck, trained_relay["target"], str(tmp_path / "o.gguf"), measure_readings=measuring(),
        check=False, log=lambda m: None,
    )  # fmt: skip
    assert res.flags["norm_output"] is True and res.taps == list(TAPS)
    assert margin(res) > 0.2


def test_localspec_checkpoints_need_no_measurement(trained_relay, tmp_path) -> None:
    res = convert(
        trained_relay["eagle3"], trained_relay["target"], str(tmp_path / "o.gguf"),
        check=False, log=lambda m: None,
    )  # fmt: skip
    assert res.family == "localspec" and res.readings == [] and res.taps == list(TAPS)
    assert res.flags["norm_output"] is False


def test_given_values_skip_the_measurement_and_the_cli_prints_every_reading(
    trained_relay, tmp_path, capsys, monkeypatch
) -> None:
    target = trained_relay["target"]
    ck = relabel(trained_relay["eagle3"], tmp_path / "ck", lambda c: c.update(norm_output=True))
    res = convert(
        ck, target, str(tmp_path / "a.gguf"), taps=[1, 2, 3], flags={"norm_output": False},
        check=False, log=lambda m: None,
    )  # fmt: skip
    assert res.readings == [] and res.taps == [1, 2, 3] and res.flags["norm_output"] is False
    # the command line: flag options override, and a measured run prints every reading
    rc = main(["convert", ck, "--target", target, "-o", str(tmp_path / "b.gguf"),
               "--taps", "1,2,3", "--no-norm-output", "--no-verify"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0 and "measuring" not in err and "norm_output=False" in err

    class Quick(MeasureConfig):  # the command line measures with the defaults; shorten them
        def __init__(self) -> None:
            super().__init__(**vars(measuring()))

    monkeypatch.setattr("localspec.converters.convert.MeasureConfig", Quick)
    rc = main(["convert", ck, "--target", target, "-o", str(tmp_path / "c.gguf"), "--taps", "1,2,3",
               "--no-verify"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0 and "the config can be read 2 ways" in err
    assert err.count("  reading ") == 2 and "chose reading 2" in err
    rc = main(["convert", ck, "--target", target, "-o", str(tmp_path / "d.gguf"), "--no-measure",
               "--no-verify"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0 and "NOT MEASURED" in err and "a guess" in err


def _m(rate: float, n: int, i: int) -> Measured:
    r = Reading((1, 2, 3), (("norm_output", bool(i)),), f"reading {i}")
    return Measured(r, drafted=n, accepted=round(rate * n), steps=n // 4)


def test_choose_keeps_the_convention_on_a_tie_and_says_so() -> None:
    best, why = choose([_m(0.50, 200, 0), _m(0.53, 200, 1)])  # 3 points, noise ~10
    assert best.reading.why == "reading 0" and "tie within noise" in why
    best, why = choose([_m(0.30, 400, 0), _m(0.70, 400, 1)])
    assert best.reading.why == "reading 1" and why.startswith("chose reading 2")
    assert "a margin of 40.0 points" in why
    best, why = choose([_m(0.0, 30, 0), _m(0.0, 30, 1), _m(0.0, 30, 2)])
    assert best.reading.why == "reading 0" and "readings 1, 2, 3 tie" in why
    # a tie that leaves the convention out keeps the next reading in the layout's order
    best, why = choose([_m(0.10, 400, 0), _m(0.60, 400, 1), _m(0.61, 400, 2)])
    assert best.reading.why == "reading 1" and "readings 2, 3 tie" in why
    assert "order of preference" in why
