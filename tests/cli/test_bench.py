"""`localspec bench`: interleaved plain-vs-speculative runs, the table, JSON and PNG, and the
prompt sets it reads."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

import pytest

import localspec
from localspec import bench, load
from localspec.bench import load_prompt_set
from localspec.cli import main
from localspec.speculation.tree import TreeShape

from conftest import EXACT
from helpers import tinymodels as tm


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "abc de"}, {"turns": ["hij", "ab cd"]}, {"prompt": "fgh ij"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_run_set_measures_every_setting_on_every_prompt(agree, prompts):
    ps = bench.load_prompt_set(prompts, None)
    assert [len(p.turns) for p in ps] == [1, 2, 1]
    with load(agree[0], draft=agree[1], **EXACT) as eng:
        settings = bench.settings_for([1, 3], [TreeShape(3, 2, 5)], auto=True)
        res = bench.run_set(eng, "mine", ps, settings, max_tokens=24)
    assert [s.label for s in res.settings] == ["plain", "auto", "k=1", "k=3", "tree 3x2/5"]
    assert [s.k for s in res.settings] == [0, None, 1, 3, None]
    for s in res.settings:
        assert len(s.prompt_tps) == 3 and s.stats.generated > 0 and s.mismatches == 0
    plain, auto, k3, tree = res.settings[0], res.settings[1], res.settings[3], res.settings[4]
    assert plain.stats.drafted == 0 and plain.stats.generated == k3.stats.generated
    assert k3.stats.tau > 2.0  # the agreeing pair: most drafts are accepted
    assert tree.stats.tau > 2.0 and tree.stats.shapes.get("tree 3x2/5", 0) > 0
    assert sum(auto.stats.shapes.values()) == auto.stats.steps
    table = bench.format_table(res, 24, 0.0)
    assert "plain" in table and "best fixed setting" in table and "auto:" in table
    assert "tree 3x2/5" in table
    d = k3.as_dict(plain)
    assert d["speedup"] > 0 and len(d["acceptance_at"]) == 3
    assert auto.as_dict(plain)["shapes"] == auto.stats.shapes
    # every EAGLE draft position is counted, its time split into native calls and the rest
    st = k3.stats
    assert st.eagle_positions == st.drafted and plain.stats.eagle_positions == 0
    assert 0 < st.t_eagle_native < st.t_eagle <= st.t_draft
    assert d["draft_host_ms_per_position"] == pytest.approx(
        1e3 * (st.t_eagle - st.t_eagle_native) / st.eagle_positions
    )
    row = next(line for line in table.splitlines() if line.strip().startswith("k=3"))
    assert f"{st.draft_host_ms:8.3f}" in row


def test_cli_bench_writes_table_json_and_png(agree, prompts, tmp_path, capsys):
    out = str(tmp_path / "res" / "b")
    rc = main(
        [
            "bench",
            agree[0],
            "--draft",
            agree[1],
            "--prompts",
            prompts,
            "--k",
            "2,1",
            "--tree",
            "2,2,4",
            "-n",
            "16",
            "--out",
            out,
            "--threads",
            "2",
            "--busy",
            "1",
            "--ctx",
            "1024",
        ]
    )
    io = capsys.readouterr()
    assert rc == 0, io.err
    assert "verify cost t(n)/t(1)" in io.out and "tau" in io.out
    data = json.loads(Path(out + ".json").read_text())
    assert data["options"]["busy_processes"] == 1
    assert data["options"]["draft_windows"] == [None]  # the agreeing drafter records none
    assert not multiprocessing.active_children()  # the busy process was stopped
    s = data["sets"]["prompts.jsonl"]
    assert [x["setting"] for x in s["settings"]] == ["plain", "auto", "k=1", "k=2", "tree 2x2/4"]
    assert s["settings"][3]["tau"] > 1.5 and s["prompts"] == 3
    fixed = [x for x in s["settings"] if x["setting"] != "auto"]
    assert s["best_fixed"] == max(fixed, key=lambda x: x["tokens_per_s"])["setting"]
    assert set(data["verify_curve_s"]) == {"1", "2", "3", "5"}
    assert Path(out + ".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one drafter: it is the run's drafter and every speculative setting's
    assert data["drafter"] == agree[1] and data["drafters"] == [agree[1]]
    assert [x["drafter"] for x in s["settings"]] == [None] + [agree[1]] * 4


@pytest.fixture(scope="module")
def other_drafter(agree, tmp_path_factory) -> str:
    """A random drafter for the agreeing target that taps other layers (1, 2, 3)."""
    path = str(tmp_path_factory.mktemp("other") / "other.eagle3.gguf")
    return tm.random_drafter_for(agree[0], path, taps=(1, 2, 3))


def test_cli_bench_compares_drafters_side_by_side(agree, other_drafter, prompts, tmp_path, capsys):
    out = str(tmp_path / "b")
    # the target after the drafters, as users type it: it is not taken for a third drafter
    args = ["bench", "--draft", agree[1], other_drafter, agree[0], "--prompts", prompts]
    rc = main([*args, "--k", "2", "--tree", "2,2,4", "-n", "12", "--out", out, "-t", "2"])
    io = capsys.readouterr()
    assert rc == 0, io.err
    assert f"drafter: {agree[1]}\ndrafter: {other_drafter}" in io.err
    data = json.loads(Path(out + ".json").read_text())
    assert data["drafters"] == [agree[1], other_drafter] and data["drafter"] is None
    settings = data["sets"]["prompts.jsonl"]["settings"]
    names = ("agree", "other")
    assert [x["setting"] for x in settings] == ["plain"] + [
        f"{label} {n}" for label in ("auto", "k=2", "tree 2x2/4") for n in names
    ]
    assert [x["drafter"] for x in settings] == [None] + [agree[1], other_drafter] * 3
    assert all(x["mismatches"] == 0 for x in settings)
    k2 = {x["drafter"]: x for x in settings if x["k"] == 2}
    assert k2[agree[1]]["tau"] > 2.0 > k2[other_drafter]["tau"]  # each row is its drafter's
    assert all(len(x["acceptance_at"]) == 2 for x in k2.values())
    # the table: a row per drafter with tau and acceptance by position, auto per drafter
    rows = {
        line.split()[1]: line for line in io.out.splitlines() if line.lstrip().startswith("k=2")
    }
    assert set(rows) == set(names) and all("%" in row for row in rows.values())
    assert "; auto agree:" in io.out and "; auto other:" in io.out
    assert Path(out + ".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_settings_per_drafter():
    one = bench.settings_for([2], [TreeShape(3, 2, 5)], auto=True, drafters=["a/x.gguf"])
    assert [s.label for s in one] == ["plain", "auto", "k=2", "tree 3x2/5"]
    assert [s.drafter for s in one] == [None, "a/x.gguf", "a/x.gguf", "a/x.gguf"]
    two = bench.settings_for([2], [], auto=False, drafters=["old.gguf", "d/new.eagle3.gguf"])
    assert [(s.label, s.drafter) for s in two] == [
        ("plain", None), ("k=2 old", "old.gguf"), ("k=2 new", "d/new.eagle3.gguf")
    ]  # fmt: skip
    assert bench.drafter_names(["a/x.gguf", "b/x.gguf", "y.gguf"]) == ["a/x", "b/x", "y"]
    assert bench.drafter_names(["a/c/x.gguf", "b/c/x.gguf"]) == ["a/c/x", "b/c/x"]
    assert bench.drafter_names(["x.gguf", "x.eagle3.gguf"]) == ["x#1", "x#2"]


def test_bench_refuses_drafters_it_cannot_compare(agree, models, prompts, tmp_path, capsys):
    base = ["bench", agree[0], "--prompts", prompts, "--k", "2", "--out", str(tmp_path / "x")]
    for extra, msg in (
        (["--draft", agree[1], agree[1]], "names a file twice"),
        (["--draft", agree[1], models["draft"], "--draft-source", "ngram"], "no EAGLE drafter"),
        (["--draft", agree[1], models["draft"]], "hidden size"),
    ):
        assert main(base + extra) == 1
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err


def test_bench_bad_input_is_one_line(models, prompts, tmp_path, capsys):
    base = ["bench", models["target"], "--draft", models["draft"], "--out", str(tmp_path / "x")]
    for extra, msg in (
        (["--prompts", prompts, "--k", "0"], "--k wants draft lengths"),
        (["--prompts", prompts, "--k", "two"], "--k wants draft lengths"),
        (["--prompts", prompts, "--tree", "2,2"], "DEPTH,TOP_K,BUDGET"),
        (["--prompts", prompts, "--k", "", "--no-auto"], "nothing to compare"),
        (["--prompts", "nosuchset"], "unknown prompt set"),
        (["--prompts", prompts, "--limit", "0"], "--limit must be >= 1"),
    ):
        assert main(base + extra) == 1
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
    # a target with no drafter next to it
    lonely = tm.write_target(str(tmp_path / "lonely.gguf"))
    eagle_only = ["--draft-source", "eagle"]  # auto would draft from the n-gram index
    rc = main(["bench", lonely, "--prompts", prompts, *eagle_only, "--out", str(tmp_path / "y")])
    assert rc == 1 and "no drafter found" in capsys.readouterr().err


def test_named_prompt_sets():
    mt = bench.load_prompt_set("mtbench", 3)
    assert len(mt) == 3 and all(len(p.turns) == 2 for p in mt)
    he = bench.load_prompt_set("humaneval", None)
    assert len(he) == 164 and "def " in he[0].turns[0]
    long = bench.load_prompt_set("long", 2)
    short = bench.load_prompt_set("short", 2)
    assert [p.turns for p in long] == [p.turns for p in short]
    for p in long:
        size = sum(len(m["content"]) for m in p.history)
        assert bench.LONG_CHARS[0] <= size <= bench.LONG_CHARS[1]
    assert all(not p.history for p in short)


def test_settings_draft_from_the_source_asked_for():
    settings = bench.settings_for([2], [TreeShape(3, 2, 5)], auto=True, source="eagle")
    assert [s.gen.get("draft_source") for s in settings] == ["none", "eagle", "eagle", "eagle"]
    assert [s.k for s in settings] == [0, None, 2, None]
    default = bench.settings_for([2], [], auto=False)
    assert [s.gen["draft_source"] for s in default] == ["none", "auto"]


def test_table_and_json_show_each_source():
    from localspec.stats import SourceStats, Stats

    plain, auto = bench.settings_for([], [], auto=True)
    plain.stats = Stats(generated=40, steps=40, t_target=1.0)
    plain.prompt_tps = [40.0]
    auto.stats = Stats(
        generated=40,
        steps=16,
        drafted=40,
        accepted=24,
        t_target=0.5,
        sources={"eagle": SourceStats(10, 30, 15), "ngram": SourceStats(8, 12, 9)},
    )
    auto.prompt_tps = [80.0]
    res = bench.SetResult("mine", 1, [plain, auto])
    table = bench.format_table(res, 40, 0.0)
    assert "draft source auto" in table.splitlines()[0]
    (line,) = [x for x in table.splitlines() if "eagle 15/30" in x]
    assert "(50%) tau 2.50" in line and "ngram 9/12 (75%) tau 2.12" in line
    d = auto.as_dict(plain)
    assert d["draft_source"] == "auto"
    assert d["sources"]["ngram"] == {
        "steps": 8, "drafted": 12, "accepted": 9, "tau": 17 / 8, "acceptance_rate": 0.75
    }  # fmt: skip
    assert plain.as_dict(None)["sources"] == {}


def test_cli_bench_draft_source_ngram_needs_no_drafter(agree, prompts, tmp_path, capsys):
    import shutil

    lonely = str(tmp_path / "lonely.gguf")  # no drafter beside it: n-gram drafts only
    shutil.copy(agree[0], lonely)
    out = str(tmp_path / "b")
    args = ["bench", lonely, "--prompts", prompts, "--k", "2", "-n", "12", "--out", out]
    rc = main([*args, "--draft-source", "ngram", "--no-auto", "--threads", "2", "--ctx", "512"])
    io = capsys.readouterr()
    assert rc == 0, io.err
    assert "draft source ngram" in io.out
    data = json.loads(Path(out + ".json").read_text())
    assert data["options"]["draft_source"] == "ngram" and data["drafter"] is None
    settings = data["sets"]["prompts.jsonl"]["settings"]
    assert [(s["setting"], s["draft_source"]) for s in settings] == [
        ("plain", "none"),
        ("k=2", "ngram"),
    ]
    assert set(settings[1]["sources"]) <= {"ngram"} and settings[0]["sources"] == {}
    for extra, msg in (
        (["--draft-source", "none"], "nothing to compare"),
        (["--draft-source", "ngram", "--tree", "2,2,4"], "fixed trees are drafted by the EAGLE"),
    ):
        assert main([*args, *extra]) == 1
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err


def test_bench_prompt_set_that_is_not_there(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for spec in ("missing.jsonl", "prompts/missing", str(tmp_path / "a.jsonl")):
        with pytest.raises(localspec.LocalspecError, match=f"^no such file: {re.escape(spec)}$"):
            load_prompt_set(spec, None)
    with pytest.raises(localspec.LocalspecError, match="mtbench, humaneval, long, short"):
        load_prompt_set("mtbnech", None)
    (tmp_path / "folder").mkdir()
    with pytest.raises(localspec.LocalspecError, match="is a folder"):
        load_prompt_set("folder", None)
    assert main(["bench", "--prompts", "missing.jsonl", "-n", "4"]) == 1
    assert capsys.readouterr().err == "localspec: error: no such file: missing.jsonl\n"


def test_bench_prompt_file_format(tmp_path) -> None:
    """The format README and docs/benchmarks.md describe: "prompt" or "turns" per line."""
    path = tmp_path / "mine.jsonl"
    recs = [{"prompt": "Name three rivers."}, {"turns": ["Write a haiku.", "Now in French."]}]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    prompts = load_prompt_set(str(path), None)
    assert [(p.id, p.turns) for p in prompts] == [
        ("mine.jsonl-0", ["Name three rivers."]),
        ("mine.jsonl-1", ["Write a haiku.", "Now in French."]),
    ]
    assert len(load_prompt_set(str(path), 1)) == 1
    for bad, why in (('["a list"]', "expected an object"), ('{"turns": "one"}', "strings")):
        path.write_text(bad + "\n")
        with pytest.raises(localspec.LocalspecError, match=f"mine.jsonl:1: .*{why}"):
            load_prompt_set(str(path), None)
