"""Checked arguments: how models run (RuntimeOptions) and the range checks of the public API."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from ._moved import moved_names as _moved_names
from .errors import InvalidParameterError
from .native.cache_types import KV_TYPES, QUANTIZED_KV
from .native.hardware import physical_cores
from .speculation.tree import MAX_TREE_NODES, TreeShape

# llama.cpp's default DRY sequence breakers (the samplers' default; the CLI shows it)
DRY_BREAKERS = ("\n", ":", '"', "*")
# llama.cpp's sampling defaults (common_params_sampling), where a model recommends nothing:
# what generate, chat and serve sample with then (--help shows them)
LLAMA_SAMPLING: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_last_n": 64,
    "repeat_penalty": 1.0,
}

NDraft = int | Literal["auto"]
MAX_DRAFT = 32
DraftSource = Literal["auto", "eagle", "mtp", "ngram", "none"]
DRAFT_SOURCES: tuple[str, ...] = ("auto", "eagle", "mtp", "ngram", "none")


# how a hybrid target's recurrent state is cut back after rejected drafts (runtime/rollback.py)
ROLLBACK_MODES = ("auto", "snapshots", "checkpoint")


def check_rollback(value: Any) -> str:
    """auto (snapshots unless they were timed to cost a plain step too much: then a checkpoint
    before each verify), snapshots, or checkpoint."""
    if value not in ROLLBACK_MODES:
        raise InvalidParameterError(
            f"rollback must be one of {', '.join(ROLLBACK_MODES)}, got {value!r}",
            parameter="rollback",
        )
    return str(value)


def check_draft_source(value: Any) -> DraftSource:
    """Where drafts may come from: every source available, the EAGLE drafter, the target's own
    MTP head, the n-gram index of the context, or none (plain decoding)."""
    if value not in DRAFT_SOURCES:
        raise InvalidParameterError(
            f"draft_source must be one of {', '.join(DRAFT_SOURCES)}, got {value!r}",
            parameter="draft_source",
        )
    return value  # type: ignore[no-any-return]


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise InvalidParameterError(
            f"{name} must be an integer in [{lo}, {hi}], got {value!r}", parameter=name
        )
    return int(value)


def check_n_draft(value: Any) -> NDraft:
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise InvalidParameterError(
            f'n_draft must be "auto" or an integer, got {value!r}', parameter="n_draft"
        )
    return check_int("n_draft", value, 0, MAX_DRAFT)


def check_tree(value: Any) -> TreeShape | None:
    """None, a TreeShape, "DEPTH,TOP_K,BUDGET" or (DEPTH, TOP_K, BUDGET) as a TreeShape."""
    if value is None or isinstance(value, TreeShape):
        return value
    if isinstance(value, str):
        return TreeShape.parse(value)
    if isinstance(value, (tuple, list)) and len(value) == 3:
        return TreeShape(*(check_int("tree", v, 1, MAX_TREE_NODES) for v in value))
    raise InvalidParameterError(f"tree must be a TreeShape, 'D,K,B' or (D, K, B), got {value!r}")


def check_stops(value: Any) -> list[str]:
    """None, a stop string or several (any iterable but a mapping) as a list; each must be a
    non-empty string."""
    if value is None:  # as llama-cpp-python and OpenAI's API take it: no stop strings
        return []
    if isinstance(value, str):
        stops = [value]
    elif isinstance(value, Iterable) and not isinstance(value, Mapping):
        stops = list(value)
    else:
        raise InvalidParameterError(
            f"stop must be a string or a list of strings, got {value!r}", parameter="stop"
        )
    if any(not isinstance(s, str) or not s for s in stops):
        raise InvalidParameterError("stop strings must be non-empty strings", parameter="stop")
    return stops


def check_flash_attn(value: Any) -> bool | None:
    """True/False, or None (llama.cpp decides: "auto"); strings as on the command line."""
    table = {"on": True, "off": False, "auto": None}
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    if value is None or isinstance(value, bool):
        return value
    raise InvalidParameterError(
        f"flash_attn must be True, False, None or on/off/auto: {value!r}", parameter="flash_attn"
    )


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
    # the drafter attends over this many latest pairs: None its GGUF's training window (all
    # pairs when it records none), 0 all of them
    draft_window: int | None = None

    def checked(self) -> RuntimeOptions:
        """The same options range-checked, with the thread count resolved."""
        threads = physical_cores() if self.n_threads is None else self.n_threads
        check_int("n_threads", threads, 1, 1024)
        check_int("n_gpu_layers", self.n_gpu_layers, -1, 100_000)
        check_int("n_ctx", self.n_ctx, 0, 1 << 24)
        check_int("n_batch", self.n_batch, 1, 1 << 16)
        check_int("draft_batch", self.draft_batch, 1, 1 << 16)
        if self.draft_window is not None:
            check_int("draft_window", self.draft_window, 0, 1 << 24)
        if self.kv_type not in KV_TYPES:
            raise InvalidParameterError(
                f"kv_type must be one of {', '.join(KV_TYPES)}", parameter="kv_type"
            )
        flash_attn = check_flash_attn(self.flash_attn)
        if self.kv_type in QUANTIZED_KV and flash_attn is False:
            # llama.cpp refuses the context (its reason only in its log); auto turns flash
            # attention on for a quantized V cache (llama_init_from_model)
            raise InvalidParameterError(
                f"kv_type {self.kv_type} quantizes the V cache, which llama.cpp runs only with "
                "flash attention: use flash_attn on or auto (--flash-attn on|auto), or an "
                "unquantized kv_type (f16, bf16, f32)"
            )
        return replace(self, n_threads=threads, flash_attn=flash_attn)

    @property
    def threads(self) -> int:
        assert self.n_threads is not None, "use checked() first"
        return self.n_threads


MAX_TOKENS = 1 << 24


def check_max_tokens(value: Any, *, least: int = 0) -> int:
    """Tokens to generate. The API takes 0 (the call only reads its prompt into the cache); a
    command generates at least one (least=1: `generate -n 0`, `chat -n 0` and `bench -n 0` are
    refused alike)."""
    return check_int("max_tokens", value, least, MAX_TOKENS)


# names that moved in 0.1 (the request rules to rules, EngineConfig to config)
_RULES = "localspec.rules"
__getattr__ = _moved_names(
    "localspec.options",
    {
        "EngineConfig": "localspec.config",
        "check_model_file": "localspec.files.model_path",
        **dict.fromkeys(
            (
                "API_SPELLING",
                "Drafting",
                "Spelling",
                "check_source_shape",
                "draft_mode",
                "loads_drafter",
                "no_drafter_note",
            ),
            _RULES,
        ),
    },
)
