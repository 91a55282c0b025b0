"""Owners of llama.cpp's native handles: a loaded model, a context (decode, logits, hidden
states, KV memory), and a reusable batch."""

from __future__ import annotations

import ctypes
import os
from time import perf_counter
from typing import Any

import numpy as np

from ..errors import GenerationError, ModelFileError
from .cache_types import GGML_CACHE_TYPE
from .graph_taps import GraphTaps, _callback_slot, _fn_address
from .hardware import cpu_extra_buffers
from .library import (
    C,
    _c_float_p,
    _c_int32_p,
    _log_lock,
    _logits_addr,
    _logits_ith_addr,
    _nextn_addr,
    _nextn_ith_addr,
    _recent_log,
    _view,
    clear_log,
    float_rows,
    get_ctx_other,
    get_embeddings_layer_inp,
    get_embeddings_nextn_ith,
    last_errors,
    model_target_layer_ids,
    model_target_layer_ids_n,
    set_embeddings_layer_inp,
    set_embeddings_nextn,
)

# --- owners of native handles ----------------------------------------------------------------


PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (llama.h): a memory's recurrent part


class NativeModel:
    """Owns a ``llama_model *`` and reads what the model and its vocabulary say; free it only
    after every context using it is freed."""

    def __init__(
        self, path: str, *, n_gpu_layers: int, use_mmap: bool = True, load_mtp: bool = False
    ) -> None:
        """load_mtp: load the multi-token-prediction (nextn) blocks after the trunk too, for
        an MTP context (NativeContext(mtp=True)) to draft with."""
        params = C.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_mmap = use_mmap
        params.load_mtp = load_mtp
        params.use_extra_bufts = cpu_extra_buffers()
        clear_log()
        ptr = C.llama_model_load_from_file(os.fsencode(path), params)
        if not ptr:
            detail = last_errors() or "llama.cpp could not load it"
            raise ModelFileError(f"cannot load model {path}: {detail}")
        self.ptr: Any = ptr
        self.mtp_loaded = load_mtp
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
    def n_layer_nextn(self) -> int:
        """Multi-token-prediction (nextn) blocks after the trunk (0: none)."""
        return int(C.llama_model_n_layer_nextn(self.ptr))

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

    def tokenize(self, text: str | bytes, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
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

    def pieces(self, *, special: bool) -> list[bytes]:
        """Every token's bytes as detokenizing it alone gives them (llama_detokenize: a
        leading space stripped where the vocabulary does so); special: control tokens render
        as their text. llama.cpp's DRY reads the vocabulary so."""
        buf = ctypes.create_string_buffer(256)
        one = (C.llama_token * 1)()
        out = []
        for t in range(self.n_vocab):
            one[0] = t
            n = C.llama_detokenize(self.vocab, one, 1, buf, 256, False, special)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = C.llama_detokenize(self.vocab, one, 1, big, -n, False, special)
                out.append(big.raw[:n])
            else:
                out.append(buf.raw[:n])
        return out

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
        n_rs_seq: int = 0,
        mtp: bool = False,
    ) -> None:
        # llama.cpp rounds n_ctx up to a multiple of 256 but caps its batch at the n_ctx asked
        # for (llama-context.cpp): ask for the rounded size and cap the batch the same way here,
        # or a batch of more rows than llama.cpp's limit aborts the process
        n_ctx = -(-max(n_ctx, 1) // 256) * 256
        n_batch = min(n_batch, n_ctx)
        if not 1 <= n_seq_max <= min(n_batch, 256):
            # llama.cpp aborts the process on these (a batch must fit one row per sequence)
            raise GenerationError(f"n_seq_max={n_seq_max} must be in [1, min(n_batch, 256)]")
        if n_rs_seq and not 0 < n_rs_seq < n_batch - 1:
            # llama.cpp aborts at the first decode unless n_ubatch > n_rs_seq + 1
            raise GenerationError(
                f"n_rs_seq={n_rs_seq} recurrent-state snapshots need n_batch > {n_rs_seq + 1} "
                f"(got {n_batch})"
            )
        params = C.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.type_k = GGML_CACHE_TYPE[kv_type]
        params.type_v = GGML_CACHE_TYPE[kv_type]
        params.kv_unified = kv_unified
        params.no_perf = True
        # a sliding-window cache prunes cells that fall out of the window; keep them all, so
        # that the cache can be cut back to any earlier position (prefix reuse, rollback)
        params.swa_full = True
        # per-token snapshots of a recurrent state, so a sequence can be cut back a few tokens
        # (llama.cpp clamps it to 0 on architectures that cannot roll back)
        params.n_rs_seq = n_rs_seq
        if graph_taps is not None:
            params.cb_eval = graph_taps.callback  # GraphTaps keeps the callback object alive
            params.cb_eval_user_data = graph_taps.tag  # finds the slot: see _callback_slot
        if flash_attn is not None:
            params.flash_attn_type = 1 if flash_attn else 0
        if ctx_other is not None:
            params.ctx_other = ctx_other.ptr
        if mtp:
            # llama.cpp aborts creating an MTP context on a model loaded without its blocks
            if not model.mtp_loaded or model.n_layer_nextn < 1:
                raise GenerationError("an MTP context needs a model loaded with its MTP blocks")
            params.ctx_type = C.LLAMA_CONTEXT_TYPE_MTP
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
        self.n_rs_seq = int(C.llama_n_rs_seq(ptr))  # as llama.cpp kept it
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

    def output_nextn(self, on: bool, *, masked: bool) -> None:
        """Return the hidden states an MTP block reads (llama_get_embeddings_nextn) after each
        decode: for every row (masked False: a target feeding an MTP drafter) or for the rows
        that ask for output (masked True: the MTP context's own)."""
        set_embeddings_nextn(self.ptr, on, masked)

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
    # partial: the _ext forms with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, one sequence's recurrent
    # state alone (a hybrid's attention cells stay; a pure recurrent memory ignores the flag)
    def state_get(self, seq: int | None = None, *, partial: bool = False) -> np.ndarray:
        """The memory of every sequence (None) or of one sequence, as bytes (a copy);
        partial: that sequence's recurrent state only (a checkpoint)."""
        ptr = self.ptr
        if partial:
            assert seq is not None, "a recurrent checkpoint is of one sequence"
            size = C.llama_state_seq_get_size_ext(ptr, seq, PARTIAL_ONLY)
        elif seq is None:
            size = C.llama_state_get_size(ptr)
        else:
            size = C.llama_state_seq_get_size(ptr, seq)
        buf = np.empty(size, dtype=np.uint8)
        dst = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if partial:
            n = C.llama_state_seq_get_data_ext(ptr, dst, size, seq, PARTIAL_ONLY)
        elif seq is None:
            n = C.llama_state_get_data(ptr, dst, size)
        else:
            n = C.llama_state_seq_get_data(ptr, dst, size, seq)
        if n != size:
            raise GenerationError(f"llama.cpp could not copy its state ({last_errors()})")
        return buf

    # size_t llama_state_set_data(llama_context * ctx, const uint8_t * src, size_t size)
    # size_t llama_state_seq_set_data(ctx, const uint8_t * src, size_t size, llama_seq_id dest)
    def state_set(self, data: np.ndarray, seq: int | None = None, *, partial: bool = False) -> bool:
        """Replace the memory of every sequence (None) or of one with bytes state_get gave
        (partial: a checkpoint of its recurrent state); False when llama.cpp refuses them (it
        never reads past len(data))."""
        data = np.ascontiguousarray(data, dtype=np.uint8)
        src = data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        clear_log()
        if partial:
            assert seq is not None, "a recurrent checkpoint is of one sequence"
            n = C.llama_state_seq_set_data_ext(self.ptr, src, data.size, seq, PARTIAL_ONLY)
        elif seq is None:
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
