"""Checked arguments: how models run (RuntimeOptions) and the range checks of the public API."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from .errors import InvalidParameterError
from .hardware import physical_cores

KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
NDraft = int | Literal["auto"]
MAX_DRAFT = 32


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise InvalidParameterError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def check_n_draft(value: Any) -> NDraft:
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise InvalidParameterError(f'n_draft must be "auto" or an integer, got {value!r}')
    return check_int("n_draft", value, 0, MAX_DRAFT)


def check_flash_attn(value: Any) -> bool | None:
    """True/False, or None (llama.cpp decides: "auto"); strings as on the command line."""
    table = {"on": True, "off": False, "auto": None}
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    if value is None or isinstance(value, bool):
        return value
    raise InvalidParameterError(f"flash_attn must be True, False, None or on/off/auto: {value!r}")


@dataclass(frozen=True)
class RuntimeOptions:
    """How the target and drafter run. n_threads None: one per physical core; n_ctx 0: the
    model's trained context; flash_attn None: llama.cpp decides."""

    n_ctx: int = 4096
    n_batch: int = 512  # prompt chunk and largest verify batch
    draft_batch: int = 64  # the drafter's batch (its tree frontier lives in it)
    n_threads: int | None = None
    n_gpu_layers: int = 0  # -1: all
    kv_type: str = "f16"
    flash_attn: bool | None = None

    def checked(self) -> RuntimeOptions:
        """The same options range-checked, with the thread count resolved."""
        threads = physical_cores() if self.n_threads is None else self.n_threads
        check_int("n_threads", threads, 1, 1024)
        check_int("n_gpu_layers", self.n_gpu_layers, -1, 100_000)
        check_int("n_ctx", self.n_ctx, 0, 1 << 24)
        check_int("n_batch", self.n_batch, 1, 1 << 16)
        check_int("draft_batch", self.draft_batch, 1, 1 << 16)
        if self.kv_type not in KV_TYPES:
            raise InvalidParameterError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        return replace(self, n_threads=threads, flash_attn=check_flash_attn(self.flash_attn))

    @property
    def threads(self) -> int:
        assert self.n_threads is not None, "use checked() first"
        return self.n_threads
