"""The one door to native code: llama-cpp-python's bindings plus llama.cpp's staging API.

Everything ctypes lives here. The staging functions of ``src/llama-ext.h`` are not declared
``extern "C"``, so libllama exports them only under C++ (Itanium ABI) mangled names and
llama-cpp-python does not bind all of them. We bind them ourselves, check every symbol at import,
and fail with one message naming the llama-cpp-python version this code was written against.
Above this module the code works with numpy arrays and Python objects only.
"""

from __future__ import annotations

import collections
import ctypes
import os
import sys
import threading
from importlib import metadata
from time import perf_counter
from typing import Any

import numpy as np

from .errors import GenerationError, ModelFileError, NativeLibraryError
from .hardware import cpu_extra_buffers
from .options import KV_TYPES, check_model_file

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


# --- ggml types for KV caches, by the names options.KV_TYPES lists -------------------------

_GGML_TYPE = dict(zip(KV_TYPES, (0, 1, 30, 8, 2), strict=True))  # f32 f16 bf16 q8_0 q4_0


# --- owners of native handles ----------------------------------------------------------------


class NativeModel:
    """Owns a ``llama_model *`` and reads what the model and its vocabulary say; free it only
    after every context using it is freed."""

    def __init__(self, path: str, *, n_gpu_layers: int, use_mmap: bool = True) -> None:
        params = C.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_mmap = use_mmap
        params.use_extra_bufts = cpu_extra_buffers()
        clear_log()
        ptr = C.llama_model_load_from_file(os.fsencode(path), params)
        if not ptr:
            detail = last_errors() or "llama.cpp could not load it"
            raise ModelFileError(f"cannot load model {path}: {detail}")
        self.ptr: Any = ptr
        self.vocab = C.llama_model_get_vocab(ptr)
        self._piece_buf = ctypes.create_string_buffer(256)

    # --- metadata ------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A metadata value as text, whole (llama.cpp returns the full length when the buffer
        is too small: read again with a buffer that fits)."""
        buf = ctypes.create_string_buffer(256)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.raw[:n].decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        """The model's default chat template (tokenizer.chat_template), or None."""
        raw = C.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def chat_formatter(self, template: str, *, add_generation_prompt: bool) -> Any:
        """llama-cpp-python's Jinja formatter for a chat template, with this model's BOS and
        EOS texts (jinja2 errors propagate: the caller words them)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        return Jinja2ChatFormatter(
            template=template,
            eos_token=self.token_text(self.eos),
            bos_token=self.token_text(self.bos),
            add_generation_prompt=add_generation_prompt,
        )

    @property
    def n_embd(self) -> int:
        return int(C.llama_model_n_embd(self.ptr))

    @property
    def n_layer(self) -> int:
        return int(C.llama_model_n_layer(self.ptr))

    @property
    def n_vocab(self) -> int:
        return int(C.llama_vocab_n_tokens(self.vocab))

    @property
    def size_bytes(self) -> int:
        return int(C.llama_model_size(self.ptr))

    @property
    def recurrent(self) -> bool:
        """Recurrent or hybrid (state space) layers: their state cannot be cut back."""
        return bool(C.llama_model_is_recurrent(self.ptr) or C.llama_model_is_hybrid(self.ptr))

    def target_layer_ids(self) -> tuple[int, ...]:
        """The tap ids an eagle3 drafter's GGUF declares (as llama.cpp read them)."""
        n = model_target_layer_ids_n(self.ptr)
        ids = model_target_layer_ids(self.ptr)
        return tuple(int(ids[i]) for i in range(n))

    # --- vocabulary ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # the buffer was too small: -n is the size needed
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token contributes to the output text (specials render as nothing)."""
        n = C.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def token_text(self, token: int) -> str:
        """A token's text as stored in the vocabulary ('' for an invalid id)."""
        if not 0 <= token < self.n_vocab:
            return ""
        raw = C.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def vocab_texts(self) -> list[bytes]:
        """Every token's text (for tokenizer comparisons)."""
        get = C.llama_vocab_get_text
        return [get(self.vocab, i) or b"" for i in range(self.n_vocab)]

    def eog_mask(self) -> np.ndarray:
        """True for every end-of-generation token (EOS, EOT, ...)."""
        is_eog = C.llama_vocab_is_eog
        return np.array([bool(is_eog(self.vocab, i)) for i in range(self.n_vocab)])

    @property
    def bos(self) -> int:
        return int(C.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(C.llama_vocab_eos(self.vocab))

    def close(self) -> None:
        if getattr(self, "ptr", None):
            C.llama_model_free(self.ptr)
            self.ptr = None


class NativeContext:
    """Owns a ``llama_context *`` built on a NativeModel (freed before its model): decoding,
    outputs (logits, tapped layer inputs, the eagle3 encoder/decoder states) and KV sequences."""

    def __init__(
        self,
        model: NativeModel,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        kv_type: str = "f16",
        flash_attn: bool | None = None,
        kv_unified: bool = True,
        n_seq_max: int = 1,
        ctx_other: NativeContext | None = None,
        embeddings_nextn: bool = False,
        graph_taps: GraphTaps | None = None,
    ) -> None:
        # llama.cpp rounds n_ctx up to a multiple of 256 but caps its batch at the n_ctx asked
        # for (llama-context.cpp): ask for the rounded size and cap the batch the same way here,
        # or a batch of more rows than llama.cpp's limit aborts the process
        n_ctx = -(-max(n_ctx, 1) // 256) * 256
        n_batch = min(n_batch, n_ctx)
        if not 1 <= n_seq_max <= min(n_batch, 256):
            # llama.cpp aborts the process on these (a batch must fit one row per sequence)
            raise GenerationError(f"n_seq_max={n_seq_max} must be in [1, min(n_batch, 256)]")
        params = C.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.type_k = _GGML_TYPE[kv_type]
        params.type_v = _GGML_TYPE[kv_type]
        params.kv_unified = kv_unified
        params.no_perf = True
        # a sliding-window cache prunes cells that fall out of the window; keep them all, so
        # that the cache can be cut back to any earlier position (prefix reuse, rollback)
        params.swa_full = True
        if graph_taps is not None:
            params.cb_eval = graph_taps.callback  # GraphTaps keeps the callback object alive
            params.cb_eval_user_data = graph_taps.tag  # finds the slot: see _callback_slot
        if flash_attn is not None:
            params.flash_attn_type = 1 if flash_attn else 0
        if ctx_other is not None:
            params.ctx_other = ctx_other.ptr
        clear_log()
        ptr = C.llama_init_from_model(model.ptr, params)
        if not ptr:
            # llama_init_from_model logs its reason last, often without the word "error"
            # (a quantized V cache without flash attention, a K/V block size the head
            # dimension does not divide)
            with _log_lock:
                tail = "".join(_recent_log).strip().splitlines()[-1:]
            detail = last_errors() or "".join(tail).strip() or "llama.cpp returned no context"
            raise GenerationError(f"cannot create a llama.cpp context (n_ctx={n_ctx}): {detail}")
        self.ptr: Any = ptr
        self.model = model
        self.graph_taps = graph_taps
        self.n_ctx = int(C.llama_n_ctx(ptr))
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.n_vocab = model.n_vocab
        self.n_embd = model.n_embd
        self.mem = C.llama_get_memory(ptr)
        self._kept_layers: set[int] = set()
        # wall seconds inside llama_decode and llama_encode so far, and in the output getters,
        # which wait for the device
        self.busy = 0.0
        self._views: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._row_views: dict[tuple[int, int, int], np.ndarray] = {}  # (address, rows, width)
        self._one_views: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # where the context keeps its eval callback, so plain steps can run without it
        self._cb_slot = _callback_slot(ptr, graph_taps) if graph_taps is not None else None
        self._cb_on = graph_taps is not None
        if embeddings_nextn:
            # masked: rows only for batch entries that request output
            set_embeddings_nextn(ptr, True, True)

    # --- running graphs ------------------------------------------------------------------------

    def decode(self, batch: Batch, what: str) -> None:
        if self.graph_taps is not None:
            self.graph_taps.begin()
        t0 = perf_counter()
        rc = C.llama_decode(self.ptr, batch.struct)
        self.busy += perf_counter() - t0
        if rc != 0:
            detail = last_errors()
            raise GenerationError(f"llama_decode failed on the {what} (code {rc}) {detail}".strip())
        if self.graph_taps is not None:
            self.graph_taps.check()

    def encode(self, batch: Batch, what: str) -> None:
        t0 = perf_counter()
        rc = C.llama_encode(self.ptr, batch.struct)
        self.busy += perf_counter() - t0
        if rc != 0:
            detail = last_errors()
            raise GenerationError(f"llama_encode failed on the {what} (code {rc}) {detail}".strip())

    # --- outputs of the last decode (views, valid until the next one: copy to keep) ------------

    def logits(self, n_rows: int) -> np.ndarray:
        """The logits of the first n_rows output rows (a view, reused as outputs' are). The
        call waits for the device, so its time counts as busy."""
        t0 = perf_counter()
        addr = _logits_addr(self.ptr)
        self.busy += perf_counter() - t0
        if not addr:
            raise GenerationError("llama.cpp returned no logits")
        return self._rows_view(addr, n_rows, self.n_vocab)

    def _rows_view(self, addr: int, n_rows: int, width: int) -> np.ndarray:
        view = self._row_views.get((addr, n_rows, width))
        if view is None:
            if len(self._row_views) > 4 * self.n_batch:  # the buffer moved many times
                self._row_views.clear()
            view = _view(addr, n_rows * width).reshape(n_rows, width)
            self._row_views[addr, n_rows, width] = view
        return view

    def outputs(self, i: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of output row i's logits and eagle3 state (valid until the next decode). A
        view is made once per place in llama.cpp's output buffer and then reused, so this
        costs two calls and no allocation (one_output: one). The first call waits for the
        device (llama.cpp synchronises there), so its time counts as the decode's (busy)."""
        t0 = perf_counter()
        lo, h = _logits_ith_addr(self.ptr, i), _nextn_ith_addr(self.ptr, i)
        self.busy += perf_counter() - t0
        if not lo or not h:
            raise GenerationError(f"llama.cpp returned no output for row {i}")
        views = self._views.get((lo, h, width))
        if views is None:
            if len(self._views) > 4 * self.n_batch:  # the buffer moved many times: start over
                self._views.clear()
            views = self._views[lo, h, width] = (_view(lo, self.n_vocab), _view(h, width))
        return views

    def one_output(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """outputs(0, width) after a decode with exactly one output row, in one call: llama.cpp
        lays its output buffer out by max(outputs, n_seq_max) and the context's fixed flags
        (embeddings on or off) alone, so after such a decode the state row sits at a fixed
        offset from the logits row, and the logits' address (which moves whenever the buffer
        does) tells which state view goes with it."""
        t0 = perf_counter()
        lo = _logits_ith_addr(self.ptr, 0)
        self.busy += perf_counter() - t0
        views = self._one_views.get((lo, width))
        if views is None:
            if len(self._one_views) > 64:  # the buffer moved many times: start over
                self._one_views.clear()
            views = self.outputs(0, width)
            self._one_views[lo, width] = views
        return views

    def keep_layer_input(self, layer: int, keep: bool) -> None:
        """Make later decodes keep (or stop keeping) the input of a layer for every row."""
        set_embeddings_layer_inp(self.ptr, layer, keep)
        if keep:
            self._kept_layers.add(layer)
        else:
            self._kept_layers.discard(layer)

    @property
    def callback_switchable(self) -> bool:
        """Whether the graph callback can be switched off (see set_eval_callback)."""
        return self._cb_slot is not None

    def set_eval_callback(self, on: bool) -> bool:
        """Install (on) or remove the graph callback this context was created with; False
        where it cannot be removed (it then stays installed and costs what it costs).

        llama.cpp has no call for this: the callback lives in the context's parameters and
        reaches the scheduler whenever a graph is built. With it installed, ggml asks Python
        about every node of every decode (about a millisecond per decode on a GPU) and
        computes the graph in pieces. So the slot is written directly (found at creation by
        the user-data tag beside it), and a scheduler reserve, which the staging call below
        requests, makes the next decode build its graph with the new value."""
        if self._cb_slot is None or self.graph_taps is None or not self.ptr:
            return False
        if on != self._cb_on:
            ctypes.c_void_p.from_address(self._cb_slot).value = (
                _fn_address(self.graph_taps.callback) if on else None
            )
            set_embeddings_layer_inp(self.ptr, 0, 0 in self._kept_layers)
            self._cb_on = on
        return True

    def layer_input(self, layer: int, n_rows: int) -> np.ndarray:
        """The input of a kept layer for the rows of the last decode [n_rows, n_embd]."""
        return float_rows(get_embeddings_layer_inp(self.ptr, layer), n_rows, self.n_embd)

    def nextn(self, n_rows: int, width: int) -> np.ndarray:
        """The eagle3 states of the last encode/decode (g rows, or the decoder's pre-norm h)."""
        t0 = perf_counter()
        addr = _nextn_addr(self.ptr)  # waits for the device, as outputs() does
        self.busy += perf_counter() - t0
        if not addr:
            raise GenerationError("llama.cpp returned no hidden-state rows")
        return self._rows_view(addr, n_rows, width)

    def nextn_ith(self, i: int, width: int) -> np.ndarray:
        return float_rows(get_embeddings_nextn_ith(self.ptr, i), 1, width)[0]

    def other(self) -> Any:
        """The context this one borrows tensors from (ctx_other), as a raw pointer."""
        return get_ctx_other(self.ptr)

    # --- KV sequences --------------------------------------------------------------------------

    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        if not C.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise GenerationError(f"llama.cpp could not remove KV positions {p0}..{p1}")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add sequence dst to the cells of src in [p0, p1) (unified KV: no data is copied)."""
        C.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_drop(self, seq: int) -> None:
        """Remove a whole sequence; cells no other sequence holds are freed."""
        C.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def seq_pos_max(self, seq: int = 0) -> int:
        return int(C.llama_memory_seq_pos_max(self.mem, seq))

    def clear(self) -> None:
        C.llama_memory_clear(self.mem, True)

    # --- saved state (session files) -------------------------------------------------------------
    # llama.cpp's own byte layout of the memory (cells, positions, sequences, K/V rows or
    # recurrent states), readable only by a context of the same model and KV settings; it
    # checks the architecture, cell counts, layer count, K/V types and row sizes itself, and a
    # refused read leaves the memory empty.

    # size_t llama_state_get_size(llama_context * ctx)
    # size_t llama_state_get_data(llama_context * ctx, uint8_t * dst, size_t size)
    # size_t llama_state_seq_get_size(llama_context * ctx, llama_seq_id seq_id)
    # size_t llama_state_seq_get_data(ctx, uint8_t * dst, size_t size, llama_seq_id seq_id)
    def state_get(self, seq: int | None = None) -> np.ndarray:
        """The memory of every sequence (None) or of one sequence, as bytes (a copy)."""
        ptr = self.ptr
        size = C.llama_state_get_size(ptr) if seq is None else C.llama_state_seq_get_size(ptr, seq)
        buf = np.empty(size, dtype=np.uint8)
        dst = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if seq is None:
            n = C.llama_state_get_data(ptr, dst, size)
        else:
            n = C.llama_state_seq_get_data(ptr, dst, size, seq)
        if n != size:
            raise GenerationError(f"llama.cpp could not copy its state ({last_errors()})")
        return buf

    # size_t llama_state_set_data(llama_context * ctx, const uint8_t * src, size_t size)
    # size_t llama_state_seq_set_data(ctx, const uint8_t * src, size_t size, llama_seq_id dest)
    def state_set(self, data: np.ndarray, seq: int | None = None) -> bool:
        """Replace the memory of every sequence (None) or of one with bytes state_get gave;
        False when llama.cpp refuses them (it never reads past len(data))."""
        data = np.ascontiguousarray(data, dtype=np.uint8)
        src = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        clear_log()
        if seq is None:
            n = C.llama_state_set_data(self.ptr, src, data.size)
        else:
            n = C.llama_state_seq_set_data(self.ptr, src, data.size, seq)
        return bool(n == data.size)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            C.llama_free(self.ptr)
            self.ptr = None
            self._cb_slot = None  # it lay inside the freed context
            self._views.clear()
            self._row_views.clear()
            self._one_views.clear()


class Batch:
    """A ``llama_batch`` whose arrays are numpy buffers we own (cheaper than llama_batch_init,
    and it can carry token ids and embedding rows at once, which the eagle3 decoder needs)."""

    def __init__(
        self, capacity: int, *, tokens: bool = True, embd: int = 0, seqs_per_row: int = 1
    ) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, seqs_per_row), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self.embd = np.zeros((capacity, embd), dtype=np.float32) if embd else None
        self._steps = np.arange(capacity, dtype=np.int32)  # consecutive positions from 0
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *[
                ctypes.cast(self.seq_ids[i].ctypes.data, ctypes.POINTER(ctypes.c_int32))
                for i in range(capacity)
            ]
        )
        s: Any = C.llama_batch()
        s.n_tokens = 0
        s.token = self.token.ctypes.data_as(ctypes.POINTER(C.llama_token)) if tokens else None
        s.embd = self.embd.ctypes.data_as(_c_float_p) if self.embd is not None else None
        s.pos = self.pos.ctypes.data_as(ctypes.POINTER(C.llama_pos))
        s.n_seq_id = self.n_seq_id.ctypes.data_as(_c_int32_p)
        s.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(C.llama_seq_id)))
        s.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.struct = s
        # leading rows already in sequence 0 alone / already with an output: a drafter's
        # batches keep that layout from step to step, and each numpy call skipped saves
        # several microseconds right after a decode (its code is out of the caches then)
        self._seq0_rows = capacity
        self._output_rows = 0

    def set(self, n: int, pos0: int, *, all_logits: bool) -> None:
        """Use the first n rows at consecutive positions pos0.. of sequence 0."""
        if n > self.capacity:
            raise ValueError(f"batch of {n} rows exceeds capacity {self.capacity}")
        if n == 1:
            self.pos[0] = pos0
        else:
            np.add(self._steps[:n], pos0, out=self.pos[:n])
        if n > self._seq0_rows:
            self.n_seq_id[:n] = 1
            self.seq_ids[:n, 0] = 0
            self._seq0_rows = n
        if all_logits:
            if n > self._output_rows:
                self.logits[:n] = 1
                self._output_rows = n
        else:
            self.logits[:n] = 0
            if n:
                self.logits[n - 1] = 1
            self._output_rows = 0
        self.struct.n_tokens = n

    def set_rows(
        self, pos: np.ndarray, seq: np.ndarray, *, logits: bool | np.ndarray = True
    ) -> None:
        """Use the first len(pos) rows at explicit positions and sequence ids (multi-sequence
        batches: parallel generation); outputs on every row when logits is set, or on the rows
        a boolean array marks."""
        n = len(pos)
        if n > self.capacity:
            raise ValueError(f"batch of {n} rows exceeds capacity {self.capacity}")
        self.pos[:n] = pos
        self.n_seq_id[:n] = 1
        self.seq_ids[:n, 0] = seq
        self.logits[:n] = logits if isinstance(logits, np.ndarray) else (1 if logits else 0)
        self._seq0_rows = self._output_rows = 0
        self.struct.n_tokens = n

    def set_tree(self, pos: np.ndarray, seqs: list[list[int]]) -> None:
        """Use the first len(pos) rows, row i in every sequence of seqs[i] (a draft tree: one
        sequence per leaf, a node in the sequences of all leaves below it); outputs on all."""
        n = len(pos)
        if n > self.capacity:
            raise ValueError(f"batch of {n} rows exceeds capacity {self.capacity}")
        self.pos[:n] = pos
        for i, ss in enumerate(seqs):
            self.n_seq_id[i] = len(ss)
            self.seq_ids[i, : len(ss)] = ss
        self.logits[:n] = 1
        self._seq0_rows, self._output_rows = 0, n
        self.struct.n_tokens = n


# --- hidden states through the graph's eval callback ------------------------------------------
# ggml asks the callback about every node of the graph (ask=True: "do you want its data?") and
# calls it again (ask=False) for the nodes it said yes to, once computed. Every decoder layer's
# output is named l_out-<il>, so this reaches the hidden states of any architecture, where
# llama.cpp's staging API only serves graphs that record layer inputs.


class _TensorHead(ctypes.Structure):
    """The leading fields of ggml's struct ggml_tensor (ggml.h): type, buffer, ne, nb."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


class GraphTaps:
    """Copies named graph nodes of every decode into numpy buffers (rows in batch order: one
    micro-batch per decode, or several appended in order). ``census`` (a set) collects the
    name of every node asked about, to learn what a graph offers."""

    def __init__(self, capacity: int, width: int) -> None:
        self.capacity, self.width = capacity, width
        self.active = False
        self.census: set[bytes] | None = None
        self._slot: dict[bytes, int] = {}  # node name -> buffer
        self._bufs: list[np.ndarray] = []
        self._rows: list[int] = []
        self.error = ""
        # the C function pointer must stay referenced while llama.cpp can call it
        self.callback = C.ggml_backend_sched_eval_callback(self._on_node)
        # the callback's user data: an address of our own that nothing else holds, which
        # tells where the context keeps the callback (the callback itself ignores it)
        self._tag_cell = ctypes.c_uint64(0x6C6F63616C737063)
        self.tag = ctypes.c_void_p(ctypes.addressof(self._tag_cell))

    def want(self, names: list[bytes]) -> None:
        self._slot = {n: i for i, n in enumerate(names)}
        self._bufs = [np.zeros((self.capacity, self.width), dtype=np.float32) for _ in names]
        self._rows = [0] * len(names)

    def begin(self) -> None:
        self._rows = [0] * len(self._rows)
        self.error = ""

    def rows(self, slot: int, n_rows: int) -> np.ndarray:
        """The copied rows of a wanted node (a view, valid until the next decode)."""
        if self._rows[slot] < n_rows:
            raise GenerationError(
                f"the graph gave {self._rows[slot]} rows of a tapped layer, {n_rows} expected"
            )
        return self._bufs[slot][:n_rows]

    def check(self) -> None:
        if self.error:
            raise GenerationError(f"tapping the target's graph failed: {self.error}")

    def _on_node(self, t: int, ask: bool, _user: Any) -> bool:
        # runs inside llama_decode for every node: no exceptions may escape (ctypes would
        # print them and return False, which tells ggml to stop computing the graph)
        try:
            name = _ggml_get_name(t)
            if ask:
                if self.census is not None:
                    self.census.add(name)
                return self.active and name in self._slot
            slot = self._slot[name]
            head = _TensorHead.from_address(t)
            n, at = int(head.ne[1]), self._rows[slot]
            if head.type != 0 or head.ne[0] != self.width or head.nb[1] != 4 * self.width:
                self.error = f"node {name.decode()} is not {self.width} contiguous f32 columns"
            elif at + n > self.capacity:
                self.error = f"node {name.decode()} has {at + n} rows, more than {self.capacity}"
            else:
                dst = self._bufs[slot][at:].ctypes.data
                _ggml_tensor_get(t, dst, 0, n * self.width * 4)
                self._rows[slot] = at + n
        except Exception as exc:  # noqa: BLE001 - reported after the decode instead
            self.error = f"{type(exc).__name__}: {exc}"
        return True


def _fn_address(fn: Any) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


_SLOT_SCAN_WORDS = 48  # the context's leading bytes searched (its parameters come second)


def _callback_slot(ctx_ptr: Any, graph_taps: GraphTaps) -> int | None:
    """The address of the context's eval-callback field: the one 8-byte word in the leading
    bytes of the llama_context that holds our callback's address, followed by our tag (the
    pair is llama_cparams' cb_eval and cb_eval_user_data, llama-cparams.h, 0.3.36). None when
    the pair is not found exactly once (another layout): the callback then stays installed."""
    base = int(ctypes.cast(ctx_ptr, ctypes.c_void_p).value or 0)
    cb, tag = _fn_address(graph_taps.callback), int(graph_taps.tag.value or 0)
    if not base or not cb or not tag:
        return None
    words = (ctypes.c_uint64 * _SLOT_SCAN_WORDS).from_address(base)
    hits = [i for i in range(_SLOT_SCAN_WORDS - 1) if words[i] == cb and words[i + 1] == tag]
    return base + 8 * hits[0] if len(hits) == 1 else None


def _view(addr: int, n: int) -> np.ndarray:
    """n float32 values at a C address, as an array that does not own them."""
    cells: Any = (ctypes.c_float * n).from_address(addr)  # a buffer numpy reads in place
    return np.frombuffer(cells, dtype=np.float32)


def float_rows(ptr: Any, n_rows: int, width: int) -> np.ndarray:
    """View n_rows x width floats at a C pointer (valid until the next decode: copy to keep)."""
    if not ptr:
        raise GenerationError("llama.cpp returned no hidden-state rows")
    return np.ctypeslib.as_array(ptr, shape=(n_rows, width))


def quantize_model(src: str, dst: str, ftype: int, n_threads: int) -> None:
    """llama.cpp's own quantizer: src GGUF -> dst GGUF of file type ftype (LLAMA_FTYPE_*)."""
    params = C.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads
    from .header_checks import check_header  # it imports this module

    check_header(GGUFHeader(src))  # the quantizer reads hparams as the loader does
    clear_log()
    if C.llama_model_quantize(os.fsencode(src), os.fsencode(dst), params) != 0:
        raise GenerationError(f"llama.cpp's quantizer failed: {last_errors() or 'no detail'}")


# --- GGUF headers through ggml's own C reader ------------------------------------------------
# gguf-py's GGUFReader parses every tokenizer string in Python (6 s for a 49k-token vocab);
# ggml's reader does the same in milliseconds, so metadata checks before loading use it.


class _GGUFInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


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
_GGUF_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


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
            dt = np.dtype(_GGUF_NUMPY[at] if at != 7 else np.int8)
            raw = ctypes.string_at(_g_arr_data(ctx, i), n * dt.itemsize)
            return np.frombuffer(raw, dtype=dt).tolist(), n
        return [], n

    @property
    def architecture(self) -> str | None:
        arch = self.kv.get("general.architecture")
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
