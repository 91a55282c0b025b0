"""The `localspec` command: a thin layer over the Python API, one module a command (each holding
its own arguments and what it runs), the shared arguments and rules in ``common``.

Expected failures (LocalspecError) print one line and exit 1; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import InvalidParameterError, LocalspecError
from . import bench, chat, convert, generate, info, serve, train
from .chat import stdin_is_terminal
from .common import (
    DefaultsHelp,
    calibrate_first,
    flag_message,
    install_hint,
    parse_duration,
    parse_size,
    require_torch,
)

__all__ = [
    "DefaultsHelp",
    "LocalspecError",
    "build_parser",
    "calibrate_first",
    "flag_message",
    "install_hint",
    "main",
    "parse_duration",
    "parse_size",
    "require_torch",
    "stdin_is_terminal",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec", description="Lossless EAGLE-3/3.1 speculative decoding for GGUF models."
    )
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (generate, convert, chat, train, bench, serve, info):  # --help's order
        command.add_parser(sub)
    for p in sub.choices.values():  # every subcommand's --help shows its defaults
        p.formatter_class = DefaultsHelp
    return parser


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
