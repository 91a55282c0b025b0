"""Makes a training-data folder of links to chosen shards of other runs' data folders, so one
run trains on a mix (replies to new prompts plus older ones as rehearsal) or is judged on a
shard the others leave out, without copying gigabytes of taps.

    python scripts/link-shards.py OUT SRC[:SHARDS] [SRC[:SHARDS] ...]

SRC is a run folder or its data folder (the one with manifest.json); SHARDS picks shards by
index, e.g. 0-4 or 0-4,6-23; a leading ^ keeps all but those (^5); no SHARDS takes them all.
The sources must come from the same target with the same data settings. The manifest written
is the first source's with its shard list rewritten, so its counts (positions, prompts used)
are that source's, not the mix's; the trainer reads rows from the shards themselves. OUT is
a run folder's data folder (RUN/data) or an eval folder; a run trained on it with
--max-tokens 1 adds no data of its own."""

from __future__ import annotations

import json
import os
import re
import sys

from localspec.training.features import taps_file

SPEC = re.compile(r"\^?\d+(-\d+)?(,\d+(-\d+)?)*")


def pick(spec: str, n: int, src: str) -> list[int]:
    if not spec:
        return list(range(n))
    drop = spec.startswith("^")
    picked: set[int] = set()
    for part in spec.lstrip("^").split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            sys.exit(f"{src}: shard range {part} runs backwards")
        picked.update(range(int(lo), int(hi or lo) + 1))
    if max(picked) >= n:
        sys.exit(f"{src}: shard {max(picked)} asked for, the folder has {n} (0-{n - 1})")
    return [i for i in range(n) if (i in picked) != drop]


def read_source(arg: str) -> tuple[str, dict, list[int]]:
    src, colon, spec = arg.rpartition(":")
    if not colon or not SPEC.fullmatch(spec):  # no shard list: the whole argument is a path
        src, spec = arg, ""
    src = os.path.realpath(src)
    if not os.path.isfile(os.path.join(src, "manifest.json")):
        src = os.path.join(src, "data")  # a run folder: its data
    try:
        with open(os.path.join(src, "manifest.json"), encoding="utf-8") as fh:
            m = json.load(fh)
        names = list(m["shards"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"{arg}: no readable manifest.json of training data ({exc})")
    return src, m, pick(spec, len(names), arg)


def link(target: str, path: str) -> None:
    """Points path at target, replacing an older link (a re-run may pick other sources)."""
    tmp = path + ".tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def main(out: str, args: list[str]) -> None:
    sources = [read_source(a) for a in args]
    first = sources[0][1]
    for (src, m, _), arg in zip(sources, args, strict=True):
        if m.get("target_fingerprint") != first.get("target_fingerprint"):
            sys.exit(f"{arg} was made with another target than {args[0]}")
        if m.get("config") != first.get("config"):
            sys.exit(f"{arg} was made with other data settings than {args[0]}: {m.get('config')}")
        if os.path.realpath(out) == src:
            sys.exit(f"{out} is one of the sources: give a new folder")
    os.makedirs(out, exist_ok=True)
    shards: list[str] = []
    for n_src, (src, m, chosen) in enumerate(sources):
        for i in chosen:
            name = m["shards"][i]
            new = f"{n_src}-{name}"  # sources may share shard names
            path = os.path.join(out, new)
            if os.path.exists(path) and not os.path.islink(path):
                sys.exit(f"{path} is a shard of its own, not a link: give a new folder")
            link(os.path.join(src, name), path)
            if os.path.exists(os.path.join(src, taps_file(name))):  # older shards hold their taps
                link(os.path.join(src, taps_file(name)), os.path.join(out, taps_file(new)))
            shards.append(new)
    if not shards:
        sys.exit("no shards chosen")
    tmp = os.path.join(out, "manifest.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({**first, "shards": shards}, fh)
    os.replace(tmp, os.path.join(out, "manifest.json"))
    print(f"{out}: {len(shards)} shards")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
