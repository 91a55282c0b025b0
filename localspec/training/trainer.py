"""Training an EAGLE-3 / EAGLE-3.1 drafter for a GGUF target, resumable across runs.

Layout of the output folder:
- ``data/``: feature shards made by the target (see features.py)
- ``state.pt``: model, optimizer and progress (and the weights' average with --ema), saved
  every few minutes and at the end
- ``checkpoint/``: the drafter in SpecForge's layout (config.json + model.safetensors), which
  ``localspec convert`` turns into a GGUF like any downloaded drafter
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import native as N
from ..datasets import Record
from ..errors import InvalidParameterError, LocalspecError
from ..files.ggufdata import read_tensors
from .averaging import EMA_KEY, WeightAverage, exported_weights
from .features import (
    DataReport,
    FeatureConfig,
    FeatureWriter,
    Manifest,
    Sequence,
    load_sequences,
    target_identity,
)
from .files import atomic_save, draft_vocab_maps, write_checkpoint
from .gguf_parent import gguf_parent_state, is_gguf
from .head_loss import fused_head_ce

VARIANTS = ("eagle3.1", "eagle3")
LOSSES = ("kl", "lk")  # kl: cross-entropy against the target's top labels; lk: LK-hybrid,
# blending that with the acceptance rate itself as the drafter starts to agree
CURVE = "curve.jsonl"
INITS = ("target", "target-layer", "random")
STATE = "state.pt"
CHECKPOINT = "checkpoint"


@dataclass
class TrainConfig:
    variant: str = "eagle3.1"  # eagle3.1: fc_norm + norm_output; eagle3: neither
    draft_vocab: int = 16_384
    steps_unrolled: int = 5  # training-time-test depth
    window: int = 512  # rows per training window
    # prompt rows kept before a reply's first trained row: what the drafter learns to attend
    # over (raise it, with window, for long histories)
    prompt_context: int = 64
    batch_tokens: int = 2048  # rows per optimizer step
    lr: float = 6e-4
    warmup: int = 50
    weight_decay: float = 0.0
    max_steps: int | None = None
    time_budget: float | None = None  # seconds of training in this run
    eval_every: int = 100
    save_every: float = 300.0  # seconds
    init: str = "target"  # "target": the target's head and final norm; "target-layer": also
    # its top layer; "random"
    init_from: str | None = None  # another run's folder or state file: start from its
    # drafter (weights and draft vocabulary) to go on training it on this run's data
    held_out: float = 0.03  # share of sequences kept for the acceptance estimate
    eval_data: str | None = None  # a feature folder to estimate acceptance on instead (e.g.
    # the target's own replies to prompts kept out of training): every variant and every
    # kind of training data is then judged on the same rows
    eval_batches: int = 8  # held-out batches per estimate
    max_epochs: float | None = None  # stop after this many passes over the data
    loss: str = "kl"
    precision: str = "auto"  # fp32, bf16 (autocast; fp32 master weights), auto: bf16 where
    # the hardware computes it natively (CUDA with bf16, CPUs with AVX512-BF16 or AMX)
    verifier: str | None = None  # the Hugging Face model the GGUF target was made from,
    # recorded in the speculators checkpoint (vLLM serves it as the target)
    # keep an exponential moving average of the weights with this decay (warmed up, see
    # averaging.warmed_decay) and estimate and export it instead of the last step's; 0 = off;
    # None = as the run being resumed kept it (a new run: off)
    ema: float | None = None
    seed: int = 0
    device: str = "auto"
    threads: int = 0  # 0 = torch's default


@dataclass
class EvalResult:
    loss: float
    acc: list[float]  # top-1 agreement with the target per draft step (teacher-forced chain)
    tau: float  # expected tokens per verify at k = steps_unrolled, from exact chains
    coverage: float  # share of held-out target tokens inside the draft vocabulary
    tau_short: float = 0.0  # tau of rows at sequence positions < SHORT
    tau_long: float = 0.0  # tau of rows at positions >= LONG (EAGLE-3.1's claim: 3.1 holds
    # its acceptance deeper into a context)
    # tau and acceptance per position as decoding sees them: chains walked through each reply,
    # each starting where the last one's tokens ended (see walk_chains)
    tau_walk: float = float("nan")  # NaN in estimates saved before it existed
    accept_walk: list[float] = field(default_factory=list)


# the long/short split of held-out rows, by position in their sequence
SHORT, LONG = 256, 512


@dataclass
class TrainResult:
    folder: str
    checkpoint: str
    steps: int
    seconds: float
    positions: int
    first_loss: float | None
    last_loss: float | None
    untrained: EvalResult | None
    final: EvalResult
    history: list[dict[str, float]] = field(default_factory=list)
    data: DataReport = field(default_factory=DataReport)  # records used and skipped, by reason


PRECISIONS = ("auto", "fp32", "bf16")


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (elsewhere bf16 is emulated, and slower)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = next((ln for ln in fh if ln.startswith("flags")), "").split()
    except OSError:  # not Linux: Apple's MPS and others stay in float32
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_precision(name: str, device: str, hidden: int) -> str:
    """auto: bf16 where it is native and the matrices are large enough to gain: on this
    project's AVX512-BF16 CPU a SmolLM2-sized step (hidden 576) ran 1.7x faster in bf16, a
    test model's (hidden 288) 8x slower."""
    import torch

    if name not in PRECISIONS:
        raise InvalidParameterError(f"precision must be one of {PRECISIONS}, got {name!r}")
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device == "cpu" and hidden >= 512 and cpu_has_bf16() else "fp32"


def pick_device(name: str) -> str:
    import torch

    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


# --- target description ---------------------------------------------------------------------


@dataclass
class TargetInfo:
    path: str
    n_layer: int
    hidden: int
    n_ff: int
    n_head: int
    n_head_kv: int
    rms_eps: float
    rope_theta: float
    context_length: int
    n_vocab: int


def target_info(path: str) -> TargetInfo:
    h = N.GGUFHeader(path)
    emb = h.tensors.get("token_embd.weight")
    if emb is None or h.arch_key("block_count") is None:
        raise LocalspecError(f"{path} is not a transformer GGUF this trainer understands")
    n_head = int(h.arch_key("attention.head_count"))
    kv = h.arch_key("attention.head_count_kv")
    return TargetInfo(
        path=path,
        n_layer=int(h.arch_key("block_count")),
        hidden=int(h.arch_key("embedding_length")),
        n_ff=int(h.arch_key("feed_forward_length")),
        n_head=n_head,
        n_head_kv=int(kv) if isinstance(kv, int) else n_head,
        rms_eps=float(h.arch_key("attention.layer_norm_rms_epsilon") or 1e-5),
        rope_theta=float(h.arch_key("rope.freq_base") or 10000.0),
        context_length=int(h.arch_key("context_length") or 4096),
        n_vocab=int(emb.shape[1]),
    )


def default_taps(n_layer: int) -> tuple[int, int, int]:
    """llama.cpp's (and EAGLE-3's) default: inputs of layers 2, L/2 and L-3."""
    return (min(2, n_layer - 1), n_layer // 2, max(1, n_layer - 3))


# --- data -------------------------------------------------------------------------------------


def build_features(
    target_path: str,
    items: Iterable[Record],
    folder: str,
    fcfg: FeatureConfig,
    *,
    n_threads: int,
    n_gpu_layers: int = 0,
    progress: Callable[[int, DataReport], None] | None = None,
) -> Manifest:
    """Write the features of `items` to `folder` (resuming it); its manifest holds the counts."""
    from ..options import RuntimeOptions
    from ..runtime.target import Target

    n_batch = max(512, fcfg.n_parallel)
    # generating: a KV stream per sequence. The data's own text: one shared stream that holds
    # the sequence a batch ends in and the next batch (earlier ones are done by then)
    fixed = not fcfg.generate
    rt = RuntimeOptions(
        n_ctx=fcfg.seq_len + 2 * n_batch if fixed else fcfg.seq_len * fcfg.n_parallel,
        n_batch=n_batch,
        n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
    )
    target = Target(target_path, rt, n_seq=fcfg.n_parallel, unified_kv=fixed)
    import torch

    threads = torch.get_num_threads()
    # the labels' top-k runs between decodes, while llama.cpp's threads are idle
    torch.set_num_threads(max(1, n_threads))
    try:
        target.enable_taps(fcfg.taps)
        return FeatureWriter(target, folder, fcfg).run(items, progress)
    finally:
        torch.set_num_threads(threads)
        target.close()


def check_eval_data(eval_folder: str, own: str) -> None:
    """--eval-data must be another feature folder made by the same target with the same taps
    and labels: one clear error otherwise, before anything is trained or judged."""
    if os.path.isdir(own) and os.path.samefile(eval_folder, own):
        raise InvalidParameterError(
            f"--eval-data {eval_folder} is this run's own training data; give another folder"
        )
    theirs, mine = Manifest.load(eval_folder), Manifest.load(own)
    if theirs is None or mine is None:
        return  # load_sequences names the missing one
    keys = ("taps", "target", "top_labels")
    if theirs.target_fingerprint != mine.target_fingerprint or any(
        theirs.config.get(k) != mine.config.get(k) for k in keys
    ):
        raise LocalspecError(
            f"--eval-data {eval_folder} was made with another target, other taps or other "
            f"labels than this run's data ({ {k: theirs.config.get(k) for k in keys} } against "
            f"{ {k: mine.config.get(k) for k in keys} })"
        )


def _hashed_share(key: str, seed: int) -> float:
    """A number in [0, 1) fixed by a sequence's name: the held-out split draws on it."""
    return zlib.crc32(f"{seed}:{key}".encode()) / 2**32


def choose_draft_vocab(seqs: list[Sequence], size: int, n_vocab: int) -> np.ndarray:
    """The `size` target tokens the target predicts most often (ascending ids): the drafter can
    only propose these, so coverage of the target's own choices is what counts."""
    size = min(size, n_vocab)
    counts = np.zeros(n_vocab, dtype=np.float64)
    for s in seqs:  # only rows whose label is trained on
        ids = s.label_ids[s.labelled]
        np.add.at(counts, ids[:, 0], 1.0)
        np.add.at(counts, ids[:, 1:].reshape(-1), 1e-3)  # ties: likely alternatives
    order = np.lexsort((np.arange(n_vocab), -counts))
    return np.sort(order[:size]).astype(np.int64)


class Batcher:
    """Windows of sequences packed into padded batches (tensors on the training device)."""

    def __init__(self, seqs: list[Sequence], cfg: TrainConfig, t2d_map: np.ndarray) -> None:
        self.seqs = seqs
        self.cfg = cfg
        self.map = t2d_map
        # windows start prompt_context rows before the first label (at most window - 2, so
        # the first window trains rows too): long prompts cost layer compute for every row,
        # while the drafter mostly attends to recent positions
        pc = min(cfg.prompt_context, cfg.window - 2)
        self.windows = [
            (i, a, min(a + cfg.window, len(s.taps)))
            for i, s in enumerate(seqs)
            for a in range(max(0, s.loss_start - 1 - pc), len(s.taps), cfg.window)
            if min(a + cfg.window, len(s.taps)) - a >= 2
        ]

    def batches(self, order: np.ndarray) -> list[list[tuple[int, int, int]]]:
        """Group windows (in this order) into batches of about batch_tokens rows."""
        out: list[list[tuple[int, int, int]]] = []
        cur: list[tuple[int, int, int]] = []
        rows = 0
        for w in (self.windows[i] for i in order):
            n = w[2] - w[1]
            if cur and (rows + n) > self.cfg.batch_tokens:
                out.append(cur)
                cur, rows = [], 0
            cur.append(w)
            rows += n
        if cur:
            out.append(cur)
        return out

    def tensors(self, batch: list[tuple[int, int, int]], device: str) -> dict[str, Any]:
        import torch

        S = self.cfg.steps_unrolled
        B = len(batch)
        W = max(b - a for _, a, b in batch)
        C = W + S - 1  # columns c = P + j; the label sits at sequence position a + c + 1
        H3 = self.seqs[batch[0][0]].taps.shape[1]
        K = self.seqs[batch[0][0]].label_ids.shape[1]
        taps = np.zeros((B, W, H3), np.float32)
        tok = np.zeros((B, C), np.int64)
        ids = np.full((B, C, K), -1, np.int64)
        logp = np.zeros((B, C, K), np.float32)
        valid = np.zeros((B, C), bool)
        for r, (si, a, b) in enumerate(batch):
            s = self.seqs[si]
            n_rows = len(s.taps)
            taps[r, : b - a] = s.taps[a:b]
            lo, hi = a + 1, min(a + 1 + C, n_rows)  # label positions that exist
            if hi <= lo:
                continue
            n = hi - lo
            tok[r, :n] = s.tokens[lo:hi]
            ids[r, :n] = self.map[s.label_ids[lo:hi]]
            logp[r, :n] = s.label_logp[lo:hi]
            # a column is trained only if its row P = c - j lies inside the window: checked
            # per step in the loss; here: the label exists and belongs to a reply
            valid[r, :n] = s.labelled[lo:hi]
        return {
            "taps": torch.from_numpy(taps).to(device),
            "tokens": torch.from_numpy(tok).to(device),
            "ids": torch.from_numpy(ids).to(device),
            "logp": torch.from_numpy(logp).to(device),
            "valid": torch.from_numpy(valid).to(device),
            "rows": torch.tensor([b - a for _, a, b in batch], device=device),
            "start": torch.tensor([a for _, a, _ in batch], device=device),
            "seq": [si for si, _, _ in batch],
            "W": W,
        }


def step_losses(
    model: Any, t: dict[str, Any], steps: int, loss: str = "kl"
) -> tuple[Any, list[Any], list[Any]]:
    """Weighted loss over the unrolled steps, and per step the (correct, counted) row masks.
    The head (most of the cost) runs only on rows that carry a label: prompt rows are keys
    for attention but never predicted.

    loss "lk" (Samarin et al., LK losses, arXiv 2602.23881, hybrid form): per row
    w * CE + (1 - w) * (1 - alpha), alpha = sum over the target's top labels of
    min(p_draft, p_target) (the acceptance rate of that row, from below: the labels hold
    nearly all of the target's mass) and w = exp(-3 alpha) without gradient, so the loss
    leans on cross-entropy while the drafter disagrees and on acceptance once it agrees."""
    import torch

    W = t["W"]
    in_window = torch.arange(W, device=t["taps"].device)[None, :] < t["rows"][:, None]
    outs = model.unroll(model.encode(t["taps"]), t["tokens"], steps)
    total: Any = 0.0
    correct, counted = [], []
    parts: list[tuple[Any, ...]] = []  # per step: rows' states, labels, weights (kl)
    for j, h in enumerate(outs):
        mask = t["valid"][:, j : j + W] & in_window
        sel = mask.nonzero(as_tuple=True)
        ids = t["ids"][:, j : j + W][sel]
        inv = ids < 0
        p_target = t["logp"][:, j : j + W][sel].exp().masked_fill(inv, 0.0)
        q = p_target / p_target.sum(-1, keepdim=True).clamp_min(1e-9)
        train_rows = ~inv[:, 0]  # the target's choice must be draftable
        row_w = (0.8**j) * train_rows / train_rows.sum().clamp_min(1)
        correct.append(torch.zeros_like(mask))
        counted.append(mask)
        if loss == "kl":  # all steps' rows go through the head at once, below
            parts.append((h[sel], ids, q, row_w, sel))
            continue
        logits = model.lm_head(h[sel])
        lp_ids = logits.float().log_softmax(-1).gather(-1, ids.clamp_min(0))
        alpha = torch.minimum(lp_ids.exp().masked_fill(inv, 0.0), p_target).sum(-1)
        w = torch.exp(-3.0 * alpha.detach())
        row_loss = w * -(q * lp_ids).sum(-1) + (1.0 - w) * (1.0 - alpha)
        total = total + (row_w * row_loss).sum()
        correct[j][sel] = logits.argmax(-1) == ids[:, 0]
    if parts:
        # the cross-entropy with its gradient, chunk by chunk (head_loss.py): one call for
        # every step, so the head weight is cast once and its gradient summed once
        h_all, ids_all, q_all, w_all = (torch.cat([p[i] for p in parts]) for i in range(4))
        total, top = fused_head_ce(h_all, model.lm_head.weight, ids_all, q_all, w_all)
        start = 0
        for j, (_, ids, _, _, sel) in enumerate(parts):
            correct[j][sel] = top[start : start + len(ids)] == ids[:, 0]
            start += len(ids)
    return total, correct, counted


def walk_chains(
    rows: dict[int, list[tuple[np.ndarray, np.ndarray]]], steps: int, limit: int | None = None
) -> tuple[float, list[float]]:
    """tau and acceptance per draft position as greedy chain decoding meets them. `rows` maps
    a sequence to its labelled rows' positions and accepted lengths. Each reply (a run of
    consecutive rows; its first token is the target's before any chain) is walked as decoding
    walks it: a chain at row p yields its L accepted tokens and the target's own, and the
    next starts at row p + L + 1; the last one stops where the reply does. Averaging over
    every row instead counts an easy stretch once per row where decoding takes it in one
    step, so that estimate reads high, by more the better the drafter. `limit` walks each
    reply's first `limit` tokens and drafts no further, as decoding with max_tokens = limit
    does. Acceptance at position j is counted as `localspec bench` counts it: chains
    accepted through j over chains that drafted j."""
    n_steps, n_tokens = 0, 0
    reach = np.zeros(steps)  # chains that accepted at least j + 1 drafts
    drafted = np.zeros(steps)  # chains that drafted position j
    for parts in rows.values():
        pos = np.concatenate([p for p, _ in parts])
        length = np.concatenate([n for _, n in parts])
        order = np.argsort(pos, kind="stable")
        pos, length = pos[order], length[order]
        for reply in np.split(np.arange(len(pos)), np.flatnonzero(np.diff(pos) != 1) + 1):
            end = len(reply) if limit is None else min(len(reply), limit - 1)
            i = 0
            while i < end:
                # tokens made so far: i + 1; decoding drafts no further than its budget
                budget = steps if limit is None else min(steps, limit - i - 2)
                n = min(int(length[reply[i]]), end - i - 1)
                n_steps += 1
                drafted[: max(budget, 0)] += 1
                reach[:n] += 1
                i += n + 1
            n_tokens += max(end, 0)
    if not n_steps:
        return float("nan"), []
    return n_tokens / n_steps, [
        float(r / d) if d else 0.0 for r, d in zip(reach, drafted, strict=True)
    ]


def evaluate(
    model: Any,
    batches: Iterable[dict[str, Any]],
    steps: int,
    loss: str = "kl",
    walk_limit: int | None = None,
) -> EvalResult:
    """Held-out loss, per-step agreement and the chain estimate of tau at k = steps: a row's
    chain accepts while each step agrees with the target (for greedy self-generated data the
    fed tokens are exactly those a real chain would see), averaged over rows and, as decoding
    meets it, walked through each reply (walk_chains, each reply's first walk_limit tokens)."""
    import torch

    loss_sum, n_b = 0.0, 0
    hits = np.zeros(steps)
    cnt = np.zeros(steps)
    chain_sum, chain_rows, cov_in, cov_all = 0.0, 0, 0, 0
    by_len = np.zeros((2, 2))  # [short, long] x [chain sum, rows]
    walk_rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    model.eval()
    with torch.no_grad():
        for t in batches:
            value, correct, counted = step_losses(model, t, steps, loss)
            loss_sum += float(value)
            n_b += 1
            run = torch.ones_like(correct[0])
            length = torch.zeros(correct[0].shape, device=correct[0].device)
            for j in range(steps):
                hits[j] += float(correct[j].sum())
                cnt[j] += float(counted[j].sum())
                run = run & correct[j]
                length = length + run.float()
            base = counted[0]
            chain_sum += float((length * base).sum())
            chain_rows += int(base.sum())
            pos = t["start"][:, None] + torch.arange(t["W"], device=base.device)[None, :]
            keep, at, got = base.cpu().numpy(), pos.cpu().numpy(), length.cpu().numpy()
            for r, si in enumerate(t["seq"]):
                walk_rows.setdefault(si, []).append((at[r][keep[r]], got[r][keep[r]].astype(int)))
            for i, part in enumerate((pos < SHORT, pos >= LONG)):
                by_len[i] += (float((length * base * part).sum()), int((base & part).sum()))
            ids0 = t["ids"][:, : t["W"], 0]
            cov_in += int(((ids0 >= 0) & base).sum())
            cov_all += int(base.sum())
    model.train()
    tau_walk, accept_walk = walk_chains(walk_rows, steps, walk_limit)
    return EvalResult(
        loss=loss_sum / max(n_b, 1),
        acc=[float(h / c) if c else 0.0 for h, c in zip(hits, cnt, strict=True)],
        tau=1.0 + chain_sum / max(chain_rows, 1),
        coverage=cov_in / max(cov_all, 1),
        # NaN where no held-out row is that short or long
        tau_short=1.0 + by_len[0, 0] / by_len[0, 1] if by_len[0, 1] else float("nan"),
        tau_long=1.0 + by_len[1, 0] / by_len[1, 1] if by_len[1, 1] else float("nan"),
        tau_walk=tau_walk,
        accept_walk=accept_walk,
    )


# --- checkpoint -------------------------------------------------------------------------------


def export_checkpoint(
    model: Any, folder: str, taps: tuple[int, ...], draft_ids: np.ndarray, meta: dict[str, Any]
) -> str:
    """Write the drafter in SpecForge's layout (LlamaForCausalLMEagle3, safetensors)."""
    c = model.c
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update(draft_vocab_maps(draft_ids, c.vocab_size))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "num_hidden_layers": 1,
        "head_dim": c.hidden_size // c.n_head,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "fc_norm": c.fc_norm,
        "norm_output": c.norm_output,
        # SpecForge numbers taps as layer outputs: input of layer i = output of layer i-1
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [t - 1 for t in taps]},
        "localspec": meta,
    }
    return write_checkpoint(os.path.join(folder, CHECKPOINT), tensors, config)


def _save_state(path: str, state: dict[str, Any]) -> None:
    import torch

    atomic_save(path, lambda tmp: torch.save(state, tmp))


# --- the loop ---------------------------------------------------------------------------------


def build_drafter(
    info: TargetInfo,
    cfg: TrainConfig,
    draft_ids: np.ndarray,
    resume: dict[str, Any] | None,
    init_seqs: list[Sequence],
) -> Any:
    """The drafter model for this target and config: a saved state's weights (resume), or
    initialised as cfg.init says from the target's tensors (init_seqs: a sample of the
    training data, for the taps' scale)."""
    import torch

    from .model import DraftConfig, Eagle3Drafter

    i, v31 = info, cfg.variant == "eagle3.1"
    dc = DraftConfig(
        hidden_size=i.hidden,
        intermediate_size=i.n_ff,
        n_head=i.n_head,
        n_head_kv=i.n_head_kv,
        target_hidden_size=i.hidden,
        vocab_size=i.n_vocab,
        draft_vocab_size=len(draft_ids),
        rms_eps=i.rms_eps,
        rope_theta=i.rope_theta,
        context_length=i.context_length,
        fc_norm=v31,
        norm_output=v31,
    )
    top = i.n_layer - 1
    names = ["token_embd.weight", "output_norm.weight"]
    hdr = N.GGUFHeader(i.path)
    if "output.weight" in hdr.tensors:
        names.append("output.weight")
    if cfg.init == "target-layer" and resume is None:
        names += [f"blk.{top}.{n}" for n in TOP_LAYER_TENSORS]
    w = read_tensors(i.path, names)
    embed = torch.from_numpy(w["token_embd.weight"])
    model = Eagle3Drafter(dc, embed)
    if resume is not None:
        model.load_state_dict(resume["model"])
    elif cfg.init != "random":
        sample = np.concatenate([s.taps for s in init_seqs]).astype(np.float32)
        rms = np.sqrt(np.square(sample.reshape(len(sample), 3, i.hidden)).mean(axis=(0, 2)))
        model.init_from_target(w, draft_ids, rms, top if cfg.init == "target-layer" else None)
    return model


def read_run_state(path: str, info: TargetInfo, verb: str = "read") -> dict[str, Any]:
    """A training run's state file (or the run folder holding it), checked to be one and to
    belong to this target (verb: what failed, in the message for a torn file)."""
    state_path = os.path.join(path, STATE) if os.path.isdir(path) else path
    st = _read_state(state_path, verb)
    if st.get("target") != target_identity(info.path):
        raise LocalspecError(f"{state_path} was trained for another target than {info.path}")
    return st


def _read_state(state_path: str, verb: str) -> dict[str, Any]:
    """A state file, checked to be one of a localspec train run."""
    import torch

    if not os.path.isfile(state_path):
        raise LocalspecError(f"no such file: {state_path}")
    try:
        st = torch.load(state_path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a torn or foreign file
        raise LocalspecError(f"cannot {verb} {state_path}: {exc}") from None
    keys = ("config", "draft_ids", "model", "taps", "positions")
    if (
        not isinstance(st, dict)
        or any(k not in st for k in keys)
        or not isinstance(st["config"], dict)
    ):
        raise LocalspecError(f"{state_path} is not the state file of a localspec train run")
    return st


def load_parent(cfg: TrainConfig, info: TargetInfo, taps: tuple[int, ...]) -> dict[str, Any]:
    """The state of the run cfg.init_from names (its folder or state file, or a drafter GGUF),
    checked to fit a run of cfg: the same target, taps, variant and draft vocabulary size (its
    weights are loaded as they are)."""
    assert cfg.init_from
    if is_gguf(cfg.init_from):
        st = gguf_parent_state(cfg.init_from, info)
    else:
        st = read_run_state(cfg.init_from, info)
    if tuple(st["taps"]) != tuple(taps):
        raise LocalspecError(
            f"{cfg.init_from} taps layers {list(st['taps'])}, this run {list(taps)}: pass the "
            "same --taps"
        )
    theirs = st["config"].get("variant")
    if theirs != cfg.variant:
        raise LocalspecError(
            f"{cfg.init_from} holds a drafter of variant {theirs}, this run trains "
            f"{cfg.variant}: pass the same --variant"
        )
    size = min(cfg.draft_vocab, info.n_vocab)  # what choose_draft_vocab would pick
    if len(st["draft_ids"]) != size:
        raise LocalspecError(
            f"{cfg.init_from} drafts from {len(st['draft_ids'])} tokens, this run from "
            f"{size}: pass --draft-vocab {len(st['draft_ids'])}"
        )
    # the drafter that run exported (its average, where it kept one) is where this one starts
    return {k: v for k, v in st.items() if k != EMA_KEY} | {"model": exported_weights(st)}


def _same_path(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    return os.path.realpath(a) == os.path.realpath(b)


def fresh_config(cfg: TrainConfig) -> TrainConfig:
    """A new run's config as its state records it: paths made absolute, so the run resumes
    from any working directory."""
    return dataclasses.replace(
        cfg,
        eval_data=os.path.abspath(cfg.eval_data) if cfg.eval_data else None,
        init_from=os.path.abspath(cfg.init_from) if cfg.init_from else None,
        ema=cfg.ema or 0.0,
    )


def resumed_config(
    cfg: TrainConfig, saved: dict[str, Any], state_path: str, step: int
) -> TrainConfig:
    """cfg for resuming a run whose state recorded `saved` after `step` steps. A run that
    trained stays judged on the rows it was judged on (estimates on other rows in one curve
    would be meaningless), and every run keeps the parent it started from: each is given
    again or inherited, never changed. Before its first step (a run that only made data) a
    run takes the --eval-data it is given."""
    folder = os.path.dirname(state_path)
    evals, parent = saved.get("eval_data"), saved.get("init_from")
    if step == 0 and cfg.eval_data:
        evals = os.path.abspath(cfg.eval_data)
    elif cfg.eval_data and not _same_path(cfg.eval_data, evals):
        raise LocalspecError(
            f"{folder} holds a run judged on {evals or '3% of its own data'}: pass the same "
            "--eval-data (or none) or use another output folder"
        )
    if cfg.init_from and not _same_path(cfg.init_from, parent):
        raise LocalspecError(
            f"{folder} already holds a run started from {parent or 'the target'}; "
            "--init-from starts a new run: use another output folder"
        )
    if evals and not os.path.isdir(evals):
        raise LocalspecError(
            f"{state_path} is judged on {evals}, which is gone: restore it or use another "
            "output folder"
        )
    ema = float(saved.get("ema") or 0.0) if cfg.ema is None else cfg.ema
    return dataclasses.replace(cfg, eval_data=evals, init_from=parent, ema=ema)


def check_resumable(cfg: TrainConfig, folder: str) -> None:
    """Refuse, before any data is made, a resume that resumed_config would refuse (the data
    and the Trainer check the target)."""
    path = os.path.join(folder, STATE)
    if os.path.isfile(path):
        st = _read_state(path, "resume from")
        resumed_config(cfg, st["config"], path, int(st.get("step", 0)))


def estimate_on(
    target_path: str,
    state_path: str,
    folder: str,
    walk_limit: int | None = None,
    span: int | None = None,
) -> EvalResult:
    """A training run's drafter (its state file) judged on any feature folder, e.g. the
    target's own replies to a benchmark's prompts: the run's held-out estimate, on other
    rows (every window of the folder, on the CPU, in float32 where the run may have used
    bf16 matmuls). walk_limit: walk each reply's first that many tokens (walk_chains).
    span: each row attends over its last that many rows, as the runtime's attention window
    (--draft-window) runs the drafter."""
    info = target_info(target_path)
    st = read_run_state(state_path, info)
    made = Manifest.load(folder)
    if made is not None and (
        made.config.get("target") != target_identity(info.path)
        or tuple(made.config.get("taps", ())) != tuple(st.get("taps", ()))
    ):
        raise LocalspecError(
            f"{folder} was made with another target or other taps than {state_path} was trained on"
        )
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in st["config"].items() if k in fields})
    draft_ids = st["draft_ids"]
    try:
        model = build_drafter(info, cfg, draft_ids, {"model": exported_weights(st)}, [])
    except RuntimeError as exc:  # weights of another shape than the config says
        raise LocalspecError(f"cannot load the drafter of {state_path}: {exc}") from None
    model.span = span
    t2d = np.full(info.n_vocab, -1, np.int64)
    t2d[draft_ids] = np.arange(len(draft_ids))
    rows = Batcher(load_sequences(folder), cfg, t2d)
    if not rows.windows:
        raise LocalspecError(f"{folder} holds no labelled rows to judge on")
    # one batch at a time: a big folder's taps never sit in memory all at once
    batches = (rows.tensors(b, "cpu") for b in rows.batches(np.arange(len(rows.windows))))
    return evaluate(model, batches, cfg.steps_unrolled, cfg.loss, walk_limit)


def check_config(cfg: TrainConfig) -> None:
    """Refuse absurd settings with one clear error (train() calls it before making data)."""
    if cfg.variant not in VARIANTS:
        raise InvalidParameterError(f"variant must be one of {VARIANTS}, got {cfg.variant!r}")
    if cfg.steps_unrolled < 1 or cfg.window < 2 or cfg.batch_tokens < cfg.window:
        raise InvalidParameterError("steps_unrolled must be >= 1 and batch_tokens >= window >= 2")
    if cfg.draft_vocab < 2 or cfg.lr <= 0:
        raise InvalidParameterError("draft_vocab must be >= 2 and lr > 0")
    if cfg.prompt_context < 0:
        raise InvalidParameterError(f"prompt_context must be >= 0, got {cfg.prompt_context}")
    if cfg.init not in INITS:
        raise InvalidParameterError(f"init must be one of {INITS}, got {cfg.init!r}")
    if cfg.ema is not None and not 0.0 <= cfg.ema < 1.0:
        raise InvalidParameterError(
            f"ema is a decay per step, 0 (off) or in (0, 1) such as 0.998; got {cfg.ema}"
        )
    if cfg.loss not in LOSSES:
        raise InvalidParameterError(f"loss must be one of {LOSSES}, got {cfg.loss!r}")


class Trainer:
    def __init__(
        self,
        target_path: str,
        folder: str,
        cfg: TrainConfig,
        taps: tuple[int, ...],
        log: Callable[[str], None] = print,
    ) -> None:
        import torch

        check_config(cfg)
        if any(t < 1 for t in taps):
            raise InvalidParameterError(
                f"taps {list(taps)}: the checkpoint layout counts layer outputs, so each tap "
                "(a layer input) must be >= 1"
            )
        self.cfg, self.folder, self.taps, self.log = cfg, folder, tuple(taps), log
        self.info = target_info(target_path)
        self.device = pick_device(cfg.device)
        self.precision = pick_precision(cfg.precision, self.device, self.info.hidden)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.state_path = os.path.join(folder, STATE)
        resume = self._load_state()
        self.cfg = cfg = (
            resumed_config(cfg, resume["config"], self.state_path, resume["step"])
            if resume is not None
            else fresh_config(cfg)
        )
        # a run that only made data, now judged on other rows: its untrained estimate and
        # curve start again on them
        rejudged = resume is not None and not _same_path(
            cfg.eval_data, resume["config"].get("eval_data")
        )
        seqs = load_sequences(os.path.join(folder, "data"))
        if len(seqs) < 2:
            raise LocalspecError(f"too little training data in {folder}/data: {len(seqs)} items")
        if cfg.eval_data:
            check_eval_data(cfg.eval_data, os.path.join(folder, "data"))
            self.train_seqs, self.held_seqs = seqs, load_sequences(cfg.eval_data)
        else:  # by a hash of each sequence's name, so data added later keeps the split; the
            # first sequence is always held out, so the set is never empty
            kept = [_hashed_share(s.key, cfg.seed) < cfg.held_out for s in seqs]
            kept[0] = True
            self.train_seqs = [s for s, k in zip(seqs, kept, strict=True) if not k]
            self.held_seqs = [s for s, k in zip(seqs, kept, strict=True) if k]
            if not self.train_seqs:
                raise LocalspecError(f"too little training data in {folder}/data")
        # a run that goes on from another's drafter: its weights and draft vocabulary (once
        # this run saved a state of its own, that state is what resumes, and it names the
        # parent it started from: a run is never silently resumed as if from another)
        parent = None
        if resume is None and cfg.init_from:
            parent = load_parent(cfg, self.info, self.taps)
            seen = parent["positions"]
            gguf = parent.get("from_gguf")
            known = "positions seen not recorded" if gguf else f"{seen} positions seen"
            log(f"starting from the drafter of {cfg.init_from} ({known})")
        self.parent_positions = (resume or parent or {}).get("parent_positions", 0)
        if parent is not None:
            self.parent_positions += parent["positions"]
        state = resume if resume is not None else parent
        if state is not None:
            self.draft_ids = state["draft_ids"]
        else:
            self.draft_ids = choose_draft_vocab(self.train_seqs, cfg.draft_vocab, self.info.n_vocab)
        self.t2d_map = np.full(self.info.n_vocab, -1, np.int64)
        self.t2d_map[self.draft_ids] = np.arange(len(self.draft_ids))
        self.model = self._build_model(resume or parent)
        # the average starts at the weights training starts from (a parent's average is
        # what its run exported, and is this run's start: see load_parent)
        self.average = self._build_average(resume)
        self.train_data = Batcher(self.train_seqs, cfg, self.t2d_map)
        held = Batcher(self.held_seqs, cfg, self.t2d_map)
        self.held = [
            held.tensors(b, self.device)
            for b in held.batches(np.arange(len(held.windows)))[: cfg.eval_batches]
        ]
        self.unique_positions = sum(int(s.labelled.sum()) for s in self.train_seqs)
        decay: list[torch.Tensor] = [p for p in self.model.parameters() if p.ndim > 1]
        other: list[torch.Tensor] = [p for p in self.model.parameters() if p.ndim <= 1]
        groups: list[dict[str, Any]] = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": other},
        ]
        self.opt = torch.optim.AdamW(
            groups,
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        self.step, self.epoch, self.cursor, self.seconds, self.positions = 0, 0, 0, 0.0, 0
        self.cpu_seconds = 0.0  # CPU time of training (all threads), for cost per CPU-hour
        self.history: list[dict[str, float]] = []
        self.untrained: EvalResult | None = None
        if resume is not None:
            self.opt.load_state_dict(resume["opt"])
            self.step, self.epoch, self.cursor = resume["step"], resume["epoch"], resume["cursor"]
            self.seconds, self.positions = resume["seconds"], resume["positions"]
            # states saved before CPU time was kept: wall time x threads, what it was at most
            self.cpu_seconds = resume.get(
                "cpu_seconds", self.seconds * (cfg.threads or torch.get_num_threads())
            )
            self.history = resume["history"]
            self.untrained = EvalResult(**resume["untrained"]) if resume["untrained"] else None
            if rejudged:
                self.untrained = None
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, CURVE))
            log(f"resuming at step {self.step} ({self.seconds / 60:.1f} min trained so far)")
            if "n_windows" not in resume:
                log(
                    "this run was started by an older localspec: its held-out set was drawn "
                    "differently, so estimates from here on are not comparable with earlier ones"
                )
                self.untrained = None
            elif resume["n_windows"] != len(self.train_data.windows):
                # the data grew: the pass in progress starts over, covering all of it
                log(f"the data grew to {self.unique_positions} labelled positions")
                self.cursor = 0

    def _load_state(self) -> dict[str, Any] | None:
        if not os.path.isfile(self.state_path):
            return None
        st = read_run_state(self.state_path, self.info, "resume from")
        mine = {k: v for k, v in asdict(self.cfg).items() if k in RESUME_KEYS}
        theirs = {k: v for k, v in st["config"].items() if k in RESUME_KEYS}
        if mine != theirs or tuple(st["taps"]) != self.taps:
            raise LocalspecError(
                f"{self.state_path} was trained with other settings {theirs} (taps "
                f"{list(st['taps'])}); use another output folder or the same settings"
            )
        return st

    def _build_model(self, resume: dict[str, Any] | None) -> Any:
        try:
            model = build_drafter(self.info, self.cfg, self.draft_ids, resume, self.train_seqs[:32])
        except RuntimeError as exc:  # saved weights of another shape than the config says
            source = self.state_path if os.path.isfile(self.state_path) else self.cfg.init_from
            raise LocalspecError(f"cannot load the drafter of {source}: {exc}") from None
        return model.to(self.device)

    def _build_average(self, resume: dict[str, Any] | None) -> WeightAverage | None:
        kept = (resume or {}).get(EMA_KEY)
        if not self.cfg.ema:
            if kept is not None:
                self.log(
                    f"{self.state_path} kept an average of its weights; with --ema 0 it is "
                    "dropped, and estimates and the checkpoint are the last step's weights"
                )
            return None
        try:
            return WeightAverage(self.model, self.cfg.ema, kept)
        except (RuntimeError, KeyError, TypeError) as exc:  # an average of another shape
            raise LocalspecError(
                f"cannot load the weight average of {self.state_path}: {exc}"
            ) from None

    def _lr(self) -> float:
        return self.cfg.lr * min(1.0, (self.step + 1) / max(self.cfg.warmup, 1))

    def save(self) -> None:
        _save_state(
            self.state_path,
            {
                "model": self.model.state_dict(),
                "opt": self.opt.state_dict(),
                "config": asdict(self.cfg),
                "taps": list(self.taps),
                "target": target_identity(self.info.path),
                "draft_ids": self.draft_ids,
                "step": self.step,
                "epoch": self.epoch,
                "cursor": self.cursor,
                "seconds": self.seconds,
                "cpu_seconds": self.cpu_seconds,
                "positions": self.positions,
                "parent_positions": self.parent_positions,
                "n_windows": len(self.train_data.windows),
                "history": self.history,
                "untrained": asdict(self.untrained) if self.untrained else None,
                **({EMA_KEY: self.average.state()} if self.average is not None else {}),
            },
        )

    @property
    def drafter(self) -> Any:
        """The weights estimated and exported: the average where the run keeps one."""
        return self.average.model if self.average is not None else self.model

    def export(self) -> str:
        meta = {
            "trained_by": "localspec train",
            "variant": self.cfg.variant,
            "steps": self.step,
            "positions": self.positions,
            "train_seconds": round(self.seconds, 1),
            "init_from": self.cfg.init_from,
            "parent_positions": self.parent_positions,
            "target": os.path.basename(self.info.path),
            "taps_layer_inputs": list(self.taps),
            # the rows it attends over in training: the runtime's drafter attends over as many
            "window": self.cfg.window,
        }
        if self.average is not None:
            meta["ema"] = {"decay": self.cfg.ema, "updates": self.average.updates}
        return export_checkpoint(self.drafter, self.folder, self.taps, self.draft_ids, meta)

    def export_speculators(self) -> str:
        """DIR/speculators: the same drafter for vLLM (written when a run ends: it carries
        the target's embeddings, too large to rewrite every few minutes)."""
        from .speculators_format import export_speculators

        if not self.cfg.verifier:
            self.log(
                f"{self.folder}/speculators names no verifier: pass --verifier (the Hugging "
                "Face model the GGUF target was made from) to serve it with vLLM as it is"
            )
        return export_speculators(
            self.drafter,
            self.folder,
            self.taps,
            self.draft_ids,
            verifier=self.cfg.verifier,
            draft_steps=self.cfg.steps_unrolled,
            architecture=N.GGUFHeader(self.info.path).architecture or "",
        )

    def _autocast(self) -> Any:
        """bf16 matmuls (1.7x faster per step on this project's AVX512-BF16 CPU) with float32
        master weights, or nothing."""
        import torch

        kind = torch.device(self.device).type
        return torch.autocast(kind, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def evaluate(self) -> EvalResult:
        with self._autocast():
            return evaluate(self.drafter, self.held, self.cfg.steps_unrolled, self.cfg.loss)

    def _record_curve(self, ev: EvalResult, epoch: float) -> None:
        """One point of the learning curve: DIR/curve.jsonl, a line per held-out estimate."""
        point = {
            "step": self.step,
            "positions": self.positions,
            "unique_positions": self.unique_positions,
            "epoch": round(epoch, 4),
            "seconds": round(self.seconds, 1),
            "cpu_seconds": round(self.cpu_seconds, 1),
            **{k: None if isinstance(v, float) and v != v else v for k, v in asdict(ev).items()},
        }
        with open(os.path.join(self.folder, CURVE), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(point) + "\n")

    def _last_curve_step(self) -> int | None:
        try:
            with open(os.path.join(self.folder, CURVE), encoding="utf-8") as fh:
                lines = [line for line in fh if line.strip()]
        except FileNotFoundError:
            return None
        try:
            return int(json.loads(lines[-1])["step"]) if lines else None
        except (ValueError, KeyError, TypeError):  # a line cut short by a hard kill
            return None

    def run(self, progress: Callable[[dict[str, float]], None] | None = None) -> TrainResult:
        import torch

        cfg = self.cfg
        if self.untrained is None:
            self.untrained = self.evaluate()
            self._record_curve(self.untrained, 0.0)
            self.log(
                f"{'at start' if cfg.init_from else 'untrained'}: held-out loss "
                f"{self.untrained.loss:.3f}, tau(k={cfg.steps_unrolled})"
                f" {self.untrained.tau:.2f} (walked {self.untrained.tau_walk:.2f}), draft-vocab"
                f" coverage {self.untrained.coverage:.1%}"
            )
        t_start = time.perf_counter()
        t_saved = t_start
        base_seconds = self.seconds
        c_start, base_cpu = time.process_time(), self.cpu_seconds
        first_loss: float | None = None
        last_loss: float | None = None
        order = np.random.default_rng(cfg.seed + self.epoch).permutation(
            len(self.train_data.windows)
        )
        batches = self.train_data.batches(order)
        interrupted = False
        try:
            while True:
                epoch = self.epoch + self.cursor / max(len(batches), 1)
                if cfg.max_steps is not None and self.step >= cfg.max_steps:
                    break
                if cfg.time_budget is not None and time.perf_counter() - t_start >= cfg.time_budget:
                    break
                if cfg.max_epochs is not None and epoch >= cfg.max_epochs:
                    break
                if self.cursor >= len(batches):
                    self.epoch += 1
                    self.cursor = 0
                    order = np.random.default_rng(cfg.seed + self.epoch).permutation(
                        len(self.train_data.windows)
                    )
                    batches = self.train_data.batches(order)
                batch = self.train_data.tensors(batches[self.cursor], self.device)
                for g in self.opt.param_groups:
                    g["lr"] = self._lr()
                with self._autocast():
                    loss, correct, counted = step_losses(
                        self.model, batch, cfg.steps_unrolled, cfg.loss
                    )
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)
                self.opt.step()
                if self.average is not None:
                    self.average.update()
                self.step += 1
                self.cursor += 1
                self.positions += int(counted[0].sum())
                last_loss = float(loss.detach())
                if first_loss is None:
                    first_loss = last_loss
                self.seconds = base_seconds + time.perf_counter() - t_start
                self.cpu_seconds = base_cpu + time.process_time() - c_start
                epoch = self.epoch + self.cursor / max(len(batches), 1)
                rec = {
                    "step": self.step,
                    "loss": last_loss,
                    "acc0": float(correct[0].sum()) / max(int(counted[0].sum()), 1),
                    "seconds": self.seconds,
                    "positions": self.positions,
                    "epoch": epoch,
                }
                if self.step % cfg.eval_every == 0:
                    ev = self.evaluate()
                    rec.update(held_loss=ev.loss, held_tau=ev.tau, held_acc0=ev.acc[0])
                    rec["held_acc"] = ev.acc  # type: ignore[assignment]
                    self.history.append(rec)
                    self._record_curve(ev, epoch)
                if progress is not None:
                    progress(rec)
                if time.perf_counter() - t_saved >= cfg.save_every:
                    self.save()
                    self.export()
                    t_saved = time.perf_counter()
        except KeyboardInterrupt:  # Ctrl-C or kill (the CLI turns SIGTERM into this)
            interrupted = True
            raise
        finally:  # an interrupted run keeps what it learned
            self.save()
            ckpt = self.export()
            try:
                self.export_speculators()
            except (OSError, LocalspecError) as exc:  # the run and DIR/checkpoint stand
                self.log(f"could not write {self.folder}/speculators: {exc}")
            if interrupted:
                self.log(
                    f"interrupted at step {self.step} ({self.positions} positions seen): "
                    f"saved {self.state_path} and {ckpt}; the same command resumes"
                )
        final = self.evaluate()
        if self.step != self._last_curve_step():  # the run's end is a point of its curve too
            self._record_curve(final, self.epoch + self.cursor / max(len(batches), 1))
        return TrainResult(
            folder=self.folder,
            checkpoint=ckpt,
            steps=self.step,
            seconds=self.seconds,
            positions=self.positions,
            first_loss=first_loss,
            last_loss=last_loss,
            untrained=self.untrained,
            final=final,
            history=self.history,
        )


# settings that must not change when a run resumes
RESUME_KEYS = ("variant", "draft_vocab", "init", "window", "prompt_context", "held_out", "seed")
TOP_LAYER_TENSORS = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
