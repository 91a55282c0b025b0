"""What `localspec chat` starts with, and how it loads the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from localspec import SessionCache, TreeShape

if TYPE_CHECKING:  # the engine module loads libllama: imported only where it is used
    from localspec import Engine

# disk for conversations' saved KV states (least recently used evicted)
SESSION_CACHE_BYTES = SessionCache.DEFAULT_MAX_BYTES


@dataclass
class ChatOptions:
    target: str | None = None
    draft: str | Literal[False] | None = None  # None: find one; False: none
    n_draft: int | str = "auto"  # "auto": the cost model picks plain, a chain or a tree
    tree: TreeShape | None = None  # a fixed draft tree instead
    draft_source: str = "auto"  # "auto", "eagle", "ngram" or "none" (plain decoding)
    n_gpu_layers: int = 0
    n_threads: int | None = None
    n_ctx: int = 4096
    system: str = ""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    context_overflow: str = "rolling"  # "rolling": drop the oldest turns; "stop": end there
    session_cache_bytes: int = SESSION_CACHE_BYTES  # 0: reopened conversations prefill again
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


def default_engine_factory(o: ChatOptions) -> Engine:
    from localspec import load

    # /source can turn EAGLE drafting on later: the chat loads the drafter found beside the
    # target whatever source it starts with (each reply names its own source), unless
    # --no-draft (draft=False) left it out
    kw: dict[str, Any] = dict(
        n_draft=o.n_draft,
        tree=o.tree,
        draft_source="auto" if o.draft_source in ("ngram", "none") else o.draft_source,
        n_gpu_layers=o.n_gpu_layers,
        n_threads=o.n_threads,
        n_ctx=o.n_ctx,
    )
    kw.update(o.engine_kwargs)  # engine options beyond the common ones (tests: exact numerics)
    return load(o.target, draft=o.draft, **kw)
