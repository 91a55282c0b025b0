"""Hidden states through the graph's eval callback, and the context slot that holds it."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..errors import GenerationError
from .library import C, _ggml_get_name, _ggml_tensor_get

# --- hidden states through the graph's eval callback ------------------------------------------
# ggml asks the callback about every node of the graph (ask=True: "do you want its data?") and
# calls it again (ask=False) for the nodes it said yes to, once computed. Every decoder layer's
# output is named l_out-<il>, so this reaches the hidden states of any architecture, where
# llama.cpp's staging API only serves graphs that record layer inputs.


class _TensorHead(ctypes.Structure):
    """The leading fields of ggml's struct ggml_tensor (ggml.h): type, buffer, ne, nb."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


class GraphTaps:
    """Copies named graph nodes of every decode into numpy buffers (rows in batch order: one
    micro-batch per decode, or several appended in order). ``census`` (a set) collects the
    name of every node asked about, to learn what a graph offers."""

    def __init__(self, capacity: int, width: int) -> None:
        self.capacity, self.width = capacity, width
        self.active = False
        self.census: set[bytes] | None = None
        self._slot: dict[bytes, int] = {}  # node name -> buffer
        self._bufs: list[np.ndarray] = []
        self._rows: list[int] = []
        self.error = ""
        # the C function pointer must stay referenced while llama.cpp can call it
        self.callback = C.ggml_backend_sched_eval_callback(self._on_node)
        # the callback's user data: an address of our own that nothing else holds, which
        # tells where the context keeps the callback (the callback itself ignores it)
        self._tag_cell = ctypes.c_uint64(0x6C6F63616C737063)
        self.tag = ctypes.c_void_p(ctypes.addressof(self._tag_cell))

    def want(self, names: list[bytes]) -> None:
        self._slot = {n: i for i, n in enumerate(names)}
        self._bufs = [np.zeros((self.capacity, self.width), dtype=np.float32) for _ in names]
        self._rows = [0] * len(names)

    def begin(self) -> None:
        self._rows = [0] * len(self._rows)
        self.error = ""

    def rows(self, slot: int, n_rows: int) -> np.ndarray:
        """The copied rows of a wanted node (a view, valid until the next decode)."""
        if self._rows[slot] < n_rows:
            raise GenerationError(
                f"the graph gave {self._rows[slot]} rows of a tapped layer, {n_rows} expected"
            )
        return self._bufs[slot][:n_rows]

    def check(self) -> None:
        if self.error:
            raise GenerationError(f"tapping the target's graph failed: {self.error}")

    def _on_node(self, t: int, ask: bool, _user: Any) -> bool:
        # runs inside llama_decode for every node: no exceptions may escape (ctypes would
        # print them and return False, which tells ggml to stop computing the graph)
        try:
            name = _ggml_get_name(t)
            if ask:
                if self.census is not None:
                    self.census.add(name)
                return self.active and name in self._slot
            slot = self._slot[name]
            head = _TensorHead.from_address(t)
            n, at = int(head.ne[1]), self._rows[slot]
            if head.type != 0 or head.ne[0] != self.width or head.nb[1] != 4 * self.width:
                self.error = f"node {name.decode()} is not {self.width} contiguous f32 columns"
            elif at + n > self.capacity:
                self.error = f"node {name.decode()} has {at + n} rows, more than {self.capacity}"
            else:
                dst = self._bufs[slot][at:].ctypes.data
                _ggml_tensor_get(t, dst, 0, n * self.width * 4)
                self._rows[slot] = at + n
        except Exception as exc:  # noqa: BLE001 - reported after the decode instead
            self.error = f"{type(exc).__name__}: {exc}"
        return True


def _fn_address(fn: Any) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


_SLOT_SCAN_WORDS = 48  # the context's leading bytes searched (its parameters come second)


def _callback_slot(ctx_ptr: Any, graph_taps: GraphTaps) -> int | None:
    """The address of the context's eval-callback field: the one 8-byte word in the leading
    bytes of the llama_context that holds our callback's address, followed by our tag (the
    pair is llama_cparams' cb_eval and cb_eval_user_data, llama-cparams.h, 0.3.36). None when
    the pair is not found exactly once (another layout): the callback then stays installed."""
    base = int(ctypes.cast(ctx_ptr, ctypes.c_void_p).value or 0)
    cb, tag = _fn_address(graph_taps.callback), int(graph_taps.tag.value or 0)
    if not base or not cb or not tag:
        return None
    words = (ctypes.c_uint64 * _SLOT_SCAN_WORDS).from_address(base)
    hits = [i for i in range(_SLOT_SCAN_WORDS - 1) if words[i] == cb and words[i + 1] == tag]
    return base + 8 * hits[0] if len(hits) == 1 else None
