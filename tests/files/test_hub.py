"""Targets by Hugging Face repo id (localspec.files.hub), against a fake hub cache in a temp folder:
nothing here touches the network (HF_HUB_OFFLINE=1, or the hub's functions replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import huggingface_hub
import pytest

import localspec
from localspec.errors import ModelFileError
from localspec.files.hub import RepoSpec, choose_gguf, parse_repo_spec, resolve_target

from helpers.hubcache import fake_cache


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def quiet(_: str) -> None:
    pass


@pytest.mark.parametrize(
    "spec, want",
    [
        ("org/name", RepoSpec("org/name")),
        (
            "bartowski/Qwen2.5-7B-Instruct-GGUF:q8_0",
            RepoSpec("bartowski/Qwen2.5-7B-Instruct-GGUF", "q8_0"),
        ),
        ("org/name/sub/M-Q4_K_M.gguf", RepoSpec("org/name", filename="sub/M-Q4_K_M.gguf")),
        ("org/model.gguf", None),  # a missing local file, not a repo named model.gguf
        ("./org/name", None),
        ("/abs/org/name", None),
        ("~/org/name", None),
        ("name", None),
        ("org/name/readme.md", None),
        ("org/name/../x.gguf", None),
        ("org/-bad", None),
        ("org/name:", None),
        ("org/name/x.gguf:Q8_0", None),
    ],
)
def test_repo_ids_and_paths_are_told_apart(spec, want) -> None:
    assert parse_repo_spec(spec) == want


def test_a_local_path_that_exists_always_wins(tmp_path, monkeypatch, offline) -> None:
    local = tmp_path / "org" / "name"
    local.parent.mkdir()
    local.write_bytes(b"x")
    fake_cache(offline, "org/name", {"M-Q4_K_M.gguf": b"gguf"})
    monkeypatch.chdir(tmp_path)
    assert resolve_target("org/name", log=quiet) == "org/name"
    assert resolve_target(str(local), log=quiet) == str(local)


def test_neither_a_file_nor_a_repo_id_is_no_such_file(tmp_path, offline) -> None:
    for spec in (str(tmp_path / "missing.gguf"), "models/missing.gguf", "plain"):
        with pytest.raises(ModelFileError, match=f"^no such file: {spec}$"):
            resolve_target(spec, log=quiet)


def test_the_preferred_quant_or_the_named_one_from_the_cache(offline) -> None:
    snap = fake_cache(
        offline,
        "org/name",
        {
            "Model-Q4_K_M.gguf": b"q4km",
            "Model-Q8_0.gguf": b"q8",
            "Model-Q4_K_S.gguf": b"q4ks",
            "Model-Q4_K_M.eagle3.gguf": b"drafter",
            "mmproj-Model-f16.gguf": b"vision",
            "sub/Other.gguf": b"other",
            "README.md": b"readme",
        },
    )
    logged: list[str] = []
    path = resolve_target("org/name", log=logged.append)
    assert path == str(snap / "Model-Q4_K_M.gguf") and Path(path).read_bytes() == b"q4km"
    assert logged == [
        "org/name: Model-Q4_K_M.gguf and its drafter Model-Q4_K_M.eagle3.gguf (from the cache)"
    ]
    assert resolve_target("org/name:q8_0", log=quiet) == str(snap / "Model-Q8_0.gguf")
    assert resolve_target("org/name:Q4_K_S", log=quiet) == str(snap / "Model-Q4_K_S.gguf")
    assert resolve_target("org/name/sub/Other.gguf", log=quiet) == str(snap / "sub/Other.gguf")
    with pytest.raises(ModelFileError, match="org/name has no GGUF file for IQ2_XS; it has: "):
        resolve_target("org/name:IQ2_XS", log=quiet)
    with pytest.raises(ModelFileError, match="org/name has no file nope.gguf; its GGUF models"):
        resolve_target("org/name/nope.gguf", log=quiet)


def test_choices_and_their_errors() -> None:
    rs = RepoSpec("o/n")
    assert choose_gguf(rs, ["only-F16.gguf", "README.md"]) == "only-F16.gguf"
    assert choose_gguf(rs, ["a-q4_k_m.gguf", "a-Q8_0.gguf"]) == "a-q4_k_m.gguf"  # any case
    with pytest.raises(ModelFileError) as e:
        choose_gguf(rs, ["a-Q8_0.gguf", "a-F16.gguf", "a.eagle3.gguf"])
    assert str(e.value) == (
        "o/n has several GGUF files and none is Q4_K_M: a-F16.gguf, a-Q8_0.gguf; "
        "pick one with o/n:QUANT or o/n/FILE"
    )
    with pytest.raises(ModelFileError, match="^o/n has no GGUF model file$"):
        choose_gguf(rs, ["model.safetensors", "x.eagle3.gguf", "mmproj-x.gguf"])
    both = ["a-Q4_K_M.gguf", "a-UD-Q4_K_M.gguf"]
    with pytest.raises(
        ModelFileError, match="several GGUF files for Q4_K_M: .*name one as o/n/FILE"
    ):
        choose_gguf(rs, both)
    # Q4_K is its own quantization, not a prefix of Q4_K_M; a part of a name still finds one
    assert choose_gguf(RepoSpec("o/n", "Q4_K"), ["a-Q4_K.gguf", "a-Q4_K_M.gguf"]) == "a-Q4_K.gguf"
    assert choose_gguf(RepoSpec("o/n", "UD-Q4"), both) == "a-UD-Q4_K_M.gguf"
    # a split model is chosen by its first part
    split = ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q8_0.gguf"]
    assert choose_gguf(rs, split) == split[0]


def test_offline_and_not_cached_is_one_clear_error(offline) -> None:
    with pytest.raises(ModelFileError) as e:
        resolve_target("org/absent", log=quiet)
    message = str(e.value)
    assert message.startswith("no such file: org/absent, and as a Hugging Face repo")
    assert "HF_HUB_OFFLINE is set" in message and str(offline / "hub") in message


def test_a_cached_repo_with_its_drafter_loads_the_pair(models, offline) -> None:
    """The files land in one snapshot folder, where discovery finds the drafter by name."""
    with open(models["target"], "rb") as t, open(models["draft"], "rb") as d:
        target, drafter = t.read(), d.read()
    snap = fake_cache(
        offline, "tiny/pair", {"Tiny-Q4_K_M.gguf": target, "Tiny-Q4_K_M.eagle3.gguf": drafter}
    )
    path = resolve_target("tiny/pair", log=quiet)
    with localspec.load(path, n_ctx=256, n_threads=1) as eng:
        assert eng.target_path == path
        assert eng.draft_path == str(snap / "Tiny-Q4_K_M.eagle3.gguf")


class FakeHub:
    """huggingface_hub's listing and download, online, without a network."""

    def __init__(self, files: list[str], fail: Exception | None = None) -> None:
        self.files, self.fail = files, fail
        self.fetched: list[str] = []

    def list_repo_files(self, repo: str, **kw: Any) -> list[str]:
        if self.fail is not None:
            raise self.fail
        return list(self.files)

    def download(self, repo: str, name: str, **kw: Any) -> str:
        assert kw["local_files_only"] is False
        self.fetched.append(name)
        return f"/cache/{repo}/{name}"


@pytest.fixture
def online(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return home


def use(monkeypatch, fake: FakeHub) -> None:
    def listing(api: Any, repo: str, **kw: Any) -> list[str]:
        return fake.list_repo_files(repo, **kw)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", listing)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake.download)


def test_online_fetches_the_target_its_parts_and_the_drafter_beside_it(online, monkeypatch) -> None:
    fake = FakeHub(
        [
            "big/M-Q4_K_M-00001-of-00002.gguf",
            "big/M-Q4_K_M-00002-of-00002.gguf",
            "big/M.eagle3.gguf",  # the folder's only drafter (discovery checks its record)
            "M-Q8_0.gguf",
            "M-Q8_0.eagle3.gguf",
        ]
    )
    use(monkeypatch, fake)
    from huggingface_hub import utils

    before = utils.are_progress_bars_disabled()
    path = resolve_target("org/name:Q4_K_M", log=quiet, progress=False)
    assert utils.are_progress_bars_disabled() == before
    assert path == "/cache/org/name/big/M-Q4_K_M-00001-of-00002.gguf"
    assert fake.fetched == [
        "big/M-Q4_K_M-00001-of-00002.gguf",
        "big/M-Q4_K_M-00002-of-00002.gguf",
        "big/M.eagle3.gguf",
    ]
    fake.fetched.clear()
    assert resolve_target("org/name:Q8_0", log=quiet) == "/cache/org/name/M-Q8_0.gguf"
    assert fake.fetched == ["M-Q8_0.gguf", "M-Q8_0.eagle3.gguf"]


def test_online_failures_fall_back_to_the_cache_or_say_why(online, monkeypatch) -> None:
    use(monkeypatch, FakeHub([], fail=ConnectionError("no route to host\nmore detail")))
    with pytest.raises(ModelFileError) as e:
        resolve_target("org/name", log=quiet)
    assert str(e.value) == (
        "no such file: org/name, and the Hugging Face hub cannot list it as a repo: "
        "no route to host"
    )
    fake_cache(online, "org/name", {"M-Q4_K_M.gguf": b"q"})
    logged: list[str] = []
    assert resolve_target("org/name", log=logged.append) == "/cache/org/name/M-Q4_K_M.gguf"
    assert logged[0] == (
        "cannot list org/name on the Hugging Face hub (no route to host): using its cached files"
    )


def test_a_home_relative_path_is_expanded(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    assert resolve_target("~/t.gguf") == str(tmp_path / "t.gguf")
