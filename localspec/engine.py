"""The scripting API: load a target (and its drafter), then generate, chat, or propose.

The engine owns the resources (target, drafter, scheduler, chat template) and checks every
argument; one Generation runs each call. Calls share the caches: each keeps the longest prefix
of its prompt that the previous calls left in them (``Stats.cached_tokens``).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from . import native as N
from .auto.calibration import snapshot_policy
from .auto.scheduler import Scheduler
from .errors import (
    ContextFullError,
    GenerationError,
    InvalidParameterError,
    LocalspecError,
    SessionStateError,
)
from .files.discovery import default_target, eagle_beside, find_drafter
from .files.model_path import check_model_file
from .options import (
    DRAFT_SOURCES,
    MAX_DRAFT,
    DraftSource,
    NDraft,
    RuntimeOptions,
    check_draft_source,
    check_flash_attn,
    check_int,
    check_max_tokens,
    check_n_draft,
    check_rollback,
    check_stops,
    check_tree,
)
from .rules import Drafting, draft_mode, loads_drafter, loads_mtp, no_drafter_note
from .runtime import session_state
from .runtime.clocks import cost_clock
from .runtime.drafter import Drafter
from .runtime.drafter_spec import DrafterSpec
from .runtime.mtp import MtpDrafter, mtp_blocks
from .runtime.parts import Parts
from .runtime.target import Target
from .speculation.generation import Event, FinishReason, Generation
from .speculation.mode import Mode
from .speculation.plan import StepPlan
from .speculation.probe import Probe
from .speculation.sampling import (
    DRY_BREAKERS,
    DryBreakers,
    SamplingParams,
    bias_items,
    recommended,
)
from .speculation.specstate import SpecState
from .speculation.tree import TreeShape
from .stats import Stats
from .text.chat_template import ChatFormatter
from .text.textstream import decode_text

_DEFAULT_SAMPLING = SamplingParams()
DRY_CACHE = 8  # DRY breaker sets kept per engine (each a scan of the vocabulary)

__all__ = ["DRAFT_SOURCES", "MAX_DRAFT", "Completion", "Engine", "Event", "FinishReason", "load"]


@dataclass
class Completion:
    text: str
    tokens: list[int]
    accepted: list[bool]
    finish_reason: FinishReason
    stats: Stats = field(default_factory=Stats)
    _events: list[Event] = field(default_factory=list, repr=False, compare=False)

    def __iter__(self) -> Iterator[Event]:
        """Deprecated: the events of the reply, one by one, as ``chat`` yielded them before it
        returned a Completion (they are replayed after the reply is whole; ``chat_stream``
        streams them live). Kept through 0.1; removed in 0.2."""
        warnings.warn(
            "iterating over the Completion that Engine.chat returns is deprecated: use "
            "Engine.chat_stream(...) to stream events, or the Completion's text and tokens",
            DeprecationWarning,
            stacklevel=2,
        )
        return iter(self._events)


def window_for(spec: DrafterSpec, rt: RuntimeOptions) -> int | None:
    """The pairs a drafter attends over: the runtime's choice (0: all), else the window it
    was trained over, as its GGUF records it (all when it records none)."""
    if rt.draft_window is None:
        return spec.attention_window
    return rt.draft_window or None


def _drafter_note(d: Drafter) -> str:
    window = f", attending over its last {d.window} pairs" if d.window is not None else ""
    if isinstance(d, MtpDrafter):
        n = d.model.n_layer_nextn
        blocks = f"{n} blocks, the first drafting" if n > 1 else "1 block"
        return f"the MTP head of {d.spec.path} ({blocks}){window}"
    return f"{d.spec.variant} drafter {d.spec.path}{window}"


def load(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | Literal[False] | None = None,
    **options: Any,
) -> Engine:
    """Load a GGUF target and pair it with a drafter; options are Engine's (n_draft, tree,
    draft_source, n_gpu_layers, n_threads, n_ctx, n_batch, draft_batch, kv_type, flash_attn,
    draft_window, recalibrate, rollback).

    draft: an EAGLE-3 drafter's path; None finds ``NAME.eagle3.gguf`` (or a drafter recorded
    for this target) next to the target; False loads none. draft_source: where drafts come
    from: "auto" (default: the EAGLE drafter when loaded and the n-gram index of the context,
    which needs no file), "eagle", "ngram", or "none" (plain decoding). With "ngram" or "none"
    no drafter is looked for (draft=None loads none; a path given is loaded, for calls that
    ask for "eagle"): a call asking for EAGLE drafts then runs plain decoding and its
    ``stats.notes`` say that no drafter is loaded. n_ctx: the context in tokens (0: the
    model's trained context); no call runs past it. n_gpu_layers=-1
    offloads every layer (CUDA/Metal builds). n_draft: "auto" (default) lets the cost model
    choose at every step between plain decoding, the sources' chains and trees and a merged
    tree; an integer fixes a chain of that length (0: plain), from the EAGLE drafter (or the
    n-gram index with draft_source="ngram"). tree: a fixed EAGLE TreeShape (or
    "DEPTH,TOP_K,BUDGET") instead. recalibrate: time this machine again for auto instead of
    using the stored calibration. rollback: how a hybrid target's recurrent state is cut back
    after rejected drafts: "auto" (default: llama.cpp's per-token snapshots, unless, under
    n_draft="auto", they cost a plain step here more than 2%, timed once and stored;
    then a checkpoint copied before each verify, which costs only the steps that draft),
    "snapshots" or "checkpoint".
    """
    return Engine(target, draft, **options)


class Engine:
    """A target, an optional drafter, and the speculative loop. Use as a context manager."""

    def __init__(
        self,
        target: str | os.PathLike[str] | None = None,
        draft: str | os.PathLike[str] | Literal[False] | None = None,
        *,
        n_draft: NDraft = "auto",
        tree: TreeShape | str | tuple[int, int, int] | None = None,
        draft_source: DraftSource = "auto",
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_ctx: int = 4096,
        n_batch: int = 512,
        draft_batch: int = 64,
        kv_type: str = "f16",
        flash_attn: bool | str | None = None,
        draft_window: int | None = None,
        recalibrate: bool = False,
        rollback: str = "auto",
    ) -> None:
        self._n_draft = check_n_draft(n_draft)
        rollback = check_rollback(rollback)
        self._tree = check_tree(tree)
        self._source = check_draft_source(draft_source)
        self._rt = RuntimeOptions(
            n_ctx,
            n_batch,
            draft_batch,
            n_threads,
            n_gpu_layers,
            kv_type,
            check_flash_attn(flash_attn),
            draft_window,
        ).checked()
        if draft is True:
            raise InvalidParameterError("draft must be a path, None (find one) or False")
        target_path = os.fspath(target) if target is not None else default_target()
        check_model_file(target_path, "target")  # the target's problems first
        # what is loaded: only what the engine's draft source may draft from
        none_note = ""
        if not loads_drafter(draft, self._source):
            none_note = no_drafter_note(draft, self._source)
            draft = False
        self.stats = Stats()
        self._last_stats = Stats()
        self._lock = threading.RLock()  # one step at a time; close() waits for it
        self._current: Generation | None = None
        self._closed = False
        self._recalibrate = bool(recalibrate)  # kept for drafters loaded later
        self._drafter: Drafter | None = None
        # every drafter loaded so far (file identity -> it and its scheduler), for use_drafter
        self._drafters: dict[tuple[str, int, int], tuple[Drafter, Scheduler]] = {}
        self._no_draft = draft is False
        self.drafter_note = none_note  # why there is no drafter (one found or loaded: which)
        # Read the drafter's header before loading anything heavy: a bad file fails fast.
        spec = None
        if draft is not None and draft is not False:
            check_model_file(os.fspath(draft), "drafter")
            spec = DrafterSpec(os.fspath(draft))
        self._max_tree, self._max_top_k = Scheduler.capacity(n_batch, draft_batch)
        header = N.GGUFHeader(target_path)
        # the target's own MTP head drafts where asked for, or for auto when no EAGLE drafter
        # is named or lies next to the target (one found there is preferred to it, and the
        # head's weights are then not loaded)
        mtp_why = mtp_blocks(header)[1]
        if self._source == "mtp" and (mtp_why or spec is not None):
            raise InvalidParameterError(
                f"draft_source='mtp' drafts with the target's own MTP head: {mtp_why}"
                if mtp_why
                else "draft_source='mtp' drafts with the target's own MTP head: leave draft "
                "unset (it names an EAGLE drafter)",
                parameter="draft_source",
            )
        mtp = loads_mtp(
            draft,
            self._source,
            usable=not mtp_why,
            # the folder's headers are read only where the head could draft for auto
            eagle_beside=not mtp_why
            and self._source == "auto"
            and draft is None
            and eagle_beside(target_path),
        )
        if draft is False and not mtp:
            # no model drafter: n-gram chains need no tree sequences, and each sequence costs
            # a sliding-window cache (Gemma 3) or a recurrent state its memory
            self._max_tree = 0
        # a hybrid target keeps snapshots of its recurrent state only where calls may draft:
        # they cost every decode (benchmarks/bench_rollback.py). Under auto (n_draft="auto",
        # the default) they are kept only where they cost a plain step little here (timed once
        # per machine and file); else, and with rollback="checkpoint", a checkpoint is copied
        # before each verify instead. A fixed chain drafts every step: snapshots. A fixed tree
        # verifies its branches in sequences of their own, which need no snapshots (a branch
        # cut short is decoded again) and leave room for more branches: checkpoints.
        checkpoint = rollback == "checkpoint" or (
            rollback == "auto" and self._tree is not None and not self._tree.is_chain
        )
        self._target = Target(
            target_path,
            self._rt,
            tree_nodes=self._max_tree,
            rollback=self._source != "none" and ("checkpoint" if checkpoint else True),
            load_mtp=mtp,
            snapshot_policy=snapshot_policy(target_path, self._rt, recalibrate=bool(recalibrate))
            if rollback == "auto" and self._n_draft == "auto" and self._tree is None
            else None,
        )
        try:
            passed = ""
            if draft is None and self._source != "mtp":
                found, passed = find_drafter(self._target)
                spec = DrafterSpec(found) if found else None
            if spec is not None:
                spec.check_pair(self._target)
                self._target.enable_taps(spec.taps)
                self._drafter = self._new_drafter(spec)
                self.drafter_note = _drafter_note(self._drafter)
            elif mtp and self._target.max_draft != 0:
                self._target.enable_mtp_taps()
                self._drafter = MtpDrafter(
                    self._target, self._rt, n_seq_max=2 * self._max_top_k + 1
                )
                self.drafter_note = _drafter_note(self._drafter)
            elif draft is False:
                pass  # drafter_note says why
            else:
                self.drafter_note = f"no drafter found next to {target_path}"
            if passed:
                self.drafter_note += f" ({passed})"
        except BaseException:
            self._target.close()
            raise
        # a recurrent or hybrid state is cut back after a rejected draft only where llama.cpp
        # keeps snapshots of it (runtime/rollback.py); it verifies trees only where its memory
        # holds a state per branch
        self._can_draft = self._target.max_draft != 0
        self._max_tree = self._target.tree_nodes
        self._eog = self._target.model.eog_mask()
        # the sampling the model's GGUF recommends (llama.cpp's defaults where it is silent)
        self.recommended_sampling, self.sampling_notes = recommended(self._target.model.meta)
        self._dry_cache: dict[tuple[str, ...], DryBreakers] = {}
        self._pieces: list[bytes] | None = None  # every token's text, specials rendered
        self._chat = ChatFormatter(self._target.model, self._target.path)
        self._scheduler = Scheduler(
            has_drafter=self._drafter is not None,
            max_tree=self._max_tree,
            max_top_k=self._max_top_k,
            branches=self._target.branches,
        )
        self._scheduler.recalibrate = self._recalibrate
        self._probe = Probe(cost_clock(self._rt.n_gpu_layers != 0 and N.gpu_offload_supported()))
        self._state = SpecState(self._target, self._drafter, self._probe)
        if self._drafter is not None:
            self._drafters[_file_key(self._drafter.spec.path)] = (
                self._drafter,
                self._scheduler,
            )

    # --- what is loaded ------------------------------------------------------------------------

    @property
    def target_path(self) -> str:
        return self._target.path

    @property
    def draft_path(self) -> str | None:
        return self._drafter.spec.path if self._drafter else None

    @property
    def draft_window(self) -> int | None:
        """The pairs of the history the drafter attends over (None: all, or no drafter)."""
        return self._drafter.window if self._drafter else None

    @property
    def draft_variant(self) -> str | None:
        """ "EAGLE-3" or "EAGLE-3.1" (None without a drafter)."""
        return self._drafter.spec.variant if self._drafter else None

    @property
    def n_ctx(self) -> int:
        """The context window in tokens: n_ctx as asked (0: the model's trained context). No
        call runs past it, though llama.cpp allocates at least 256 cells (in steps of 256)."""
        return self._target.n_ctx

    @property
    def drafting(self) -> Drafting:
        """What this engine can draft with: the facts rules.draft_mode reads (the command
        line names its notes with its own flags from them)."""
        return Drafting(
            can_draft=self._can_draft,
            has_drafter=self._drafter is not None,
            drafter_note=self.drafter_note,
            architecture=self._target.architecture,
            max_tree=self._max_tree,
            max_top_k=self._max_top_k,
            no_draft_note=self._target.rollback.why_not if not self._can_draft else "",
            tree_note=self._target.tree_note,
            drafter_kind=self._drafter.kind if self._drafter is not None else "eagle",
        )

    @property
    def draft_source(self) -> DraftSource:
        """Where this engine's calls draft from unless a call says otherwise."""
        return self._source

    @property
    def n_threads(self) -> int:
        """CPU threads llama.cpp decodes with."""
        return self._rt.threads

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the target's cache holds for the next call to reuse."""
        return self._target.n

    @property
    def chat_template_note(self) -> str:
        """Empty when chats use the model's own template; else what is used instead."""
        return self._chat.note

    @property
    def last_stats(self) -> Stats:
        return self._last_stats

    # --- text --------------------------------------------------------------------------------

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        self._check_open()
        return self._target.model.tokenize(
            text, add_special=add_special, parse_special=parse_special
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of tokens as a finished generation gives it (a character cut off at the
        end is dropped; malformed bytes read as U+FFFD)."""
        self._check_open()
        piece = self._target.model.piece
        return decode_text(b"".join(piece(int(t)) for t in tokens))

    def format_chat(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[str]]:
        """The prompt text for a conversation (the GGUF's chat template, or ChatML when it has
        none) and the stop strings the template declares."""
        self._check_open()
        return self._chat.render(messages)

    # --- generation --------------------------------------------------------------------------

    def complete_stream(
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
        min_p: float = 0.0,
        typical_p: float = 1.0,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        dry_multiplier: float = 0.0,
        dry_base: float = 1.75,
        dry_allowed_length: int = 2,
        dry_penalty_last_n: int = 64,
        dry_sequence_breakers: Sequence[str] = DRY_BREAKERS,
        logit_bias: Mapping[int | str, float] | Sequence[tuple[int | str, float]] = (),
        sampling: SamplingParams | None = None,
        tree: TreeShape | str | tuple[int, int, int] | None = None,
        draft_source: DraftSource | None = None,
        add_special: bool = True,
        parse_special: bool = False,
    ) -> Generator[Event, None, None]:
        """Stream a continuation of ``prompt`` (text, or token ids) event by event. n_draft,
        tree and draft_source override the engine's for this call (tree wins when both tree
        and n_draft are given). The samplers are llama.cpp's, under llama-server's names and
        in its order (docs/sampling.md); ``sampling`` gives them all at once instead (a single
        one beside it is refused). A newer call on the same engine supersedes this one: its
        next step raises GenerationError."""
        self._check_open()
        singles: dict[str, Any] = {
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
            "typical_p": typical_p,
            "repeat_penalty": repeat_penalty,
            "repeat_last_n": repeat_last_n,
            "presence_penalty": presence_penalty,
            "frequency_penalty": frequency_penalty,
            "dry_multiplier": dry_multiplier,
            "dry_base": dry_base,
            "dry_allowed_length": dry_allowed_length,
            "dry_penalty_last_n": dry_penalty_last_n,
            "dry_sequence_breakers": dry_sequence_breakers,
            "logit_bias": logit_bias,
        }
        if sampling is None:
            sp = SamplingParams(**{**singles, "logit_bias": self._token_bias(logit_bias)})
        elif not isinstance(sampling, SamplingParams):
            raise InvalidParameterError(
                f"sampling must be a SamplingParams, got {type(sampling).__name__}", "sampling"
            )
        else:  # all at once: a single setting beside it would be silently dropped
            sp = sampling
            for name, value in singles.items():
                if isinstance(value, (list, tuple, Mapping)):
                    value = tuple(value)
                if value != getattr(_DEFAULT_SAMPLING, name):
                    raise InvalidParameterError(
                        f"{name} given beside sampling=: give every sampler setting in the "
                        "SamplingParams",
                        name,
                    )
        check_max_tokens(max_tokens)
        mode, notes = self._mode(n_draft, tree, draft_source)
        if seed is not None:
            check_int("seed", seed, 0, 2**63 - 1)
        stops = check_stops(stop)
        tokens = self._prompt_tokens(prompt, add_special, parse_special)
        gen = Generation(
            self._parts(),
            tokens,
            lock=self._step_lock,
            totals=self.stats,
            max_tokens=max_tokens,
            sampling=sp,
            seed=seed,
            stops=stops,
            mode=mode,
            recalibrate=self._scheduler.recalibrate,
            breakers=self._dry_breakers,
        )
        self._scheduler.recalibrate = False
        self._current = gen
        gen.stats.notes += notes
        self._last_stats = gen.stats
        return gen.run()

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Generator[Event, None, None]:
        """Deprecated alias of ``complete_stream``, the name the README used before; kept
        through 0.1, removed in 0.2."""
        warnings.warn(
            "Engine.generate is deprecated: use Engine.complete_stream (same arguments)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.complete_stream(prompt, **kwargs)

    def complete(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        """Generate to the end and return the whole text, tokens and statistics; keyword
        arguments are ``complete_stream``'s."""
        return self._collect(self.complete_stream(prompt, **kwargs))

    def chat_stream(
        self, messages: Sequence[dict[str, str]], **kwargs: Any
    ) -> Generator[Event, None, None]:
        """Stream a reply to a conversation, formatted with the GGUF's own chat template;
        keyword arguments are ``complete_stream``'s (stop strings add to the template's)."""
        prompt, stops = self.format_chat(messages)
        extra = check_stops(kwargs.pop("stop", ()))
        return self.complete_stream(
            prompt, stop=stops + extra, add_special=False, parse_special=True, **kwargs
        )

    def chat(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> Completion:
        """The whole reply to a conversation, with its statistics (``chat_stream`` streams)."""
        return self._collect(self.chat_stream(messages, **kwargs))

    def _collect(self, events: Iterator[Event]) -> Completion:
        texts: list[str] = []
        tokens: list[int] = []
        accepted: list[bool] = []
        reason: FinishReason = "length"
        kept: list[Event] = []
        for ev in events:
            kept.append(ev)
            texts.append(ev.text)
            tokens += ev.tokens
            accepted += ev.accepted
            reason = ev.finish_reason or reason
        return Completion("".join(texts), tokens, accepted, reason, self.last_stats, kept)

    def propose(self, prompt: str | Sequence[int], k: int = 4) -> list[int]:
        """The drafter's greedy chain for the k positions after the target's next token."""
        self._check_open()
        if self._drafter is None:
            raise LocalspecError("no drafter is loaded")
        k = check_int("k", k, 1, MAX_DRAFT)
        tokens = self._prompt_tokens(prompt, True, False)
        if len(tokens) + k >= self._target.n_ctx:
            raise InvalidParameterError("the prompt does not fit the context")
        gen = Generation(
            self._parts(),
            tokens,
            lock=self._step_lock,
            totals=self.stats,
            max_tokens=1,
            sampling=SamplingParams(),
            seed=0,
            stops=[],
            mode=Mode("chain", TreeShape(k, 1, k)),
        )
        self._current = gen
        with self._step_lock(gen):
            gen.prefill()
            tree = self._state.draft(StepPlan(TreeShape(k, 1, k)), np.random.default_rng(0))
        drafts = list(tree.tokens)
        return drafts

    def reset(self) -> None:
        """Forget what the caches hold: the next call processes its whole prompt, and the
        n-gram source forgets the session's earlier generations. A generation still running
        is superseded (its next step raises): its history is gone."""
        with self._lock:
            self._check_open()
            self._current = None
            self._empty_caches()
            self._state.forget()

    def use_drafter(self, draft: str | os.PathLike[str]) -> None:
        """Put another EAGLE drafter to work with the loaded target (which is not loaded again).
        Drafters used before stay loaded, so switching back costs nothing but the switch; each
        keeps its own calibration and auto's judgement of it. The drafter at work is left as
        it is; after any other switch both caches are empty (the next call processes its whole
        prompt), the n-gram source forgets the session as after ``reset()``, and a generation
        still running is superseded. A drafter tapping other layers of the target moves the
        taps. The file is checked against the target before anything is loaded; on any failure
        (LocalspecError naming the file) the previous drafter stays at work: a file its header
        refuses changes nothing; one refused later (the pair check may decode a probe on a
        graph-callback target) leaves the caches empty and supersedes a running generation.
        A file rewritten since it was loaded (e.g. converted again) is loaded anew."""
        path = os.fspath(draft)
        key = _file_key(path)
        with self._lock:
            self._check_open()
            loaded = self._drafters.get(key)
            if loaded is not None and loaded[0] is self._drafter:
                return
            if loaded is None:
                try:
                    loaded = self._load_drafter(path)
                except BaseException:
                    # the pair check may have re-created the target's context (the graph
                    # callback's probe): the drafter at work gets its taps back
                    if self._drafter is not None:
                        self._tap_for(self._drafter)
                    raise
                self._drafters[key] = loaded
            drafter, scheduler = loaded
            self._current = None  # the caches change under a running generation
            self._tap_for(drafter)
            self._drafter, self._scheduler = drafter, scheduler
            self._state = SpecState(self._target, drafter, self._probe)
            self._empty_caches()
            self.drafter_note = _drafter_note(drafter)

    def _tap_for(self, drafter: Drafter) -> None:
        """The target's taps this drafter reads: an MTP head's hidden state, or an EAGLE
        drafter's layers (checked when it was loaded)."""
        if self._target.taps == drafter.spec.taps:
            return
        if isinstance(drafter, MtpDrafter):
            self._target.enable_mtp_taps()
        else:
            self._target.enable_taps(drafter.spec.taps)

    def _load_drafter(self, path: str) -> tuple[Drafter, Scheduler]:
        """A drafter for use_drafter, and a scheduler of its own; refused (LocalspecError)
        before any native work where its header says it cannot pair with the target."""
        if self._no_draft:
            # without a drafter at load the target has no sequences for draft trees
            raise LocalspecError(
                f"cannot use drafter {path}: this engine was loaded without one "
                f"({self.drafter_note}), which leaves out what draft trees need; load it with "
                "a drafter to switch drafters"
            )
        spec = DrafterSpec(path)  # the header alone: nothing native yet
        self._current = None  # a graph-callback target's first tap check decodes a probe
        try:
            spec.check_pair(self._target)  # ends with the target's tap check
            drafter = self._new_drafter(spec)
        except BaseException:
            self._empty_caches()
            raise
        scheduler = Scheduler(
            has_drafter=True,
            max_tree=self._max_tree,
            max_top_k=self._max_top_k,
            branches=self._target.branches,
        )
        scheduler.recalibrate = self._recalibrate
        return drafter, scheduler

    def _new_drafter(self, spec: DrafterSpec) -> Drafter:
        # a tree's frontier takes two banks of top_k sequences (+ the committed prefix's)
        return Drafter(
            spec,
            self._target,
            self._rt,
            n_seq_max=2 * self._max_top_k + 1,
            window=window_for(spec, self._rt),
        )

    # --- sessions on disk ----------------------------------------------------------------------

    def save_session(self, path: str | os.PathLike[str]) -> int:
        """Save what the caches hold to a file (written whole or not at all), for
        ``load_session`` in this or a later process on the same model files and cache settings;
        returns its size in bytes. A generation still streaming is not disturbed: its history
        so far is saved, as a stopped stream would leave it. SessionStateError when the file
        cannot be written."""
        path = os.fspath(path)
        with self._lock:  # between steps
            self._check_open()
            ident = session_state.identity(self._target, self._drafter, self._rt)
            target, drafter = self._state.snapshot()
        return session_state.write(path, ident, target, drafter)

    def load_session(self, path: str | os.PathLike[str]) -> int:
        """Make the caches hold what ``save_session`` saved; returns the positions restored.
        The next call keeps the prefix they share with its prompt, as after any call
        (``Stats.cached_tokens``). A generation still running is superseded (its next step
        raises). SessionStateError, naming the file and the reason, when it is missing,
        truncated, corrupt, of another format version, or saved for other model files or cache
        settings (n_ctx, n_batch, draft_batch, kv_type, flash_attn), or when llama.cpp refuses
        it: the caches are then empty and the engine works on."""
        path = os.fspath(path)
        with self._lock:
            self._check_open()
            self._current = None
            self._calibrate_first()
            self._empty_caches()
            self._state.forget()
            ident = session_state.identity(self._target, self._drafter, self._rt)
            target, drafter = session_state.read(path, ident)
            try:
                self._state.restore(target, drafter)
            except SessionStateError as exc:
                raise SessionStateError(f"session file {path}: {exc}") from None
            return self._target.n

    @property
    def calibration_pending(self) -> bool:
        """Whether the engine's next auto call would first time this machine (no calibration
        in use and none stored for this set-up, or one timed on a busy machine that is due to
        be timed again now that the machine is quiet): ``calibrate`` does it now, with
        progress. For a call with other settings than the engine's: ``calibration_due``."""
        return self.calibration_due()

    def calibration_due(
        self, *, n_draft: NDraft | None = None, tree: Any = None, draft_source: Any = None
    ) -> bool:
        """calibration_pending for a call with these settings (as complete_stream takes
        them; None: the engine's)."""
        with self._lock:
            self._check_open()
            mode, _ = self._mode(n_draft, tree, draft_source)
            sched = self._scheduler
            if not sched.calibration_needed(mode, sched.recalibrate):
                return False
            if sched.recalibrate or sched.retime:
                return True
            rows, widths = sched.calibration_request(self._target.n_batch)
            return not self._state.calibration_stored(self._rt, max_rows=rows, top_ks=widths)

    def calibrate(
        self,
        progress: Callable[[float], None] | None = None,
        *,
        n_draft: NDraft | None = None,
        tree: Any = None,
        draft_source: Any = None,
    ) -> bool:
        """Time this machine for auto now, if a call with these settings (None: the engine's)
        would at its start (auto, no calibration in use). A valid stored calibration is used
        instead of timing again. progress(fraction) is called as the timing advances (from
        this thread). When it calibrates (or reads a stored calibration), a generation still
        running is superseded and the caches are emptied; otherwise nothing changes. Returns
        True when the machine was timed."""
        with self._lock:
            self._check_open()
            mode, _ = self._mode(n_draft, tree, draft_source)
            if not self._scheduler.calibration_needed(mode, self._scheduler.recalibrate):
                return False
            self._current = None
            return self._calibrate_first(progress, mode=mode)

    def _calibrate_first(
        self, progress: Callable[[float], None] | None = None, *, mode: Mode | None = None
    ) -> bool:
        """Calibrate auto now when the engine's own mode would at its next call: timing the
        machine empties the caches, which would lose a restored session. mode: a call's,
        which the caller found needs it."""
        sched = self._scheduler
        if mode is None:
            mode, _ = self._mode(None, None)
            if not sched.calibration_needed(mode, sched.recalibrate):
                return False
        cal = sched.calibrate(
            self._state,
            self._rt,
            self._target.n_batch,
            recalibrate=sched.recalibrate,
            progress=progress,
        )
        sched.recalibrate = False
        return cal.measured

    # --- resources ---------------------------------------------------------------------------

    @contextmanager
    def _step_lock(self, gen: Generation) -> Iterator[None]:
        """Hold the engine for one step of gen. A step that fails leaves the caches in an
        unknown state: they are emptied, so the next call starts afresh."""
        with self._lock:
            self._check_open()
            if self._current is not gen:
                raise GenerationError("this generation was superseded by a newer call")
            try:
                yield
            except BaseException:
                self._empty_caches()
                raise

    def sampling_with(self, **settings: Any) -> SamplingParams:
        """The model's recommended sampling (``recommended_sampling``: its GGUF's
        general.sampling.* keys, else llama.cpp's defaults) with each setting given here (not
        None) in its place; texts in ``logit_bias`` become their tokens. What ``chat``,
        ``serve`` and ``generate`` sample with; the API's own default stays greedy."""
        given = {k: v for k, v in settings.items() if v is not None}
        unknown = sorted(set(given) - set(SamplingParams.__dataclass_fields__))
        if unknown:
            raise InvalidParameterError(f"no sampler setting is named {unknown[0]}", unknown[0])
        if "logit_bias" in given:
            given["logit_bias"] = self._token_bias(given["logit_bias"])
        if "dry_sequence_breakers" in given and not isinstance(given["dry_sequence_breakers"], str):
            given["dry_sequence_breakers"] = tuple(given["dry_sequence_breakers"])
        return replace(self.recommended_sampling, **given)

    def _token_bias(
        self, bias: Mapping[int | str, float] | Sequence[tuple[int | str, float]]
    ) -> list[tuple[int, float]]:
        """logit_bias with texts resolved: a text biases each of its tokens, once per
        occurrence (as llama-server reads [["text", bias]]); token ids pass through, checked
        by SamplingParams."""
        out: list[tuple[Any, Any]] = []
        for t, b in bias_items(bias):
            if isinstance(t, str):
                toks = self._target.model.tokenize(t, add_special=False, parse_special=False)
                if not toks:
                    raise InvalidParameterError("logit_bias names an empty text", "logit_bias")
                out += [(tok, b) for tok in toks]  # per occurrence, as llama-server adds it
            else:
                out.append((t, b))
        return out

    def _dry_breakers(self, strings: tuple[str, ...]) -> DryBreakers:
        """DRY's sequence breakers as this model's tokens (a scan of the vocabulary, kept)."""
        got = self._dry_cache.pop(strings, None)
        if got is None:
            model = self._target.model
            if self._pieces is None:
                self._pieces = model.pieces(special=True)
            got = DryBreakers.build(
                strings,
                self._pieces,
                lambda b: model.tokenize(b, add_special=False, parse_special=False),
            )
            while len(self._dry_cache) >= DRY_CACHE:  # the least recently used goes
                del self._dry_cache[next(iter(self._dry_cache))]
        self._dry_cache[strings] = got  # (re)inserted last: the most recently used
        return got

    def _parts(self) -> Parts:
        return Parts(
            self._target,
            self._drafter,
            self._scheduler,
            self._rt,
            self._eog,
            self._max_tree,
            self._max_top_k,
            self._state,
            self._probe,
        )

    @contextmanager
    def _exclusive(self) -> Iterator[Parts]:
        """The parts for lowlevel.hold: no call runs meanwhile; a running one is superseded."""
        with self._lock:
            self._check_open()
            self._current = None
            yield self._parts()

    def _empty_caches(self) -> None:
        """Both caches hold nothing: the next call processes its whole prompt."""
        self._state.reset()

    def _check_open(self) -> None:
        if self._closed:  # a NULL context would crash inside llama.cpp
            raise LocalspecError("the engine is closed")

    def close(self) -> None:
        """Free the models. Safe from another thread: waits for a step in progress to end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            drafters = {id(d): d for d, _ in self._drafters.values()}
            if self._drafter is not None:
                drafters[id(self._drafter)] = self._drafter
            for drafter in drafters.values():
                drafter.close()  # its context borrows from the target's: free first
            if getattr(self, "_target", None) is not None:
                self._target.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- argument checks -----------------------------------------------------------------------

    def _mode(
        self, n_draft: NDraft | None, tree: Any, draft_source: Any = None
    ) -> tuple[Mode, list[str]]:
        """The mode a call runs, and a note for each part of the request it cannot honour
        (rules.draft_mode: the rules the command line shares). A call's n_draft, tree and
        draft_source replace the engine's; its n_draft alone replaces the engine's tree too."""
        k = self._n_draft if n_draft is None else check_n_draft(n_draft)
        shape = check_tree(tree) if tree is not None else (self._tree if n_draft is None else None)
        source = self._source if draft_source is None else check_draft_source(draft_source)
        both = tree is not None and n_draft is not None
        mode, notes = draft_mode(k, shape, source, self.drafting, both_given=both)
        return mode, notes

    def _prompt_tokens(
        self, prompt: str | Sequence[int], add_special: bool, parse_special: bool
    ) -> list[int]:
        if isinstance(prompt, str):
            tokens = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            tokens = [int(t) for t in prompt]
            if any(not 0 <= t < self._target.n_vocab for t in tokens):
                raise InvalidParameterError(f"token ids must be in [0, {self._target.n_vocab})")
        if not tokens:
            raise InvalidParameterError("the prompt is empty")
        if len(tokens) >= self._target.n_ctx:
            raise ContextFullError(
                f"the prompt has {len(tokens)} tokens; the context holds {self._target.n_ctx}"
            )
        return tokens


def _file_key(path: str) -> tuple[str, int, int]:
    """A drafter file as use_drafter remembers it: the same path rewritten is another file."""
    try:
        st = os.stat(path)
    except OSError:
        return (os.path.realpath(path), -1, -1)  # DrafterSpec names what is wrong with it
    return (os.path.realpath(path), st.st_mtime_ns, st.st_size)
