"""What a wrong reading of a drafter's config costs on a real pair: SmolLM2-135M-Instruct and its
shipped EAGLE-3.1 drafter (trained by `localspec train` on taps 2, 15, 27 with fc_norm and
norm_output), measured the way `localspec convert` measures readings.

A copy of the drafter is rewritten to each reading (tap ids shifted by one either way, as a
tool counting outputs instead of inputs would write them; norm_output read as plain EAGLE-3, as
SpecForge before its PR #879 meant it) and drafts greedy chains for the target on the chat
prompts `convert` uses, then on a slice of MT-Bench. Every number comes from this one run.

    python benchmarks/readings_smollm2.py [--prompts 10] [--max-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from localspec.converters.formats import Reading
from localspec.converters.measure import PROMPTS, MeasureConfig, choose, measure
from localspec.datasets import mtbench_questions
from localspec.files.discovery import default_target, drafter_path_for

SHIPPED = os.path.join(
    os.path.dirname(__file__), "..", "localspec", "models", "SmolLM2-135M-Instruct.Q4_1.eagle3.gguf"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--prompts", type=int, default=10, help="MT-Bench first turns to add")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    target = args.target or default_target()
    draft = args.draft or (
        drafter_path_for(target) if os.path.exists(drafter_path_for(target)) else SHIPPED
    )
    flags = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": True}

    def reading(taps: tuple[int, int, int], norm_output: bool, why: str) -> Reading:
        return Reading(taps, tuple({**flags, "norm_output": norm_output}.items()), why)

    candidates = [
        reading((2, 15, 27), True, "as trained: taps 2, 15, 27, EAGLE-3.1 feedback"),
        reading((3, 16, 28), True, "ids [2, 15, 27] read as outputs (+1)"),
        reading((1, 14, 26), True, "ids [1, 14, 26] read as inputs (an output-counting tool)"),
        reading((2, 15, 27), False, "norm_output read as plain EAGLE-3 (SpecForge pre-#879)"),
    ]
    prompts = list(PROMPTS) + [turns[0] for turns in mtbench_questions()[: args.prompts]]
    cfg = MeasureConfig(prompts=prompts, n_draft=4, max_tokens=args.max_tokens,
                        n_threads=args.threads)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "drafter.gguf")
        shutil.copy(draft, copy)
        print(f"target {os.path.basename(target)}, drafter {os.path.basename(draft)}")
        print(f"{len(prompts)} chat prompts, greedy chains of 4, {args.max_tokens} tokens each")
        t0 = time.perf_counter()
        measured = measure(copy, target, candidates, cfg)
        seconds = time.perf_counter() - t0
    _, why = choose(measured)
    print(why)
    print(f"measuring {len(candidates)} readings took {seconds:.0f} s")


if __name__ == "__main__":
    main()
