from __future__ import annotations

import os

import pytest

from helpers import tinymodels as tm


def _reference_model_params():  # type: ignore[no-untyped-def]
    """llama-cpp-python's own Llama, the tests' independent reference, loads models with
    llama.cpp's default parameters, which crash on some AMX CPUs; give it the extra-buffer
    setting localspec itself uses (localspec.native.hardware.cpu_extra_buffers)."""
    from localspec.native.hardware import cpu_extra_buffers

    params = _llama_model_default_params()
    params.use_extra_bufts = cpu_extra_buffers()
    return params


try:
    import llama_cpp.llama_cpp as _llama_c
except Exception:  # noqa: BLE001  (no llama-cpp-python: the tests say so themselves)
    pass
else:
    _llama_model_default_params = _llama_c.llama_model_default_params
    _llama_c.llama_model_default_params = _reference_model_params

# exact numerics for comparisons with references: f32 KV cache, no flash attention
EXACT = {"kv_type": "f32", "flash_attn": False, "n_threads": 2, "n_ctx": 1024}


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test calibrates afresh: a stored calibration from another test (or from the
    user's own runs) must not stand in for timings a test controls."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", os.path.join(str(tmp_path), "cache"))


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibrations count as made on a quiet machine (stored, never timed again): whether
    other programs beside the tests keep the CPU busy is not what a test checks; the tests of
    that judgement (test_costmodel_bursts) set the load they want."""
    from localspec.auto import calibration

    monkeypatch.setattr(calibration.OtherLoad, "cores", lambda self: 0.0)
    monkeypatch.setattr(calibration.OtherLoad, "busy", lambda self: False)


def quick_measure():  # type: ignore[no-untyped-def]
    """A short measurement of readings, for tests where measuring is not the point."""
    from localspec.converters.measure import MeasureConfig

    return MeasureConfig(prompts=("the quick brown fox",), n_draft=3, max_tokens=12, n_threads=1)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("models")
    target = tm.write_target(str(d / "tiny.gguf"))
    out = {"dir": str(d), "target": target}
    out["draft"] = tm.write_drafter(str(d / "tiny.eagle3.gguf"), target)
    out["draft31"] = tm.write_drafter(
        str(d / "tiny31.gguf"), target, tm.DrafterShape(fc_norm=True, norm_output=True)
    )
    return out


@pytest.fixture(scope="session")
def agree(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return tm.write_agreeing_pair(str(tmp_path_factory.mktemp("agree")))


@pytest.fixture(scope="session")
def trained_relay(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The relay target and drafters trained for it by `localspec train` (both variants)."""
    pytest.importorskip("torch")
    from helpers.trained import train_relay_drafters

    return train_relay_drafters(str(tmp_path_factory.mktemp("relay")))


@pytest.fixture(scope="session")
def noisy_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """An agreeing pair whose shared head has random logits added: sampling has real choices
    (the sampling tests' chi-square checks)."""
    return tm.write_agreeing_pair(
        str(tmp_path_factory.mktemp("noisy")), head_noise=0.2, name="noisy"
    )
