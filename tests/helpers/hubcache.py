"""A fake Hugging Face hub cache in a temp folder: the hub's own layout, so that targets by
repo id resolve offline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(home: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """The hub's cache layout: blobs by hash, snapshots/COMMIT/... links, refs/main."""
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot
