"""The settings of a training run, the results it reports, and the rules that check them and
carry them across a resume."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidParameterError, LocalspecError
from .features import (
    DataReport,
    target_identity,
)
from .targets import TargetInfo

VARIANTS = ("eagle3.1", "eagle3")
LOSSES = ("kl", "lk")  # kl: cross-entropy against the target's top labels; lk: LK-hybrid,
# blending that with the acceptance rate itself as the drafter starts to agree
CURVE = "curve.jsonl"
INITS = ("target", "target-layer", "random")
STATE = "state.pt"
CHECKPOINT = "checkpoint"
# the long/short split of held-out rows, by position in their sequence
SHORT, LONG = 256, 512


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


def _same_path(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    return os.path.realpath(a) == os.path.realpath(b)


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


# settings that must not change when a run resumes
RESUME_KEYS = ("variant", "draft_vocab", "init", "window", "prompt_context", "held_out", "seed")
