"""A target's own MTP (nextn) head as a draft source (runtime/mtp.py): tiny qwen35 targets with
one MTP block, written here. With cycle=8 the head agrees with the trunk (it carries the given
token's embedding through), so its drafts are accepted; without, it is random and they are
mostly rejected. Either way the output is the target's own: greedy equals a plain loop replayed
one token at a time (near-tie rule), sampling matches the target's distribution."""

from __future__ import annotations

import gguf
import pytest

import localspec
from localspec.errors import InvalidParameterError, LocalspecError
from localspec.files.fileinfo import describe, format_info
from localspec.lowlevel import parts
from localspec.runtime.mtp import MtpDrafter, mtp_blocks

from helpers import tinymodels as tm
from helpers.chisquare import chi2_critical, chi2_of_samples, exact_distribution
from helpers.costs import inject_costs
from helpers.greedy import assert_greedy_lossless

# snapshots, as most of these tests are about (auto may choose checkpoints by what snapshots cost
# here: the random head's test runs both)
EXACT = {
    "kv_type": "f32",
    "flash_attn": False,
    "n_threads": 2,
    "n_ctx": 512,
    "rollback": "snapshots",
}
PROMPT = "the cat sat on the mat; the dog"


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory) -> str:
    return tm.write_qwen35_target(
        str(tmp_path_factory.mktemp("mtp") / "agree.gguf"), mtp=True, cycle=8
    )


@pytest.fixture(scope="module")
def random_head(tmp_path_factory) -> str:
    return tm.write_qwen35_target(str(tmp_path_factory.mktemp("mtp") / "random.gguf"), mtp=True)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_fixed_mtp_chains_are_lossless_and_accepted(agreeing, k) -> None:
    with localspec.load(agreeing, **EXACT, draft_source="mtp") as eng:
        assert isinstance(parts(eng).drafter, MtpDrafter)
        assert eng.drafting.drafter_kind == "mtp" and "MTP head" in eng.drafter_note
        c = eng.complete(PROMPT, max_tokens=80, n_draft=k)
        s = eng.last_stats
        assert set(s.sources) == {"mtp"}, s.sources
        assert s.sources["mtp"].accepted >= 0.8 * s.sources["mtp"].drafted > 0
        assert s.mode == f"mtp chain {k}"
        assert_greedy_lossless(eng, PROMPT, c)


@pytest.mark.parametrize("rollback", ["snapshots", "checkpoint"])
def test_a_random_head_is_rejected_and_still_lossless(random_head, rollback) -> None:
    """Rejections cut the hybrid state back (snapshots, or a checkpoint put back and the
    accepted tokens decoded again) and the MTP cache with it."""
    opts = {**EXACT, "rollback": rollback}
    with localspec.load(random_head, **opts, draft_source="mtp") as eng:
        assert parts(eng).target.rollback.checkpoint == (rollback == "checkpoint")
        c = eng.complete(PROMPT, max_tokens=80, n_draft=4)
        s = eng.last_stats
        assert s.sources["mtp"].drafted > 0 and s.accepted < s.drafted
        assert_greedy_lossless(eng, PROMPT, c)
        # a second call, after the check's own decodes
        c2 = eng.complete(PROMPT, max_tokens=40, n_draft=4)
        assert_greedy_lossless(eng, PROMPT, c2)


def test_auto_drafts_with_the_head_where_verifying_is_cheap(agreeing, monkeypatch) -> None:
    """A GPU-like flat verify curve: auto drafts with the MTP head, losslessly (the cycling
    text repeats, so with n-gram drafts allowed the index wins: both are checked)."""
    with localspec.load(agreeing, **EXACT) as eng:  # auto finds the head in the target
        assert eng.drafting.drafter_kind == "mtp"
        inject_costs(monkeypatch, eng, lambda n: 15e-3 + 1e-4 * n, drafter=0.3e-3)
        prompt = "zebra quartz violin"
        c = eng.complete(prompt, max_tokens=150, draft_source="mtp")
        s = eng.last_stats
        assert s.mode == "auto (mtp)"
        assert s.sources.get("mtp") and s.sources["mtp"].accepted > 50, s.sources
        assert_greedy_lossless(eng, prompt, c)
        c = eng.complete(prompt, max_tokens=150)
        assert eng.last_stats.mode == "auto (mtp, ngram)" and eng.last_stats.accepted > 50
        assert_greedy_lossless(eng, prompt, c)


@pytest.mark.parametrize(
    "sp_kw",
    [
        {"temperature": 30.0, "top_k": 3},
        # a pull towards the tokens just drafted (a window that left the path out would miss
        # it; at temperature 30 a presence penalty of -60 moves a logit by 2)
        {"temperature": 30.0, "top_k": 3, "presence_penalty": -60.0, "repeat_last_n": 4},
    ],
    ids=["top_k", "penalties"],
)  # fmt: skip
def test_mtp_chain_sampling_matches_target_distribution(agreeing, sp_kw) -> None:
    """Rejection sampling from the head's own distribution on the hybrid target: the target's
    distribution exactly, as llama.cpp's chain gives it (the head agrees on the best token,
    not on the two others top_k keeps)."""
    with localspec.load(agreeing, **EXACT, draft_source="mtp") as eng:
        prompt = eng.tokenize("abc")
        expected = exact_distribution(eng, prompt, sp_kw)
        stat, df, acc = chi2_of_samples(eng, prompt, expected, sp_kw, n_samples=2000, n_draft=2)
    assert 0.05 < acc < 1.95, acc  # drafts were accepted and rejected
    assert df >= 5
    assert stat < chi2_critical(df), (stat, df)


def test_saved_sessions_keep_the_heads_cache(agreeing, tmp_path) -> None:
    """The next turn of a conversation continues from a saved session: the target's state
    (snapshots included) and the head's cache are restored, and the reply is the same."""
    path = str(tmp_path / "s.lsess")
    with localspec.load(agreeing, **EXACT, draft_source="mtp") as eng:
        prompt = eng.tokenize(PROMPT)
        history = prompt + eng.complete(prompt, max_tokens=30, n_draft=4).tokens
        eng.save_session(path)
        want = eng.complete(history, max_tokens=40, n_draft=4).tokens
        assert eng.last_stats.cached_tokens >= len(history) - 1
    with localspec.load(agreeing, **EXACT, draft_source="mtp") as eng:
        eng.load_session(path)
        got = eng.complete(history, max_tokens=40, n_draft=4)
        assert eng.last_stats.cached_tokens >= len(history) - 1
        assert got.tokens == want
        assert eng.last_stats.sources["mtp"].accepted > 0


def test_mtp_on_a_target_without_a_head_is_one_clear_error(tmp_path) -> None:
    plain = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    with pytest.raises(InvalidParameterError, match="has no MTP head"):
        localspec.load(plain, **EXACT, draft_source="mtp")
    with localspec.load(plain, **EXACT) as eng:  # auto: n-gram drafts only, no head
        assert not eng.drafting.has_drafter
        c = eng.complete(PROMPT, max_tokens=8, draft_source="mtp", n_draft="auto")
        assert c.stats.mode == "plain" and any("mtp" in n for n in c.stats.notes)


def test_an_engine_drafting_with_its_head_says_why_eagle_runs_plain(agreeing) -> None:
    with localspec.load(agreeing, **EXACT) as eng:
        c = eng.complete(PROMPT, max_tokens=8, draft_source="eagle")
        assert c.stats.mode == "plain"
        assert any("MTP head" in n for n in c.stats.notes), c.stats.notes


def test_an_mtp_block_with_a_missing_tensor_is_one_clear_error(tmp_path) -> None:
    src = tm.write_qwen35_target(str(tmp_path / "full.gguf"), mtp=True)
    bad = str(tmp_path / "missing.gguf")
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(bad, "qwen35")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        if t.name != "blk.4.nextn.eh_proj.weight":
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(LocalspecError, match="eh_proj|nextn|MTP") as e:
        localspec.load(bad, **EXACT, draft_source="mtp")
    assert "Traceback" not in str(e.value)
    # llama.cpp checks the block's tensors whether or not it loads them: any load says so
    with pytest.raises(LocalspecError, match="nextn.eh_proj"):
        localspec.load(bad, **EXACT, draft_source="none")


def test_info_says_the_target_has_an_mtp_head(agreeing, tmp_path) -> None:
    info = describe(agreeing)
    assert info["mtp_blocks"] == 1
    text = format_info(info)
    assert "MTP head      1 block: drafts with --draft-source mtp" in text, text
    assert "chains of at most" in text
    plain = describe(tm.write_qwen35_target(str(tmp_path / "q.gguf")))
    assert plain["mtp_blocks"] == 0 and "MTP" not in format_info(plain)


def test_switching_between_the_head_and_an_eagle_drafter(agreeing, tmp_path) -> None:
    """use_drafter from the head to an EAGLE drafter re-creates the target's context for the
    graph callback (its taps follow), and back: every reply stays the target's own."""
    eagle = tm.random_drafter_for(agreeing, str(tmp_path / "d.eagle3.gguf"), taps=(1, 2, 3))
    with localspec.load(agreeing, **EXACT) as eng:
        assert eng.drafting.drafter_kind == "mtp"
        for which, source in ((eagle, "eagle"), (agreeing, "mtp"), (eagle, "eagle")):
            eng.use_drafter(which)
            assert eng.drafting.drafter_kind == source
            c = eng.complete(PROMPT, max_tokens=30, n_draft=3, draft_source=source)
            assert eng.last_stats.sources[source].drafted > 0
            assert_greedy_lossless(eng, PROMPT, c)
        bad = tm.write_drafter(str(tmp_path / "bad.eagle3.gguf"), tm.write_target(
            str(tmp_path / "other.gguf")))  # fmt: skip
        eng.use_drafter(agreeing)
        with pytest.raises(LocalspecError):
            eng.use_drafter(bad)  # refused: the head stays at work, its taps on
        c = eng.complete(PROMPT, max_tokens=30, n_draft=3, draft_source="mtp")
        assert eng.last_stats.sources["mtp"].accepted > 0
        assert_greedy_lossless(eng, PROMPT, c)


def test_an_eagle_drafter_beside_the_target_is_preferred_and_the_head_not_loaded(
    agreeing, tmp_path
) -> None:
    import shutil

    target = str(tmp_path / "t.gguf")
    shutil.copy(agreeing, target)
    tm.random_drafter_for(target, str(tmp_path / "t.eagle3.gguf"), taps=(1, 2, 3))
    with localspec.load(target, **EXACT) as eng:
        assert eng.drafting.drafter_kind == "eagle"
        assert not parts(eng).target.model.mtp_loaded


class _Header:
    def __init__(self, arch: str, nextn: int, tensors: tuple[str, ...]) -> None:
        self.architecture, self.path = arch, f"{arch}.gguf"
        self.tensors = dict.fromkeys(tensors)
        self._keys = {"nextn_predict_layers": nextn, "block_count": 5}

    def arch_key(self, key: str):
        return self._keys.get(key)


def test_heads_llama_cpp_would_abort_on_are_refused_from_the_header() -> None:
    eh = "blk.4.nextn.eh_proj.weight"
    assert mtp_blocks(_Header("qwen35", 1, (eh,))) == (1, "")
    assert "has no MTP head" in mtp_blocks(_Header("qwen35", 0, ()))[1]
    assert "runs no MTP block of lfm2" in mtp_blocks(_Header("lfm2", 1, (eh,)))[1]
    # GGML_ASSERT(n_layer_nextn == 1) in the qwen35 MTP graph; step35 runs several
    assert "runs one MTP block of qwen35" in mtp_blocks(_Header("qwen35", 2, (eh,)))[1]
    assert mtp_blocks(_Header("step35", 2, ("blk.3.nextn.eh_proj.weight",))) == (2, "")
    # a trunk-only export: the key kept, the blocks left out
    assert "holds no blk.4.nextn.eh_proj.weight" in mtp_blocks(_Header("glm4moe", 1, ()))[1]
