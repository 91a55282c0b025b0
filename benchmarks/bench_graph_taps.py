"""Graph-callback taps benchmark, in one run:

1. What tapping costs per one-token decode on SmolLM2 (llama: both routes exist): no taps, the
   staging API, the graph's eval callback, and the callback with taps off (plain steps once a
   drafter is loaded), interleaved rounds, medians and ratios.
2. Qwen2.5-Coder-1.5B Q4_K_M (qwen2: only the callback exists): the same costs, its verify-cost
   curve t(k)/t(1) with the callback's taps on (as speculation runs it), and what auto decides
   there: the acceptance a chain of k would need to break even, and the shapes auto runs with
   a random drafter (never accepted: auto should settle on plain decoding).

    python benchmarks/bench_graph_taps.py [-t 2] [--rounds 5]
(Qwen2.5-Coder comes from scripts/get-real-targets.py; its part is skipped when absent.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import localspec  # noqa: E402
from localspec import native as N  # noqa: E402
from localspec.files.discovery import default_target  # noqa: E402
from localspec.lowlevel import verify_curve  # noqa: E402
from localspec.options import RuntimeOptions  # noqa: E402
from localspec.runtime.taps import GRAPH, STAGING  # noqa: E402
from localspec.runtime.target import Target  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402

# a callback-tapped target with its taps off (auto asleep, n_draft=0): localspec removes the
# callback then, so this should cost what no taps cost
GRAPH_OFF = "graph, taps off"
TAPS_OF = {"smollm2": (2, 15, 27), "qwen2.5-coder-1.5b": (2, 14, 25)}


def decode_costs(
    path: str, routes: list[str | None], taps: tuple, threads: int, rounds: int, gpu_layers: int = 0
):
    """Median seconds of a one-token decode after a 128-token context, per route (None: no
    taps), in interleaved rounds of 32 decodes each."""
    rt = RuntimeOptions(n_ctx=1024, n_batch=256, n_threads=threads, n_gpu_layers=gpu_layers)
    targets = {}
    for route in routes:
        native = GRAPH if route == GRAPH_OFF else route
        t = Target(path, rt, tap_route=native)
        if native is not None:
            t.enable_taps(taps)
        if route == GRAPH_OFF:
            t.set_taps_active(False)  # how plain decoding runs once a drafter is loaded
        targets[route] = t
    times: dict[str | None, list[float]] = {r: [] for r in routes}
    try:
        for _ in range(rounds):
            for route, t in targets.items():
                t.clear()
                t.decode([(100 + j) % t.n_vocab for j in range(128)], all_logits=False)
                for i in range(32):
                    t0 = time.perf_counter()
                    t.decode([(300 + i) % t.n_vocab], all_logits=False)
                    times[route].append(time.perf_counter() - t0)
    finally:
        for t in targets.values():
            t.close()
    return {r: statistics.median(v) for r, v in times.items()}


def switch_costs(path: str, taps: tuple, threads: int, context: int = 512, gpu_layers: int = 0):
    """What turning the callback taps off (plain steps) and on again costs, by the ways there
    are: (1) removing the callback in place (localspec's way: the next decode rebuilds
    llama.cpp's scheduler), (2) re-creating the context without it and carrying the cache
    over, (3) a second context without it, which costs its own KV cache (bytes at n_ctx).
    Median seconds over 10 tries after a `context`-token prompt."""
    rt = RuntimeOptions(n_ctx=4096, n_batch=256, n_threads=threads, n_gpu_layers=gpu_layers)
    t = Target(path, rt, tap_route=GRAPH)
    try:
        t.enable_taps(taps)
        toks = [(100 + j) % t.n_vocab for j in range(context)]
        t.clear()
        t.prefill(toks)
        steady, flip, recreate = [], [], []
        for i in range(10):
            t0 = time.perf_counter()
            t.decode([7], all_logits=False)
            steady.append(time.perf_counter() - t0)
            t.keep(context)
            t.set_taps_active(i % 2 == 1)  # taps start on: every round switches them
            t0 = time.perf_counter()
            t.decode([7], all_logits=False)
            flip.append(time.perf_counter() - t0 - steady[-1])
            t.keep(context)
            t0 = time.perf_counter()
            state = t.ctx.state_get()
            other = N.NativeContext(t.model, **t._ctx_args)
            other.state_set(state)
            recreate.append(time.perf_counter() - t0)
            other.close()
        kv_per_token = (len(t.ctx.state_get()) - len(_empty_state(t))) / context
        return {
            "steady decode": statistics.median(steady),
            "flip in place": statistics.median(flip),
            "re-create + carry": statistics.median(recreate),
            "second context KV bytes": kv_per_token * t.n_ctx,
        }
    finally:
        t.close()


def _empty_state(t: Target):
    t.keep(0)
    return t.ctx.state_get()


def show_switch(name: str, sw: dict) -> None:
    print(f"\n{name}: switching the callback taps off and on (n_ctx 4096, 512 cached tokens)")
    print(f"  one-token decode              {1e3 * sw['steady decode']:7.2f} ms")
    print(f"  flip in place (one reserve)   {1e3 * sw['flip in place']:7.2f} ms extra, 0 bytes")
    print(f"  re-create context + carry KV  {1e3 * sw['re-create + carry']:7.2f} ms, 0 bytes")
    print(f"  second context without it     {sw['second context KV bytes'] / 2**20:7.1f} MiB of KV")


def show_costs(name: str, costs: dict) -> None:
    base = costs[None]
    print(f"\n{name}: one-token decode after 128 tokens (median)")
    print(f"  no taps          {1e3 * base:7.2f} ms")
    for route in (STAGING, GRAPH, GRAPH_OFF):
        if route in costs:
            c = costs[route]
            print(
                f"  {route:<16} {1e3 * c:7.2f} ms  (+{1e3 * (c - base):.2f} ms, "
                f"x{c / base:.3f} of no taps)"
            )
    if STAGING in costs and GRAPH in costs:
        print(f"  callback / staging: x{costs[GRAPH] / costs[STAGING]:.3f}")


def qwen_auto(path: str, threads: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        draft = tm.random_drafter_for(path, os.path.join(d, "random.eagle3.gguf"))
        with localspec.load(path, draft=draft, n_threads=threads, n_ctx=2048) as eng:
            curve = verify_curve(eng, [1, 2, 3, 4, 5, 6, 8, 12, 16], reps=5, taps=True)
            t1 = curve[1]
            print("\nqwen2.5-coder-1.5b verify cost t(k)/t(1), graph-callback taps on:")
            print("  " + "  ".join(f"k={k}: {t / t1:.2f}" for k, t in curve.items()))
            # a chain of k pays when (1 + expected accepted) / t(k+1) > 1 / t(1); with the same
            # acceptance a at every position, expected accepted = a + a^2 + ... + a^k
            print("  acceptance per position a chain of k needs to break even:")
            needs = []
            for k in (1, 2, 3, 4, 7):
                goal = curve.get(k + 1, curve[max(curve)]) / t1 - 1
                a = next(
                    (
                        x / 100
                        for x in range(1, 101)
                        if sum((x / 100) ** j for j in range(1, k + 1)) >= goal
                    ),
                    None,
                )
                needs.append(f"k={k}: {'never' if a is None else f'{a:.2f}'}")
            print("  " + ", ".join(needs))
            prompt, _ = eng.format_chat([{"role": "user", "content": "Write quicksort in Python."}])
            c = eng.complete(prompt, max_tokens=128, parse_special=True, add_special=False)
            st = c.stats
            print(
                f"  auto with a random drafter: {st.shape_summary()}; {st.tokens_per_s:.1f} tok/s "
                f"(cost model predicted {st.predicted_tokens_per_s:.1f}); calibration "
                f"{st.t_calibrate:.2f} s"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    smol = default_target()
    show_costs(
        "smollm2 (llama)",
        decode_costs(
            smol, [None, STAGING, GRAPH, GRAPH_OFF], TAPS_OF["smollm2"], args.threads, args.rounds
        ),
    )
    show_switch("smollm2 (llama)", switch_costs(smol, TAPS_OF["smollm2"], args.threads))
    from helpers import realmodels  # needs pytest: only here, so bench_gpu runs without it

    qwen = realmodels.real_target_path(realmodels.QWEN25_CODER)
    if qwen is None:
        print("\nqwen2.5-coder-1.5b: absent (python scripts/get-real-targets.py)")
        return
    taps = TAPS_OF["qwen2.5-coder-1.5b"]
    show_costs(
        "qwen2.5-coder-1.5b (qwen2)",
        decode_costs(qwen, [None, GRAPH, GRAPH_OFF], taps, args.threads, args.rounds),
    )
    show_switch("qwen2.5-coder-1.5b (qwen2)", switch_costs(qwen, taps, args.threads))
    qwen_auto(qwen, args.threads)


if __name__ == "__main__":
    main()
