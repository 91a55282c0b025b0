"""scripts/get-real-targets.py and tests/helpers/realmodels.py: how tests find the real qwen2 and
gemma3 targets, and (when they are present) that llama.cpp runs them and names every layer's
output."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from localspec.lowlevel import parts

from helpers import realmodels
from helpers.cpp_pass import llama_cpp_pass

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_check_reports_missing_and_wrong_files(tmp_path: object) -> None:
    folder = str(tmp_path)
    with open(os.path.join(folder, "gemma-3-270m-q4_k_m.gguf"), "wb") as f:
        f.write(b"GGUF but far too short")
    script = os.path.join(ROOT, "scripts", "get-real-targets.py")
    run = subprocess.run(
        [sys.executable, script, "--check", "--dest", folder], capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "qwen25-coder-1.5b: missing or wrong" in run.stdout
    assert "gemma3-270m: missing or wrong" in run.stdout
    assert os.listdir(folder) == ["gemma-3-270m-q4_k_m.gguf"]  # --check downloads nothing


def test_helpers_skip_when_the_folder_lacks_them(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALSPEC_REAL_MODELS", str(tmp_path))
    assert realmodels.real_target_path(realmodels.QWEN25_CODER) is None
    with pytest.raises(pytest.skip.Exception, match="get-real-targets.py"):
        realmodels.gemma3_270m_path()


@pytest.mark.real_targets
@pytest.mark.parametrize(
    ("find", "toks", "n_layer", "n_embd"),
    [
        (realmodels.qwen25_coder_path, [9707, 11, 1879, 0, 576, 4128], 28, 1536),
        (realmodels.gemma3_270m_path, [2, 818, 5279, 529, 7001, 563], 18, 640),
    ],
    ids=["qwen25-coder-1.5b", "gemma3-270m"],
)
def test_real_target_runs_and_names_every_layer_output(find, toks, n_layer, n_embd) -> None:  # type: ignore[no-untyped-def]
    names = [f"l_out-{il}" for il in range(n_layer + 1)]
    logits, states = llama_cpp_pass(find(), toks, [len(toks)], names)
    assert np.isfinite(logits).all()
    assert sorted(states) == sorted(names[:-1])  # l_out-0 .. l_out-(n_layer-1), no more
    for name in names[:-1]:
        assert states[name].shape == (len(toks) * n_embd,), name
        assert np.isfinite(states[name]).all()


@pytest.mark.real_targets
@pytest.mark.parametrize(
    ("find", "prompt"),
    [
        (realmodels.qwen25_coder_path, 'def quicksort(items):\n    """Sort a list."""\n'),
        (realmodels.gemma3_270m_path, "The history of the printing press begins in"),
    ],
    ids=["qwen25-coder-1.5b", "gemma3-270m"],
)
def test_speculation_on_a_real_untappable_target_is_plain_greedy(find, prompt, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """128 tokens through the graph callback's taps, chains and trees: every token is plain
    greedy's up to near-ties of the quantized target (helpers/greedy.py)."""
    import localspec

    from helpers import tinymodels as tm
    from helpers.greedy import QUANT_MARGIN, assert_greedy_lossless

    target = find()
    draft = tm.random_drafter_for(target, str(tmp_path / "random.eagle3.gguf"))
    with localspec.load(target, draft=draft, n_threads=2, n_ctx=1024) as eng:
        assert parts(eng).target.tap_route == "graph callback"
        for mode in ({"n_draft": 3}, {"tree": (3, 2, 6)}):
            c = eng.complete(prompt, max_tokens=128, **mode)
            assert len(c.tokens) == 128 or c.finish_reason == "eos"
            assert c.stats.drafted > 0
            assert_greedy_lossless(eng, prompt, c, margin=QUANT_MARGIN)
