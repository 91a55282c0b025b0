"""`localspec convert`: an EAGLE-3/3.1 checkpoint to a GGUF drafter."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import (
    parse_taps,
    require_torch,
)


def add_parser(sub: Any) -> None:
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


def cmd_convert(args: argparse.Namespace) -> int:
    require_torch("convert")
    from ..converters.convert import convert

    taps = parse_taps(args.taps)
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
