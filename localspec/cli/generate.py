"""`localspec generate` (alias `run`): one prompt, its text on stdout and, asked, statistics."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from ..errors import LocalspecError
from ..rules import draft_mode
from .common import (
    add_model_args,
    add_sampling_args,
    calibrate_first,
    check_max_tokens_flag,
    engine_config,
    sampler_kwargs,
    say_mode_notes,
    target_arg,
)


def add_parser(sub: Any) -> None:
    gen = sub.add_parser("generate", aliases=["run"], help="generate text from a prompt")
    add_model_args(gen)
    add_sampling_args(gen)
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


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise LocalspecError("give a prompt with --prompt/-p or on standard input")
        prompt = sys.stdin.read()
    cfg = engine_config(args)
    check_max_tokens_flag(args)
    cfg = replace(cfg, target=target_arg(args)).checked()
    tree, source = cfg.tree, cfg.draft_source
    with cfg.load() as eng:
        # what was asked for and cannot be done, named by the flags typed (before anything
        # runs: a request no engine can run is refused in them too)
        say_mode_notes(eng, args, tree, source)
        calibrate_first(eng)
        # the model's recommended sampling, the flags given in its place
        sampling = eng.sampling_with(**sampler_kwargs(args))
        for note in eng.sampling_notes.values():
            print(f"localspec: note: {note}", file=sys.stderr)
        kw = dict(max_tokens=args.max_tokens, seed=args.seed, stop=args.stop, sampling=sampling)
        if args.chat:
            msgs = [{"role": "system", "content": args.system}] if args.system else []
            events = eng.chat_stream([*msgs, {"role": "user", "content": prompt}], **kw)
        else:
            events = eng.complete_stream(prompt, **kw)
        # the engine's own notes, less its mode's (said above in flags)
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
