"""The native door: every staging symbol binds, and failures name the required version."""

from __future__ import annotations

import pytest

from localspec import _native as N
from localspec.errors import NativeLibraryError


def test_all_staging_symbols_bound() -> None:
    for name in N._STAGING:
        fn = getattr(N, name)
        assert fn.restype is not None or N._STAGING[name][2] is None
        assert fn.argtypes == N._STAGING[name][1]


def test_wrong_version_is_refused_with_the_required_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(N, "INSTALLED_LLAMA_CPP_PYTHON", "0.3.99")
    with pytest.raises(NativeLibraryError, match=r"llama-cpp-python==0\.3\.36"):
        N._bind_staging()


def test_missing_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = dict(N._STAGING)
    bogus["nope"] = ("_Z4nopev", [], None)
    monkeypatch.setattr(N, "_STAGING", bogus)
    with pytest.raises(NativeLibraryError, match=r"_Z4nopev.*0\.3\.36"):
        N._bind_staging()


def test_header_reader_matches_gguf_py(models: dict[str, str]) -> None:
    from gguf import GGUFReader

    h = N.GGUFHeader(models["draft"])
    r = GGUFReader(models["draft"])
    assert h.architecture == "eagle3"
    assert h.kv["eagle3.target_layers"] == [1, 2, 3]
    assert set(h.tensors) == {t.name for t in r.tensors}
    for t in r.tensors:
        assert h.tensors[t.name].shape == tuple(int(x) for x in t.shape)
        assert h.data_offset + h.tensors[t.name].offset == t.data_offset
