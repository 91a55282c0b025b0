"""Byte-level GGUF editing for fuzz tests: parse a file into its key/values, tensor table and
data section, change any of them (values of any type, array lengths, tensor dims, types and
offsets), and write it back, the data section re-aligned so that only the intended field
differs. Works on any file `gguf` writes; no checks, since the point is to write bad files."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f"}
_FMT |= {BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


@dataclass
class KV:
    key: str
    type: int
    value: Any  # scalar, str, or (item_type, list) for arrays


@dataclass
class TensorInfo:
    name: str
    dims: list[int]
    ggml_type: int
    offset: int


@dataclass
class GGUF:
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes  # the data section, from the aligned start
    alignment: int = 32

    def kv(self, key: str) -> KV:
        for kv in self.kvs:
            if kv.key == key:
                return kv
        raise KeyError(key)

    def set(self, key: str, value: Any, type_: int | None = None) -> None:
        """Set (or add) a key; type_ defaults to the key's current type."""
        for kv in self.kvs:
            if kv.key == key:
                kv.value = value
                kv.type = kv.type if type_ is None else type_
                return
        if type_ is None:
            raise KeyError(f"{key} is new: give its type")
        self.kvs.append(KV(key, type_, value))

    def drop(self, key: str) -> None:
        self.kvs = [kv for kv in self.kvs if kv.key != key]

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> Any:
        v = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        raw = self.buf[self.at : self.at + n]
        self.at += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, t: int) -> Any:
        if t == STR:
            return self.string()
        if t == ARR:
            it, n = self.take("<I"), self.take("<Q")
            return (it, [self.value(it) for _ in range(n)])
        return self.take(_FMT[t])


def read(path: str) -> GGUF:
    with open(path, "rb") as fh:
        buf = fh.read()
    r = _Reader(buf)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path} is not GGUF")
    r.at = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        t = r.take("<I")
        kvs.append(KV(key, t, r.value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        tensors.append(TensorInfo(name, dims, r.take("<I"), r.take("<Q")))
    g = GGUF(version, kvs, tensors, b"")
    for kv in kvs:
        if kv.key == "general.alignment":
            g.alignment = int(kv.value)
    start = -(-r.at // g.alignment) * g.alignment
    g.data = buf[start:]
    return g


def _string(s: str) -> bytes:
    raw = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _value(t: int, v: Any) -> bytes:
    if t == STR:
        return _string(v)
    if t == ARR:
        it, items = v
        return struct.pack("<IQ", it, len(items)) + b"".join(_value(it, x) for x in items)
    return struct.pack(_FMT[t], v)


def header_bytes(g: GGUF) -> bytes:
    out = [b"GGUF", struct.pack("<IQQ", g.version, len(g.tensors), len(g.kvs))]
    for kv in g.kvs:
        out += [_string(kv.key), struct.pack("<I", kv.type), _value(kv.type, kv.value)]
    for t in g.tensors:
        out += [_string(t.name), struct.pack("<I", len(t.dims))]
        out += [struct.pack("<Q", d) for d in t.dims] + [struct.pack("<IQ", t.ggml_type, t.offset)]
    head = b"".join(out)
    return head + b"\0" * (-len(head) % g.alignment)


def to_bytes(g: GGUF) -> bytes:
    return header_bytes(g) + g.data


def write(g: GGUF, path: str) -> str:
    with open(path, "wb") as fh:
        fh.write(to_bytes(g))
    return path
