"""GGUF headers through ggml's own C reader: keys, arrays and tensor records without loading
the model."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import gguf
import numpy as np

from ..errors import ModelFileError
from ..files.model_path import check_model_file
from .library import _bind_c, _vp, clear_log, last_errors

# --- GGUF headers through ggml's own C reader ------------------------------------------------
# gguf-py's GGUFReader parses every tokenizer string in Python (6 s for a 49k-token vocab);
# ggml's reader does the same in milliseconds, so metadata checks before loading use it.


class _GGUFInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


_g_init = _bind_c("gguf_init_from_file", [ctypes.c_char_p, _GGUFInitParams], _vp)
_g_free = _bind_c("gguf_free", [_vp], None)
_g_n_kv = _bind_c("gguf_get_n_kv", [_vp], ctypes.c_int64)
_g_key = _bind_c("gguf_get_key", [_vp, ctypes.c_int64], ctypes.c_char_p)
_g_kv_type = _bind_c("gguf_get_kv_type", [_vp, ctypes.c_int64], ctypes.c_int)
_g_arr_type = _bind_c("gguf_get_arr_type", [_vp, ctypes.c_int64], ctypes.c_int)
_g_val_data = _bind_c("gguf_get_val_data", [_vp, ctypes.c_int64], _vp)
_g_val_str = _bind_c("gguf_get_val_str", [_vp, ctypes.c_int64], ctypes.c_char_p)
_g_arr_n = _bind_c("gguf_get_arr_n", [_vp, ctypes.c_int64], ctypes.c_size_t)
_g_arr_data = _bind_c("gguf_get_arr_data", [_vp, ctypes.c_int64], _vp)
_g_arr_str = _bind_c("gguf_get_arr_str", [_vp, ctypes.c_int64, ctypes.c_size_t], ctypes.c_char_p)
_g_n_tensors = _bind_c("gguf_get_n_tensors", [_vp], ctypes.c_int64)
_g_t_name = _bind_c("gguf_get_tensor_name", [_vp, ctypes.c_int64], ctypes.c_char_p)
_g_t_type = _bind_c("gguf_get_tensor_type", [_vp, ctypes.c_int64], ctypes.c_int)
_g_t_ne = _bind_c("gguf_get_tensor_ne", [_vp, ctypes.c_int64], ctypes.POINTER(ctypes.c_int64))
_g_t_offset = _bind_c("gguf_get_tensor_offset", [_vp, ctypes.c_int64], ctypes.c_size_t)
_g_t_size = _bind_c("gguf_get_tensor_size", [_vp, ctypes.c_int64], ctypes.c_size_t)
_g_data_offset = _bind_c("gguf_get_data_offset", [_vp], ctypes.c_size_t)
_g_find_key = _bind_c("gguf_find_key", [_vp, ctypes.c_char_p], ctypes.c_int64)

# gguf_type -> numpy dtype for scalar and numeric array values
_V = gguf.GGUFValueType
_GGUF_NUMPY = {
    _V.UINT8: np.uint8,
    _V.INT8: np.int8,
    _V.UINT16: np.uint16,
    _V.INT16: np.int16,
    _V.UINT32: np.uint32,
    _V.INT32: np.int32,
    _V.FLOAT32: np.float32,
    _V.BOOL: np.bool_,
    _V.UINT64: np.uint64,
    _V.INT64: np.int64,
    _V.FLOAT64: np.float64,
}
_GGUF_STRING, _GGUF_ARRAY = _V.STRING, _V.ARRAY


class GGUFTensorInfo:
    __slots__ = ("name", "ggml_type", "shape", "offset", "nbytes")

    def __init__(self, name: str, ggml_type: int, shape: tuple[int, ...], offset: int, nbytes: int):
        self.name, self.ggml_type, self.shape = name, ggml_type, shape
        self.offset, self.nbytes = offset, nbytes


class GGUFHeader:
    """Metadata and tensor table of a GGUF file, read without loading any weights.

    ``kv`` holds scalars as Python values and arrays as lists; string arrays longer than
    ``max_str_array`` (tokenizer vocabularies) are kept only as their length in ``kv_len``.
    """

    def __init__(self, path: str, *, max_str_array: int = 64) -> None:
        check_model_file(path)  # missing, or a folder (named as one)
        file_size = os.path.getsize(path)
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise ModelFileError(f"{path} is not a GGUF file (bad magic {magic!r})")
        clear_log()
        ctx = _g_init(os.fsencode(path), _GGUFInitParams(True, None))
        if not ctx:
            detail = last_errors() or "corrupt or truncated header"
            raise ModelFileError(f"cannot read GGUF header of {path}: {detail}")
        try:
            self.kv: dict[str, Any] = {}
            self.kv_len: dict[str, int] = {}
            self.kv_types: dict[str, tuple[int, int | None]] = {}  # (gguf type, array item type)
            for i in range(_g_n_kv(ctx)):
                key = _g_key(ctx, i).decode("utf-8", errors="replace")
                self.kv[key], self.kv_len[key] = self._value(ctx, i, max_str_array)
                t = _g_kv_type(ctx, i)
                self.kv_types[key] = (t, _g_arr_type(ctx, i) if t == _GGUF_ARRAY else None)
            self.tensors: dict[str, GGUFTensorInfo] = {}
            data_offset = _g_data_offset(ctx)
            end = data_offset
            for i in range(_g_n_tensors(ctx)):
                name = _g_t_name(ctx, i).decode("utf-8", errors="replace")
                ne = _g_t_ne(ctx, i)
                shape = tuple(int(ne[d]) for d in range(4))
                while len(shape) > 1 and shape[-1] == 1:
                    shape = shape[:-1]
                off, size = int(_g_t_offset(ctx, i)), int(_g_t_size(ctx, i))
                self.tensors[name] = GGUFTensorInfo(name, int(_g_t_type(ctx, i)), shape, off, size)
                end = max(end, data_offset + off + size)
        finally:
            _g_free(ctx)
        if end > file_size:
            raise ModelFileError(
                f"{path} is truncated: its tensors need {end} bytes, the file has {file_size}"
            )
        self.path = path
        self.file_size = file_size
        self.data_offset = data_offset

    @staticmethod
    def _value(ctx: Any, i: int, max_str_array: int) -> tuple[Any, int]:
        t = _g_kv_type(ctx, i)
        if t == _GGUF_STRING:
            return _g_val_str(ctx, i).decode("utf-8", errors="replace"), 1
        if t in _GGUF_NUMPY:
            raw = ctypes.string_at(_g_val_data(ctx, i), np.dtype(_GGUF_NUMPY[t]).itemsize)
            return np.frombuffer(raw, dtype=_GGUF_NUMPY[t])[0].item(), 1
        if t != _GGUF_ARRAY:
            return None, 0
        n, at = int(_g_arr_n(ctx, i)), _g_arr_type(ctx, i)
        if at == _GGUF_STRING:
            if n > max_str_array:
                return None, n
            return [_g_arr_str(ctx, i, j).decode("utf-8", errors="replace") for j in range(n)], n
        if at in _GGUF_NUMPY and n:
            dt = np.dtype(_GGUF_NUMPY[at] if at != gguf.GGUFValueType.BOOL else np.int8)
            raw = ctypes.string_at(_g_arr_data(ctx, i), n * dt.itemsize)
            return np.frombuffer(raw, dtype=dt).tolist(), n
        return [], n

    @property
    def architecture(self) -> str | None:
        arch = self.kv.get(gguf.Keys.General.ARCHITECTURE)
        return arch if isinstance(arch, str) else None

    def arch_key(self, suffix: str) -> Any:
        return self.kv.get(f"{self.architecture}.{suffix}")


def gguf_string_array(path: str, key: str) -> list[bytes] | None:
    """Every item of a string array (a whole vocabulary) as the C strings llama.cpp reads, cut
    at the first NUL as its std::string(const char *) does; None when the key is absent or
    not an array of strings."""
    ctx = _g_init(os.fsencode(path), _GGUFInitParams(True, None))
    if not ctx:
        raise ModelFileError(f"cannot read GGUF header of {path}: {last_errors()}")
    try:
        i = _g_find_key(ctx, key.encode())
        if i < 0 or _g_kv_type(ctx, i) != _GGUF_ARRAY or _g_arr_type(ctx, i) != _GGUF_STRING:
            return None
        get = _g_arr_str
        return [get(ctx, i, j) or b"" for j in range(_g_arr_n(ctx, i))]
    finally:
        _g_free(ctx)
