"""Taps through the graph's eval callback: equal to the staging API's where both exist, and
what lets architectures without staged layer inputs (qwen2, gemma3) feed a drafter."""

from __future__ import annotations

import numpy as np
import pytest

import localspec
from localspec.options import RuntimeOptions
from localspec.taps import GRAPH, STAGING
from localspec.target import Target

import tinymodels as tm

RT = RuntimeOptions(n_ctx=1024, n_batch=64, n_threads=2, kv_type="f32", flash_attn=False)
TAPS = (1, 2, 3)


def test_callback_taps_equal_staging_taps_exactly(models) -> None:
    """The same llama target tapped both ways: identical rows for chunks of several sizes at
    several positions (the callback copies l_out-(L-1), the very tensor staged as layer L's
    input)."""
    staged = Target(models["target"], RT)
    graph = Target(models["target"], RT, tap_route=GRAPH)
    try:
        assert (staged.tap_route, graph.tap_route) == (STAGING, GRAPH)
        staged.enable_taps(TAPS)
        graph.enable_taps(TAPS)
        rng = np.random.default_rng(0)
        for size in (1, 3, 7, 16, 64, 2, 1):  # positions run on from 0 to 94
            toks = [int(t) for t in rng.integers(0, tm.N_VOCAB - 3, size)]
            a = staged.decode(toks, all_logits=True).copy()
            b = graph.decode(toks, all_logits=True).copy()
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(staged.read_taps(size), graph.read_taps(size))
        # switched off (plain decoding): the callback copies nothing
        graph.set_taps_active(False)
        graph.decode([5], all_logits=False)
        with pytest.raises(localspec.GenerationError, match="rows"):
            graph.read_taps(1)
    finally:
        staged.close()
        graph.close()


def test_a_graph_without_a_named_input_refuses_tap_zero(models) -> None:
    t = Target(models["target"], RT, tap_route=GRAPH)
    try:
        with pytest.raises(localspec.UnsupportedModelError, match=r"layers before \[0\]"):
            t.enable_taps((0, 1, 2))
        t.enable_taps(TAPS)  # the same graph serves taps 1..3
    finally:
        t.close()
