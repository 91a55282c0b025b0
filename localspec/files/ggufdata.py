"""Tensor data of a GGUF file as numpy arrays (floats dequantized to float32 with gguf-py).

The tensor table comes from ggml's C header reader and the bytes from a memory map, so reading
a few tensors of a large model takes milliseconds instead of gguf-py's full-file parse.
"""

from __future__ import annotations

import numpy as np

from .. import native as N
from ..errors import ModelFileError


def read_tensor(header: N.GGUFHeader, name: str) -> np.ndarray:
    """One tensor in numpy order (rows, columns): floats dequantized to float32, integer
    tensors (an EAGLE-3 drafter's d2t) as they are."""
    import gguf

    info = header.tensors.get(name)
    if info is None:
        raise ModelFileError(f"{header.path} has no tensor '{name}'")
    start = header.data_offset + info.offset
    raw = np.memmap(header.path, dtype=np.uint8, mode="r", offset=start, shape=(info.nbytes,))
    shape = tuple(reversed(info.shape))
    n_rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    ints = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}
    try:
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        if qtype.name in ints:
            return np.array(raw).view(ints[qtype.name]).reshape(shape)
        values = gguf.quants.dequantize(np.array(raw).reshape(n_rows, -1), qtype)
    except (ValueError, NotImplementedError) as exc:
        raise ModelFileError(f"cannot read tensor '{name}' of {header.path}: {exc}") from None
    return np.asarray(values, dtype=np.float32).reshape(shape)


def read_tensors(path: str, names: list[str]) -> dict[str, np.ndarray]:
    header = N.GGUFHeader(path)
    return {n: read_tensor(header, n) for n in names}
