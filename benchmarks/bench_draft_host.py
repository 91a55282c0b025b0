"""Where an EAGLE draft position's time goes: llama.cpp's decode against the host work around it.

`localspec bench` reports one host-time column (Python, copies, numpy per draft position). This
splits it: every drafter call on the draft path is timed (self time: its timed callees are
subtracted), over real greedy generations with the real drafter, and printed per EAGLE draft
position, for a chain and a tree side by side (interleaved rounds, medians). llama.cpp's KV
sequence calls (seq_rm, seq_cp, seq_drop) run native code but are not decodes, so bench counts
them as host time; they are listed on their own here.

    python benchmarks/bench_draft_host.py [--target T.gguf --draft D.gguf] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import localspec
from localspec import native as N
from localspec.files.discovery import default_target
from localspec.native import model as native_model
from localspec.runtime.drafter import Drafter
from localspec.speculation import drafttree
from localspec.speculation.sources import eagle as eagle_source

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten year old.",
    "List five tips for learning a new programming language, with one sentence each.",
]
# what bench counts as native (the context's busy clock): the decodes and the output-address
# calls, where llama.cpp waits for the device
NATIVE = {
    "NativeContext.decode",
    "NativeContext.encode",
    "native.model._logits_ith_addr",
    "native.model._nextn_ith_addr",
    "native.model._nextn_addr",
    "native.model._logits_addr",
}


class Clock:
    """Self time per timed call made within a scope call (the drafter's flush and the draft:
    the target's own decodes go through the same native wrapper): each call's wall time less
    that of the timed calls it made."""

    def __init__(self, scopes: set[str]) -> None:
        self.scopes = scopes
        self.self_s: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []  # per open call: time spent in its timed callees

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._stack and name not in self.scopes:
                return fn(*args, **kwargs)
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - t0
                inner = self._stack.pop()
                self.self_s[name] += total - inner
                if self._stack:
                    self._stack[-1] += total

        return timed

    def reset(self) -> None:
        self.self_s.clear()


def instrument(clock: Clock) -> None:
    """Time the draft path's calls in place (classes and module functions)."""
    targets: list[tuple[Any, str]] = [
        (Drafter, n)
        for n in (
            "flush",
            "encode",
            "decode",
            "chain_start",
            "chain_next",
            "draft_logits",
            "draft_token",
            "best_token",
            "feedback",
            "rewind",
            "branch",
            "drop_branches",
            "decode_frontier",
            "draft_ids",
        )
    ]
    calls = ("decode", "encode", "outputs", "one_output", "nextn", "logits")
    targets += [(N.NativeContext, n) for n in calls]
    targets += [(N.NativeContext, n) for n in ("seq_rm", "seq_cp", "seq_drop")]
    targets += [(eagle_source.EagleSource, "draft"), (drafttree.DraftTree, "add")]
    targets += [(eagle_source, "_top"), (eagle_source, "_best_k"), (eagle_source, "_best_chain")]
    targets += [(N.Batch, "set"), (N.Batch, "set_rows")]
    # the output-address bindings, where the context reads them
    targets += [(native_model, n.removeprefix("native.model.")) for n in NATIVE if "._" in n]
    for owner, name in targets:
        label = f"{getattr(owner, '__name__', owner)}.{name}".replace("localspec.", "")
        setattr(owner, name, clock.wrap(label, getattr(owner, name)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tree", default="4,2,8", help="depth,top_k,budget")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    target = args.target or default_target()
    clock = Clock({"Drafter.flush", "EagleSource.draft"})
    instrument(clock)
    shapes: dict[str, dict[str, Any]] = {
        f"chain {args.k}": {"n_draft": args.k},
        f"tree {args.tree}": {"tree": args.tree},
    }
    with localspec.load(target, draft=args.draft, n_threads=args.threads, n_ctx=4096) as eng:
        if eng.draft_path is None:
            print("no drafter: pass --draft D.gguf", file=sys.stderr)
            return 2
        print(f"target: {target}\ndrafter: {eng.drafter_note}")
        print(
            f"{len(PROMPTS)} prompts x {args.rounds} rounds, {args.max_tokens} tokens, greedy, "
            f"threads {eng.n_threads}, EAGLE drafts only (no auto)"
        )
        prompts = [eng.format_chat([{"role": "user", "content": p}])[0] for p in PROMPTS]
        # per shape: per round, ms per draft position of each call, and of host in all
        per: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in shapes}
        positions: dict[str, int] = defaultdict(int)
        kw = {"parse_special": True, "add_special": False, "draft_source": "eagle"}
        eng.complete(prompts[0], max_tokens=16, **kw)  # warm-up
        for _ in range(args.rounds):
            for name, shape in shapes.items():  # interleaved: both see the same machine state
                clock.reset()
                n_pos = 0
                for p in prompts:
                    c = eng.complete(p, max_tokens=args.max_tokens, **shape, **kw)
                    n_pos += c.stats.eagle_positions
                positions[name] += n_pos
                row = per[name]
                host = 0.0
                for call, s in clock.self_s.items():
                    row[call].append(1e3 * s / n_pos)
                    host += 0.0 if call in NATIVE else s
                row["host in all"].append(1e3 * host / n_pos)
        calls = sorted({c for row in per.values() for c in row if c != "host in all"})
        names = list(shapes)
        print(
            f"\nms per EAGLE draft position, median of {args.rounds} rounds (self time; each"
            " row is its own median, so rows need not add up to 'host in all', and a timed"
            " call's wrapper adds about a microsecond to its caller's row)"
        )
        print(f"{'call':<36}" + "".join(f"{n:>16}" for n in names))
        for call in [*sorted(NATIVE), "host in all", *[c for c in calls if c not in NATIVE]]:
            cells = []
            for n in names:
                v = per[n].get(call)
                cells.append(f"{statistics.median(v):16.4f}" if v else f"{'-':>16}")
            print(f"{call:<36}" + "".join(cells))
        print("positions: " + ", ".join(f"{n} {positions[n]}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
