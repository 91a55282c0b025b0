#!/usr/bin/env python3
"""A training run's drafter judged on other feature folders, the way the run judges its own
held-out set: τ of an exact chain at k = its unrolled steps, agreement per draft step, and τ
of rows before/after the short/long position marks. Make a folder from any prompts with
`localspec train TARGET --data PROMPTS --max-steps 0 -o DIR` (the target's greedy replies),
then pass DIR/data. docs/train.md used it to compare the held-out set with MT-Bench:

    python scripts/held-out-on.py runs/curve/eagle3.1-kl/state.pt runs/diag/mtbench-feat/data
"""

from __future__ import annotations

import argparse
import sys

from localspec.discovery import default_target
from localspec.errors import LocalspecError
from localspec.training.trainer import estimate_on


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state", help="the run's DIR/state.pt")
    ap.add_argument("folders", nargs="+", help="feature folders (a run's DIR/data)")
    ap.add_argument("--target", help="target GGUF (default: SmolLM2-135M-Instruct)")
    args = ap.parse_args()
    try:
        target = args.target or default_target()
        for folder in args.folders:
            ev = estimate_on(target, args.state, folder)
            agree = " ".join(f"{100 * a:.1f}%" for a in ev.acc)
            print(f"{folder}: tau {ev.tau:.3f}, agreement per step {agree}, "
                  f"short {ev.tau_short:.3f}, long {ev.tau_long:.3f}, "
                  f"draft-vocab coverage {ev.coverage:.1%}")  # fmt: skip
    except LocalspecError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
