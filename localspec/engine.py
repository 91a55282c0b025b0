"""The scripting API: load a target (and its drafter) and generate, chat, or propose."""

from __future__ import annotations

import codecs
import ctypes
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Literal

import numpy as np

from . import _native as N
from .costmodel import MAX_DEPTH, TOP_KS, CostModel, Plan, calibrate
from .discovery import default_target, find_drafter
from .drafter import Drafter, DrafterSpec
from .errors import ContextFullError, InvalidParameterError, LocalspecError
from .sampling import Draws, SamplingParams
from .speculative import ChainState, StepResult, draft_chain, pick, speculative_step
from .stats import Stats
from .target import Target
from .text import ChatFormatter, tokenize
from .tree import GAP_SEQ, MAX_TOP_K, MAX_TREE_NODES, TreeShape, tree_step

MAX_DRAFT = 32
FinishReason = Literal["eos", "stop", "length", "context_full"]
NDraft = int | Literal["auto"]


@dataclass
class Event:
    """One step of generation: the text that became visible and the tokens emitted."""

    text: str
    tokens: list[int]
    accepted: list[bool]  # per token: True where the drafter proposed it and it was accepted
    finish_reason: FinishReason | None = None


@dataclass
class Completion:
    text: str
    tokens: list[int]
    accepted: list[bool]
    finish_reason: FinishReason
    stats: Stats = field(default_factory=Stats)


def load(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | Literal[False] | None = None,
    **options: Any,
) -> Engine:
    """Load a GGUF target and pair it with a drafter; options are Engine's (n_draft, tree,
    n_gpu_layers, n_threads, n_ctx, n_batch, draft_batch, kv_type, flash_attn).

    draft: a path; None finds ``NAME.eagle3.gguf`` (or a recorded drafter) next to the target;
    False runs without speculation. n_gpu_layers=-1 offloads every layer (CUDA/Metal builds).
    n_draft: "auto" (default) lets the cost model choose plain decoding, a chain or a tree at
    every step; an integer fixes a chain of that length (0: plain). tree: a fixed TreeShape
    (or "DEPTH,TOP_K,BUDGET") instead.
    """
    return Engine(target, draft, **options)


def _check_n_draft(value: Any) -> NDraft:
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise InvalidParameterError(f'n_draft must be "auto" or an integer, got {value!r}')
    return _check_int("n_draft", value, 0, MAX_DRAFT)


def _check_tree(value: Any) -> TreeShape | None:
    if value is None or isinstance(value, TreeShape):
        return value
    if isinstance(value, str):
        return TreeShape.parse(value)
    if isinstance(value, (tuple, list)) and len(value) == 3:
        return TreeShape(*(_check_int("tree", v, 1, MAX_TREE_NODES) for v in value))
    raise InvalidParameterError(f"tree must be a TreeShape, 'D,K,B' or (D, K, B), got {value!r}")


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise InvalidParameterError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


class Engine:
    """A target, an optional drafter, and the speculative loop. Use as a context manager."""

    def __init__(
        self,
        target: str | os.PathLike[str] | None = None,
        draft: str | os.PathLike[str] | Literal[False] | None = None,
        *,
        n_draft: NDraft = "auto",
        tree: TreeShape | str | tuple[int, int, int] | None = None,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_ctx: int = 4096,
        n_batch: int = 512,
        draft_batch: int = 64,
        kv_type: str = "f16",
        flash_attn: bool | None = None,
    ) -> None:
        self.n_draft = _check_n_draft(n_draft)
        self.tree = _check_tree(tree)
        _check_int("n_gpu_layers", n_gpu_layers, -1, 100_000)
        default_threads = max(1, os.cpu_count() or 1)
        threads = _check_int(
            "n_threads", default_threads if n_threads is None else n_threads, 1, 1024
        )
        _check_int("n_ctx", n_ctx, 0, 1 << 24)
        _check_int("n_batch", n_batch, 1, 1 << 16)
        _check_int("draft_batch", draft_batch, 1, 1 << 16)
        if kv_type not in N.KV_TYPES:
            raise InvalidParameterError(f"kv_type must be one of {sorted(N.KV_TYPES)}")
        target_path = os.fspath(target) if target is not None else default_target()
        self.stats = Stats()
        self._last_stats = Stats()
        self.drafter: Drafter | None = None
        self.drafter_note = ""
        # Read the drafter's header before loading anything heavy: a bad file fails fast.
        spec = None
        if draft is True:
            raise InvalidParameterError("draft must be a path, None (find one) or False")
        if draft is not None and draft is not False:
            spec = DrafterSpec(os.fspath(draft))
        self._max_tree = 0 if draft is False else max(0, min(MAX_TREE_NODES, n_batch - 2))
        self.target = Target(
            target_path,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=threads,
            n_gpu_layers=n_gpu_layers,
            kv_type=kv_type,
            flash_attn=flash_attn,
            tree_nodes=self._max_tree,
        )
        # a tree's drafter frontier takes two banks of top_k sequences (+ the committed one)
        self._max_top_k = min(MAX_TOP_K, (min(draft_batch, n_batch) - 1) // 2)  # 0: chains only
        self.cost: CostModel | None = None  # calibrated on the first "auto" generation
        try:
            if draft is None:
                found = find_drafter(target_path, self.target.vocab_fingerprint)
                if found is not None:
                    spec = DrafterSpec(found)
                else:
                    self.drafter_note = f"no drafter found next to {target_path}"
            if spec is not None:
                spec.check_pair(self.target)
                self.target.enable_taps(spec.taps)
                self.drafter = Drafter(
                    spec,
                    self.target,
                    n_batch=min(draft_batch, n_batch),
                    n_threads=threads,
                    n_gpu_layers=n_gpu_layers,
                    kv_type=kv_type,
                    flash_attn=flash_attn,
                    n_seq_max=2 * self._max_top_k + 1,
                )
                self.drafter_note = f"{spec.variant} drafter {spec.path}"
            elif draft is False:
                self.drafter_note = "speculation off"
        except BaseException:
            self.target.close()
            raise
        vocab = self.target.model.vocab
        self._eog = np.array(
            [bool(N.C.llama_vocab_is_eog(vocab, i)) for i in range(self.target.n_vocab)]
        )
        self._piece_buf = ctypes.create_string_buffer(256)
        self._chat = ChatFormatter(self.target.model, self.target.path)

    # --- public API --------------------------------------------------------------------------

    @property
    def target_path(self) -> str:
        return self.target.path

    @property
    def draft_path(self) -> str | None:
        return self.drafter.spec.path if self.drafter else None

    @property
    def draft_variant(self) -> str | None:
        """"EAGLE-3" or "EAGLE-3.1" (None without a drafter)."""
        return self.drafter.spec.variant if self.drafter else None

    @property
    def n_ctx(self) -> int:
        """The context window in tokens (llama.cpp may round the requested size up)."""
        return self.target.n_ctx

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        self._check_open()
        return tokenize(
            self.target.model, text, add_special=add_special, parse_special=parse_special
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self._piece(t) for t in tokens).decode("utf-8", errors="replace")

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        n_draft: NDraft | None = None,
        tree: TreeShape | str | tuple[int, int, int] | None = None,
        add_special: bool = True,
        parse_special: bool = False,
    ) -> Iterator[Event]:
        """Stream a continuation of ``prompt`` (text, or token ids) event by event. n_draft and
        tree override the engine's for this call (tree wins when both are given)."""
        self._check_open()
        sp = SamplingParams(float(temperature), top_k, float(top_p))
        _check_int("max_tokens", max_tokens, 0, 1 << 24)
        k = self.n_draft if n_draft is None else _check_n_draft(n_draft)
        shape = _check_tree(tree) if tree is not None else (self.tree if n_draft is None else None)
        if shape is not None and self.drafter is None:
            shape = None  # no drafter: plain decoding, as for any n_draft
        if shape is not None and (
            shape.top_k > max(1, self._max_top_k)
            or (not shape.is_chain and shape.budget > self._max_tree)
        ):
            raise InvalidParameterError(
                f"{shape} does not fit this engine: at most {self._max_tree} nodes "
                f"(n_batch - 2) and top_k {self._max_top_k} ((draft_batch - 1) // 2)"
            )
        if seed is not None:
            _check_int("seed", seed, 0, 2**63 - 1)
        stops = [stop] if isinstance(stop, str) else list(stop)
        if any(not isinstance(s, str) or not s for s in stops):
            raise InvalidParameterError("stop strings must be non-empty strings")
        if isinstance(prompt, str):
            tokens = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            tokens = [int(t) for t in prompt]
            if any(not 0 <= t < self.target.n_vocab for t in tokens):
                raise InvalidParameterError(f"token ids must be in [0, {self.target.n_vocab})")
        if not tokens:
            raise InvalidParameterError("the prompt is empty")
        if len(tokens) >= self.target.n_ctx:
            raise ContextFullError(
                f"the prompt has {len(tokens)} tokens; the context holds {self.target.n_ctx}"
            )
        return self._run(tokens, max_tokens, sp, Draws(seed, len(tokens)), stops, k, shape)

    def complete(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        """Generate to the end and return the whole text, tokens and statistics."""
        texts: list[str] = []
        tokens: list[int] = []
        accepted: list[bool] = []
        reason: FinishReason = "length"
        for ev in self.generate(prompt, **kwargs):
            texts.append(ev.text)
            tokens += ev.tokens
            accepted += ev.accepted
            reason = ev.finish_reason or reason
        return Completion("".join(texts), tokens, accepted, reason, self.last_stats)

    def chat(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> Iterator[Event]:
        """Stream a reply to a conversation, formatted with the GGUF's own chat template."""
        prompt, stops = self.format_chat(messages)
        extra = kwargs.pop("stop", ())
        extra = [extra] if isinstance(extra, str) else list(extra)
        return self.generate(
            prompt, stop=stops + extra, add_special=False, parse_special=True, **kwargs
        )

    def format_chat(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[str]]:
        self._check_open()
        return self._chat.render(messages)

    @property
    def chat_template_note(self) -> str:
        """Empty when chats use the model's own template; else what is used instead."""
        return self._chat.note

    def propose(self, prompt: str | Sequence[int], k: int = 4) -> list[int]:
        """The drafter's greedy chain for the k positions after the target's next token."""
        self._check_open()
        if self.drafter is None:
            raise LocalspecError("no drafter is loaded")
        k = _check_int("k", k, 1, MAX_DRAFT)
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not tokens or len(tokens) + k >= self.target.n_ctx:
            raise InvalidParameterError("the prompt is empty or does not fit the context")
        sp = SamplingParams()
        self.target.set_taps_active(True)
        st = self._prefill(tokens, self.drafter, sp, Draws(0, len(tokens)), Stats())
        drafts, _ = draft_chain(self.drafter, st, k, sp, np.random.default_rng(0))
        return drafts

    def _check_open(self) -> None:
        if not self.target.ctx.ptr:  # a NULL context would crash inside llama.cpp
            raise LocalspecError("the engine is closed")

    @property
    def last_stats(self) -> Stats:
        return self._last_stats

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()  # the drafter's context borrows from the target's: free first
            self.drafter = None
        if getattr(self, "target", None) is not None:
            self.target.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ----------------------------------------------------------------------------

    def _prefill(
        self,
        tokens: list[int],
        dft: Drafter | None,
        sp: SamplingParams,
        draws: Draws,
        stats: Stats,
    ) -> ChainState:
        """Process the prompt in chunks, queue the drafter's pairs, choose the first token."""
        tgt = self.target
        tgt.ctx.clear()
        if dft is not None:
            dft.clear()
        t0 = perf_counter()
        taps = []
        logits = None
        for a in range(0, len(tokens), tgt.n_batch):
            chunk = tokens[a : a + tgt.n_batch]
            logits = tgt.decode(chunk, a, all_logits=False)
            if dft is not None:
                taps.append(tgt.read_taps(len(chunk)))
        assert logits is not None
        first, _ = pick(logits[0], sp, draws.rng, draws.at(len(tokens)))
        st = ChainState(n=len(tokens), last=first)
        if dft is not None:
            st.queue_tokens = [*tokens[1:], first]
            st.queue_taps = taps  # encoded at once, which resets the row count
            st.encode_pending(dft)  # one batched encode belongs to prompt processing
        stats.t_prefill += perf_counter() - t0
        return st

    def _run(
        self,
        tokens: list[int],
        max_tokens: int,
        sp: SamplingParams,
        draws: Draws,
        stops: list[str],
        k: NDraft,
        shape: TreeShape | None,
    ) -> Iterator[Event]:
        stats = Stats(prompt_tokens=len(tokens), generations=1)
        self._last_stats = stats
        text = _TextStream(stops)
        n_ctx = self.target.n_ctx
        # n_draft=0 (or no drafter): the plain target on the same loop, taps off
        drafter = self.drafter if (shape is not None or k != 0) else None
        if drafter is None:
            mode = "plain"
        elif shape is not None:
            mode = str(shape)
        elif k == "auto":
            mode = "auto"
            self._ensure_cost_model()
        else:
            mode = f"chain {k}"
        stats.mode = mode
        self.target.set_taps_active(drafter is not None)
        try:
            if max_tokens == 0:
                yield Event("", [], [], "length")
                return
            # auto on a machine where no drafting can pay: plain decoding with taps off (the
            # drafter is fed again from the step where a search says drafting might pay)
            dormant = mode == "auto" and self.cost is not None and self.cost.hopeless
            if dormant:
                self.target.set_taps_active(False)
            st = self._prefill(tokens, None if dormant else drafter, sp, draws, stats)
            st.dormant = dormant
            step_tokens, step_acc = [st.last], [False]
            reason: FinishReason | None = None
            while True:
                # emit what the last step produced, checking EOS, stop strings and budget
                out_t: list[int] = []
                out_a: list[bool] = []
                for t, a in zip(step_tokens, step_acc, strict=True):
                    if self._eog[t]:
                        reason = "eos"
                        break
                    out_t.append(t)
                    out_a.append(a)
                    stats.generated += 1
                    if text.feed(self._piece(t)):
                        reason = "stop"
                        break
                    if stats.generated >= max_tokens:
                        reason = "length"
                        break
                if reason is None and st.n >= n_ctx:
                    reason = "context_full"
                if reason is not None:
                    yield Event(text.take(final=reason != "stop"), out_t, out_a, reason)
                    return
                if out_t:
                    yield Event(text.take(final=False), out_t, out_a)
                # one speculative step; never draft past max_tokens or the context end
                budget = min(max_tokens - stats.generated, n_ctx - st.n, self.target.n_batch) - 1
                free = n_ctx - st.n - st.gap_cells  # cells a tree may still occupy
                if st.gap_cells and free < self._max_tree + 2:
                    # context nearly full: give the gap cells back (tokens from here on may
                    # round differently from plain decoding, rather than stopping early)
                    self.target.ctx.seq_drop(GAP_SEQ)
                    st.gap_cells, free = 0, n_ctx - st.n
                res = self._step(drafter, st, sp, draws, k, shape, budget, free - 1, stats)
                step_tokens = res.tokens
                step_acc = [True] * res.n_accepted + [False]
        finally:
            self.stats.add(stats)

    def _wake(self, drafter: Drafter, st: ChainState) -> None:
        """Feed the drafter again after dormant steps: its cache restarts at the current
        position (it has no taps for the steps in between)."""
        self.target.set_taps_active(True)
        drafter.clear()
        st.drafter_n = st.n
        st.clear_queue()
        st.dormant = False

    def _ensure_cost_model(self) -> None:
        if self.cost is None and self.drafter is not None:
            self.target.set_taps_active(True)  # verification runs with taps: time it so
            self.cost = calibrate(
                self.target,
                self.drafter,
                max_rows=min(self.target.n_batch, max(self._max_tree, MAX_DEPTH) + 1),
                max_nodes=self._max_tree,
                top_ks=tuple(k for k in TOP_KS if k == 1 or k <= self._max_top_k),
            )

    def _step(
        self,
        drafter: Drafter | None,
        st: ChainState,
        sp: SamplingParams,
        draws: Draws,
        k: NDraft,
        shape: TreeShape | None,
        budget: int,
        cells: int,
        stats: Stats,
    ) -> StepResult:
        """Choose this step's shape (fixed, or by the cost model), run it, and learn from it.
        budget: draft depth allowed (tokens and positions left); cells: free KV cells."""
        plan: Plan | None = None
        if drafter is None or budget < 1:
            shape = None
        elif shape is not None:
            shape = shape.clipped(budget)
        elif k == "auto":
            assert self.cost is not None
            plan = self.cost.plan(budget)
            shape = plan.shape
            if st.dormant and shape is not None:
                self._wake(drafter, st)  # this step plain with taps: the drafter's first pair
                shape = None
            elif not st.dormant and shape is None and self.cost.hopeless:
                self.target.set_taps_active(False)
                st.dormant = True
        else:
            shape = TreeShape(min(k, budget), 1, min(k, budget, MAX_TREE_NODES))
        if st.dormant:
            drafter = None  # no taps are produced: nothing to queue
        drafter_cells = self.target.n_ctx - st.n  # the drafter's cache mirrors the target's
        if (
            shape is not None
            and not shape.is_chain
            and (
                shape.budget > min(cells, self._max_tree)
                or (shape.depth - 1) * shape.top_k >= drafter_cells
            )
        ):
            shape = TreeShape(min(shape.depth, budget), 1, min(shape.depth, budget))
        t0 = perf_counter()
        st.t_flush = 0.0
        if shape is None or shape.is_chain:
            n_chain = shape.depth if shape is not None else 0
            # fixed chains sample by rejection sampling (it accepts more); auto accepts by the
            # target's own position-keyed draws, so its text for a seed never depends on timing
            res = speculative_step(
                self.target,
                drafter,
                st,
                n_chain,
                sp,
                draws,
                ranks=plan is not None,
                own_draws=k == "auto" or n_chain == 0,
            )
            rows = n_chain + 1
        else:
            assert drafter is not None
            res = tree_step(self.target, drafter, st, shape, sp, draws)
            rows = res.n_drafted + 1
        glue = perf_counter() - t0 - res.t_target - res.t_draft
        stats.t_target += res.t_target
        stats.t_draft += res.t_draft
        stats.t_glue += glue
        stats.record_step(
            res.n_drafted, res.n_accepted, shape_label(shape), shape.depth if shape else 0
        )
        if plan is not None:
            assert self.cost is not None
            stats.record_prediction(plan.tokens, plan.seconds)
            self.cost.observe(
                shape,
                verify_rows=rows,
                t_verify=res.t_target,
                t_flush=st.t_flush,
                t_draft=res.t_draft,
                t_glue=glue,
                ranks=res.ranks,
                emitted=len(res.tokens),
            )
        return res

    def _piece(self, token: int) -> bytes:
        n = N.C.llama_token_to_piece(
            self.target.model.vocab, token, self._piece_buf, len(self._piece_buf), 0, False
        )
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = N.C.llama_token_to_piece(self.target.model.vocab, token, buf, -n, 0, False)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]


def shape_label(shape: TreeShape | None) -> str:
    return "plain" if shape is None else str(shape)


class _TextStream:
    """Incremental UTF-8 decoding with stop strings: never splits a character, and holds back
    any tail that could still become a stop string."""

    def __init__(self, stops: list[str]) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = stops
        self._text = ""
        self._sent = 0
        self._cut: int | None = None

    def feed(self, data: bytes) -> bool:
        """Add bytes; True when a stop string appeared (the text is cut before it)."""
        self._text += self._dec.decode(data)
        for s in self._stops:
            i = self._text.find(s, max(0, self._sent - len(s)))
            if i >= 0 and (self._cut is None or i < self._cut):
                self._cut = i
        return self._cut is not None

    def take(self, *, final: bool) -> str:
        if self._cut is not None:
            end = self._cut
        elif final:
            self._text += self._dec.decode(b"", final=True)
            end = len(self._text)
        else:
            end = len(self._text) - self._holdback()
        out = self._text[self._sent : end]
        self._sent = max(self._sent, end)
        return out

    def _holdback(self) -> int:
        keep = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self._text) - self._sent), 0, -1):
                if self._text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        return keep
