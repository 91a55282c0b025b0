#!/usr/bin/env python3
"""A training run's drafter judged on other feature folders, the way the run judges its own
held-out set: τ of an exact chain at k = its unrolled steps, agreement per draft step, and τ
of rows before/after the short/long position marks, and tau and acceptance per position with
chains walked through each reply as decoding walks them (what `localspec bench` measures;
--walk-tokens N stops each reply at N tokens, as bench's --max-tokens does). Make a folder
from any prompts with `localspec train TARGET --data PROMPTS --max-steps 0 -o DIR` (the
target's greedy replies), then pass DIR/data. docs/train.md used it to compare the held-out
set with MT-Bench:

    python scripts/held-out-on.py runs/curve/eagle3.1-kl/state.pt runs/diag/mtbench-feat/data
"""

from __future__ import annotations

import argparse
import sys

from localspec.errors import LocalspecError
from localspec.files.discovery import default_target
from localspec.training.evaluation import estimate_on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state", help="the run's DIR/state.pt")
    ap.add_argument("folders", nargs="+", help="feature folders (a run's DIR/data)")
    ap.add_argument("--target", help="target GGUF (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--walk-tokens", type=int, help="walk only each reply's first N tokens")
    ap.add_argument(
        "--attention-window",
        type=int,
        metavar="N",
        help="each row attends over its last N rows, as `--draft-window N` runs the drafter "
        "(0: all rows)",
    )
    args = ap.parse_args()
    if args.walk_tokens is not None and args.walk_tokens < 2:
        ap.error("--walk-tokens must be at least 2 (the target makes the first token alone)")
    if args.attention_window is not None and args.attention_window < 0:
        ap.error("--attention-window must be 0 (all rows) or more")
    try:
        target = args.target or default_target()
        for folder in args.folders:
            span = args.attention_window or None
            ev = estimate_on(target, args.state, folder, args.walk_tokens, span)
            agree = " ".join(f"{100 * a:.1f}%" for a in ev.acc)
            walked = " ".join(f"{100 * a:.1f}%" for a in ev.accept_walk)
            print(f"{folder}: tau {ev.tau:.3f}, agreement per step {agree}, "
                  f"short {ev.tau_short:.3f}, long {ev.tau_long:.3f}, "
                  f"draft-vocab coverage {ev.coverage:.1%}; walked: tau {ev.tau_walk:.3f}, "
                  f"acceptance per position {walked}")  # fmt: skip
    except LocalspecError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
