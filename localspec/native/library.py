"""llama-cpp-python, checked and completed: the version gate, llama.cpp's C++-mangled staging
functions bound by their Itanium names (checked at import), the raw-address bindings the hot
paths read through, and llama.cpp's log kept quiet but remembered for error messages."""

from __future__ import annotations

import collections
import ctypes
import os
import sys
import threading
from importlib import metadata
from typing import Any

import numpy as np

from ..errors import GenerationError, NativeLibraryError

REQUIRED_LLAMA_CPP_PYTHON = "0.3.36"

try:
    import llama_cpp as _llama_cpp_pkg
    from llama_cpp import llama_cpp as C
except Exception as exc:  # ImportError, or OSError when libllama cannot be loaded
    raise NativeLibraryError(
        f"localspec needs llama-cpp-python=={REQUIRED_LLAMA_CPP_PYTHON} "
        f"(pip install 'llama-cpp-python=={REQUIRED_LLAMA_CPP_PYTHON}'): {exc}"
    ) from None

from llama_cpp.llama_chat_format import (  # noqa: E402  (after the check above)
    CHATML_CHAT_TEMPLATE as CHATML_CHAT_TEMPLATE,
)


def _installed_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return getattr(_llama_cpp_pkg, "__version__", "unknown")


INSTALLED_LLAMA_CPP_PYTHON = _installed_version()

_c_float_p = ctypes.POINTER(ctypes.c_float)
_c_int32_p = ctypes.POINTER(ctypes.c_int32)
_ctx_p = C.llama_context_p_ctypes
_model_p = C.llama_model_p_ctypes

# name -> (Itanium-mangled symbol, argtypes, restype). The C++ prototype is the comment above.
_STAGING: dict[str, tuple[str, list[Any], Any]] = {
    # void llama_set_embeddings_layer_inp(llama_context * ctx, uint32_t lid, bool value)
    "set_embeddings_layer_inp": (
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        [_ctx_p, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    # float * llama_get_embeddings_layer_inp(llama_context * ctx, uint32_t lid)
    "get_embeddings_layer_inp": (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        [_ctx_p, ctypes.c_uint32],
        _c_float_p,
    ),
    # void llama_set_embeddings_nextn(llama_context * ctx, bool value, bool masked)
    "set_embeddings_nextn": (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        [_ctx_p, ctypes.c_bool, ctypes.c_bool],
        None,
    ),
    # float * llama_get_embeddings_nextn(llama_context * ctx)
    "get_embeddings_nextn": (
        "_Z26llama_get_embeddings_nextnP13llama_context",
        [_ctx_p],
        _c_float_p,
    ),
    # float * llama_get_embeddings_nextn_ith(llama_context * ctx, int32_t i)
    "get_embeddings_nextn_ith": (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        [_ctx_p, ctypes.c_int32],
        _c_float_p,
    ),
    # const int32_t * llama_model_target_layer_ids(const llama_model * model)
    "model_target_layer_ids": (
        "_Z28llama_model_target_layer_idsPK11llama_model",
        [_model_p],
        _c_int32_p,
    ),
    # uint32_t llama_model_target_layer_ids_n(const llama_model * model)
    "model_target_layer_ids_n": (
        "_Z30llama_model_target_layer_ids_nPK11llama_model",
        [_model_p],
        ctypes.c_uint32,
    ),
    # llama_context * llama_get_ctx_other(llama_context * ctx)
    "get_ctx_other": ("_Z19llama_get_ctx_otherP13llama_context", [_ctx_p], _ctx_p),
}


def _bind_staging() -> dict[str, Any]:
    if INSTALLED_LLAMA_CPP_PYTHON != REQUIRED_LLAMA_CPP_PYTHON:
        raise NativeLibraryError(
            f"localspec needs llama-cpp-python=={REQUIRED_LLAMA_CPP_PYTHON} exactly (it binds "
            f"llama.cpp's unstable staging API); found {INSTALLED_LLAMA_CPP_PYTHON}. "
            f"Run: pip install 'llama-cpp-python=={REQUIRED_LLAMA_CPP_PYTHON}'"
        )
    lib = C._lib
    bound: dict[str, Any] = {}
    missing = []
    for name, (symbol, argtypes, restype) in _STAGING.items():
        try:
            fn = getattr(lib, symbol)
        except AttributeError:
            missing.append(symbol)
            continue
        fn.argtypes = argtypes
        fn.restype = restype
        bound[name] = fn
    if missing:
        raise NativeLibraryError(
            "libllama lacks staging symbols localspec needs (" + ", ".join(missing) + "); "
            f"install llama-cpp-python=={REQUIRED_LLAMA_CPP_PYTHON} built for Linux or macOS "
            "(Windows/MSVC mangles C++ names differently and is not supported)"
        )
    return bound


_S = _bind_staging()

set_embeddings_layer_inp = _S["set_embeddings_layer_inp"]
get_embeddings_layer_inp = _S["get_embeddings_layer_inp"]
set_embeddings_nextn = _S["set_embeddings_nextn"]
get_embeddings_nextn_ith = _S["get_embeddings_nextn_ith"]
model_target_layer_ids = _S["model_target_layer_ids"]
model_target_layer_ids_n = _S["model_target_layer_ids_n"]
get_ctx_other = _S["get_ctx_other"]


# --- logging: keep llama.cpp quiet, but remember its last lines for error messages ----------

_recent_log: collections.deque[str] = collections.deque(maxlen=40)
_log_lock = threading.Lock()
_VERBOSE = bool(os.environ.get("LOCALSPEC_VERBOSE"))


@C.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    msg = text.decode("utf-8", errors="replace")
    with _log_lock:
        _recent_log.append(msg)
    if _VERBOSE:
        print(msg, end="", file=sys.stderr, flush=True)


C.llama_log_set(_log_callback, ctypes.c_void_p(0))  # the callback object lives at module level
C.llama_backend_init()


def clear_log() -> None:
    with _log_lock:
        _recent_log.clear()


def last_errors(n: int = 3) -> str:
    """The last few error-looking lines llama.cpp printed (for a readable exception)."""
    with _log_lock:
        lines = "".join(_recent_log).splitlines()
    keep = [ln.strip() for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    return "; ".join(keep[-n:])


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can run layers on a GPU (CUDA, Metal, ...)."""
    return bool(C.llama_supports_gpu_offload())


def _bind_c(name: str, argtypes: list[Any], restype: Any, *, own: bool = False) -> Any:
    """own: a function object of our own (ctypes shares the one attribute access gives, and
    other bindings of the same symbol must keep their types)."""
    try:
        fn = C._lib[name] if own else getattr(C._lib, name)
    except AttributeError:
        raise NativeLibraryError(
            f"libllama lacks {name}; install llama-cpp-python=={REQUIRED_LLAMA_CPP_PYTHON}"
        ) from None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


_vp = ctypes.c_void_p
# llama_get_logits_ith and the staging llama_get_embeddings_nextn_ith as plain addresses (the
# bindings above return ctypes pointer objects, which cost more to turn into arrays)
_logits_ith_addr = _bind_c("llama_get_logits_ith", [_ctx_p, ctypes.c_int32], _vp, own=True)
_nextn_ith_addr = _bind_c(
    _STAGING["get_embeddings_nextn_ith"][0], [_ctx_p, ctypes.c_int32], _vp, own=True
)
_nextn_addr = _bind_c(_STAGING["get_embeddings_nextn"][0], [_ctx_p], _vp, own=True)
_logits_addr = _bind_c("llama_get_logits", [_ctx_p], _vp, own=True)
_ggml_get_name = _bind_c("ggml_get_name", [_vp], ctypes.c_char_p)
_ggml_tensor_get = _bind_c(
    "ggml_backend_tensor_get", [_vp, _vp, ctypes.c_size_t, ctypes.c_size_t], None
)


def _view(addr: int, n: int) -> np.ndarray:
    """n float32 values at a C address, as an array that does not own them."""
    cells: Any = (ctypes.c_float * n).from_address(addr)  # a buffer numpy reads in place
    return np.frombuffer(cells, dtype=np.float32)


def float_rows(ptr: Any, n_rows: int, width: int) -> np.ndarray:
    """View n_rows x width floats at a C pointer (valid until the next decode: copy to keep)."""
    if not ptr:
        raise GenerationError("llama.cpp returned no hidden-state rows")
    return np.ctypeslib.as_array(ptr, shape=(n_rows, width))
