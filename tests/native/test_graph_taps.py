"""Taps through the graph's eval callback: equal to the staging API's where both exist, and
what lets architectures without staged layer inputs (qwen2, gemma3) feed a drafter."""

from __future__ import annotations

import numpy as np
import pytest

import localspec
from localspec.lowlevel import parts
from localspec.options import RuntimeOptions
from localspec.runtime.taps import GRAPH, STAGING
from localspec.runtime.target import Target

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless

RT = RuntimeOptions(n_ctx=1024, n_batch=64, n_threads=2, kv_type="f32", flash_attn=False)
TAPS = (0, 2, 3)  # 0: the input embedding ("embd"), 2 and 3: outputs of layers 1 and 2


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


def test_the_callback_is_removed_while_taps_are_off(models) -> None:
    """Plain steps of a callback-tapped target run without the callback: ggml asks it about no
    node (each ask enters Python, about a millisecond a decode on a GPU, and splits the
    graph). Switched on again, it copies the very rows the staging API keeps."""
    staged = Target(models["target"], RT)
    graph = Target(models["target"], RT, tap_route=GRAPH)
    try:
        staged.enable_taps(TAPS)
        graph.enable_taps(TAPS)
        assert graph.ctx.callback_switchable
        assert graph.ctx.graph_taps is not None
        asked: set[bytes] = set()
        graph.ctx.graph_taps.census = asked
        rng = np.random.default_rng(2)
        for on in (False, True, False, True):
            graph.set_taps_active(on)
            staged.set_taps_active(on)
            asked.clear()
            toks = [int(t) for t in rng.integers(0, tm.N_VOCAB - 3, 5)]
            a = staged.decode(toks, all_logits=True).copy()
            b = graph.decode(toks, all_logits=True).copy()
            np.testing.assert_array_equal(a, b)
            if on:
                assert {b"l_out-1", b"l_out-2"} <= asked
                np.testing.assert_array_equal(staged.read_taps(5), graph.read_taps(5))
            else:
                assert asked == set()
    finally:
        staged.close()
        graph.close()


@pytest.mark.parametrize("route", [STAGING, GRAPH])
def test_taps_move_to_other_layers(models, route) -> None:
    """enable_taps again with other layers (another drafter on the same target): the rows are
    those of a target tapped at those layers from the start, and the old layers are no longer
    kept."""
    rng = np.random.default_rng(2)
    tokens = [int(t) for t in rng.integers(0, tm.N_VOCAB - 3, 12)]
    fresh = Target(models["target"], RT, tap_route=route)
    moved = Target(models["target"], RT, tap_route=route)
    try:
        fresh.enable_taps(TAPS)
        moved.enable_taps((1, 2, 3))
        moved.decode(tokens[:5], all_logits=False)
        moved.clear()
        moved.enable_taps(TAPS)
        assert moved.taps == TAPS and moved.taps_active
        if route == STAGING:
            assert moved.ctx._kept_layers == set(TAPS)
        for t in (fresh, moved):
            t.decode(tokens, all_logits=False)
        np.testing.assert_array_equal(moved.read_taps(12), fresh.read_taps(12))
    finally:
        fresh.close()
        moved.close()


def test_a_tap_the_graph_does_not_name_is_refused(models) -> None:
    t = Target(models["target"], RT, tap_route=GRAPH)
    try:
        census = t._graph_census()
        assert {b"embd", b"l_out-0", b"l_out-1", b"l_out-2", b"l_out-3"} <= census
        t._census = census - {b"l_out-1"}  # a graph that would not name layer 1's output
        with pytest.raises(localspec.UnsupportedModelError, match=r"layers before \[2\]"):
            t.enable_taps((1, 2, 3))
        t._census = {n for n in census if not n.startswith(b"l_out-")}
        with pytest.raises(localspec.UnsupportedModelError, match="no l_out"):
            t.enable_taps((0,))
        t._census = census
        t.enable_taps((1, 2, 3))
    finally:
        t.close()


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Tiny qwen2 (q/k/v biases) and gemma3 (scaled embeddings, sliding-window layers) targets,
    each with a random EAGLE-3.1 drafter tapping layers 0, 2 and 3."""
    d = tmp_path_factory.mktemp("foreign")
    out = {}
    for arch, write in (("qwen2", tm.write_qwen2_target), ("gemma3", tm.write_gemma3_target)):
        target = write(str(d / f"{arch}.gguf"))
        ds = tm.DrafterShape(taps=(0, 2, 3), fc_norm=True, norm_output=True)
        out[arch] = (target, tm.write_drafter(str(d / f"{arch}.eagle3.gguf"), target, ds))
    return out


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_callback_taps_equal_an_independent_reference(foreign, arch) -> None:
    """Rows decoded in chunks at several positions, past gemma3's 6-token window, equal the
    numpy reference's hidden states entering layers 0, 2 and 3."""
    from helpers.reference_targets import RefTarget

    target, _ = foreign[arch]
    rng = np.random.default_rng(1)
    tokens = [int(t) for t in rng.integers(0, tm.N_VOCAB - 3, 30)]
    want = RefTarget(target).forward(tokens).inputs
    t = Target(target, RT)
    try:
        assert t.tap_route == GRAPH
        t.enable_taps(TAPS)
        at = 0
        for size in (1, 7, 2, 12, 8):
            t.decode(tokens[at : at + size], all_logits=False)
            got = t.read_taps(size).reshape(size, len(TAPS), t.n_embd)
            for j, layer in enumerate(TAPS):
                ref = want[layer, at : at + size]
                err = np.abs(got[:, j] - ref).max() / np.abs(ref).max()
                assert err < 1e-4, (arch, layer, at, err)
            at += size
    finally:
        t.close()


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
@pytest.mark.parametrize(
    "mode", [{"n_draft": 3}, {"tree": (3, 2, 6)}, {}], ids=["chain", "tree", "auto"]
)
def test_speculation_on_untappable_architectures_is_plain_greedy(foreign, arch, mode) -> None:
    target, draft = foreign[arch]
    with localspec.load(target, draft=draft, **EXACT) as eng:
        assert parts(eng).target.tap_route == GRAPH and eng.draft_variant == "EAGLE-3.1"
        for prompt in ("the quick brown fox jumps", "Once upon a time, there was"):
            c = eng.complete(prompt, max_tokens=50, **mode)
            assert len(c.tokens) == 50
            if mode:
                assert c.stats.drafted > 0
            assert_greedy_lossless(eng, prompt, c)
