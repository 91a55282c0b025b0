"""Plot learning curves of `localspec train` runs (their DIR/curve.jsonl) to one PNG, and print
them as a table: held-out tau, agreement per draft step, and tau of short (positions < 256)
and long (>= 512) rows, against training positions seen.

    python scripts/plot-learning-curve.py RUN [RUN ...] -o docs/bench/learning-curve.png
"""

from __future__ import annotations

import argparse
import json
import os


def read_curve(run: str) -> list[dict]:
    path = os.path.join(run, "curve.jsonl")
    with open(path, encoding="utf-8") as fh:
        points = [json.loads(line) for line in fh if line.strip()]
    # a resumed run re-evaluates nothing twice, but keep the last point per step anyway
    by_step = {p["step"]: p for p in points}
    return [by_step[s] for s in sorted(by_step)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for run in a.runs:
        pts = read_curve(run)
        name = os.path.basename(os.path.normpath(run))
        x = [p["positions"] / 1e6 for p in pts]
        (line,) = axes[0].plot(x, [p["tau"] for p in pts], marker=".", label=name)
        for j in range(len(pts[-1]["acc"])):
            axes[1].plot(
                x,
                [p["acc"][j] for p in pts],
                color=line.get_color(),
                alpha=1.0 - 0.17 * j,
                label=f"{name} step {j + 1}" if j in (0, len(pts[-1]["acc"]) - 1) else None,
            )
        # None (no held-out row that short or long) leaves a gap in the line
        nan = float("nan")
        short = [nan if p["tau_short"] is None else p["tau_short"] for p in pts]
        long = [nan if p["tau_long"] is None else p["tau_long"] for p in pts]
        axes[2].plot(x, short, color=line.get_color(), ls="--")
        axes[2].plot(x, long, color=line.get_color(), label=name)
        print(f"\n{name}")
        print("positions   epoch   hours  tau    short  long   agreement per draft step")
        for p, s, lg in zip(pts, short, long, strict=True):
            acc = " ".join(f"{v:.0%}" for v in p["acc"])
            print(
                f"{p['positions']:>9}  {p['epoch']:>6.2f}  {p['seconds'] / 3600:5.2f}  "
                f"{p['tau']:.3f}  {s:.3f}  {lg:.3f}  {acc}"
            )
    axes[0].set(title="held-out tau (chain of 5)", xlabel="positions seen (M)", ylabel="tau")
    axes[1].set(title="agreement per draft step", xlabel="positions seen (M)")
    axes[2].set(
        title="tau by position in context\nlong >= 512 (solid), short < 256 (dashed)",
        xlabel="positions seen (M)",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
