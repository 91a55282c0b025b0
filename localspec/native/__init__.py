"""The one door to native code: llama-cpp-python's bindings plus llama.cpp's staging API.

Everything ctypes lives in this package, one module a job: ``library`` (the version gate, the
C++-mangled staging symbols bound and checked at import, llama.cpp's log), ``model`` (a loaded
model, a context, a batch), ``graph_taps`` (hidden states through the graph's eval callback),
``gguf_header`` (GGUF headers through ggml's own reader), ``header_checks`` (what llama.cpp
would abort on, refused first), ``quantize`` (llama.cpp's quantizer) and ``hardware`` (cores,
CPU features). The staging functions of ``src/llama-ext.h`` are not declared ``extern "C"``, so
libllama exports them only under C++ (Itanium ABI) mangled names and llama-cpp-python does not
bind all of them: we bind them ourselves, check every symbol at import, and fail with one
message naming the llama-cpp-python version this code was written against. Above this package
the code works with numpy arrays and Python objects only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .gguf_header import GGUFHeader, GGUFTensorInfo, gguf_string_array
    from .graph_taps import GraphTaps
    from .library import (
        CHATML_CHAT_TEMPLATE,
        INSTALLED_LLAMA_CPP_PYTHON,
        REQUIRED_LLAMA_CPP_PYTHON,
        clear_log,
        float_rows,
        gpu_offload_supported,
        last_errors,
    )
    from .model import Batch, NativeContext, NativeModel
    from .quantize import quantize_model

# name -> the module that defines it, imported on first use: ``hardware`` and
# ``header_checks``' constants must not load libllama (options.py and `import localspec` stay
# cheap, and a missing llama-cpp-python surfaces as NativeLibraryError where it is used)
_HOME = {
    "GGUFHeader": "gguf_header",
    "GGUFTensorInfo": "gguf_header",
    "gguf_string_array": "gguf_header",
    "GraphTaps": "graph_taps",
    "CHATML_CHAT_TEMPLATE": "library",
    "INSTALLED_LLAMA_CPP_PYTHON": "library",
    "REQUIRED_LLAMA_CPP_PYTHON": "library",
    "clear_log": "library",
    "float_rows": "library",
    "gpu_offload_supported": "library",
    "last_errors": "library",
    "Batch": "model",
    "NativeContext": "model",
    "NativeModel": "model",
    "quantize_model": "quantize",
}

__all__ = [
    "Batch",
    "CHATML_CHAT_TEMPLATE",
    "GGUFHeader",
    "GGUFTensorInfo",
    "GraphTaps",
    "INSTALLED_LLAMA_CPP_PYTHON",
    "NativeContext",
    "NativeModel",
    "REQUIRED_LLAMA_CPP_PYTHON",
    "clear_log",
    "float_rows",
    "gguf_string_array",
    "gpu_offload_supported",
    "last_errors",
    "quantize_model",
]
assert set(__all__) == set(_HOME)


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
