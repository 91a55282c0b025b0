"""localspec: lossless EAGLE-3 / EAGLE-3.1 speculative decoding for local GGUF models.

import localspec
with localspec.load("target.gguf", draft="target.eagle3.gguf") as eng:  # n_draft="auto"
    for ev in eng.complete_stream("Once upon a time", max_tokens=64):
        print(ev.text, end="")
    print(eng.stats.summary())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    CheckpointError,
    ContextFullError,
    GenerationError,
    InvalidParameterError,
    LocalspecError,
    ModelFileError,
    NativeLibraryError,
    PairMismatchError,
    SessionStateError,
    UnsupportedModelError,
)
from .files.hub import resolve_target
from .files.session_cache import SessionCache
from .stats import Stats
from .text.context_fit import (
    OVERFLOW_POLICIES,
    ContextUse,
    Fitted,
    check_overflow_policy,
    context_use,
    fit_messages,
)

if TYPE_CHECKING:  # the lazy names below, typed for type checkers
    from .config import EngineConfig
    from .converters.convert import convert
    from .engine import DRAFT_SOURCES, MAX_DRAFT, Completion, Engine, Event, load
    from .options import RuntimeOptions
    from .speculation.sampling import SamplingParams
    from .speculation.tree import TreeShape

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "CheckpointError",
    "ContextFullError",
    "DRAFT_SOURCES",
    "Engine",
    "EngineConfig",
    "Event",
    "GenerationError",
    "InvalidParameterError",
    "LocalspecError",
    "MAX_DRAFT",
    "ModelFileError",
    "NativeLibraryError",
    "PairMismatchError",
    "RuntimeOptions",
    "SamplingParams",
    "SessionCache",
    "SessionStateError",
    "Stats",
    "TreeShape",
    "UnsupportedModelError",
    "convert",
    "load",
    "ContextUse",
    "Fitted",
    "OVERFLOW_POLICIES",
    "check_overflow_policy",
    "context_use",
    "fit_messages",
    "resolve_target",
]


def __dir__() -> list[str]:
    """The module's names with the lazily imported public ones (load, Engine...), which exist
    only once first used: dir() and completion in a REPL list them too."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> object:
    # The engine imports the native door (libllama); load it on first use so that
    # `import localspec` stays cheap and its errors surface as LocalspecError at use.
    if name in ("load", "Engine", "Event", "Completion", "MAX_DRAFT", "DRAFT_SOURCES"):
        from . import engine

        return getattr(engine, name)
    if name == "EngineConfig":
        from .config import EngineConfig

        return EngineConfig
    if name == "RuntimeOptions":
        from .options import RuntimeOptions

        return RuntimeOptions
    if name == "SamplingParams":
        from .speculation.sampling import SamplingParams

        return SamplingParams
    if name == "TreeShape":
        from .speculation.tree import TreeShape

        return TreeShape
    if name == "convert":
        from .converters.convert import convert

        return convert
    raise AttributeError(name)
