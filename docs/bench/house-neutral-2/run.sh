#!/bin/bash
# behaviour-neutral check for issue 49 (second session): 9e6470a (before the house) vs HEAD,
# interleaved old, new, new, old
set -u
PY=/work/main/.venv/bin/python
ARGS="bench --prompts mtbench humaneval long short --limit 4 --max-tokens 64 --k 3"
run() { # name dir
  echo "== $1 $(date -u +%T)"
  (cd $2 && PYTHONPATH=$2 $PY -c "import sys; from localspec.cli import main; sys.exit(main())" $ARGS --out /tmp/bn/$1) > /tmp/bn/$1.txt 2>&1
  echo "rc=$? $(date -u +%T)"
}
run old1 /work/old-wt
run new1 /work/main
run new2 /work/main
run old2 /work/old-wt
