"""llama.cpp's own answer for a token list: logits of every row and named graph tensors (such as
`l_out-<il>`), copied out by a graph eval callback of the tests' own through llama.cpp's C API.

Independent of localspec's tap code, so tests can hold both localspec and the numpy reference
(reference_targets.py) against it.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Sequence

import llama_cpp
import numpy as np

from localspec.native.hardware import cpu_extra_buffers


def _ggml_base() -> ctypes.CDLL:
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    (path,) = sorted(glob.glob(os.path.join(lib_dir, "libggml-base.*")))[:1]
    lib = ctypes.CDLL(path)
    lib.ggml_get_name.argtypes, lib.ggml_get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    lib.ggml_nbytes.argtypes, lib.ggml_nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t] * 2
    lib.ggml_backend_tensor_get.restype = None
    return lib


def llama_cpp_pass(
    path: str,
    toks: Sequence[int],
    chunks: Sequence[int],
    names: Sequence[str],
    *,
    n_ctx: int = 256,
    n_threads: int = 1,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Decode `toks` at positions 0.. in batches of the given sizes (f32 KV cache, no flash
    attention, every row an output) and return the logits [n_tokens, n_vocab] and, per
    requested node name that the graph has, its data over all batches as one flat float array
    (an `l_out-<il>` reshapes to [n_tokens, n_embd]). One thread by default: plenty for tiny
    models, and not slowed down by a busy machine the way spinning threads are."""
    assert sum(chunks) == len(toks)
    ggml = _ggml_base()
    wanted = {n.encode() for n in names}
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}

    def on_node(t: int, ask: bool, _user: int) -> bool:
        name = ggml.ggml_get_name(t)
        if ask:
            return name in wanted
        # struct ggml_tensor opens with its `enum ggml_type type`; 0 is GGML_TYPE_F32
        assert ctypes.c_int.from_address(t).value == 0, f"{name!r} is not an f32 tensor"
        buf = np.empty(ggml.ggml_nbytes(t) // 4, dtype=np.float32)
        ggml.ggml_backend_tensor_get(t, buf.ctypes.data, 0, buf.nbytes)
        got[name.decode()].append(buf)
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(on_node)  # referenced until freed
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = cpu_extra_buffers()  # llama.cpp's AMX kernels crash (hardware.py)
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    assert model, path
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = cp.n_ubatch = max(chunks)
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
    cp.flash_attn_type = 0
    cp.cb_eval = callback
    ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx, path
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    logits = []
    batch = llama_cpp.llama_batch_init(max(chunks), 0, 1)
    try:
        start = 0
        for size in chunks:
            batch.n_tokens = size
            for i in range(size):
                batch.token[i] = toks[start + i]
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            assert llama_cpp.llama_decode(ctx, batch) == 0
            rows = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(size, n_vocab))
            logits.append(rows.astype(np.float64))
            start += size
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    states = {n: np.concatenate(v).astype(np.float64) for n, v in got.items() if v}
    return np.concatenate(logits), states
