"""Makes a training-data folder of links to chosen shards of other runs' data folders, so one
run trains on a mix (replies to new prompts plus older ones as rehearsal) or is judged on a
shard the others leave out, without copying gigabytes of taps.

    python scripts/link-shards.py OUT SRC[:SHARDS] [SRC[:SHARDS] ...]

SRC is a run's data folder (with manifest.json); SHARDS picks shards by index, e.g. 0-4 or
0-4,6-23; a leading ^ keeps all but those (^5). The manifest written is the first source's
with its shard list rewritten (as made the shipped drafter's data; the trainer counts rows
from the shards themselves)."""

from __future__ import annotations

import json
import os
import sys


def indices(spec: str, n: int) -> list[int]:
    drop = spec.startswith("^")
    picked: set[int] = set()
    for part in spec.lstrip("^").split(","):
        lo, _, hi = part.partition("-")
        picked.update(range(int(lo), int(hi or lo) + 1))
    if max(picked) >= n:
        sys.exit(f"shard {max(picked)} asked for, the folder has {n}")
    return [i for i in range(n) if (i in picked) != drop]


def main(out: str, sources: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    manifest: dict | None = None
    shards: list[str] = []
    for n_src, arg in enumerate(sources):
        src, _, spec = arg.partition(":")
        src = os.path.abspath(src)
        with open(os.path.join(src, "manifest.json"), encoding="utf-8") as fh:
            m = json.load(fh)
        manifest = manifest or m
        names = m["shards"]
        for i in indices(spec, len(names)) if spec else range(len(names)):
            name = f"{n_src}-{names[i]}"  # sources may share shard names
            for s, d in ((names[i], name), (names[i][:-4] + ".taps.npy", name[:-4] + ".taps.npy")):
                link = os.path.join(out, d)
                if not os.path.lexists(link):
                    os.symlink(os.path.join(src, s), link)
            shards.append(name)
    assert manifest is not None
    tmp = os.path.join(out, "manifest.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({**manifest, "shards": shards}, fh)
    os.replace(tmp, os.path.join(out, "manifest.json"))
    print(f"{out}: {len(shards)} shards")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
