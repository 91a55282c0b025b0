"""Moved to ``localspec.files.discovery``; this path is kept through 0.1 and removed in 0.2."""

from ._moved import moved as _moved

__getattr__, __dir__ = _moved("localspec.discovery", "localspec.files.discovery")
