"""How the target's hidden states reach the drafter: llama.cpp's staging API where the graph
records layer inputs (fast everywhere), else the graph's eval callback, which serves any
architecture whose layers name their output ``l_out-<il>`` (the input of layer L is the output
of layer L-1; on a GPU every node it copies splits the graph and synchronises). The callback is
installed only while taps are on.
"""

from __future__ import annotations

import numpy as np

from .. import native as N
from ..files.gguf_keys import RECURRENT_ARCHS, STAGING_ARCHS

STAGING = "staging API"
GRAPH = "graph callback"


def route_for(architecture: str) -> str:
    """How a target of this architecture is tapped: recurrent and hybrid graphs (qwen35, lfm2,
    nemotron_h, mamba ...) name their layer outputs too, so the callback serves them."""
    if architecture in RECURRENT_ARCHS:
        return GRAPH
    return STAGING if architecture in STAGING_ARCHS else GRAPH


def input_node(layer: int, census: set[bytes]) -> bytes | None:
    """The graph node that holds the input of a layer, if the graph names one."""
    if layer > 0:
        name = f"l_out-{layer - 1}".encode()
        return name if name in census else None
    # layer 0 reads the token embeddings: "embd" (llama.cpp's generic input, with its generic
    # scale), unless the model scales them again in its own graph, where it names the result
    # (gemma's "inp_scaled", afmoe's "inp_embd_scaled": vendored src/models/*.cpp, 0.3.36)
    for name in (b"inp_scaled", b"inp_embd_scaled", b"embd"):
        if name in census:
            return name
    return None


class StagingTaps:
    """Layer inputs kept by llama.cpp itself (llama_set_embeddings_layer_inp)."""

    route = STAGING

    def __init__(self, ctx: N.NativeContext, layers: tuple[int, ...]) -> None:
        self.ctx, self.layers, self.active = ctx, layers, False

    def set_active(self, active: bool) -> None:
        for lid in self.layers:
            self.ctx.keep_layer_input(lid, active)
        self.active = active

    def read(self, n_rows: int, out: np.ndarray) -> None:
        w = self.ctx.n_embd
        for j, lid in enumerate(self.layers):
            out[:, j * w : (j + 1) * w] = self.ctx.layer_input(lid, n_rows)


class CallbackTaps:
    """Layer outputs copied out of the graph as it is computed (N.GraphTaps). While they are
    off the callback is removed, so plain steps decode as a context without one does."""

    route = GRAPH

    def __init__(self, ctx: N.NativeContext, nodes: list[bytes]) -> None:
        assert ctx.graph_taps is not None
        self.ctx, self.graph, self.active = ctx, ctx.graph_taps, False
        unique = list(dict.fromkeys(nodes))  # a layer tapped twice is copied once
        self.graph.want(unique)
        self._slots = [unique.index(n) for n in nodes]

    def set_active(self, active: bool) -> None:
        self.graph.active = self.active = active
        self.ctx.set_eval_callback(active)

    def read(self, n_rows: int, out: np.ndarray) -> None:
        w = self.graph.width
        for j, slot in enumerate(self._slots):
            out[:, j * w : (j + 1) * w] = self.graph.rows(slot, n_rows)


class NextnTaps:
    """The hidden state an MTP head reads (llama.cpp's nextn embeddings of every row), for a
    target that drafts with its own multi-token-prediction block. One "tap" of n_embd."""

    route = "nextn (MTP)"

    def __init__(self, ctx: N.NativeContext) -> None:
        self.ctx, self.active = ctx, False

    def set_active(self, active: bool) -> None:
        self.ctx.output_nextn(active, masked=False)
        self.active = active

    def read(self, n_rows: int, out: np.ndarray) -> None:
        out[:] = self.ctx.nextn(n_rows, self.ctx.n_embd)
