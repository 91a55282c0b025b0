"""Collects gen.sh's outputs into generate-streams.jsonl and says which streams differ."""

import json
import os
import sys

out = os.environ.get("OUT", "/tmp/bn")
S = ["--no-draft", "-k 3", "--tree 3,2,6", "--draft-source ngram -k 4", "--temp 0.8 --seed 7 -k 3"]
rows, same, diff = [], 0, []
for i in range(6):
    for j, flags in enumerate(S):
        got = {}
        for tree, commit in (("old", "9e6470a"), ("new", sys.argv[1])):
            with open(f"{out}/g-{tree}-{i}-{j}.json") as fh:
                d = json.load(fh)
            got[tree] = (d["text"], d["stats"]["generated"], d["finish_reason"])
            rows.append({"commit": commit, "prompt": i, "flags": flags, **d})
        if got["old"] == got["new"]:
            same += 1
        else:
            diff.append((i, flags))
with open(os.path.join(os.path.dirname(__file__), "generate-streams.jsonl"), "w") as fh:
    fh.writelines(json.dumps(r) + "\n" for r in rows)
print(f"{same} of {same + len(diff)} streams identical; differ: {diff}")
