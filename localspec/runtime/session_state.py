"""Session files: what an engine's caches hold, on disk, so that a conversation reopened in a
later process continues without processing its history again (Engine.save_session and
load_session).

A file is written whole or not at all (a temporary file beside it, renamed over it) and read
only when everything checks: its length, a sha256 over all of it, and the identity it was saved
for (the model files and the settings that shape the caches). llama.cpp's own state bytes carry
no such checks that could not abort the process on bad input, so it is handed nothing else.

Layout (little-endian)::

    magic       8 bytes   b"LSPSESS\\0"
    version     u32       FORMAT_VERSION
    header_len  u32
    digest      32 bytes  sha256 of the header and every section
    header      JSON      identity, the drafter's start/end, each section's name and shape
    sections    arrays back to back, in the header's order (SECTIONS gives their types)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import struct
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SessionStateError
from .drafter import DrafterState
from .target import TargetState

if TYPE_CHECKING:
    from ..options import RuntimeOptions
    from .drafter import Drafter
    from .target import Target

MAGIC = b"LSPSESS\0"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sII32s")

# every array a file may hold, by name: its type (files list theirs in this order)
SECTIONS: dict[str, str] = {
    "target.tokens": "int32",  # the token at each position of the history
    "target.gaps": "int32",  # positions of cells parked for rejected tree nodes
    "target.memory": "uint8",  # llama.cpp's state of every target sequence
    "drafter.pair_tokens": "int32",  # the token of each pair from the drafter's start on
    "drafter.queued_g": "float32",  # encoded pairs not yet written [rows, n_embd]
    "drafter.queued_taps": "float32",  # taps not yet encoded [rows, taps x target n_embd]
    "drafter.memory": "uint8",  # llama.cpp's state of the drafter's written pairs' sequence
}

# settings that change what the caches hold or how their cells are laid out; n_threads and
# n_gpu_layers do not (llama.cpp copies the state between host and device memory)
SETTINGS = ("n_ctx", "n_batch", "draft_batch", "kv_type", "flash_attn")


def file_identity(path: str) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def identity(target: Target, drafter: Drafter | None, rt: RuntimeOptions) -> dict[str, Any]:
    """What a saved state is valid for: the llama.cpp build, both files as they are on disk,
    and the cache settings."""
    from ..native import INSTALLED_LLAMA_CPP_PYTHON

    settings: dict[str, Any] = {"n_ctx": target.n_ctx}  # the context as used (as asked)
    settings.update((k, getattr(rt, k)) for k in SETTINGS if k != "n_ctx")
    return {
        "llama_cpp_python": INSTALLED_LLAMA_CPP_PYTHON,
        "target": file_identity(target.path),
        "drafter": file_identity(drafter.spec.path) if drafter is not None else None,
        "settings": settings,
    }


def mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a state saved for `saved` cannot serve `current` (None: it can)."""
    if saved["llama_cpp_python"] != current["llama_cpp_python"]:
        return (
            f"it was saved by llama-cpp-python {saved['llama_cpp_python']}, this is "
            f"{current['llama_cpp_python']}"
        )
    for role in ("target", "drafter"):
        was, now = saved[role], current[role]
        if was == now:
            continue
        if now is None:
            return f"it was saved with the drafter {was['path']}; this engine has none"
        if was is None:
            return f"it was saved without a drafter; this engine has {now['path']}"
        if was["path"] != now["path"]:
            return f"it was saved for another {role} file, {was['path']}"
        return f"the {role} file {now['path']} changed since (its size or modification time)"
    for key in SETTINGS:
        was, now = saved["settings"][key], current["settings"][key]
        if was != now:
            return f"it was saved with {key}={was}; this engine runs {key}={now}"
    return None


# --- writing -----------------------------------------------------------------------------------


def write(
    path: str, ident: dict[str, Any], target: TargetState, drafter: DrafterState | None
) -> int:
    """Write a session file (whole, or not at all); its size in bytes."""
    arrays: dict[str, np.ndarray] = {
        "target.tokens": np.asarray(target.tokens),
        "target.gaps": np.asarray(target.gaps),
        "target.memory": target.memory,
    }
    if drafter is not None:
        arrays.update(
            {
                "drafter.pair_tokens": np.asarray(drafter.pair_tokens),
                "drafter.queued_g": drafter.queued_g,
                "drafter.queued_taps": drafter.queued_taps,
                "drafter.memory": drafter.memory,
            }
        )
    arrays = {k: np.ascontiguousarray(a, dtype=SECTIONS[k]) for k, a in arrays.items()}
    header = {
        "identity": ident,
        "drafter": {"start": drafter.start, "end": drafter.end} if drafter is not None else None,
        "sections": [[k, list(a.shape)] for k, a in arrays.items()],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    digest = hashlib.sha256(head)
    for a in arrays.values():
        digest.update(a.data)
    prefix = PREFIX.pack(MAGIC, FORMAT_VERSION, len(head), digest.digest())
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(prefix)
            fh.write(head)
            for a in arrays.values():
                fh.write(a.data)
        # no fsync: a file torn by a crash fails its digest and is refused like any other
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise SessionStateError(f"session file {path}: cannot write it ({exc})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return PREFIX.size + len(head) + sum(a.nbytes for a in arrays.values())


# --- reading -----------------------------------------------------------------------------------


class _Refused(Exception):
    """Why a file is refused (read() words it as a SessionStateError naming the file)."""


def read(path: str, current: dict[str, Any]) -> tuple[TargetState, DrafterState | None]:
    """The states a session file holds, when it was saved for `current` and is whole;
    SessionStateError naming the file and the reason otherwise."""
    try:
        return _read(path, current)
    except FileNotFoundError:
        reason = "no such file"
    except OSError as exc:
        reason = f"cannot read it ({exc.strerror or exc})"
    except _Refused as exc:
        reason = str(exc)
    except (KeyError, TypeError, ValueError, IndexError):  # a header that parses but is wrong
        reason = "it is corrupt (its header does not describe a session)"
    raise SessionStateError(f"session file {path}: {reason}")


def _read(path: str, current: dict[str, Any]) -> tuple[TargetState, DrafterState | None]:
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise _Refused("it is empty")
        raw = fh.read(PREFIX.size)
        if not raw.startswith(MAGIC) and not MAGIC.startswith(raw):
            raise _Refused("it is not a localspec session file")
        if len(raw) < PREFIX.size:
            raise _Refused("it is truncated")
        _, version, head_len, digest = PREFIX.unpack(raw)
        if version != FORMAT_VERSION:
            raise _Refused(
                f"it has session format {version}; this localspec reads format {FORMAT_VERSION}"
            )
        if PREFIX.size + head_len > size:
            raise _Refused("it is truncated")
        head = fh.read(head_len)
        try:
            header = json.loads(head)
        except ValueError:
            raise _Refused("it is corrupt (its header is not JSON)") from None
        shapes = [(str(name), tuple(int(d) for d in shape)) for name, shape in header["sections"]]
        if any(name not in SECTIONS or min(shape, default=0) < 0 for name, shape in shapes):
            raise _Refused("it is corrupt (unknown sections)")
        counts = [math.prod(shape) for _, shape in shapes]
        sizes = [np.dtype(SECTIONS[n]).itemsize * math.prod(s) for n, s in shapes]
        end = PREFIX.size + head_len + sum(sizes)
        if size < end:
            raise _Refused(f"it is truncated ({size} bytes of {end})")
        if size > end:
            raise _Refused(f"it is corrupt ({size - end} bytes after its end)")
        why = mismatch(header["identity"], current)  # before reading what it would not serve
        if why:
            raise _Refused(why)
        payload = bytearray(end - PREFIX.size - head_len)
        if fh.readinto(payload) != len(payload):
            raise _Refused("it is truncated")
    check = hashlib.sha256(head)
    check.update(payload)
    if check.digest() != digest:
        raise _Refused("it is corrupt (its checksum does not match)")
    arrays: dict[str, np.ndarray] = {}
    at = 0
    for (name, shape), count, nbytes in zip(shapes, counts, sizes, strict=True):
        flat = np.frombuffer(payload, dtype=SECTIONS[name], count=count, offset=at)
        arrays[name] = flat.reshape(shape)
        at += nbytes
    target = TargetState(
        arrays["target.tokens"].tolist(), arrays["target.gaps"].tolist(), arrays["target.memory"]
    )
    d = header["drafter"]
    drafter = None
    if d is not None:
        drafter = DrafterState(
            int(d["start"]),
            int(d["end"]),
            arrays["drafter.pair_tokens"].tolist(),
            arrays["drafter.queued_g"],
            arrays["drafter.queued_taps"],
            arrays["drafter.memory"],
        )
    return target, drafter
