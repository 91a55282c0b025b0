"""Module paths that moved when localspec's flat folder became subpackages (0.1): the old path
keeps working through 0.1, each name read through it with a DeprecationWarning, and is
removed in 0.2."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable


def moved(old: str, new: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` for the shim at ``old``: it hands out
    ``new``'s names (``from old import *`` included), each with a DeprecationWarning, and
    lists them."""

    def public() -> list[str]:
        module = importlib.import_module(new)
        names = getattr(module, "__all__", None)
        return sorted(names if names is not None else (n for n in vars(module) if n[0] != "_"))

    def warn() -> None:
        warnings.warn(
            f"{old} moved to {new}; the old path is removed in localspec 0.2",
            DeprecationWarning,
            stacklevel=3,
        )

    def __getattr__(name: str) -> object:
        if name == "__all__":  # from old import *
            warn()
            return public()
        if name.startswith("__"):
            raise AttributeError(name)
        warn()
        return getattr(importlib.import_module(new), name)

    return __getattr__, public


def moved_names(old: str, names: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` for a module ``old`` some of whose names moved: each name in
    ``names`` is handed out from its new module with a DeprecationWarning."""

    def __getattr__(name: str) -> object:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old}.{name} moved to {new}.{name}; the old path is removed in localspec 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
