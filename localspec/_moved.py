"""Module paths that moved when localspec's flat folder became subpackages (0.1): the old path
keeps working through 0.1, each name read through it with a DeprecationWarning, and is
removed in 0.2."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable


def forward(old: str, new: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for the shim at ``old`` that hands out ``new``'s names."""

    def __getattr__(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        warnings.warn(
            f"{old} moved to {new}; the old path is removed in localspec 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
