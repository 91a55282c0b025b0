"""`localspec info`: what a GGUF target or drafter is, and whether a pair matches."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import LocalspecError


def add_parser(sub: Any) -> None:
    info = sub.add_parser("info", help="describe a GGUF target or drafter")
    info.add_argument("file", help="a GGUF file")
    info.add_argument("--target", help="also check that this drafter pairs with TARGET.gguf")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    from ..files.fileinfo import check_pairing, describe, format_info

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
