"""`localspec train`: train a drafter for a GGUF target (resumable)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import (
    add_runtime_args,
    parse_duration,
    parse_taps,
    raise_interrupt,
    require_torch,
)


def add_parser(sub: Any) -> None:
    tr = sub.add_parser(
        "train",
        help="train an EAGLE-3.1 drafter for a GGUF target (resumable)",
        description="Runs the target over the data to make features (its own replies by "
        "default), trains a drafter, and writes DIR/checkpoint in SpecForge's layout for "
        "`localspec convert`. Re-running with the same DIR resumes.",
    )
    tr.add_argument("target", nargs="?", help="target GGUF (default: SmolLM2-135M-Instruct)")
    tr.add_argument(
        "--data",
        nargs="+",
        required=True,
        help="chat JSON/JSONL (ShareGPT or OpenAI shape), .txt/.md files, or the named sets "
        "sharegpt, mtbench, humaneval",
    )
    tr.add_argument("-o", "--output", required=True, help="run folder (data, state, checkpoint)")
    tr.add_argument(
        "--variant", default="eagle3.1", choices=["eagle3.1", "eagle3"], help="drafter variant"
    )
    tr.add_argument("--draft-vocab", type=int, default=16384, help="draft vocabulary size")
    tr.add_argument("--ttt-steps", type=int, default=5, help="draft steps unrolled in training")
    tr.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    tr.add_argument(
        "--time-budget", default=None, help="stop training after this long: 900, 15m, 2h"
    )
    tr.add_argument(
        "--epochs", type=float, default=None, help="stop after this many passes over the data"
    )
    tr.add_argument(
        "--loss",
        default="kl",
        choices=["kl", "lk"],
        help="kl: cross-entropy against the target's labels (default); lk: LK-hybrid, which "
        "moves to the acceptance rate itself as the drafter starts to agree",
    )
    tr.add_argument(
        "--eval-data",
        help="estimate acceptance on this feature folder (another run's DIR or DIR/data, "
        "e.g. the target's own replies to prompts kept out of training) instead of 3%% of "
        "the training data",
    )
    tr.add_argument("--eval-every", type=int, default=100, help="steps between estimates")
    tr.add_argument(
        "--eval-batches", type=int, default=8, help="held-out batches per estimate (default 8)"
    )
    tr.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="bf16: bfloat16 matmuls, float32 weights; auto (default): bf16 where the "
        "hardware has it (CUDA, CPUs with AVX512-BF16 or AMX), else fp32",
    )
    tr.add_argument(
        "--verifier",
        help="the Hugging Face model the target GGUF was made from (e.g. "
        "HuggingFaceTB/SmolLM2-135M-Instruct), recorded in DIR/speculators for vLLM",
    )
    tr.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    tr.add_argument(
        "--ema",
        type=float,
        default=None,
        metavar="DECAY",
        help="keep an exponential moving average of the weights (decay per step, warmed up "
        "as min(DECAY, (1+n)/(10+n)); 0.998: about the last 500 steps once past ~4,500), "
        "estimate and export it instead of the last step's weights (0: off, the default for "
        "a new run; a resumed run keeps its own unless given)",
    )
    tr.add_argument("--batch-tokens", type=int, default=2048, help="positions per step")
    tr.add_argument("--window", type=int, default=512, help="positions per training window")
    tr.add_argument(
        "--prompt-context",
        type=int,
        default=64,
        help="prompt positions a reply's first window keeps before its first trained one "
        "(at most --window - 2 are): raise both to train for long conversations",
    )
    tr.add_argument(
        "--init",
        default="target",
        choices=["target", "target-layer", "random"],
        help="start from the target's head (default), also its top layer, or noise",
    )
    tr.add_argument(
        "--init-from",
        metavar="RUN",
        help="start from the drafter of another run (its folder or state.pt) or a drafter "
        "GGUF (the shipped one, say) and go on training it on this run's data: the same "
        "target, taps and variant",
    )
    tr.add_argument("--taps", help="three comma-separated layer ids (default 2, L/2, L-3)")
    tr.add_argument("--max-tokens", type=int, default=400_000, help="positions of data to make")
    tr.add_argument("--max-new", type=int, default=256, help="tokens per generated reply")
    tr.add_argument("--max-prompt", type=int, default=512, help="skip longer prompts")
    tr.add_argument("--parallel", type=int, default=16, help="sequences generated together")
    tr.add_argument(
        "--no-generate",
        action="store_true",
        help="train on the data's own replies instead of the target's",
    )
    tr.add_argument("--gen-temperature", type=float, default=0.0, help="0 = greedy replies")
    tr.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    add_runtime_args(tr)
    tr.add_argument("--seed", type=int, default=0, help="seed of data order and init")
    tr.add_argument("--gguf", help="also convert the result to this GGUF file")
    tr.add_argument("--outtype", default="q8_0", help="GGUF type with --gguf (default q8_0)")
    tr.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    import signal

    require_torch("train")

    from ..files.discovery import default_target
    from ..training import FeatureConfig, TrainConfig, data_folder, train

    # `kill` (and Ctrl-C, even in a background job) stops a run with its state saved
    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGINT, raise_interrupt)

    target = args.target or default_target()
    taps = parse_taps(args.taps)
    cfg = TrainConfig(
        variant=args.variant,
        draft_vocab=args.draft_vocab,
        steps_unrolled=args.ttt_steps,
        window=args.window,
        prompt_context=args.prompt_context,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        ema=args.ema,
        max_steps=args.max_steps,
        time_budget=parse_duration(args.time_budget) if args.time_budget else None,
        init=args.init,
        init_from=args.init_from,
        seed=args.seed,
        device=args.device,
        threads=args.threads or 0,
        max_epochs=args.epochs,
        loss=args.loss,
        eval_data=data_folder(args.eval_data) if args.eval_data else None,
        eval_every=args.eval_every,
        eval_batches=args.eval_batches,
        verifier=args.verifier,
        precision=args.precision,
    )
    fcfg = FeatureConfig(
        taps=(),
        generate=not args.no_generate,
        temperature=args.gen_temperature,
        max_prompt=args.max_prompt,
        max_new=args.max_new,
        max_tokens=args.max_tokens,
        n_parallel=args.parallel,
        seed=args.seed,
    )
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    res = train(
        target,
        args.data,
        args.output,
        config=cfg,
        features=fcfg,
        taps=taps,
        n_threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        log=log,
    )
    f, u = res.final, res.untrained
    log(
        f"trained {res.steps} steps ({res.seconds / 60:.1f} min, {res.positions} positions); "
        f"held-out tau(k={cfg.steps_unrolled}) {f.tau:.2f}"
        + (f" ({'at start' if args.init_from else 'untrained'} {u.tau:.2f})" if u else "")
        + f", walked as decoding meets it {f.tau_walk:.2f}"
        + (f" ({u.tau_walk:.2f})" if u and u.tau_walk == u.tau_walk else "")  # NaN: saved before
        + ", agreement per step "
        + " ".join(f"{a:.0%}" for a in f.acc)
        + f", draft-vocab coverage {f.coverage:.1%}"
    )
    log(f"checkpoint: {res.checkpoint}")
    if args.gguf:
        from ..converters.convert import convert

        convert(res.checkpoint, target, args.gguf, outtype=args.outtype, force=True, log=log)
    else:
        log(f"next: localspec convert {res.checkpoint} --target {target}")
    return 0
