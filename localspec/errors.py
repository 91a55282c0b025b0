"""The one exception hierarchy of localspec: every expected failure is a LocalspecError."""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class: a readable, expected failure (bad file, bad pair, bad parameter...)."""


class NativeLibraryError(LocalspecError):
    """llama-cpp-python is missing, the wrong version, or lacks a staging symbol we bind."""


class ModelFileError(LocalspecError):
    """A GGUF file is missing, truncated, unreadable, or not the kind of model expected."""


class UnsupportedModelError(LocalspecError):
    """The model is valid GGUF but its architecture or features cannot be used here."""


class PairMismatchError(LocalspecError):
    """Drafter and target do not belong together (sizes, taps, vocabulary, tokenizer)."""


class InvalidParameterError(LocalspecError, ValueError):
    """An argument is out of range or inconsistent. ``parameter``: the argument's name as the
    API spells it (max_tokens, n_ctx...) where one argument is at fault, else None; the
    command line names its own flag instead."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class GenerationError(LocalspecError):
    """llama.cpp failed while decoding (for example out of memory)."""


class ContextFullError(GenerationError):
    """The context window cannot hold the prompt."""


class CheckpointError(LocalspecError):
    """A drafter checkpoint is missing, corrupt, or uses features we cannot convert."""


class SessionStateError(LocalspecError):
    """A saved session cannot be restored: missing, truncated, corrupt, another format
    version, or written for other model files or cache settings."""
