"""A target's own multi-token-prediction (MTP, "nextn") head as a drafter.

Qwen3.5/3.6, GLM-4.5+, DeepSeek V3 and others ship one or more MTP blocks after the trunk in
the same GGUF. llama.cpp runs such a block in a second context on the same model (the MTP
context type): fed the pair (token x[p+1], the target's hidden state h[p]) it predicts
x[p+2], and it returns its own hidden state, which the next draft step reads instead of the
target's. That is exactly the EAGLE-3 decoder's contract (pair (token[P+1], g[P]), the state
fed back), with the target's nextn hidden state for g and no encoder, so the MTP drafter is
the EAGLE Drafter with those two graphs swapped: the same cache bookkeeping, chains, trees,
windows and saved sessions, and every draft source built on it (auto included) works
unchanged.

A file with several MTP blocks (one per draft depth: step35, hy_v3, mimo2) is driven through its
first block applied recurrently; the others stay unused. The other architectures' graphs run
exactly one block (mtp_blocks refuses more before llama.cpp would abort).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidParameterError, UnsupportedModelError
from ..options import RuntimeOptions
from .drafter import Drafter
from .target import Target

MTP = "MTP"  # the variant, where an EAGLE drafter says "EAGLE-3" or "EAGLE-3.1"

# architectures whose llama.cpp graph runs an MTP block (vendored src/models/*.cpp, 0.3.36)
MTP_ARCHS = frozenset(
    {
        "qwen35", "qwen35moe", "qwen3next", "glm4moe", "glm-dsa", "glm5-next", "deepseek2",
        "deepseek32", "deepseek4", "bailingmoe3", "cohere2moe", "nemotron_h_moe", "step35",
        "hy_v3", "mimo2",
    }
)  # fmt: skip
# ... of which these run one block per draft step; the others assert that there is one block
# (GGML_ASSERT(n_layer_nextn == 1) while the MTP graph is reserved: an abort at context creation)
MULTI_HEAD_ARCHS = frozenset({"step35", "hy_v3", "mimo2"})


def mtp_blocks(header: Any) -> tuple[int, str]:
    """(the MTP blocks a target's header declares, "" when its head can draft, else why not),
    read before llama.cpp sees the file: an architecture without an MTP graph, a block count
    its graph asserts on, or blocks declared but left out of the file (a trunk-only export)."""
    arch = header.architecture or "unknown"
    n = header.arch_key("nextn_predict_layers")
    n = n if isinstance(n, int) and n > 0 else 0
    if n == 0:
        return 0, f"{header.path} has no MTP head (no {arch}.nextn_predict_layers blocks)"
    if arch not in MTP_ARCHS:
        return n, f"llama.cpp runs no MTP block of {arch}"
    if n > 1 and arch not in MULTI_HEAD_ARCHS:
        return n, f"llama.cpp runs one MTP block of {arch}, and {header.path} declares {n}"
    blocks = header.arch_key("block_count")
    first = f"blk.{blocks - n}.nextn.eh_proj.weight" if isinstance(blocks, int) else ""
    if first not in header.tensors:
        return n, f"{header.path} declares {n} MTP block(s) but holds no {first or 'eh_proj'}"
    return n, ""


@dataclass(frozen=True)
class MtpSpec:
    """What the engine and session files read of a drafter's spec, for an MTP head: its file
    is the target's own."""

    path: str
    n_heads: int  # MTP blocks in the file (the first drafts)
    variant: str = MTP
    taps: tuple[int, ...] = (-1,)  # the target's nextn hidden state: one row of n_embd
    attention_window: int | None = None  # trained over the whole history


class MtpDrafter(Drafter):
    """The target's MTP block in its own llama.cpp context (the model is the target's, loaded
    with its MTP blocks: Target(load_mtp=True))."""

    kind = "mtp"

    def __init__(
        self,
        target: Target,
        rt: RuntimeOptions,
        *,
        n_seq_max: int = 1,
        window: int | None = None,
    ) -> None:
        rt = rt.checked()
        if not target.has_mtp:
            raise UnsupportedModelError(
                f"{target.path} has no MTP head (no {target.architecture}.nextn_predict_layers "
                "blocks), so it cannot draft with one"
            )
        if window is not None and window < 1:
            raise InvalidParameterError(
                f"the drafter's attention window must be >= 1, got {window}"
            )
        self.spec = MtpSpec(target.path, target.model.n_layer_nextn)  # type: ignore[assignment]
        self._out_norm = None
        self.model = target.model  # shared: closed with the target, not here
        self._open(target, rt, n_seq_max, window, target.n_embd, mtp=True)

    def encode(self, taps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """No encoder: the head reads the target's hidden state as it is."""
        if out is None:
            return np.array(taps, dtype=np.float32)
        out[:] = taps
        return out

    def feedback(self, h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The block's own hidden state feeds its next step as it is."""
        if out is None:
            return np.array(h, dtype=np.float32)
        np.copyto(out, h)
        return out

    def close(self) -> None:
        self.ctx.close()  # the model is the target's
