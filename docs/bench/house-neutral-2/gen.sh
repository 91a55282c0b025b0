#!/bin/bash
# greedy (and seeded sampling) streams: 9e6470a (before issue 49's house) vs HEAD, same machine,
# one after the other; each call a fresh process (`localspec generate --json`)
set -u
PY=/work/main/.venv/bin/python
OUT=${OUT:-/tmp/bn}
P=("Explain why the sky is blue in three sentences." "Write a Python function that checks whether a string is a palindrome." "List five capitals of European countries." "Rewrite this sentence formally: gonna be late, traffic is nuts." "def fib(n):" "Summarise the plot of Romeo and Juliet.")
S=("--no-draft" "-k 3" "--tree 3,2,6" "--draft-source ngram -k 4" "--temp 0.8 --seed 7 -k 3")
for tree in old new; do
  dir=/work/main; [ $tree = old ] && dir=/work/old-wt
  for i in "${!P[@]}"; do for j in "${!S[@]}"; do
    (cd $dir && PYTHONPATH=$dir $PY -c "import sys; from localspec.cli import main; sys.exit(main())" generate --chat -n 64 ${S[$j]} -p "${P[$i]}" --json) > $OUT/g-$tree-$i-$j.json 2>$OUT/g-$tree-$i-$j.err
  done; done
done
echo done
