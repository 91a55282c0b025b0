"""`localspec bench`: plain decoding against auto, fixed chains and trees, interleaved."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import LocalspecError
from ..rules import check_source_shape
from .common import (
    TARGET_HELP,
    add_cache_args,
    add_ctx_arg,
    add_runtime_args,
    add_source_arg,
    calibrate_first,
    check_max_tokens_flag,
    engine_options,
    flag_spelling,
    target_arg,
)


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="plain decoding vs auto, fixed chains and trees, interleaved, on prompt sets",
        description="Answers each prompt with plain decoding, auto, every k and every tree "
        "in rotated order, prints a table per prompt set (tokens/s, speedup, tau, acceptance "
        "by position, shapes auto ran) and the target's verify-cost curve, and writes "
        "PREFIX.json and PREFIX.png. Several --draft files are compared side by side: each "
        "speculative setting runs once per drafter on the same loaded target.",
    )
    b.add_argument("target", nargs="?", help=TARGET_HELP)
    b.add_argument(
        "--draft",
        nargs="+",
        metavar="D.gguf",
        help="drafter GGUF, or several to compare side by side (default: the one paired with "
        "the target)",
    )
    b.add_argument(
        "--prompts",
        nargs="+",
        default=["mtbench", "humaneval"],
        help="mtbench, humaneval, long, short, copy (copy-heavy edits), copy-wide (edits of "
        "every length, two-turn edits), or JSONL files "
        "(default: mtbench humaneval)",
    )
    b.add_argument("--k", default="1,2,3,4,5,6,8", help="fixed chain lengths to sweep")
    b.add_argument(
        "--tree",
        nargs="*",
        default=[],
        metavar="D,K,B",
        help="fixed draft-tree shapes to add (depth, top-k, node budget), e.g. 4,2,8",
    )
    add_source_arg(b, bench=True)
    b.add_argument(
        "--no-auto", action="store_true", help="leave out n_draft=auto (the default setting)"
    )
    b.add_argument("--max-tokens", "-n", type=int, default=128, help="tokens per turn")
    b.add_argument("--limit", type=int, default=None, help="first N prompts of each set")
    b.add_argument(
        "--turns",
        type=int,
        default=None,
        metavar="N",
        help="measure only the first N turns of each prompt (MT-Bench has 2; default: all)",
    )
    b.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="answer every prompt N times with every setting, each round in another order",
    )
    b.add_argument(
        "--temperature", "--temp", type=float, default=0.0,
        help="0: greedy, bench's default for measurement (not the model's recommendation, "
        "which generate, chat and serve use); above 0: that temperature alone",
    )  # fmt: skip
    b.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature)")
    b.add_argument("--out", default="localspec-bench", help="write OUT.json and OUT.png")
    b.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N other processes spinning on the CPU while measuring (speculation and auto "
        "on a machine that is busy with something else)",
    )
    add_runtime_args(b)
    add_ctx_arg(b)
    add_cache_args(b)
    b.set_defaults(func=cmd_bench)


def _is_drafter(path: str) -> bool:
    """Whether a file is an EAGLE-3 GGUF drafter (its header's architecture, read with gguf);
    anything else, a repo id included, may be the target."""
    if not os.path.isfile(path):
        return False
    try:
        import gguf

        from ..files.gguf_keys import EAGLE3_ARCH

        field = gguf.GGUFReader(path).get_field(gguf.Keys.General.ARCHITECTURE)
        return field is not None and field.contents() == EAGLE3_ARCH
    except Exception:  # not a GGUF at all: not a drafter either
        return False


def _bench_drafters(paths: Sequence[str] | None, source: str) -> list[str]:
    """The --draft files to compare ([]: the drafter paired with the target, or none)."""
    paths = list(paths or [])
    if len({os.path.realpath(p) for p in paths}) < len(paths):
        raise LocalspecError("--draft names a file twice")
    if len(paths) > 1 and source == "ngram":
        raise LocalspecError(
            "--draft-source ngram drafts from no EAGLE drafter: several --draft files would "
            "all measure the same n-gram drafts"
        )
    return paths


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .. import TreeShape, bench
    from ..engine import MAX_DRAFT, load

    try:
        ks = sorted({int(x) for x in args.k.split(",") if x.strip()})
    except ValueError:
        ks = [-1]
    if not all(1 <= k <= MAX_DRAFT for k in ks):
        raise LocalspecError(f"--k wants draft lengths in 1..{MAX_DRAFT}, got {args.k!r}")
    trees = [TreeShape.parse(t) for t in args.tree]
    if not ks and not trees and args.no_auto:
        raise LocalspecError("nothing to compare: give --k, --tree, or drop --no-auto")
    source = args.draft_source or "auto"
    if source == "none":
        raise LocalspecError("nothing to compare: --draft-source none is plain decoding")
    for t in trees:
        check_source_shape(source, t, flag_spelling(args))
    check_max_tokens_flag(args)
    sets = {
        os.path.basename(name): bench.load_prompt_set(name, args.limit) for name in args.prompts
    }
    if args.busy < 0:
        raise LocalspecError("--busy must be >= 0")
    if args.rounds < 1:
        raise LocalspecError("--rounds must be >= 1")
    if args.turns is not None:
        if args.turns < 1:
            raise LocalspecError("--turns must be >= 1")
        for prompts in sets.values():
            for p in prompts:
                p.turns = p.turns[: args.turns]
    if args.draft and not args.target and len(args.draft) > 1 and not _is_drafter(args.draft[-1]):
        # `--draft D TARGET`: argparse gave the target (a GGUF model or a repo id) to --draft
        args.target = args.draft.pop()
    drafts = _bench_drafters(args.draft, source)
    eng = load(
        target_arg(args),
        draft=drafts[0] if drafts else None,
        draft_source=source,  # ngram: no drafter looked for beside the target
        **engine_options(args),
    )
    with eng, bench.busy_load(args.busy):
        if eng.draft_path is None and (source == "eagle" or (source == "auto" and args.no_auto)):
            # auto drafts from the n-gram index without a drafter; fixed -k / --tree do not
            raise LocalspecError(
                f"bench compares speculation with plain decoding: {eng.drafter_note} "
                "(auto and --draft-source ngram need no drafter)"
            )
        drafts = drafts or ([eng.draft_path] if eng.draft_path else [])
        # every drafter is loaded (and checked against the target) before measuring, and
        # warmed up: first-call costs (auto's calibration, shown, among them) stay out of the
        # numbers
        windows: dict[str, int | None] = {}  # the pairs each drafter attends over
        for d in reversed(drafts):
            eng.use_drafter(d)
            windows[d] = eng.draft_window
            calibrate_first(eng)
            eng.complete("Hello", max_tokens=8)
        if not drafts:
            calibrate_first(eng)
            eng.complete("Hello", max_tokens=8)
        shown = "\n".join(
            f"drafter: {d}" + (f" (attends over its last {windows[d]} pairs)" if windows[d] else "")
            for d in drafts
        )
        shown = shown or f"drafter: {eng.draft_path}"
        print(f"target:  {eng.target_path}\n{shown}\ndraft source: {source}", file=sys.stderr)
        if args.busy:
            print(f"with {args.busy} other processes busy on the CPU", file=sys.stderr)
        results = []
        for name, prompts in sets.items():
            settings = bench.settings_for(
                ks, trees, auto=not args.no_auto, source=source, drafters=drafts
            )
            bar = tqdm(
                total=len(prompts) * len(settings) * args.rounds, desc=name, unit="run", leave=False
            )

            def tick(done: int, total: int, bar: Any = bar) -> None:
                bar.update(done - bar.n)

            res = bench.run_set(
                eng,
                name,
                prompts,
                settings,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                progress=tick,
                rounds=args.rounds,
            )
            bar.close()
            results.append(res)
            print(bench.format_table(res, args.max_tokens, args.temperature) + "\n")
        sizes = {1, 2, *[k + 1 for k in ks], *[t.budget + 1 for t in trees]}
        # taps on as EAGLE speculation runs them (a target without a drafter has none)
        curve = bench.verify_curve(eng, sorted(sizes), taps=eng.draft_path is not None)
        print(bench.format_curve(curve))
        data = bench.report(
            results,
            curve,
            target=eng.target_path,
            drafters=drafts,
            options={
                "ks": ks,
                "trees": [str(t) for t in trees],
                "auto": not args.no_auto,
                "draft_source": source,
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                "sampler": "greedy" if args.temperature == 0 else f"temperature {args.temperature}",
                "limit": args.limit,
                "turns": args.turns,
                "rounds": args.rounds,
                "threads": eng.n_threads,
                "n_gpu_layers": args.gpu_layers,
                "ctx": args.ctx,
                "busy_processes": args.busy,
                # per drafter: the pairs it attends over (null: all)
                "draft_windows": [windows[d] for d in drafts],
            },
        )
    folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(folder, exist_ok=True)
    bench.write_json(args.out + ".json", data)
    bench.write_png(args.out + ".png", results, curve)
    print(f"wrote {args.out}.json and {args.out}.png", file=sys.stderr)
    if any(s.mismatches for r in results for s in r.settings):
        print(
            "note: '!!' rows produced tokens that differ from plain decoding. Past 256 "
            "cached tokens llama.cpp's CPU flash attention computes a one-token decode with "
            "another kernel than a verify batch (logit gaps up to ~1 measured on SmolLM2), so "
            "a near-tie can flip; see docs/speculation.md",
            file=sys.stderr,
        )
    return 0
