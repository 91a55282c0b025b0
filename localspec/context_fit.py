"""Moved to ``localspec.text.context_fit``; this path is kept through 0.1 and removed in 0.2."""

from ._moved import forward

__getattr__ = forward("localspec.context_fit", "localspec.text.context_fit")
