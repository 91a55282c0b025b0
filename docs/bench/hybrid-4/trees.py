"""Draft trees on hybrid targets (Target.verify_tree: one sequence per branch), measured on
this CPU beside the chains they compete with.

Part 1, per target file: the verify decode alone, as medians of ROUNDS interleaved rounds, in
milliseconds: a plain step (1 row), a chain of DEPTH drafts (DEPTH + 1 rows in the history's
sequence), and a tree of BRANCHES branches DEPTH deep (BRANCHES x (DEPTH + 1) rows, one
sequence each, forked from the history), with what the commit adds: the snapshots' cut
(snapshots) or the accepted path decoded again (checkpoint), where the accepted path stops
one token short of the leaf.

Part 2, the MTP head of an agreeing tiny qwen35 (its drafts are nearly all accepted): plain,
a fixed chain and fixed trees end to end, interleaved, ROUNDS rounds, tokens per second
(medians), and what auto chose here.

    python docs/bench/hybrid-4/trees.py ROUNDS OUT_DIR
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

import localspec  # noqa: E402
from localspec.options import RuntimeOptions  # noqa: E402
from localspec.runtime import rollback as rb  # noqa: E402
from localspec.runtime.target import Target  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402

DEPTH, BRANCHES = 4, 4
RT = {"kv_type": "f16", "flash_attn": None, "n_threads": 2, "n_ctx": 2048}


def _tree(depth: int, branches: int) -> tuple[list[int], list[int], list[int]]:
    """branches disjoint paths of depth tokens under the root: tokens, depths, parents."""
    tokens, depths, parents = [], [], []
    for b in range(branches):
        parent = -1
        for d in range(1, depth + 1):
            tokens.append(10 + b * depth + d)
            depths.append(d)
            parents.append(parent)
            parent = len(tokens) - 1
    return tokens, depths, parents


def verify_costs(path: str, mode: str, rounds: int) -> dict[str, float]:
    t = Target(
        path,
        RuntimeOptions(**RT),
        tree_nodes=62,
        rollback="checkpoint" if mode == "checkpoint" else True,
    )
    try:
        assert t.branches >= BRANCHES, t.tree_note
        t.prefill(list(range(5, 69)))
        tokens, depths, parents = _tree(DEPTH, BRANCHES)
        first_path = list(range(DEPTH - 1))  # accepted: one token short of the first leaf
        times: dict[str, list[float]] = {"plain": [], "chain": [], "tree": [], "commit": []}
        for r in range(rounds):
            order = ["plain", "chain", "tree"]
            order = order[r % 3 :] + order[: r % 3]
            for kind in order:
                n0 = t.n
                t0 = time.perf_counter()
                if kind == "plain":
                    t.decode([7], all_logits=False)
                    times[kind].append(time.perf_counter() - t0)
                elif kind == "chain":
                    t.decode([7, *tokens[:DEPTH]], all_logits=True)
                    times[kind].append(time.perf_counter() - t0)
                    t.keep(n0 + DEPTH)  # the last draft rejected
                else:
                    t.verify_tree(7, tokens, depths, parents)
                    t1 = time.perf_counter()
                    t.commit_tree(7, first_path, tokens)
                    times[kind].append(t1 - t0)
                    times["commit"].append(time.perf_counter() - t1)
            if t.n > 1900:
                t.keep(64)
        return {k: statistics.median(v) * 1e3 for k, v in times.items()}
    finally:
        t.close()


def end_to_end(path: str, rounds: int) -> tuple[dict[str, float], dict[str, str]]:
    prompts = ["the cat sat on the mat; the dog", "a b c d e f g", "once upon a time"]
    kinds = {
        "plain": {"n_draft": 0},
        "chain 3": {"n_draft": 3},
        "tree 3x2/5": {"tree": (3, 2, 5)},
        "tree 4x3/8": {"tree": (4, 3, 8)},
        "auto": {},
    }
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    chose: dict[str, str] = {}
    with localspec.load(path, draft_source="mtp", rollback="checkpoint", **RT) as eng:
        eng.complete("warm up", max_tokens=8)
        for r in range(rounds):
            names = list(kinds)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                for p in prompts:
                    t0 = time.perf_counter()
                    c = eng.complete(p, max_tokens=96, **kinds[name])
                    dt = time.perf_counter() - t0
                    rates[name].append(len(c.tokens) / dt)
                    if name == "auto":
                        chose[p] = eng.last_stats.shape_summary()
    return {k: statistics.median(v) for k, v in rates.items()}, chose


def main(rounds: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rb.MEMORY_SHARE = 4.0  # the tiny files' weights leave no room for a branch otherwise
    files = {
        "qwen35": tm.write_qwen35_target(str(out / "qwen35.gguf"), cycle=8),
        "lfm2": tm.write_lfm2_target(str(out / "lfm2.gguf"), cycle=8),
    }
    print(f"part 1: verify decodes, ms (medians of {rounds} interleaved rounds), no GPU")
    print(f"chain: {DEPTH + 1} rows; tree: {BRANCHES} branches x {DEPTH + 1} rows")
    for arch, path in files.items():
        for mode in ("snapshots", "checkpoint"):
            c = verify_costs(path, mode, rounds)
            print(
                f"{arch:7s} {mode:10s} plain {c['plain']:.3f}  chain {c['chain']:.3f} "
                f"({c['chain'] / c['plain']:.2f}x)  tree {c['tree']:.3f} "
                f"({c['tree'] / c['plain']:.2f}x)  tree commit {c['commit']:.3f}"
            )
    agree = tm.write_qwen35_target(str(out / "agree.gguf"), mtp=True, cycle=8)
    rates, chose = end_to_end(agree, rounds)
    print(f"part 2: tiny qwen35 + its agreeing MTP head, tokens/s (medians, {rounds} rounds)")
    for k, v in rates.items():
        print(f"{k:11s} {v:8.1f}  ({v / rates['plain']:.2f}x plain)")
    for p, why in chose.items():
        print(f"auto on {p!r}: {why}")
    print("numpy", np.__version__)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
