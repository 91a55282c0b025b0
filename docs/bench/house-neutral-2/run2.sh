#!/bin/bash
# the same four runs in the other order (new, old, old, new): a gap that follows the order,
# not the code, is the machine's
set -u
PY=/work/main/.venv/bin/python
ARGS="bench --prompts mtbench humaneval long short --limit 4 --max-tokens 64 --k 3"
run() { # name dir
  echo "== $1 $(date -u +%T)"
  (cd $2 && PYTHONPATH=$2 $PY -c "import sys; from localspec.cli import main; sys.exit(main())" $ARGS --out /tmp/bn/$1) > /tmp/bn/$1.txt 2>&1
  echo "rc=$? $(date -u +%T)"
}
run new3 /work/main
run old3 /work/old-wt
run old4 /work/old-wt
run new4 /work/main
