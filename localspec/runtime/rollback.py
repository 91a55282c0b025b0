"""Cutting a hybrid target's recurrent state back after rejected drafts.

Attention layers keep a cache that can be cut at any position; recurrent layers (gated delta
nets, short convolutions, Mamba-2) keep one state that each token overwrites. The llama.cpp
that localspec runs keeps, per sequence, `n_rs_seq` per-token snapshots of that state on the
architectures in `ROLLBACK_ARCHS` (llm_arch_supports_rs_rollback), so a verify batch whose last
tokens were rejected can be cut back with one `seq_rm`, as an attention cache is.

Its rules, each seen to abort the process, fail or silently corrupt the state (notes 19), and
kept here and in Target.keep before llama.cpp sees a call:
- a context's n_ubatch must exceed n_rs_seq + 1 (an abort at the first decode otherwise);
- one cut back after a decode, of at most min(n_rs_seq, the decode's tokens - 1) tokens: a
  second cut before the next decode, or a longer one, fails or leaves a wrong state. A cut the
  snapshots cannot serve rebuilds the state from the history instead (clear and prefill).

Other recurrent architectures (mamba, mamba2, jamba, falcon-h1, granite hybrids, rwkv, qwen3next
...) keep no snapshots. For them a draft's verify starts from a checkpoint: a copy of the
sequence's recurrent state (llama_state_seq_get_data_ext, its recurrent part only) taken before
the verify decode; when drafts are rejected the checkpoint is put back, the verify's attention
cells are removed, and the accepted tokens are decoded again (a replay). It costs a copy of the
state every drafting step and a replay after each rejection: auto prices both as they are
measured (the copy inside the verify, the replay in the step's bookkeeping), so it drafts only
where that pays; fixed drafts always run it.

The snapshots cost memory: each recurrent layer keeps, per snapshot, its convolution state
(n_embd_r) and its recurrent state (n_embd_s) in f32, as llama.cpp's hparams size them. At most
`MEMORY_SHARE` of the model's weights go to them; drafts never run longer than the snapshots
kept (the scheduler's budget is capped at n_rs_seq).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLLBACK_ARCHS = frozenset(
    {
        "qwen35", "qwen35moe", "qwen4exp", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
        "deepseek4", "glm5-next", "kimi-k3", "bailingmoe3",
    }
)  # fmt: skip
# the rollback archs whose state size localspec computes from the header (the others run plain)
_DELTA_NET = frozenset({"qwen35", "qwen35moe", "qwen4exp"})
_SHORT_CONV = frozenset({"lfm2", "lfm2moe"})
_MAMBA2 = frozenset({"nemotron_h", "nemotron_h_moe"})
_MAMBA = frozenset({"mamba", "mamba2"})  # every layer recurrent; llama.cpp keeps no snapshots
SIZED_ARCHS = _DELTA_NET | _SHORT_CONV | _MAMBA2 | _MAMBA

DEFAULT_RS_SEQ = 16  # snapshots kept: the longest draft a hybrid target verifies
CHECKPOINT_DRAFT = 16  # the longest draft verified from a checkpoint (replays stay short)
MEMORY_SHARE = 0.10  # of the model's weights, the most the snapshots may take
# draft trees on a recurrent state: one sequence per branch, each with a state of its own
MAX_BRANCHES = 8
F32 = 4


def size_text(n: float) -> str:
    """Bytes as a person reads them."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class Rollback:
    """How a target's recurrent state is cut back: n_rs_seq snapshots of row_bytes each (0: it
    cannot be, and why)."""

    n_rs_seq: int
    row_bytes: int  # one snapshot of every recurrent layer's state
    why_not: str = ""  # when n_rs_seq is 0 and no checkpoint is taken: why (notes, `info`)
    lowered: str = ""  # when fewer than DEFAULT_RS_SEQ: why
    checkpoint: bool = False  # no snapshots: a checkpoint before each verify, a replay after

    @property
    def memory(self) -> int:
        """Bytes the snapshots take (beside the state itself)."""
        return self.n_rs_seq * self.row_bytes

    @property
    def max_draft(self) -> int:
        """The longest draft the target verifies and cuts back (0: none)."""
        return CHECKPOINT_DRAFT if self.checkpoint else self.n_rs_seq


def _per_layer(value: Any, n_layer: int) -> list[int] | None:
    if isinstance(value, int):
        return [value] * n_layer
    if isinstance(value, (list, tuple)) and len(value) >= n_layer:
        return [int(v) for v in value[:n_layer]]
    return None


def recurrent_row_bytes(arch: str, key: Any, n_embd: int) -> int | None:
    """One snapshot of every recurrent layer's state, in bytes, from the header (key: the
    header's arch_key); None for an architecture or header localspec cannot size."""
    n_block = key("block_count")
    if not isinstance(n_block, int) or n_block < 1 or n_embd < 1:
        return None
    nextn = key("nextn_predict_layers")
    n_layer = n_block - (nextn if isinstance(nextn, int) and 0 <= nextn < n_block else 0)
    if arch in _SHORT_CONV:
        l_cache, kv = key("shortconv.l_cache"), _per_layer(key("attention.head_count_kv"), n_layer)
        if not isinstance(l_cache, int) or l_cache < 1 or kv is None:
            return None
        recurrent = sum(1 for h in kv if h == 0)
        return recurrent * n_embd * (l_cache - 1) * F32
    d_conv, d_inner = key("ssm.conv_kernel"), key("ssm.inner_size")
    d_state, n_group = key("ssm.state_size"), key("ssm.group_count")
    if arch == "mamba" and n_group is None:
        n_group = 0  # Mamba-1 has no groups
    if not all(isinstance(v, int) and v >= 0 for v in (d_conv, d_inner, d_state, n_group)):
        return None
    if arch in _DELTA_NET:
        interval = key("full_attention_interval")
        if interval is None:
            interval = 4  # llama.cpp's default when the key is absent
        if not isinstance(interval, int) or interval < 1:
            return None
        recurrent = sum(1 for il in range(n_layer) if (il + 1) % interval != 0)
    elif arch in _MAMBA2:
        kv = _per_layer(key("attention.head_count_kv"), n_layer)
        ff = _per_layer(key("feed_forward_length"), n_layer)
        if kv is None or ff is None:
            return None
        recurrent = sum(1 for h, f in zip(kv, ff, strict=True) if h == 0 and f == 0)
    elif arch in _MAMBA:
        recurrent = n_layer
    else:
        return None
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return recurrent * (conv + d_state * d_inner) * F32


def plan_rollback(
    arch: str, key: Any, *, n_embd: int, n_batch: int, weights_bytes: int
) -> Rollback:
    """The snapshots a target of this architecture keeps: DEFAULT_RS_SEQ, fewer where n_batch
    or the memory share allows fewer; a checkpoint before each verify instead where the
    architecture keeps none, none fits, or localspec cannot size them."""
    row = recurrent_row_bytes(arch, key, n_embd)
    if arch not in ROLLBACK_ARCHS:
        # llama.cpp keeps no snapshots of their state: checkpoints and replays instead
        return Rollback(0, row or 0, checkpoint=True)
    if row is None:  # snapshots localspec cannot size: a checkpoint needs no size
        return Rollback(
            0, 0, lowered=f"{arch}: snapshots localspec cannot size yet", checkpoint=True
        )
    n, lowered = DEFAULT_RS_SEQ, ""
    if n_batch - 2 < n:
        n, lowered = max(n_batch - 2, 0), f"n_batch {n_batch} leaves room for {n_batch - 2}"
    if row > 0 and n * row > MEMORY_SHARE * weights_bytes:
        fit = int(MEMORY_SHARE * weights_bytes // row)
        if fit < n:
            n = fit
            lowered = (
                f"{fit} snapshots of {size_text(row)} fit in {MEMORY_SHARE:.0%} of the "
                f"weights ({size_text(weights_bytes)})"
            )
    if n < 1:  # one checkpoint (a copy of the state) still fits
        return Rollback(0, row, lowered=f"no snapshot fits ({lowered})", checkpoint=True)
    return Rollback(n, row, lowered=lowered)


def tree_branches(plan: Rollback, weights_bytes: int, n_batch: int = 512) -> tuple[int, str]:
    """The branches a draft tree may have on a recurrent target (0: chains only, and why).

    Attention caches share a tree's common prefix between its leaves; a recurrent state is one
    per sequence, so each branch is verified in a sequence of its own holding its whole path
    (Target.verify_tree), and the cells of branches rejected before the accepted one are parked
    in one more sequence (which holds a state too). Each of those states takes 1 + n_rs_seq
    rows; together with the history's snapshots they stay within MEMORY_SHARE of the weights.
    A decode holds two rows of every branch, and llama.cpp at most n_batch sequences."""
    if not plan.n_rs_seq and not plan.checkpoint:
        return 0, plan.why_not or "its recurrent state cannot be cut back"
    if plan.row_bytes <= 0:
        return 0, "draft trees need a recurrent state per branch, which localspec cannot size"
    if min(n_batch // 2, n_batch - 2) < 2:
        return 0, f"n_batch {n_batch} holds no two branches"
    per = (1 + plan.n_rs_seq) * plan.row_bytes
    fit = int((MEMORY_SHARE * weights_bytes - plan.memory) // per) - 1  # less the parked cells'
    fit = min(fit, n_batch // 2, n_batch - 2)
    if fit < 2:
        return 0, (
            f"draft trees need a recurrent state per branch ({size_text(per)} each): fewer than "
            f"2 fit in {MEMORY_SHARE:.0%} of the weights ({size_text(weights_bytes)})"
            + (" beside the snapshots" if plan.n_rs_seq else "")
        )
    return min(MAX_BRANCHES, fit), ""


class RollbackGuard:
    """Tracks, for one context, what llama.cpp can cut back now: after a decode of `batch`
    tokens, one cut of at most min(n_rs_seq, batch - 1) tokens."""

    def __init__(self, n_rs_seq: int) -> None:
        self.n_rs_seq = n_rs_seq
        self._last = 0  # tokens of the last decode (0: none since a cut or a clear)
        # a cut is applied at the sequence's next decode: until then its state lies in a
        # snapshot that a copy of the sequence (seq_cp) would not read
        self.pending = False

    def decoded(self, n_tokens: int) -> None:
        self._last = n_tokens
        self.pending = False

    def reset(self) -> None:
        self._last = 0
        self.pending = False

    def can_cut(self, back: int) -> bool:
        return 0 < back <= min(self.n_rs_seq, self._last - 1)

    def cut(self) -> None:
        self._last = 0  # a second cut must wait for the next decode
        self.pending = True


# --- what the snapshots cost each step ----------------------------------------------------------

# Auto keeps snapshots only where they cost a plain step at most this share: they are paid on
# every decode, drafted or not, while a checkpoint costs only the steps that draft (a copy of
# the state, and a replay after rejections), which auto's cost model sees and prices.
SNAPSHOT_TAX = 0.02
TAX_CONTEXT = 32  # tokens decoded before the timed steps
TAX_BLOCK = 4  # one-token decodes per timed block
TAX_ROUNDS = (3, 41)  # rounds of blocks: at least, at most
TAX_BUDGET_S = 1.0  # no further round once the timing took this long (after the least)
# the rounds' plain-step ratios agree when their interquartile range is within this: on the
# tiny test hybrids a quiet machine's read 0.08-0.16 and one core busy 0.63-4.3
# (docs/bench/hybrid-3/snapshot-spread.txt)
TAX_AGREE = 0.25
TAX_FORMAT = 1  # the stored timings' format (the method's: bumped when it changes)


@dataclass(frozen=True)
class SnapshotTax:
    """What keeping n_rs_seq snapshots costs, measured here: a one-token decode (a plain step)
    and a verify of n_rs_seq + 1 rows, with snapshots against without, as ratios minus one
    (medians of interleaved rounds)."""

    n_rs_seq: int
    step: float
    verify: float
    rounds: int
    spread: float = 0.0  # the rounds' plain-step ratios: interquartile range

    @property
    def settled(self) -> bool:
        """The rounds agree (their middle half within TAX_AGREE): a figure worth storing where
        it cannot be told whether other programs took the cores meanwhile."""
        return self.spread <= TAX_AGREE

    def text(self) -> str:
        return (
            f"{self.n_rs_seq} snapshots cost a plain step {self.step:+.1%} and a verify of "
            f"{self.n_rs_seq + 1} tokens {self.verify:+.1%} (measured here)"
        )


def measure_snapshot_tax(
    model: Any, n_rs_seq: int, *, n_threads: int, kv_type: str, flash_attn: bool | None
) -> SnapshotTax:
    """Time one-token decodes and verifies of n_rs_seq + 1 rows in two short contexts of the
    model, one keeping n_rs_seq snapshots and one none, interleaved (the order alternates each
    round, so a burst of other work falls on both); a few rounds, bounded in time. Each decode
    is timed up to its logits (on a GPU the decode returns before the device is done)."""
    from statistics import median
    from time import perf_counter

    from .. import native as N

    n_batch = max(n_rs_seq + 2, TAX_BLOCK + 1)
    n_ctx = TAX_CONTEXT + (n_rs_seq + 2) + TAX_ROUNDS[1] * (TAX_BLOCK + n_rs_seq + 1)
    ctxs: list[Any] = []
    try:
        for n in (0, n_rs_seq):
            ctxs.append(
                N.NativeContext(
                    model,
                    n_ctx=n_ctx,
                    n_batch=n_batch,
                    n_threads=n_threads,
                    kv_type=kv_type,
                    flash_attn=flash_attn,
                    n_rs_seq=n,
                )
            )
        batch = N.Batch(n_batch)
        ids = [(7 + 13 * i) % model.n_vocab for i in range(n_ctx)]
        pos = [0, 0]

        def decode(c: int, rows: int) -> float:
            """rows tokens in one decode (every row's logits, as a verify, when several)."""
            batch.token[:rows] = ids[pos[c] : pos[c] + rows]
            batch.set(rows, pos[c], all_logits=rows > 1)
            t0 = perf_counter()
            ctxs[c].decode(batch, "snapshot cost timing")
            ctxs[c].logits(rows if rows > 1 else 1)  # waits for the device
            pos[c] += rows
            return perf_counter() - t0

        for c in (0, 1):  # the context, and a warm-up of both sizes
            for a in range(0, TAX_CONTEXT, n_batch):
                decode(c, min(n_batch, TAX_CONTEXT - a))
            decode(c, 1)
            decode(c, n_rs_seq + 1)
        steps: list[float] = []
        verifies: list[float] = []
        start = perf_counter()
        r = 0
        while r < TAX_ROUNDS[1] and (r < TAX_ROUNDS[0] or perf_counter() - start < TAX_BUDGET_S):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            t = {c: sum(decode(c, 1) for _ in range(TAX_BLOCK)) for c in order}
            v = {c: decode(c, n_rs_seq + 1) for c in order}
            steps.append(t[1] / t[0])
            verifies.append(v[1] / v[0])
            r += 1
    finally:
        for ctx in ctxs:
            ctx.close()
    q1, _, q3 = _quartiles(steps)
    return SnapshotTax(n_rs_seq, median(steps) - 1.0, median(verifies) - 1.0, r, q3 - q1)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    from statistics import quantiles

    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = quantiles(xs, n=4)
    return q[0], q[1], q[2]


def with_checkpoints(plan: Rollback, tax: SnapshotTax) -> Rollback:
    """Auto's choice: the snapshots planned, or a checkpoint per drafting step where the
    snapshots would cost every plain step more than SNAPSHOT_TAX."""
    if plan.n_rs_seq < 1 or tax.step <= SNAPSHOT_TAX:
        return plan
    return Rollback(
        0,
        plan.row_bytes,
        lowered=f"{tax.text()}: above {SNAPSHOT_TAX:.0%}, so each draft is verified from a "
        "checkpoint instead",
        checkpoint=True,
    )
