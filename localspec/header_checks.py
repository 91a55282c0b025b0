"""Moved to ``localspec.native.header_checks``; this path is kept through 0.1 and removed in 0.2."""

from ._moved import moved as _moved

__getattr__, __dir__ = _moved("localspec.header_checks", "localspec.native.header_checks")
