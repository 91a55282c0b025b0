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

__all__ = [
    "CHATML_CHAT_TEMPLATE",
    "INSTALLED_LLAMA_CPP_PYTHON",
    "REQUIRED_LLAMA_CPP_PYTHON",
    "Batch",
    "GGUFHeader",
    "GGUFTensorInfo",
    "GraphTaps",
    "NativeContext",
    "NativeModel",
    "clear_log",
    "float_rows",
    "gguf_string_array",
    "gpu_offload_supported",
    "last_errors",
    "quantize_model",
]
