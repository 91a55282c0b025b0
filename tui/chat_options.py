"""What `localspec chat` starts with, and how it loads the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localspec import EngineConfig, SessionCache

if TYPE_CHECKING:  # the engine module loads libllama: imported only where it is used
    from localspec import Engine

# disk for conversations' saved KV states (least recently used evicted)
SESSION_CACHE_BYTES = SessionCache.DEFAULT_MAX_BYTES


@dataclass
class ChatOptions:
    # the engine to load: target, drafter, speculation and how the parts run (the command
    # line checked it before the app started); its draft_source and n_draft / tree are the
    # first replies' (/source, /k and /tree change them)
    config: EngineConfig = field(default_factory=EngineConfig)
    system: str = ""
    # None: as the model recommends (its GGUF's general.sampling.*, else llama.cpp's defaults)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    max_tokens: int = 512
    seed: int | None = None
    context_overflow: str = "rolling"  # "rolling": drop the oldest turns; "stop": end there
    session_cache_bytes: int = SESSION_CACHE_BYTES  # 0: reopened conversations prefill again


def default_engine_factory(o: ChatOptions) -> Engine:
    # /source can turn EAGLE drafting on later: the chat loads the drafter found beside the
    # target whatever source it starts with (each reply names its own source), unless
    # --no-draft (draft=False) left it out
    source = o.config.draft_source
    engine: Engine = o.config.load(draft_source="auto" if source in ("ngram", "none") else source)
    return engine
