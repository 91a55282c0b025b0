"""The training loop of an EAGLE-3 / EAGLE-3.1 drafter for a GGUF target, resumable across runs
(its settings and their checks: config.py; the device: devices.py; the data and its batches:
data.py; the losses: losses.py; estimates: evaluation.py; the drafter on disk: checkpoints.py).

Layout of the output folder:
- ``data/``: feature shards made by the target (see features.py)
- ``state.pt``: model, optimizer and progress (and the weights' average with --ema), saved
  every few minutes and at the end
- ``checkpoint/``: the drafter in SpecForge's layout (config.json + model.safetensors), which
  ``localspec convert`` turns into a GGUF like any downloaded drafter
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from .. import native as N
from ..errors import InvalidParameterError, LocalspecError
from .averaging import EMA_KEY, WeightAverage
from .checkpoints import _save_state, build_drafter, export_checkpoint, load_parent
from .config import (
    CURVE,
    RESUME_KEYS,
    STATE,
    EvalResult,
    TrainConfig,
    TrainResult,
    _same_path,
    check_config,
    fresh_config,
    read_run_state,
    resumed_config,
)
from .data import Batcher, _hashed_share, check_eval_data, choose_draft_vocab
from .devices import pick_device, pick_precision
from .evaluation import evaluate
from .features import (
    Sequence,
    load_sequences,
    target_identity,
)
from .losses import step_losses
from .targets import target_info


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
        self._split(load_sequences(os.path.join(folder, "data")))
        parent = self._parent(resume)
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
        self.opt = self._optimizer()
        self.step, self.epoch, self.cursor, self.seconds, self.positions = 0, 0, 0, 0.0, 0
        self.cpu_seconds = 0.0  # CPU time of training (all threads), for cost per CPU-hour
        self.history: list[dict[str, float]] = []
        self.untrained: EvalResult | None = None
        if resume is not None:
            self._resume(resume, rejudged)

    def _split(self, seqs: list[Sequence]) -> None:
        """The training and held-out sequences: another folder's (--eval-data), or a share of
        this run's own by a hash of each sequence's name."""
        cfg, folder = self.cfg, self.folder
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

    def _parent(self, resume: dict[str, Any] | None) -> dict[str, Any] | None:
        """The drafter this run starts from when it goes on from another's (None: its own
        state or a new one), and the draft vocabulary either gives (else one chosen)."""
        cfg, log = self.cfg, self.log
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
        return parent

    def _optimizer(self) -> Any:
        """AdamW, weight decay on the matrices only."""
        import torch

        cfg = self.cfg
        decay: list[torch.Tensor] = [p for p in self.model.parameters() if p.ndim > 1]
        other: list[torch.Tensor] = [p for p in self.model.parameters() if p.ndim <= 1]
        groups: list[dict[str, Any]] = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": other},
        ]
        return torch.optim.AdamW(
            groups,
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )

    def _resume(self, resume: dict[str, Any], rejudged: bool) -> None:
        """Progress, optimizer and history from the run's own state file."""
        import torch

        cfg, folder, log = self.cfg, self.folder, self.log
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
