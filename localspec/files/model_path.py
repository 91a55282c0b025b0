"""A model path that is not a file, named for what it is: missing, or a folder (with the GGUF
files it holds). Read by the options' checks and by the GGUF header reader alike."""

from __future__ import annotations

import os

from ..errors import ModelFileError


def check_model_file(path: str, role: str | None = None) -> None:
    """ModelFileError for a model path that is not a file: missing, or a folder (which is
    named as one, with the GGUF files it holds). role: "target" or "drafter"."""
    if os.path.isfile(path):
        return
    if not os.path.isdir(path):
        raise ModelFileError(f"no such file: {path}")
    try:
        ggufs = sorted(n for n in os.listdir(path) if n.lower().endswith(".gguf"))
    except OSError:
        ggufs = []
    held = f" (it holds {', '.join(ggufs[:4])}{', ...' if len(ggufs) > 4 else ''})" if ggufs else ""
    what = f"the {role}'s" if role else "a"
    raise ModelFileError(
        f"{path} is a folder, not a GGUF file: give {what} .gguf file itself{held}"
    )
