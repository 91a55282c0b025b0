"""`localspec chat`: the terminal chat, after checking what can be checked before it starts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from ..errors import LocalspecError
from .common import (
    SEED_HELP,
    SESSION_CACHE_SIZE,
    add_basic_sampler_args,
    add_model_args,
    add_overflow_arg,
    check_max_tokens_flag,
    engine_config,
    parse_size,
    target_arg,
)


def add_parser(sub: Any) -> None:
    chat = sub.add_parser("chat", help="terminal chat that shows speculation live")
    add_model_args(chat)
    chat.add_argument("--system", default="", help="system prompt")
    add_basic_sampler_args(chat)
    chat.add_argument("--max-tokens", "-n", type=int, default=512, help="tokens per reply (>= 1)")
    chat.add_argument("--seed", type=int, default=None, help=SEED_HELP)
    add_overflow_arg(chat)
    chat.add_argument(
        "--session-cache-size",
        metavar="SIZE",
        default=SESSION_CACHE_SIZE,
        help="disk space for the saved KV caches of conversations, so that reopening one "
        f"skips its prefill: e.g. 500M, 4G; 0 saves none (default {SESSION_CACHE_SIZE})",
    )
    chat.set_defaults(func=cmd_chat)


def stdin_is_terminal() -> bool:
    """Whether standard input is a terminal (tests of the app without one replace this)."""
    return sys.stdin is not None and sys.stdin.isatty()


def cmd_chat(args: argparse.Namespace) -> int:
    from .. import SamplingParams

    # check what can be checked before the full-screen app starts: one clear line on error
    cache_bytes = parse_size(args.session_cache_size)
    cfg = engine_config(args)
    cfg = replace(cfg, target=target_arg(args)).checked()  # the files, as load() checks them
    SamplingParams(
        0.0 if args.temperature is None else args.temperature,
        args.top_k or 0,
        1.0 if args.top_p is None else args.top_p,
    )
    check_max_tokens_flag(args)
    if not stdin_is_terminal():
        # the app reads keys from a terminal; without one it would wait forever
        print(
            "localspec: error: localspec chat needs a terminal: standard input is not a TTY; "
            "use `localspec generate` for piped input",
            file=sys.stderr,
        )
        return 2
    from ..tui.app import ChatOptions, LocalspecApp
    from ..tui.store import ChatStore

    opts = ChatOptions(
        config=cfg,
        system=args.system,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        context_overflow=args.context_overflow,
        session_cache_bytes=cache_bytes,
    )
    app = LocalspecApp(opts, store=ChatStore())
    app.run()
    for note in app.exit_notes:  # said in the app too; repeated once it has left the screen
        print(f"localspec: {note}", file=sys.stderr)
    if app.load_error:
        raise LocalspecError(app.load_error)
    return 0
