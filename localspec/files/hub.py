"""Targets named by Hugging Face repo id, fetched into the hub's own cache.

``org/name`` picks the repo's Q4_K_M GGUF (or its only GGUF), ``org/name:QUANT`` the GGUF
whose name carries that quantization (case-insensitive, as llama.cpp's ``-hf``), and
``org/name/path/file.gguf`` that file. An EAGLE-3 drafter published beside it
(``NAME.eagle3.gguf``, or the folder's only ``*.eagle3.gguf``) is fetched too: the hub's cache
puts both in one snapshot folder, where ``localspec.files.discovery`` finds it next to the target.

HF_HOME / HF_HUB_CACHE (where), HF_HUB_OFFLINE (cache only) and HF_TOKEN (private and gated
repos) are honoured; the first two are read at each call, so a process may change them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..errors import ModelFileError

PREFERRED_QUANT = "Q4_K_M"
DRAFTER_SUFFIX = ".eagle3.gguf"
# Hugging Face's repo names: letters, digits, '-', '_', '.'; not starting or ending with - or .
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
_QUANT = re.compile(r"[A-Za-z0-9_.-]+")
# llama.cpp's split files: NAME-00001-of-00003.gguf (the first part names the model)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class RepoSpec:
    """What a repo id asks for: the repo, and a quantization or a file in it (or neither)."""

    repo: str
    quant: str | None = None
    filename: str | None = None


def parse_repo_spec(spec: str) -> RepoSpec | None:
    """The repo id in ``spec``, or None when it cannot be one (it reads as a path)."""
    if spec.startswith(("/", ".", "~")) or "\\" in spec:
        return None
    head, colon, quant = spec.partition(":")
    parts = head.split("/")
    if len(parts) < 2 or not all(_NAME.fullmatch(p) for p in parts[:2]):
        return None
    repo = "/".join(parts[:2])
    if colon:
        return RepoSpec(repo, quant=quant) if len(parts) == 2 and _QUANT.fullmatch(quant) else None
    if len(parts) == 2:
        # "folder/model.gguf" is a missing local file, not a repo named model.gguf
        return None if parts[1].lower().endswith(".gguf") else RepoSpec(repo)
    rest = parts[2:]
    if rest[-1].lower().endswith(".gguf") and all(p not in ("", ".", "..") for p in rest):
        return RepoSpec(repo, filename="/".join(rest))
    return None


def resolve_target(spec: str, log: Callable[[str], None] = print, *, progress: bool = True) -> str:
    """A local path for a target given as a path or a repo id (see the module's notes),
    downloading the GGUF and a drafter beside it when they are not cached. A path that
    exists always wins (~ is expanded). progress=False hides the hub's download bars (a
    full-screen app)."""
    if os.path.exists(os.path.expanduser(spec)):
        return os.path.expanduser(spec)
    rs = parse_repo_spec(spec)
    if rs is None:
        raise ModelFileError(f"no such file: {spec}")
    hub = _hub()
    cache, offline = cache_dir(), offline_mode()
    files = _repo_files(hub, spec, rs.repo, cache, offline, log)
    target = choose_gguf(rs, files)
    wanted = [*split_parts(target, files)]
    drafter = drafter_beside(target, files)
    if drafter is not None:
        wanted.append(drafter)
    log(
        f"{rs.repo}: {target}"
        + (f" and its drafter {os.path.basename(drafter)}" if drafter else "")
        + (" (from the cache)" if offline else "")
    )
    paths = []
    with _progress_bars(hub, progress):
        for name in wanted:
            try:
                paths.append(
                    hub.hf_hub_download(rs.repo, name, cache_dir=cache, local_files_only=offline)
                )
            except Exception as exc:  # offline and not cached, network, gated, disk full
                where = "is not in the Hugging Face cache" if offline else "cannot be fetched"
                raise ModelFileError(
                    f"{rs.repo}/{name} {where}"
                    + (" and HF_HUB_OFFLINE is set" if offline else f": {_first_line(exc)}")
                ) from None
    return paths[0]


def choose_gguf(rs: RepoSpec, files: list[str]) -> str:
    """The repo file a spec names: its file, the GGUF carrying its quantization, or the
    preferred quantization (else the only GGUF). Drafters, vision projectors and the later
    parts of split files are never chosen."""
    models = sorted(f for f in files if _is_model(f))
    listing = ", ".join(models) or "none"
    if rs.filename is not None:
        if rs.filename not in files:
            raise ModelFileError(f"{rs.repo} has no file {rs.filename}; its GGUF models: {listing}")
        return rs.filename
    if not models:
        raise ModelFileError(f"{rs.repo} has no GGUF model file")
    quant = rs.quant or PREFERRED_QUANT
    found = _with_quant(models, quant)
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ModelFileError(
            f"{rs.repo} has several GGUF files for {quant}: {', '.join(found)}; "
            f"name one as {rs.repo}/FILE"
        )
    if rs.quant is not None:
        raise ModelFileError(f"{rs.repo} has no GGUF file for {rs.quant}; it has: {listing}")
    if len(models) == 1:
        return models[0]
    raise ModelFileError(
        f"{rs.repo} has several GGUF files and none is {PREFERRED_QUANT}: {listing}; "
        f"pick one with {rs.repo}:QUANT or {rs.repo}/FILE"
    )


def split_parts(target: str, files: list[str]) -> list[str]:
    """All parts of a split GGUF, first part first (the target alone when it is whole)."""
    m = _SPLIT.search(target)
    if m is None:
        return [target]
    stem, n = target[: m.start()], int(m.group(2))
    parts = [f"{stem}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    missing = [p for p in parts if p not in files]
    if missing:
        raise ModelFileError(f"{target} is split in {n} parts and {missing[0]} is missing")
    return parts


def drafter_beside(target: str, files: list[str]) -> str | None:
    """The EAGLE-3 drafter published for the target: NAME.eagle3.gguf beside NAME.gguf, or
    the only drafter in its folder (discovery then checks that it records this target)."""
    named = target[:-5] + DRAFTER_SUFFIX
    if named in files:
        return named
    folder = os.path.dirname(target)
    beside = [
        f for f in files if f.lower().endswith(DRAFTER_SUFFIX) and os.path.dirname(f) == folder
    ]
    return beside[0] if len(beside) == 1 else None


def cache_dir() -> str | None:
    """The hub cache folder from the environment as it is now (None: the hub's default)."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return os.path.expanduser(env[name])
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(env["HF_HOME"]), "hub")
    return None


def offline_mode() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return value in ("1", "ON", "YES", "TRUE")


def cached_files(repo: str, cache: str | None) -> list[str] | None:
    """The files of the repo's cached main revision (None when it has none), read from the
    hub's cache layout: models--ORG--NAME/refs/main names a snapshots/COMMIT folder."""
    if cache is None:
        cache = _hub().constants.HF_HUB_CACHE
    folder = os.path.join(cache, "models--" + repo.replace("/", "--"))
    try:
        with open(os.path.join(folder, "refs", "main"), encoding="utf-8") as fh:
            commit = fh.read().strip()
    except OSError:
        return None
    snapshot = os.path.join(folder, "snapshots", commit)
    if not commit or not os.path.isdir(snapshot):
        return None
    out = []
    for root, _, names in os.walk(snapshot):
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path):  # a dangling link is a file the cache lost
                out.append(os.path.relpath(path, snapshot).replace(os.sep, "/"))
    return sorted(out)


def _repo_files(
    hub: Any, spec: str, repo: str, cache: str | None, offline: bool, log: Callable[[str], None]
) -> list[str]:
    """The repo's files: listed by the hub, or from the cache when offline or unreachable."""
    if offline:
        files = cached_files(repo, cache)
        if files is None:
            raise ModelFileError(
                f"no such file: {spec}, and as a Hugging Face repo it is not in the cache "
                f"({cache or hub.constants.HF_HUB_CACHE}) while HF_HUB_OFFLINE is set"
            )
        return files
    try:
        return list(hub.HfApi().list_repo_files(repo))
    except Exception as exc:  # not found, gated, no network
        reason = _first_line(exc)
        files = cached_files(repo, cache)
        if files is None:
            raise ModelFileError(
                f"no such file: {spec}, and the Hugging Face hub cannot list it as a repo: {reason}"
            ) from None
        log(f"cannot list {repo} on the Hugging Face hub ({reason}): using its cached files")
        return files


def _is_model(name: str) -> bool:
    base = os.path.basename(name).lower()
    if not base.endswith(".gguf") or base.endswith(DRAFTER_SUFFIX) or base.startswith("mmproj"):
        return False
    m = _SPLIT.search(base)
    return m is None or int(m.group(1)) == 1


def _with_quant(models: list[str], quant: str) -> list[str]:
    """The models whose file name carries the quantization as a whole word (Q4_K matches
    Q4_K.gguf, not Q4_K_M.gguf); failing that, anywhere in the name."""
    word = re.compile(rf"(?:^|[-._]){re.escape(quant)}(?=[-.]|$)", re.IGNORECASE)
    found = [m for m in models if word.search(os.path.basename(m))]
    return found or [m for m in models if quant.lower() in os.path.basename(m).lower()]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hub() -> SimpleNamespace:
    """The parts of huggingface_hub used here, looked up at each call (tests replace them)."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, utils
    except ImportError:
        raise ModelFileError(
            "a Hugging Face repo id needs huggingface-hub: pip install huggingface-hub"
        ) from None
    return SimpleNamespace(
        HfApi=huggingface_hub.HfApi,
        hf_hub_download=huggingface_hub.hf_hub_download,
        constants=constants,
        utils=utils,
    )


@contextmanager
def _progress_bars(hub: Any, on: bool) -> Iterator[None]:
    """The hub's download bars off for the block when not wanted (they are process-wide)."""
    utils = hub.utils
    was_off = utils.are_progress_bars_disabled()
    if not on and not was_off:
        utils.disable_progress_bars()
    try:
        yield
    finally:
        if not on and not was_off:
            utils.enable_progress_bars()
