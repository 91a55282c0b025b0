"""GPU benchmark on targets of a real model's shape, made on the spot (nothing to download):
what speculation gains where verifying k tokens costs about what one does.

The target has Qwen2.5-1.5B's shape (1536 wide, 28 layers, 12/2 heads, FFN 8960) as llama
Q4_K_M with zero weights, so a decode costs what the real model's does while its output is
known: it counts letters (tests/helpers/tinymodels.write_agreeing_pair). Two drafters bound what a
real drafter gives: one that always agrees (acceptance 1) and a random one (never accepted).
In one run, with every layer on the GPU:

1. one-token decode cost: no taps, the staging API, the graph callback (taps on and off: with
   them off the callback is removed, so plain steps should cost what no taps cost);
2. the verify-cost curve t(k)/t(1) with taps on;
3. what a 10-deep chain costs against 10 bare drafter decodes (the loop's own share);
4. tokens/s of plain decoding, chains, a tree and auto (EAGLE drafts only, and with the n-gram
   source too), interleaved in rotated rounds (median per setting), with each output checked
   against plain decoding's, and the drafter's native and host time per draft position.

    CMAKE_ARGS="-DGGML_CUDA=on" pip install llama-cpp-python==0.3.36   # or -DGGML_METAL=on
    python benchmarks/bench_gpu.py [--tokens 256] [--rounds 3] [--json OUT.json]

--shape qwen3.5-27b-mtp runs a hybrid target with an agreeing MTP head instead
(hybrid_shape.py: about 15 GiB of Q4_K zeros written first; hybrid-small is its dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))

from bench_graph_taps import GRAPH_OFF, decode_costs, show_switch, switch_costs  # noqa: E402
from hybrid_shape import SHAPES as HYBRID_SHAPES  # noqa: E402
from hybrid_shape import run as run_hybrid  # noqa: E402

import localspec  # noqa: E402
from localspec import native as N  # noqa: E402
from localspec.auto import costmodel as cm  # noqa: E402
from localspec.lowlevel import draft_costs, hold, parts, verify_curve  # noqa: E402
from localspec.runtime.taps import GRAPH, STAGING  # noqa: E402
from localspec.speculation.tree import TreeShape  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402

SHAPES = {
    "qwen2.5-1.5b": tm.TargetShape(
        n_embd=1536, n_layer=28, n_head=12, n_head_kv=2, n_ff=8960, n_ctx=8192
    ),
    "llama-3.1-8b": tm.TargetShape(
        n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, n_ctx=8192
    ),
    "small": tm.TargetShape(n_embd=512, n_layer=4, n_head=8, n_head_kv=2, n_ff=1024),  # a dry run
}
Q4_K_M = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
EAGLE_ONLY = {"draft_source": "eagle"}  # the drafter under test alone
SETTINGS: list[tuple[str, dict]] = [
    ("plain", {"n_draft": 0}),
    ("chain 1", {"n_draft": 1, **EAGLE_ONLY}),
    ("chain 4", {"n_draft": 4, **EAGLE_ONLY}),
    ("chain 10", {"n_draft": 10, **EAGLE_ONLY}),
    ("chain 16", {"n_draft": 16, **EAGLE_ONLY}),  # the deepest auto planned before (runs 2-4)
    # as deep as auto plans now (costmodel.MAX_DEPTH): whether that pays (agreeing drafter only)
    ("chain 24", {"n_draft": 24, **EAGLE_ONLY}),
    ("chain 32", {"n_draft": 32, **EAGLE_ONLY}),
    ("tree 4,2,8", {"tree": (4, 2, 8), **EAGLE_ONLY}),
    ("auto", {**EAGLE_ONLY}),
    # the target counts letters, which the n-gram index predicts as well as a drafter could
    ("auto + n-gram", {"draft_source": "auto"}),
]


def make_models(folder: str, shape: tm.TargetShape) -> tuple[str, str, str]:
    """(Q4_K_M target, agreeing drafter, random drafter)."""
    t0 = time.perf_counter()
    f32, agree = tm.write_agreeing_pair(folder, shape=shape, name="shaped")
    target = os.path.join(folder, "shaped.q4_k_m.gguf")
    N.quantize_model(f32, target, Q4_K_M, os.cpu_count() or 4)
    os.unlink(f32)
    rand = tm.random_drafter_for(target, os.path.join(folder, "random.eagle3.gguf"))
    print(f"models made in {time.perf_counter() - t0:.0f} s: target "
          f"{os.path.getsize(target) / 2**20:.0f} MiB, agreeing drafter "
          f"{os.path.getsize(agree) / 2**20:.1f} MiB, random drafter "
          f"{os.path.getsize(rand) / 2**20:.1f} MiB", flush=True)  # fmt: skip
    return target, agree, rand


NO_DRAFTER = "plain, no drafter"  # an engine loaded with draft=False: the true baseline
AGREEING_ONLY = {"chain 24", "chain 32"}  # with a drafter never accepted they only cost time


def speeds(
    target: str, draft: str, tokens: int, rounds: int, gpu_layers: int, settings: list
) -> dict:
    """tokens/s per setting (median of rounds, settings rotated each round) and whether each
    output equals plain decoding's. NO_DRAFTER runs on a second engine without a drafter."""
    prompt = "abcdefgh"
    out: dict[str, dict] = {name: {"tps": [], "same": True} for name, _ in settings}
    opts = {"n_gpu_layers": gpu_layers, "n_ctx": 4096}
    with (
        localspec.load(target, draft=draft, **opts) as eng,
        localspec.load(target, draft=False, **opts) as bare,
    ):
        for e in (eng, bare):
            e.complete(prompt, max_tokens=8)  # warm-up (and auto's calibration)
        plain = eng.complete(prompt, max_tokens=tokens, n_draft=0).tokens
        for r in range(rounds):
            order = settings[r % len(settings) :] + settings[: r % len(settings)]
            for name, kw in order:
                e = bare if name == NO_DRAFTER else eng
                e.reset()
                before = searches(e)
                c = e.complete(prompt, max_tokens=tokens, **kw)
                out[name]["tps"].append(c.stats.tokens_per_s)
                out[name]["same"] &= c.tokens == plain
                out[name]["tau"] = c.stats.tau
                out[name]["shapes"] = c.stats.shape_summary()
                out[name]["draft_ms_per_position"] = {
                    "native": c.stats.draft_native_ms,
                    "host": c.stats.draft_host_ms,
                }
                st = c.stats
                if name.startswith("auto"):
                    out[name].setdefault("model", []).append(auto_view(e, st.steps, before))
                out[name]["ms_per_step"] = {
                    k: 1e3 * v / max(st.steps, 1)
                    for k, v in (
                        ("target", st.t_target),
                        ("draft", st.t_draft),
                        ("glue", st.t_glue),
                    )
                }
                # each round's own (the columns above are the last round's)
                out[name].setdefault("rounds", []).append(
                    {"ms_per_step": out[name]["ms_per_step"], "shapes": out[name]["shapes"]}
                )
    for v in out.values():
        v["median"] = statistics.median(v["tps"])
        # paired: each round's ratio to plain decoding in the same round (rounds minutes apart
        # drift by several per cent on a shared machine; settings of one round do not)
        v["paired"] = statistics.median(
            a / b for a, b in zip(v["tps"], out["plain"]["tps"], strict=True)
        )
    return out


def searches(eng: localspec.Engine) -> tuple[int, float]:
    """(searches auto's cost model ran so far, their seconds): the engine keeps one model
    across calls and settings."""
    cost = parts(eng).scheduler.cost
    return (cost.searches, cost.search_s) if cost is not None else (0, 0.0)


def auto_view(eng: localspec.Engine, steps: int, before: tuple[int, float]) -> dict:
    """What auto's cost model believes after a call, to tell why it chose its depth: t(n) near
    the deepest chain (measured or interpolated), the drafting costs, first-position
    acceptance and each deep chain's predicted tokens/s; and the call's searches (host time
    per step that a fixed chain does not pay)."""
    cost = parts(eng).scheduler.cost
    if cost is None:
        return {}
    top = cm.MAX_DEPTH + 1
    n_search, s_search = (a - b for a, b in zip(searches(eng), before, strict=True))
    return {
        "steps": steps,
        "searches": n_search,
        "search_ms_each": 1e3 * s_search / max(n_search, 1),
        "t1_ms": 1e3 * cost.verify(1),
        "verify_ms": {n: 1e3 * cost.verify(n) for n in range(top - 4, top + 2)},
        "measured": [n for n in range(top - 4, top + 2) if n in cost.verify.ratio],
        "expand_ms": {k: 1e3 * v.value for k, v in cost.expand.items()},
        "flush_ms": 1e3 * cost.flush.value,
        "glue_ms": {k: 1e3 * v.value for k, v in cost.glue.items()},
        "first_accept": float(cost.acceptance.probabilities()[0, 0]),
        "chain_tps": {
            d: cost.predict(TreeShape(d, 1, d)).tokens_per_s
            for d in range(cm.MAX_DEPTH - 3, cm.MAX_DEPTH + 1)
        },
    }


def verify_in_a_loop(eng: localspec.Engine, rows: int = 17, reps: int = 10) -> dict[str, float]:
    """Median wall ms of a target decode of `rows` rows with logits for all, as a chain that
    is always accepted makes them: each after the last (taps read back, taps off: nothing
    read), and with 16 bare drafter decodes between (as a step drafts). Against the verify
    curve's t(rows), which follows a 64-token decode each time, it tells what the decodes
    around a verify cost it (a graph built again, the device shared). The context grows from
    64 to about 270 tokens here; the curve's stays at 64."""
    out: dict[str, float] = {}
    with hold(eng) as p:
        target, d = p.target, p.drafter
        assert d is not None
        hi = min(1000, target.n_vocab)
        rng = np.random.default_rng(0)
        one = N.Batch(1, tokens=True, embd=d.n_embd)
        for label, taps, between in (
            ("taps on", True, 0),
            ("taps off", False, 0),
            ("taps on, 16 drafter decodes between", True, 16),
        ):
            target.set_taps_active(taps)
            target.keep(0)
            target.decode([int(t) for t in rng.integers(0, hi, 64)], all_logits=False)
            times = []
            for _ in range(reps + 2):  # the first two warm up
                d.ctx.clear()
                for j in range(between):
                    one.token[0] = int(rng.integers(0, hi))
                    one.set(1, j, all_logits=True)
                    d.ctx.decode(one, "drafter decoder")
                    d.ctx.outputs(0, d.n_embd)
                t0 = time.perf_counter()
                target.decode([int(t) for t in rng.integers(0, hi, rows)], all_logits=True)
                if taps:
                    target.read_taps(rows)
                times.append(time.perf_counter() - t0)
            out[label] = 1e3 * statistics.median(times[2:])
    return out


def gpu_memory_mib() -> int | None:
    """Device memory in use (nvidia-smi), or None where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out.stdout.split()[0])


def drafter_memory(target: str, draft: str, gpu_layers: int) -> tuple[int, int] | None:
    """(MiB the target engine alone holds, MiB more with the drafter: its weights, its KV
    cache, the target's extra sequences and buffers), or None without nvidia-smi."""
    base = gpu_memory_mib()
    if base is None:
        return None
    used = []
    for d in (False, draft):
        with localspec.load(target, draft=d, n_gpu_layers=gpu_layers, n_ctx=4096) as eng:
            eng.complete("abc", max_tokens=4)
            used.append(gpu_memory_mib() or 0)
    return used[0] - base, used[1] - used[0]


def show_speeds(title: str, res: dict) -> None:
    base = res["plain"]["median"]
    print(f"\n{title}")
    print(f"  {'setting':<18} {'tok/s':>8} {'x plain':>8} {'paired':>7} {'tau':>6}  same as plain  "
          "draft ms/pos native+host  ms/step target/draft/glue  shapes run")  # fmt: skip
    for name, v in res.items():
        pos = v.get("draft_ms_per_position") or {}
        cost = f"{pos['native']:.3f}+{pos['host']:.3f}" if pos.get("native") else "-"
        print(f"  {name:<18} {v['median']:8.1f} {v['median'] / base:8.2f} {v['paired']:7.3f}"
              f" {v.get('tau', 1.0):6.2f}"
              f"  {'yes' if v['same'] else 'NO':<13}  {cost:<24}  "
              f"{'/'.join(f'{x:.2f}' for x in v['ms_per_step'].values()):<25}  "
              f"{v['shapes']}")  # fmt: skip
    for name, v in res.items():
        for i, m in enumerate(v.get("model", [])):
            if not m:
                continue
            t = " ".join(f"{n}{'' if n in m['measured'] else '~'}:{x:.2f}"
                         for n, x in m["verify_ms"].items())  # fmt: skip
            tps = " ".join(f"{d}:{x:.0f}" for d, x in m["chain_tps"].items())
            print(f"  {name} model after round {i + 1}: {m['searches']} searches in its "
                  f"{m['steps']} steps ({m['search_ms_each']:.2f} ms each); "
                  f"t(n) ms {t} (~ interpolated); expand {m['expand_ms']} flush "
                  f"{m['flush_ms']:.2f} glue {m['glue_ms']}; first accepted "
                  f"{m['first_accept']:.2f}; chain tok/s {tps}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-layers", "-ngl", type=int, default=-1)
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES) + sorted(HYBRID_SHAPES),
        default="qwen2.5-1.5b",
        help="a llama shape with EAGLE drafters, or a qwen35 hybrid with an MTP head "
        "(hybrid_shape.py: the snapshots' cost, MTP chains and auto)",
    )
    ap.add_argument("--drafters", default="agreeing,random", help="which drafters to run")
    ap.add_argument(
        "--only-plain-auto", action="store_true", help="plain, auto and no drafter only"
    )
    ap.add_argument("--settings", nargs="+", help="these speed settings only (their names)")
    ap.add_argument(
        "--speeds-only", action="store_true", help="skip the decode, switch and curve costs"
    )
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()
    known = [n for n, _ in SETTINGS] + [NO_DRAFTER]
    unknown = sorted(set(args.settings or ()) - set(known))
    if unknown:
        ap.error(f"unknown settings {unknown}; the settings are {known}")
    if set(args.drafters.split(",")) - {"agreeing", "random"}:
        ap.error("--drafters takes agreeing, random or both")
    if args.gpu_layers != 0 and not N.gpu_offload_supported():
        sys.exit("this llama-cpp-python has no GPU backend (build it with CMAKE_ARGS, above)")
    if args.shape in HYBRID_SHAPES:
        with tempfile.TemporaryDirectory() as d:
            hybrid = run_hybrid(args.shape, tokens=args.tokens, rounds=args.rounds,
                                gpu_layers=args.gpu_layers, folder=d)  # fmt: skip
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(hybrid, fh, indent=1)
        return
    report: dict = {"shape": args.shape, "gpu_layers": args.gpu_layers}
    with tempfile.TemporaryDirectory() as d:
        target, agree, rand = make_models(d, SHAPES[args.shape])
        if not args.speeds_only:
            cost_sections(report, target, agree, rand, args)
        settings = SETTINGS + [(NO_DRAFTER, {"n_draft": 0})]
        if args.only_plain_auto:
            settings = [(n, kw) for n, kw in settings if n in ("plain", "auto", NO_DRAFTER)]
        if args.settings:  # plain always: the other rows are read against it
            settings = [(n, kw) for n, kw in settings if n in {"plain", *args.settings}]
        drafters = {"agreeing": agree, "random": rand}
        for name in args.drafters.split(","):
            label = f"{name} drafter"
            run = [(n, kw) for n, kw in settings if name == "agreeing" or n not in AGREEING_ONLY]
            res = speeds(target, drafters[name], args.tokens, args.rounds, args.gpu_layers,
                         run)  # fmt: skip
            show_speeds(f"{label}: {args.tokens} greedy tokens, {args.rounds} rounds", res)
            report[label] = res
            if args.json:  # after each drafter: a run cut short keeps what it measured
                with open(args.json, "w", encoding="utf-8") as fh:
                    json.dump(report, fh, indent=1)


def cost_sections(
    report: dict, target: str, agree: str, rand: str, args: argparse.Namespace
) -> None:
    """Decode costs per tap route, the callback switch, the verify curve, the chain-10 cost
    and the drafter's memory, printed and added to the report."""
    costs = decode_costs(target, [None, STAGING, GRAPH, GRAPH_OFF], (0, 1, 2), 4, 5,
                         gpu_layers=args.gpu_layers)  # fmt: skip
    base = costs[None]
    print("\none-token decode after 128 tokens (median)")
    for route, c in costs.items():
        print(f"  {route or 'no taps':<16} {1e3 * c:7.3f} ms  x{c / base:.3f}")
    report["decode_ms"] = {str(k): 1e3 * v for k, v in costs.items()}
    n_layer = SHAPES[args.shape].n_layer
    sw = switch_costs(target, (1, n_layer // 2, n_layer - 1), 4, gpu_layers=args.gpu_layers)
    show_switch(args.shape, sw)
    report["callback_switch"] = sw
    with localspec.load(target, draft=agree, n_gpu_layers=args.gpu_layers) as eng:
        curve = verify_curve(eng, [1, 2, 3, 4, 5, 6, 8, 12, 16, 17, 24, 32, 33], taps=True)
        bare, chain = draft_costs(eng, 10, reps=30)
        in_loop = verify_in_a_loop(eng)
    t1 = curve[1]
    print("\nverify cost t(k)/t(1), taps on: "
          + "  ".join(f"{k}: {t / t1:.2f}" for k, t in curve.items()))  # fmt: skip
    report["verify_ratio"] = {k: t / t1 for k, t in curve.items()}
    print(f"\na 10-deep chain: {1e3 * chain:.3f} ms against 10 bare drafter decodes "
          f"{10e3 * bare:.3f} ms: x{chain / (10 * bare):.2f}")  # fmt: skip
    report["chain10_ms"] = {"chain": 1e3 * chain, "bare_decode": 1e3 * bare}
    print(f"\n17-row verify: {1e3 * curve[17]:.3f} ms after a 64-token decode (the curve); "
          + "; ".join(f"{k}: {v:.3f} ms" for k, v in in_loop.items()))  # fmt: skip
    report["verify17_ms"] = {"curve": 1e3 * curve[17], **in_loop}
    mem = drafter_memory(target, rand, args.gpu_layers)
    if mem is not None:
        print(f"\ndevice memory: target engine {mem[0]} MiB, the random drafter adds "
              f"{mem[1]} MiB ({mem[1] / max(mem[0], 1):.1%})")  # fmt: skip
        report["memory_mib"] = {"target": mem[0], "drafter_adds": mem[1]}


if __name__ == "__main__":
    main()
