"""Training data made by the GGUF target itself, through llama.cpp.

For every position of a sequence we keep what the drafter sees and what it must predict:
the three tapped hidden states and the target's top-K next-token log-probabilities. Taps are
stored as float16 where they fit, else float32: Gemma's residual stream exceeds float16's range.
With ``generate`` the target writes its own replies to the prompts (greedy by default: the
distribution the drafter meets at run time), several sequences decoding in one batch, and the
same decodes yield the features, so generation and extraction are a single pass.

A source record that cannot be used (see `datasets.usable`; also a prompt too long, a text
too short, or a conversation the chat template refuses) is skipped and counted by reason.

Shards are ``data/shard-NNNNN.npz`` (concatenated sequences plus offsets) listed in
``data/manifest.json`` together with the source items already done (used or skipped) and the
counts, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import native as N
from ..datasets import Record, Unusable, usable
from ..errors import InvalidParameterError, LocalspecError
from ..runtime.target import Target
from ..speculation.sampling import SamplingParams
from ..speculation.verify import pick
from ..text.chat_template import ChatFormatter
from .files import atomic_save

MANIFEST = "manifest.json"
# why the feature pass skips a record, besides the reasons of `datasets.usable`
TEMPLATE_REFUSED = "template refused"
PROMPT_TOO_LONG = "prompt too long"
TOO_SHORT = "too short"
TEMPLATE_UNSTABLE = "template renders turns differently in context"


@dataclass
class FeatureConfig:
    taps: tuple[int, ...]
    generate: bool = True  # the target writes the replies (else the data's own text is used)
    temperature: float = 0.0  # for generated replies; 0 = greedy
    max_prompt: int = 512  # longer prompts are skipped
    max_new: int = 256  # tokens per generated reply
    max_tokens: int = 400_000  # stop after this many positions in total
    n_parallel: int = 16  # sequences decoded together
    top_labels: int = 8  # target log-probabilities kept per position
    shard_tokens: int = 32_768
    seed: int = 0

    @property
    def seq_len(self) -> int:
        """Positions per sequence: a prompt, its reply and a margin, in whole KV pages (the
        data's own texts are cut there)."""
        return -(-(self.max_prompt + self.max_new + 8) // 256) * 256


@dataclass
class DataReport:
    """What a feature pass made of its source records."""

    used: int = 0  # records whose features were written
    trimmed: int = 0  # of those, records whose leading non-user turns were dropped
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records

    def __str__(self) -> str:
        n = sum(self.skipped.values())
        out = f"{self.used} records used"
        if self.trimmed:
            out += f" ({self.trimmed} with leading turns dropped)"
        out += f", {n} skipped"
        if n:
            by_count = sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))
            out += ": " + ", ".join(f"{c} {reason}" for reason, c in by_count)
        return out


@dataclass
class Manifest:
    target_fingerprint: str
    config: dict
    done: list[int] = field(default_factory=list)  # source items written to shards or skipped
    shards: list[str] = field(default_factory=list)
    n_tokens: int = 0  # positions with features
    n_label_tokens: int = 0  # positions that carry loss
    complete_for: int = 0  # max_tokens of the last run that finished (0: none finished)
    used: int = 0  # the counts of DataReport, saved with `done` so a resumed run adds to them
    trimmed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0  # CPU time (all threads) spent making the shards: what a
    # position of this kind of data costs, next to the training it buys

    def report(self) -> DataReport:
        return DataReport(self.used, self.trimmed, dict(self.skipped))

    @staticmethod
    def load(folder: str) -> Manifest | None:
        path = os.path.join(folder, MANIFEST)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                return Manifest(**json.load(fh))
        except (ValueError, TypeError) as exc:
            raise LocalspecError(f"{path} is corrupt ({exc}); delete the data folder") from None

    def save(self, folder: str) -> None:
        text = json.dumps(asdict(self))
        atomic_save(os.path.join(folder, MANIFEST), lambda tmp: Path(tmp).write_text(text))


@dataclass
class _Seq:
    item: int
    tokens: list[int]
    loss_start: int  # first position whose label is trained on (the drafter never predicts
    # the reply's first token: the target does)
    spans: list[tuple[int, int]] = field(default_factory=list)  # rows [a, b) whose labels
    # are trained on; empty: every row from loss_start on
    taps: list[np.ndarray] = field(default_factory=list)
    label_ids: list[np.ndarray] = field(default_factory=list)
    label_logp: list[np.ndarray] = field(default_factory=list)
    n_new: int = 0
    done: bool = False
    trimmed: bool = False  # leading non-user turns of its record were dropped

    @property
    def n_rows(self) -> int:
        return sum(len(t) for t in self.taps)

    def labelled(self, p: int) -> bool:
        """Whether row p's label (the target's prediction of token p + 1) is trained on."""
        if not self.spans:
            return p >= self.loss_start
        return any(a <= p < b for a, b in self.spans)

    def label_mask(self) -> np.ndarray:
        mask = np.zeros(self.n_rows, bool)
        if not self.spans:
            mask[self.loss_start :] = True
        for a, b in self.spans:
            mask[a:b] = True
        return mask


def target_identity(path: str) -> dict[str, int]:
    """What must match for data or a trained state to belong to a target (the tokenizer is
    checked apart, by fingerprint)."""
    h = N.GGUFHeader(path)
    return {
        "file_size": h.file_size,
        "n_layer": int(h.arch_key("block_count") or 0),
        "n_embd": int(h.arch_key("embedding_length") or 0),
    }


def top_labels(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely ids per row and their log-probabilities (over the whole vocabulary)."""
    import torch

    z = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    vals, ids = z.topk(k, dim=-1)
    logp = vals - torch.logsumexp(z, dim=-1, keepdim=True)
    return ids.numpy().astype(np.int32), logp.numpy().astype(np.float16)


class FeatureWriter:
    """Runs the target over source items and writes feature shards."""

    def __init__(self, target: Target, folder: str, cfg: FeatureConfig) -> None:
        if cfg.n_parallel < 1 or cfg.max_new < 1 or cfg.max_prompt < 1 or cfg.top_labels < 1:
            raise InvalidParameterError("n_parallel, max_new, max_prompt, top_labels must be > 0")
        self.t = target
        self.cfg = cfg
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        fp = target.vocab_fingerprint
        want = {k: v for k, v in asdict(cfg).items() if k not in ("max_tokens", "n_parallel")}
        want["taps"] = list(cfg.taps)
        want["target"] = target_identity(target.path)
        want["item_ids"] = 2  # 2: item ids count every source record, unusable ones too
        if not cfg.generate:  # 2: labels on the replies alone (1: all from the first reply)
            want["reply_labels"] = 2
        m = Manifest.load(folder)
        if m is not None and (m.target_fingerprint != fp or m.config != want):
            raise LocalspecError(
                f"{folder} holds training data made with another target or other settings "
                f"({m.config}); use a new output folder or delete it"
            )
        self.manifest = m or Manifest(target_fingerprint=fp, config=want)
        self.pending: list[_Seq] = []
        self._flushing = False
        self._cpu_mark = time.process_time()  # CPU time up to the last shard written
        self.eog = target.model.eog_mask()
        self.rng = np.random.default_rng(cfg.seed + len(self.manifest.shards))
        self.sampling = SamplingParams(temperature=cfg.temperature)
        self.seq_len = cfg.seq_len
        need = cfg.seq_len * cfg.n_parallel if cfg.generate else cfg.seq_len + target.n_batch
        if target.n_ctx < need:
            raise InvalidParameterError(
                f"the target's context ({target.n_ctx}) cannot hold the sequences to decode"
            )
        self.chat = ChatFormatter(target.model, target.path)

    # --- preparing sequences -----------------------------------------------------------------

    def _prepare(self, item: int, record: Record) -> _Seq:
        """The sequence a record gives; raises Unusable when it gives none."""
        generate = self.cfg.generate
        msgs, trimmed = usable(record, replies=not generate)
        bounds: list[str] = []  # the text before and after each assistant turn
        if record.text and not generate:  # plain text: every position is trained on
            text = msgs[0]["content"]
        else:
            try:
                # generate: the prompt, and the target replies; else the whole conversation,
                # with no assistant header opened after its last turn
                text, _ = self.chat.render(msgs, add_generation_prompt=generate)
                if not generate:  # only the replies are trained on, as drafted: from
                    # after the assistant header to the end of the turn
                    for i, m in enumerate(msgs):
                        if m["role"] == "assistant":
                            head = self.chat.render(msgs[:i])[0]
                            end = self.chat.render(msgs[: i + 1], add_generation_prompt=False)[0]
                            bounds += [head, end]
                            if len(head) > 4 * self.seq_len:  # past any sequence: enough
                                break
            except LocalspecError:
                raise Unusable(TEMPLATE_REFUSED) from None
        tokens = self._tokens(text)
        if generate:
            if len(tokens) > self.cfg.max_prompt or len(tokens) + 8 > self.seq_len:
                raise Unusable(PROMPT_TOO_LONG)
            return _Seq(item, tokens, loss_start=len(tokens), trimmed=trimmed)
        tokens = tokens[: self.seq_len]
        if len(tokens) < 4:
            raise Unusable(TOO_SHORT)
        if not all(text.startswith(b) for b in bounds):
            # a template that renders earlier turns differently (e.g. dropping their
            # reasoning): token counts of its prefixes would not locate the replies
            raise Unusable(TEMPLATE_UNSTABLE)
        cuts = [len(self._tokens(b)) if b else 0 for b in bounds]
        spans = []
        for a, b in zip(cuts[::2], cuts[1::2], strict=True):
            b = min(b, len(tokens))
            # the last row trained on predicts the turn's end-of-generation token: nothing
            # after it is ever drafted
            e = next((p for p in range(a, b) if self.eog[tokens[p]]), b)
            if a < e:
                spans.append((a, e))
        if bounds and not spans:  # the reply starts beyond the sequence: nothing to train on
            raise Unusable(PROMPT_TOO_LONG)
        start = spans[0][0] if spans else 0
        return _Seq(item, tokens, loss_start=start, spans=spans, trimmed=trimmed)

    def _tokens(self, text: str) -> list[int]:
        return self.t.model.tokenize(text, add_special=True, parse_special=True)

    # --- decoding ----------------------------------------------------------------------------

    def _decode(self, rows: list[tuple[_Seq, int, int]]) -> None:
        """Decode (sequence, slot, position) rows in one batch and record taps and labels."""
        n, k = len(rows), self.cfg.top_labels
        # logits only where a label is trained on or the next token is generated: the output
        # head is a sixth of SmolLM2's compute per row
        want = np.array(
            [s.labelled(p) or (self.cfg.generate and p == len(s.tokens) - 1) for s, _, p in rows]
        )
        logits = self.t.decode_rows(
            [s.tokens[p] for s, _, p in rows],
            np.array([p for _, _, p in rows], dtype=np.int32),
            np.array([slot for _, slot, _ in rows], dtype=np.int32),
            outputs=want,
        )
        taps = self.t.read_taps(n).astype(np.float32, copy=False)
        # rows without a label keep id 0 and log-probability 0; nothing reads them
        ids = np.zeros((n, k), np.int32)
        logp = np.zeros((n, k), np.float16)
        if len(logits):
            ids[want], logp[want] = top_labels(logits, k)
        out_row = np.cumsum(want) - 1  # row i's place among the output rows
        start = 0
        while start < n:  # rows of one sequence are contiguous
            s = rows[start][0]
            end = start
            while end < n and rows[end][0] is s:
                end += 1
            s.taps.append(taps[start:end])
            s.label_ids.append(ids[start:end])
            s.label_logp.append(logp[start:end])
            if self.cfg.generate and rows[end - 1][2] == len(s.tokens) - 1:
                self._extend(s, logits[out_row[end - 1]])
            start = end

    def _extend(self, s: _Seq, logits: np.ndarray) -> None:
        """Append the target's next token to a generating sequence (greedy or sampled)."""
        if s.n_new >= self.cfg.max_new or len(s.tokens) >= self.seq_len:
            s.done = True
            return
        tok = pick(logits, self.sampling, self.rng)
        s.tokens.append(int(tok))
        s.n_new += 1
        if self.eog[tok] or s.n_new >= self.cfg.max_new:
            s.done = True  # the last token needs no features: nothing follows it

    def run(
        self,
        items: Iterable[Record],
        progress: Callable[[int, DataReport], None] | None = None,
    ) -> Manifest:
        """Process source items until max_tokens positions are written (resumes a manifest).
        progress gets the rows of each finished item (0 for a skipped one) and the counts."""
        cfg, m = self.cfg, self.manifest
        if m.complete_for >= cfg.max_tokens:
            return m  # made by an earlier run: a resumed training does not add data
        done = set(m.done)
        source: Iterator[tuple[int, Record]] = (
            (i, rec) for i, rec in enumerate(items) if i not in done
        )
        try:
            if cfg.generate:
                self._run_generating(source, progress)
            else:
                self._run_fixed(source, progress)
        except KeyboardInterrupt:  # Ctrl-C or kill: the finished sequences waiting for a
            # shard are kept (up to shard_tokens rows of work); those in flight are made again
            if not self._flushing:  # a shard half-recorded when it came is not written twice
                self._flush(force=True)
            raise
        self._flush(force=True)
        if m.used == 0:
            raise LocalspecError(f"no record of the training data can be used: {m.report()}")
        m.complete_for = cfg.max_tokens
        m.save(self.folder)
        return m

    def _next_usable(
        self,
        source: Iterator[tuple[int, Record]],
        progress: Callable[[int, DataReport], None] | None,
    ) -> _Seq | None:
        """The next source item that gives a sequence (skipped ones counted), None at the end."""
        for nxt in source:
            try:
                return self._prepare(*nxt)
            except Unusable as skip:
                self._skip(nxt[0], skip.reason, progress)
        return None

    def _run_fixed(
        self,
        source: Iterator[tuple[int, Record]],
        progress: Callable[[int, DataReport], None] | None,
    ) -> None:
        """The data's own text: a prefill, every batch filled to n_batch rows with the next
        rows of as many sequences as it takes (each its own sequence id in one shared KV
        stream), so short texts cost what long ones do per row."""
        cfg, n_batch = self.cfg, self.t.n_batch
        live: list[tuple[_Seq, int]] = []  # sequences being decoded and their slots
        free = list(range(cfg.n_parallel))
        fed: dict[int, int] = {}  # id(seq) -> positions already decoded
        queued = self.manifest.n_tokens
        exhausted = False
        while True:
            rows: list[tuple[_Seq, int, int]] = []
            i = 0
            while len(rows) < n_batch:
                if i == len(live):
                    if exhausted or queued >= cfg.max_tokens or not free:
                        break
                    s = self._next_usable(source, progress)
                    if s is None:
                        exhausted = True
                        break
                    slot = free.pop(0)
                    live.append((s, slot))
                    fed[id(s)] = 0
                    queued += len(s.tokens)
                s, slot = live[i]
                a = fed[id(s)]
                b = min(len(s.tokens), a + n_batch - len(rows))
                rows.extend((s, slot, p) for p in range(a, b))
                fed[id(s)] = b
                i += 1
            if not rows:
                return
            self._decode(rows)
            for s, slot in [x for x in live if fed[id(x[0])] == len(x[0].tokens)]:
                live = [x for x in live if x[0] is not s]
                self.t.forget_sequence(slot)  # its cells make room for the next batch
                free.append(slot)
                del fed[id(s)]
                self._finish(s, progress)

    def _run_generating(
        self,
        source: Iterator[tuple[int, Record]],
        progress: Callable[[int, DataReport], None] | None,
    ) -> None:
        """The target writes the replies: n_parallel sequences decode together, each prompt
        prefilled when its slot frees up."""
        cfg, m = self.cfg, self.manifest
        slots: list[_Seq | None] = [None] * cfg.n_parallel
        # positions written plus those reserved for the sequences in flight (each its prompt
        # and a full reply); a reply that ends early gives back what it did not use, so the
        # data reaches max_tokens rather than stopping short by every early end
        queued = m.n_tokens
        reserved: dict[int, int] = {}
        exhausted = False
        while True:
            for slot in range(cfg.n_parallel):  # fill free slots, prefilling their prompts
                if slots[slot] is None and not exhausted and queued < cfg.max_tokens:
                    s = self._next_usable(source, progress)
                    if s is None:
                        exhausted = True
                        break
                    self.t.forget_sequence(slot)
                    n_prompt = len(s.tokens)
                    for p0 in range(0, n_prompt, self.t.n_batch):
                        p1 = min(p0 + self.t.n_batch, n_prompt)
                        self._decode([(s, slot, p) for p in range(p0, p1)])
                    reserved[id(s)] = len(s.tokens) + cfg.max_new
                    queued += reserved[id(s)]
                    slots[slot] = s
            live = [(s, i) for i, s in enumerate(slots) if s is not None]
            for s, i in live:
                if s.done:
                    queued += self._finish(s, progress) - reserved.pop(id(s))
                    slots[i] = None
            live = [(s, i) for i, s in enumerate(slots) if s is not None]
            if not live:
                if exhausted or queued >= cfg.max_tokens:
                    break
                continue
            self._decode([(s, i, len(s.tokens) - 1) for s, i in live])

    # --- shards ------------------------------------------------------------------------------

    def _skip(
        self, item: int, reason: str, progress: Callable[[int, DataReport], None] | None
    ) -> None:
        # counted with its item in `done`: both are saved together by the next shard
        m = self.manifest
        m.done.append(item)
        m.skipped[reason] = m.skipped.get(reason, 0) + 1
        if progress is not None:
            progress(0, m.report())

    def _finish(self, s: _Seq, progress: Callable[[int, DataReport], None] | None) -> int:
        """Queue a finished sequence for the next shard; the rows it adds (0: too short)."""
        if s.n_rows < 3:
            self._skip(s.item, TOO_SHORT, progress)
            return 0
        m = self.manifest
        s.taps = [_compact(np.concatenate(s.taps))]  # a shard is float32 if any part must be
        self.pending.append(s)
        m.used += 1
        m.trimmed += s.trimmed
        if progress is not None:
            progress(s.n_rows, m.report())
        self._flush(force=False)
        return s.n_rows

    def _flush(self, *, force: bool) -> None:
        rows = sum(s.n_rows for s in self.pending)
        if not self.pending or (rows < self.cfg.shard_tokens and not force):
            return
        self._flushing = True
        self._write_shard()
        self._flushing = False

    def _write_shard(self) -> None:
        """The pending sequences as the next shard, then the manifest that lists it."""
        m, seqs = self.manifest, self.pending
        taps = np.concatenate([np.concatenate(s.taps) for s in seqs])
        ids = np.concatenate([np.concatenate(s.label_ids) for s in seqs])
        logp = np.concatenate([np.concatenate(s.label_logp) for s in seqs])
        # tokens keep one more entry than rows when the last token was never decoded
        tokens = np.concatenate([np.asarray(s.tokens[: s.n_rows + 1], np.int32) for s in seqs])
        offsets = np.cumsum([0] + [s.n_rows for s in seqs]).astype(np.int64)
        tok_offsets = np.cumsum([0] + [min(len(s.tokens), s.n_rows + 1) for s in seqs])
        masks = [s.label_mask() for s in seqs]
        name = f"shard-{len(m.shards):05d}.npz"
        # the taps (98% of a shard) in a .npy of their own, which the trainer maps into memory
        # instead of reading: data far larger than RAM still trains
        atomic_save(os.path.join(self.folder, taps_file(name)), lambda tmp: np.save(tmp, taps))
        labels: dict[str, Any] = {
            "labelled": np.concatenate(masks),
            "label_ids": ids,
            "label_logp": logp,
            "tokens": tokens,
            "offsets": offsets,
            "tok_offsets": tok_offsets.astype(np.int64),
            "loss_start": np.array([s.loss_start for s in seqs], np.int64),
        }
        atomic_save(os.path.join(self.folder, name), lambda tmp: np.savez(tmp, **labels))
        m.shards.append(name)
        m.done.extend(s.item for s in seqs)
        m.n_tokens += int(offsets[-1])
        m.n_label_tokens += int(sum(mask.sum() for mask in masks))
        now = time.process_time()
        m.cpu_seconds += now - self._cpu_mark
        self._cpu_mark = now
        m.save(self.folder)
        self.pending = []


def taps_file(shard: str) -> str:
    return shard.removesuffix(".npz") + ".taps.npy"


def _compact(taps: np.ndarray) -> np.ndarray:
    """float16 when every value fits (half the disk and memory), else float32 unchanged."""
    with np.errstate(over="ignore"):
        half = taps.astype(np.float16)
    return half if np.isfinite(half).all() else taps


@dataclass
class Sequence:
    """One training sequence: its features and labels (rows) and its tokens (rows or rows+1)."""

    taps: np.ndarray  # [rows, 3H] float16 or float32 (a view of a memory-mapped file)
    label_ids: np.ndarray  # [rows, K]
    label_logp: np.ndarray  # [rows, K]
    tokens: np.ndarray  # [>= rows]
    loss_start: int
    labelled: np.ndarray  # [rows] bool: the label is trained on
    key: str = ""  # shard name and index: a name for the sequence that data added later
    # never changes (the held-out split hashes it)


def data_folder(path: str) -> str:
    """The feature folder a path names: a run folder (its data/) or a data folder itself."""
    for folder in (os.path.join(path, "data"), path):
        if os.path.isfile(os.path.join(folder, MANIFEST)):
            return folder
    raise LocalspecError(f"{path} holds no training data (no {MANIFEST} in it or in its data/)")


def _allow_open_maps(n: int) -> None:
    """Each mapped taps file holds a file descriptor: raise the soft limit toward the hard one
    so a data set of many shards maps whole (1,000 shards is ~33M positions)."""
    try:
        import resource
    except ImportError:  # not Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        top = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
        if top < want:
            raise LocalspecError(
                f"{n} training shards need {want} open files, but this system allows {hard} "
                "(ulimit -n): raise the limit"
            )


def load_sequences(folder: str) -> list[Sequence]:
    """All sequences of a data folder: labels in memory, taps memory-mapped."""
    m = Manifest.load(folder)
    if m is None:
        raise LocalspecError(f"{folder} holds no training data ({MANIFEST} is missing)")
    _allow_open_maps(len(m.shards))
    out = []
    for name in m.shards:
        path = os.path.join(folder, name)
        tpath = os.path.join(folder, taps_file(name))
        try:
            with np.load(path) as z:
                d = {k: z[k] for k in z.files}
            if "taps" not in d:  # newer shards keep the taps in a .npy of their own: mapped
                d["taps"] = np.load(tpath, mmap_mode="r")
        except (OSError, ValueError, KeyError) as exc:
            raise LocalspecError(f"cannot read training shard {path}: {exc}") from None
        off, toff = d["offsets"], d["tok_offsets"]
        if len(d["taps"]) != int(off[-1]):
            raise LocalspecError(f"training shard {tpath} is truncated; delete the data folder")
        for i in range(len(off) - 1):
            a, b = int(off[i]), int(off[i + 1])
            start = int(d["loss_start"][i])
            # older shards have no mask: every row from loss_start on is trained on
            labelled = d["labelled"][a:b] if "labelled" in d else np.arange(b - a) >= start
            out.append(
                Sequence(
                    taps=d["taps"][a:b],
                    label_ids=d["label_ids"][a:b],
                    label_logp=d["label_logp"][a:b],
                    tokens=d["tokens"][int(toff[i]) : int(toff[i + 1])],
                    loss_start=start,
                    labelled=labelled,
                    key=f"{name}:{i}",
                )
            )
    return out
