"""The command line: a thin layer over the API that turns errors into one line."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys

import pytest

import localspec
from localspec.cli import main


def test_generate_prints_text_and_stats(agree, capsys) -> None:
    target, draft = agree
    rc = main(["generate", target, "--draft", draft, "-p", "abc", "-n", "10", "--stats"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.strip() == "defghijklm"
    assert "EAGLE-3 drafter" in err and "tau" in err


def test_generate_json(agree, capsys) -> None:
    target, draft = agree
    assert main(["generate", target, "-p", "abc", "-n", "5", "--json", "-k", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["text"] == "defgh"
    assert data["finish_reason"] == "length"
    assert data["drafter"] == draft  # found next to the target by name
    assert data["stats"]["generated"] == 5


def test_no_draft(agree, capsys) -> None:
    target, _ = agree
    assert main(["generate", target, "--no-draft", "-p", "abc", "-n", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["drafter"] is None


def test_errors_are_one_line(tmp_path, models, capsys) -> None:
    assert main(["generate", str(tmp_path / "missing.gguf"), "-p", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localspec: error: no such file") and err.count("\n") == 1
    assert main(["generate", models["target"], "--draft", models["target"], "-p", "x"]) == 1
    assert "not an EAGLE-3 drafter" in capsys.readouterr().err
    assert main(["generate", models["target"], "--no-draft", "-p", "x", "--temperature", "-2"]) == 1
    assert "temperature" in capsys.readouterr().err
    args = ["generate", models["target"], "--draft", models["draft"], "-p", "x"]
    assert main([*args, "--draft-window", "-3"]) == 1
    err = capsys.readouterr().err
    assert "--draft-window must be" in err and err.count("\n") == 1


def test_convert_command(models, tmp_path, capsys) -> None:
    import shutil

    from helpers import tinymodels as tm
    from helpers.hfcheckpoints import write_checkpoint

    ds = tm.DrafterShape(fc_norm=True, norm_output=True)
    ck = write_checkpoint(
        str(tmp_path / "ck"), "specforge", ds, tm.drafter_tensors(ds, 64), taps=[0, 1, 2]
    )
    target = str(tmp_path / "t.gguf")
    shutil.copy(models["target"], target)
    assert main(["convert", ck, "--target", target, "--outtype", "q8_0"]) == 0
    err = capsys.readouterr().err
    assert "[1, 2, 3]" in err and "outputs of layers, +1" in err
    assert (tmp_path / "t.eagle3.gguf").exists()  # found by load(target) by convention
    assert main(["convert", ck, "--target", target]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["convert", ck, "--target", target, "--taps", "1,x,3", "--force"]) == 1
    assert "--taps" in capsys.readouterr().err


def test_convert_command_checks(models, tmp_path, capsys) -> None:
    from helpers import tinymodels as tm
    from helpers.hfcheckpoints import write_checkpoint

    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    out = str(tmp_path / "d.gguf")
    assert main(["convert", ck, "--target", models["target"], "-o", out, "--check-acceptance"]) == 0
    err = capsys.readouterr().err
    assert "verify passed" in err and "acceptance on 4 prompts" in err
    assert (
        main(["convert", ck, "--target", models["target"], "-o", out, "--force", "--no-verify"])
        == 0
    )
    assert "verify" not in capsys.readouterr().err


def test_chat_bad_arguments_fail_before_the_app(tmp_path, models, capsys) -> None:
    assert main(["chat", str(tmp_path / "missing.gguf")]) == 1
    assert capsys.readouterr().err.startswith("localspec: error: no such file")
    assert main(["chat", models["target"], "--temperature", "-1"]) == 1
    assert "temperature" in capsys.readouterr().err
    assert main(["chat", models["target"], "--n-draft", "99"]) == 1
    assert "--n-draft" in capsys.readouterr().err
    assert main(["chat", models["target"], "--draft", str(tmp_path / "nope.gguf")]) == 1
    assert "nope.gguf" in capsys.readouterr().err


def test_os_errors_are_one_line_and_leave_no_file(models, tmp_path, capsys) -> None:
    """A folder that cannot hold the output (here /proc, where nothing can be created even by
    root, and a path under a regular file) gives one error line, no traceback, no file."""
    from helpers import tinymodels as tm
    from helpers.hfcheckpoints import write_checkpoint

    ds = tm.DrafterShape()
    ck = write_checkpoint(str(tmp_path / "ck"), "eagle", ds, tm.drafter_tensors(ds, 64))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in ("/proc/x.gguf", str(blocker / "x.gguf")):
        rc = main(["convert", ck, "--target", models["target"], "-o", out, "--no-verify"])
        err = capsys.readouterr().err
        assert rc == 1 and err == f"localspec: error: cannot write {out}: {err.split(': ')[-1]}"
        assert "Traceback" not in err
    assert not any(p.name.startswith(".localspec-") for p in tmp_path.iterdir())
    rc = main(["train", models["target"], "--data", "mtbench", "-o", str(blocker / "run")])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("localspec: error:") and err.count("\n") == 1, err


def test_convert_and_train_without_torch_say_how_to_get_it(models, tmp_path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"  # as if PyTorch were not installed
        "from localspec.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for args in (
        ["convert", str(tmp_path), "--target", models["target"]],
        ["train", models["target"], "--data", "mtbench", "-o", str(tmp_path / "run")],
    ):
        run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        assert run.returncode == 1, run.stderr
        assert run.stderr.startswith("localspec: error:") and "needs PyTorch" in run.stderr
        assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


ALPHABET = "abcdefghijklmnopqrstuvwxyz"  # the agreeing target repeats it: the context drafts


def test_generate_draft_source_ngram_prints_its_line(agree, capsys) -> None:
    """--draft-source ngram drafts from the context alone: --stats says so per source, and the
    JSON carries the per-source statistics."""
    target, draft = agree
    args = ["generate", target, "-p", ALPHABET, "-n", "30", "--draft-source", "ngram"]
    assert main([*args, "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == ALPHABET + "abcd"
    assert "draft source ngram" in err
    lines = [line.strip() for line in err.splitlines()]
    (ngram,) = [line for line in lines if line.startswith("ngram:")]
    assert "drafted" in ngram and "accepted" in ngram and "tau" in ngram
    assert not any(line.startswith("eagle:") for line in lines)  # no EAGLE drafts asked for
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["draft_source"] == "ngram" and set(data["stats"]["sources"]) == {"ngram"}
    st = data["stats"]["sources"]["ngram"]
    assert st["accepted"] > 0 and st["drafted"] >= st["accepted"] and st["tau"] > 1


def test_ngram_drafts_need_no_drafter_file(agree, tmp_path, capsys) -> None:
    import shutil

    lonely = str(tmp_path / "lonely.gguf")  # the target with no drafter beside it
    shutil.copy(agree[0], lonely)
    assert main(["generate", lonely, "-p", ALPHABET, "-n", "20", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # auto: the n-gram index drafts
    assert data["drafter"] is None and data["stats"]["sources"]["ngram"]["accepted"] > 0


def test_no_draft_means_no_drafts_at_all(agree, capsys) -> None:
    """--no-draft is plain decoding: no drafter file and no n-gram drafts either."""
    target, _ = agree
    assert main(["generate", target, "--no-draft", "-p", ALPHABET, "-n", "20", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["draft_source"] == "none" and data["drafter"] is None
    assert data["stats"]["drafted"] == 0 and data["stats"]["sources"] == {}
    rc = main(["generate", target, "--no-draft", "--draft-source", "ngram", "-p", "x"])
    err = capsys.readouterr().err
    assert rc == 1 and "--no-draft" in err and err.count("\n") == 1


def test_draft_source_flag_errors_are_one_line(agree, capsys) -> None:
    target, _ = agree
    rc = main(["generate", target, "-p", "x", "--draft-source", "ngram", "--tree", "3,2,5"])
    err = capsys.readouterr().err
    assert rc == 1 and "fixed trees are drafted by the EAGLE drafter" in err
    assert err.count("\n") == 1
    rc = main(["chat", target, "--draft-source", "ngram", "--tree", "3,2,5"])  # before the app
    assert rc == 1 and "--draft-source ngram takes -k" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse refuses what is not a source
        main(["generate", target, "-p", "x", "--draft-source", "both"])
    assert "invalid choice" in capsys.readouterr().err
    for cmd in ("chat", "serve", "bench"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "--draft-source {auto,eagle,mtp,ngram,none}" in capsys.readouterr().out


# --- the chat's context and session-cache flags; targets by Hugging Face repo id -------------


@pytest.mark.parametrize(
    "text, size",
    [
        ("0", 0),
        ("4096", 4096),
        ("500M", 500 << 20),
        ("500mb", 500 << 20),
        ("2G", 2 << 30),
        ("2 GiB", 2 << 30),
        ("1.5G", 3 << 29),
        ("64k", 64 << 10),
        ("1T", 1 << 40),
    ],
)
def test_sizes(text, size) -> None:
    from localspec.cli import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["-1G", "", "big", "2X", "5P", "1e9", "G"])
def test_bad_sizes_are_one_clear_error(text) -> None:
    from localspec.cli import parse_size
    from localspec.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="--session-cache-size wants a size like"):
        parse_size(text)
    with pytest.raises(InvalidParameterError, match="is more than 1 PiB"):
        parse_size("2000T")


class FakeApp:
    """Stands for the chat app: records the options it would run with."""

    seen: list = []

    def __init__(self, opts, store=None) -> None:
        self.seen.append(opts)
        self.exit_notes: list[str] = []
        self.load_error = None

    def run(self) -> None:
        pass


@pytest.fixture
def fake_app(monkeypatch, tmp_path) -> list:
    from localspec import cli
    from localspec.tui import app

    FakeApp.seen = []
    monkeypatch.setattr(app, "LocalspecApp", FakeApp)
    monkeypatch.setattr(cli.chat, "stdin_is_terminal", lambda: True)  # pytest's stdin is not one
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    return FakeApp.seen


def test_chat_passes_the_context_and_session_cache_flags(models, fake_app, capsys) -> None:
    from localspec.tui.chat_options import SESSION_CACHE_BYTES

    assert main(["chat", models["target"]]) == 0
    assert fake_app[-1].context_overflow == "rolling"
    assert fake_app[-1].session_cache_bytes == SESSION_CACHE_BYTES == 2 << 30
    args = ["--context-overflow", "stop", "--session-cache-size", "500M"]
    assert main(["chat", models["target"], *args]) == 0
    assert fake_app[-1].context_overflow == "stop"
    assert fake_app[-1].session_cache_bytes == 500 << 20
    assert main(["chat", models["target"], "--session-cache-size", "0"]) == 0
    assert fake_app[-1].session_cache_bytes == 0
    n = len(fake_app)
    assert main(["chat", models["target"], "--session-cache-size=-2G"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localspec: error: --session-cache-size") and err.count("\n") == 1
    assert len(fake_app) == n  # refused before the app
    with pytest.raises(SystemExit):
        main(["chat", models["target"], "--context-overflow", "wrap"])
    assert "invalid choice" in capsys.readouterr().err
    for cmd in ("chat", "serve"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "--context-overflow {rolling,stop}" in capsys.readouterr().out


def test_targets_by_repo_id_come_from_the_hub_cache(agree, tmp_path, monkeypatch, capsys) -> None:
    """generate (and chat, serve, bench) take org/name[:QUANT]; offline, from the cache,
    with the drafter published beside the GGUF found as usual."""
    from helpers.hubcache import fake_cache

    target, draft = agree
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with open(target, "rb") as t, open(draft, "rb") as d:
        files = {"Agree-Q4_K_M.gguf": t.read(), "Agree-Q4_K_M.eagle3.gguf": d.read()}
    snap = fake_cache(tmp_path / "hf", "tiny/agree", files)
    assert main(["generate", "tiny/agree:q4_k_m", "-p", "abc", "-n", "5", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["text"] == "defgh" and data["drafter"] == str(snap / "Agree-Q4_K_M.eagle3.gguf")
    assert "localspec: tiny/agree: Agree-Q4_K_M.gguf and its drafter" in err
    for cmd in (["generate", "tiny/absent", "-p", "x"], ["chat", "tiny/absent"]):
        assert main(cmd) == 1
        err = capsys.readouterr().err
        assert err.startswith("localspec: error: no such file: tiny/absent, and as a Hugging")
        assert "HF_HUB_OFFLINE" in err and err.count("\n") == 1


# --- what a new user hit (issue 48): the flags' rules, in the flags' words --------------------


def test_no_draft_with_k_says_it_runs_plain(agree, capsys) -> None:
    """--no-draft -k 3 runs plain decoding and says so on stderr, as the README promises for
    -k without a drafter; --no-draft alone asks for nothing more: no note."""
    target, _ = agree
    assert main(["generate", target, "--no-draft", "-k", "3", "-p", "abc", "-n", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "def"
    assert "localspec: warning: -k 3 runs plain decoding: --no-draft drafts nothing" in err
    assert "n_draft" not in err
    assert main(["generate", target, "--no-draft", "-p", "abc", "-n", "3"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_no_drafter_notes_name_the_flags(agree, tmp_path, capsys) -> None:
    import shutil

    lonely = str(tmp_path / "lonely.gguf")  # no drafter beside it
    shutil.copy(agree[0], lonely)
    assert main(["generate", lonely, "-k", "3", "-p", "abc", "-n", "3"]) == 0
    err = capsys.readouterr().err
    assert f"warning: -k 3 runs plain decoding: no drafter found next to {lonely}" in err
    assert err.count("runs plain decoding") == 1  # said once, in flags


def test_a_small_context_is_honoured(agree, capsys) -> None:
    """--ctx 10: the generation stops where a 10-token context ends (llama.cpp allocates 256
    cells; a 10-token context once produced 22 tokens)."""
    target, _ = agree
    assert main(["generate", target, "--ctx", "10", "-p", "abc", "-n", "50", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    st = data["stats"]
    assert data["finish_reason"] == "context_full"
    # the context holds 10 positions; the token predicted after the last one is emitted too
    assert st["prompt_tokens"] + st["generated"] == 10 + 1, st
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0: the model's trained context" in help_text


def test_errors_name_the_flag_typed(models, capsys) -> None:
    """An argument out of range is named by its flag (-n), not by the API's parameter
    (max_tokens)."""
    base = ["generate", models["target"], "--no-draft", "-p", "x"]
    for extra, flag, param in (
        (["-n", "-1"], "-n/--max-tokens must be", "max_tokens"),
        (["--ctx", "-1"], "--ctx must be", "n_ctx"),
        (["--temperature", "-2"], "--temperature must be", None),
        (["--top-p", "2"], "--top-p must be", None),
        (["-t", "0"], "-t/--threads must be", "n_threads"),
        (["-k", "99"], "-k/--n-draft must be", "n_draft"),
        (["--stop", ""], "--stop strings must be", None),
        (["--min-p", "2"], "--min-p must be", "min_p"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be", "repeat_penalty"),
        (["--repeat-last-n", "-3"], "--repeat-last-n must be", "repeat_last_n"),
        (["--dry-base", "0.5"], "--dry-base must be", "dry_base"),
        (["--logit-bias", "15+x"], "--logit-bias must read", "logit_bias"),
        (["--logit-bias", "99999+1"], "--logit-bias names token 99999", "logit_bias"),
        (["--dry-sequence-breaker", ""], "--dry-sequence-breaker must be", None),
    ):
        assert main([*base, *extra]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"localspec: error: {flag}"), err
        assert err.count("\n") == 1
        if param:
            assert param not in err, err
    assert main(["chat", models["target"], "--top-k", "-1"]) == 1
    assert capsys.readouterr().err.startswith("localspec: error: --top-k must be")


def test_sampler_flags_give_the_apis_text(agree, capsys) -> None:
    """llama.cpp's sampler flags reach the engine under the API's names: the text
    Engine.complete gives with the model's recommendation and those settings in their place
    (penalties and a ban change it here; a seed fixes the draw)."""
    target, _ = agree
    flags = ["--seed", "3", "--temperature", "0.7", "--repeat-penalty", "1.3",
             "--presence-penalty", "80", "--repeat-last-n", "40",
             "--min-p", "0.05", "--dry-multiplier", "0.8", "--dry-sequence-breaker", "none",
             "--logit-bias", f"{ord('k')}-inf", "-l", f"{ord('q')}+2.5"]  # fmt: skip
    prompt = "abcdefghijklmnopqrstuvwxyzabc"
    assert main(["generate", target, "-p", prompt, "-n", "40", "--json", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    with localspec.load(target) as eng:  # as the command loads it (the drafter beside it)
        sampling = eng.sampling_with(
            temperature=0.7, repeat_penalty=1.3, presence_penalty=80.0, repeat_last_n=40,
            min_p=0.05, dry_multiplier=0.8, dry_sequence_breakers=[],
            logit_bias={ord("k"): -math.inf, ord("q"): 2.5},
        )  # fmt: skip
        want = eng.complete(prompt, max_tokens=40, seed=3, sampling=sampling)
        plain = eng.complete(
            prompt, max_tokens=40, seed=3, sampling=eng.sampling_with(temperature=0.7)
        )
    assert out["text"] == want.text
    assert want.text != plain.text


def test_zero_tokens_are_refused_by_every_command(models, fake_app, tmp_path, capsys) -> None:
    """generate, chat and bench take one rule for -n: at least one token (the API's
    max_tokens=0, which only reads the prompt, is not a command)."""
    want = "localspec: error: -n/--max-tokens must be an integer in [1, 16777216], got 0\n"
    t = models["target"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "abc"}) + "\n")
    for cmd in (
        ["generate", t, "-p", "x", "-n", "0"],
        ["chat", t, "-n", "0"],
        ["bench", t, "--prompts", str(prompts), "-n", "0", "--out", str(tmp_path / "b")],
    ):
        assert main(cmd) == 1, cmd
        assert capsys.readouterr().err == want, cmd
    assert fake_app == []  # refused before the app


def test_a_folder_as_the_model_is_named_and_the_target_comes_first(models, tmp_path, capsys):
    folder = str(tmp_path)
    for cmd in (["generate", folder, "-p", "x"], ["chat", folder]):
        assert main(cmd) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"localspec: error: {folder} is a folder, not a GGUF file"), err
        assert "target's .gguf" in err and "no such file" not in err
    assert main(["generate", models["target"], "--draft", models["dir"], "-p", "x"]) == 1
    err = capsys.readouterr().err
    assert "is a folder" in err and "drafter's .gguf" in err and "tiny.eagle3.gguf" in err
    # both missing: the target is what is wrong first
    missing_t, missing_d = str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf")
    for cmd in (["generate", missing_t, "--draft", missing_d, "-p", "x"],
                ["chat", missing_t, "--draft", missing_d]):  # fmt: skip
        assert main(cmd) == 1
        assert capsys.readouterr().err == f"localspec: error: no such file: {missing_t}\n"


def test_ngram_source_loads_no_drafter(agree, capsys) -> None:
    """--draft-source ngram drafts from the context: the drafter beside the target is not
    loaded."""
    target, _ = agree
    args = ["generate", target, "-p", ALPHABET, "-n", "8", "--draft-source", "ngram"]
    assert main([*args, "--json", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["drafter"] is None
    assert "no EAGLE drafter loaded (draft source ngram drafts from the context only)" in err


def test_install_hints_match_the_readme(monkeypatch) -> None:
    """The README installs from the checkout: pip install -e ".[train]", pip install
    ".[serve]"; no hint names a localspec package on an index."""
    import glob
    import importlib.util
    import os

    from localspec import cli

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as fh:
        readme = fh.read()
    assert cli.install_hint("train").split(" (")[0] in readme
    assert cli.install_hint("serve").split(" (")[0] in readme
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(cli.LocalspecError, match=r'pip install -e "\.\[train\]"'):
        cli.require_torch("train")
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for path in glob.glob(os.path.join(root, "localspec", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        assert "install 'localspec[" not in text and 'install "localspec[' not in text, path


def test_every_default_is_in_the_help(capsys) -> None:
    """--help of every subcommand shows each option's default (chat's above all)."""
    from localspec.cli import DefaultsHelp, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        fmt = DefaultsHelp(name)
        for action in p._actions:
            default = action.default
            if not action.option_strings or default is None or default is False:
                continue  # nothing to show
            if default in ([], "", argparse.SUPPRESS):
                continue
            text = fmt._get_help_string(action) or ""
            assert "default" in text, (name, action.option_strings)
    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 512)", "(default: 4096)", "rolling (default)",
                  "default: the model's general.sampling.temp, else llama.cpp's 0.8",
                  "general.sampling.top_p, else llama.cpp's 0.95"):  # fmt: skip
        assert shown in out, shown


class FakeCalibrating:
    """An engine whose auto has not timed this machine yet."""

    def __init__(self) -> None:
        self.calls = 0

    def calibration_due(self, **mode) -> bool:
        return self.calls == 0

    def calibrate(self, progress=None, **mode) -> bool:
        self.calls += 1
        for f in (0.0, 0.25, 0.5, 1.0):
            if progress is not None:
                progress(f)
        return True


class FakeTTY:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def test_calibration_is_shown_on_stderr(monkeypatch) -> None:
    """Auto's first-call timing runs before the work, said on stderr: one updating line on a
    terminal, else a line at its start and one with the seconds it took; once."""
    import sys

    from localspec.cli import calibrate_first

    for tty in (True, False):
        err = FakeTTY(tty)
        monkeypatch.setattr(sys, "stderr", err)
        eng = FakeCalibrating()
        calibrate_first(eng)
        calibrate_first(eng)  # timed: nothing more
        assert eng.calls == 1
        if tty:
            assert err.text.count("\n") == 1 and err.text.endswith("\n")
            assert "timing this machine for auto (once)\u2026  25%" in err.text
            assert " done in " in err.text.split("\r")[-1]
        else:
            lines = err.text.splitlines()
            assert lines[0] == "localspec: timing this machine for auto (once)\u2026"
            assert re.fullmatch(r"localspec: timed this machine in \d+\.\d s", lines[1])
            assert len(lines) == 2


def test_generate_times_the_machine_first_and_says_so(agree, capsys) -> None:
    """Auto's timing runs before the generation, said on stderr, and stays out of the
    generation's own statistics; fixed modes need none."""
    target, _ = agree
    assert main(["generate", target, "-p", "abc", "-n", "4", "--json"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    start = lines.index("localspec: timing this machine for auto (once)\u2026")
    assert lines[start + 1].startswith("localspec: timed this machine in ")
    assert json.loads(out)["stats"]["t_calibrate"] == 0
    assert main(["generate", target, "-p", "abc", "-n", "4", "-k", "3"]) == 0
    assert "timing" not in capsys.readouterr().err


def test_cli_quantized_kv_without_flash_attention(models, capsys) -> None:
    for cmd in (["generate", "-p", "x", "-n", "1"], ["chat"]):
        argv = [cmd[0], models["target"], "--kv-type", "q4_0", "--flash-attn", "off", *cmd[1:]]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("localspec: error: kv_type q4_0 quantizes the V cache")
        assert "flash attention" in err and err.count("\n") == 1


@pytest.mark.parametrize("stdin", ["devnull", "pipe"])
def test_chat_without_a_terminal_says_so(models, tmp_path, stdin: str) -> None:
    """Refused after the arguments are checked, before the app starts (it would wait for
    keys forever); the timeout catches an app that started anyway."""
    run = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "chat", models["target"], "--no-draft"],
        stdin=subprocess.DEVNULL if stdin == "devnull" else None,
        input="hello\n" if stdin == "pipe" else None,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOCALSPEC_DATA_DIR": str(tmp_path)},
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("localspec: error: localspec chat needs a terminal")
    assert "standard input is not a TTY" in run.stderr and "localspec generate" in run.stderr
    assert run.stderr.count("\n") == 1 and run.stdout == ""


def test_rollback_reaches_the_engine_from_every_command(tmp_path, capsys) -> None:
    """--rollback (generate, chat, serve, bench) goes into the engine's configuration; a mode
    that does not exist is refused by the flags."""
    from localspec.cli.common import engine_config, engine_options

    from helpers import tinymodels as tm

    q = tm.write_qwen35_target(str(tmp_path / "q.gguf"))
    rc = main(["generate", q, "--rollback", "checkpoint", "-p", "the cat", "-n", "6", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["stats"]["generated"] == 6
    ns = argparse.Namespace(
        ctx=512, threads=2, gpu_layers=0, kv_type="f16", flash_attn="auto", draft_window=None,
        recalibrate=False, rollback="snapshots", draft=None, no_draft=True, draft_source=None,
        n_draft="auto", tree=None,
    )  # fmt: skip
    assert engine_options(ns)["rollback"] == "snapshots"
    cfg = engine_config(ns)
    assert cfg.rollback == "snapshots" and cfg.load_options()["rollback"] == "snapshots"
    with pytest.raises(SystemExit):
        main(["generate", q, "--rollback", "sometimes", "-p", "x"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err
