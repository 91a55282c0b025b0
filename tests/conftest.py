from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import tinymodels as tm  # noqa: E402

# exact numerics for comparisons with references: f32 KV cache, no flash attention
EXACT = {"kv_type": "f32", "flash_attn": False, "n_threads": 2, "n_ctx": 1024}


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test calibrates afresh: a stored calibration from another test (or from the
    user's own runs) must not stand in for timings a test controls."""
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", os.path.join(str(tmp_path), "cache"))


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
