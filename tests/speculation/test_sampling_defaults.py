"""The sampling a user gets without asking: the model's recommendation from its GGUF
(general.sampling.*, read as llama.cpp reads them), else llama.cpp's defaults, in generate,
chat and serve; the API stays greedy by default; bench stays greedy and says so."""

from __future__ import annotations

import json

import openai
import pytest

import localspec
from localspec.cli import main
from localspec.options import LLAMA_SAMPLING
from localspec.speculation.sampling import SamplingParams

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.server import running

RECOMMENDS = {
    "general.sampling.temp": 0.6,
    "general.sampling.top_k": 20,
    "general.sampling.top_p": 0.9,
    "general.sampling.min_p": 0.1,
    "general.sampling.penalty_last_n": 32,
    "general.sampling.penalty_repeat": 1.1,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("defaults")
    return {
        "plain": tm.write_target(str(d / "plain.gguf")),
        "recommends": tm.write_target(str(d / "rec.gguf"), kv=RECOMMENDS),
        "odd": tm.write_target(
            str(d / "odd.gguf"),
            kv={
                "general.sampling.top_p": "high",  # no number: llama.cpp's default stays
                "general.sampling.top_k": -1,  # llama.cpp's "all tokens"
                "general.sampling.temp": 0.3,
                "general.sampling.mirostat": 2,
                "general.sampling.sequence": "top_k;temperature",
            },
        ),
    }


def test_the_models_recommendation_else_llama_cpps_defaults(files) -> None:
    with localspec.load(files["plain"], draft=False, **EXACT) as eng:
        assert eng.recommended_sampling == SamplingParams(**LLAMA_SAMPLING)
        assert eng.sampling_notes == {}
    with localspec.load(files["recommends"], draft=False, **EXACT) as eng:
        sp = eng.recommended_sampling
        assert (sp.temperature, sp.top_k, sp.min_p, sp.repeat_last_n) == (0.6, 20, 0.1, 32)
        assert sp.top_p == pytest.approx(0.9) and sp.repeat_penalty == pytest.approx(1.1)
        # a setting given takes its place; the rest stay the model's
        mine = eng.sampling_with(temperature=0.0, presence_penalty=0.5)
        assert mine.greedy and mine.top_k == 20 and mine.presence_penalty == 0.5
        assert eng.sampling_with() == sp
    with localspec.load(files["odd"], draft=False, **EXACT) as eng:
        sp = eng.recommended_sampling
        assert sp.temperature == pytest.approx(0.3) and sp.top_p == 0.95 and sp.top_k == 0
        notes = eng.sampling_notes
        assert set(notes) == {
            "general.sampling.top_p",
            "general.sampling.mirostat",
            "general.sampling.sequence",
        }
        assert "not a usable top_p" in notes["general.sampling.top_p"]


def test_the_api_stays_greedy_by_default(files) -> None:
    """Scripts written against the README keep their text: complete() is greedy unless told."""
    with localspec.load(files["recommends"], draft=False, **EXACT) as eng:
        a = eng.complete("abc", max_tokens=24)
        b = eng.complete("abc", max_tokens=24, temperature=0.0)
        assert a.tokens == b.tokens


def test_generate_samples_as_the_model_recommends(files, capsys) -> None:
    """No sampler flag: the model's recommendation (the text of sampling_with() for the
    seed); --temperature 0 is greedy; a flag given replaces only its own setting."""
    t = files["recommends"]
    runs = {}
    for name, flags in (
        ("default", []),
        ("greedy", ["--temperature", "0"]),
        ("top_k", ["--top-k", "3"]),
    ):
        cmd = ["generate", t, "--no-draft", "-p", "abc", "-n", "24", "--seed", "7", "--json"]
        assert main([*cmd, *flags]) == 0
        runs[name] = json.loads(capsys.readouterr().out)["text"]
    with localspec.load(t, draft=False) as eng:
        want = {
            "default": eng.complete("abc", max_tokens=24, seed=7, sampling=eng.sampling_with()),
            # greedy, with the model's other settings (its repeat penalty here)
            "greedy": eng.complete(
                "abc", max_tokens=24, sampling=eng.sampling_with(temperature=0.0)
            ),
            "top_k": eng.complete(
                "abc", max_tokens=24, seed=7, sampling=eng.sampling_with(top_k=3)
            ),
        }
    for name, c in want.items():
        assert runs[name] == c.text, name
    assert runs["default"] != runs["greedy"]  # it samples


def test_generate_says_what_the_model_recommends_and_was_left_out(files, capsys) -> None:
    assert main(["generate", files["odd"], "--no-draft", "-p", "abc", "-n", "4"]) == 0
    err = capsys.readouterr().err
    assert "general.sampling.mirostat = 2 is a sampler localspec does not offer" in err
    assert "general.sampling.top_p = 'high' is not a usable top_p" in err


def test_help_shows_every_sampling_default(capsys) -> None:
    for cmd in ("generate", "chat"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "default: the model's general.sampling.temp, else llama.cpp's 0.8" in text
        assert "general.sampling.top_k, else llama.cpp's 40" in text
        assert "general.sampling.top_p, else llama.cpp's 0.95" in text
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "0: greedy, bench's default for measurement" in text


def test_serve_samples_as_the_model_recommends(files) -> None:
    """A request that names no sampler: the model's recommendation (OpenAI's temperature 1
    no longer); one it names replaces only that setting."""
    t = files["recommends"]
    with (
        localspec.load(t, draft=False, **EXACT) as served,
        localspec.load(t, draft=False, **EXACT) as ref,
        running(served) as u,
    ):
        client = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0)
        for seed in (1, 2):
            r = client.completions.create(model="x", prompt="abc", max_tokens=20, seed=seed)
            want = ref.complete("abc", max_tokens=20, seed=seed, sampling=ref.sampling_with())
            assert r.choices[0].text == want.text
        r = client.completions.create(
            model="x", prompt="abc", max_tokens=20, seed=3, temperature=1.5
        )
        want = ref.complete(
            "abc", max_tokens=20, seed=3, sampling=ref.sampling_with(temperature=1.5)
        )
        assert r.choices[0].text == want.text


def test_info_says_how_the_model_samples(files, capsys) -> None:
    assert main(["info", files["recommends"]]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("sampling"))
    assert "penalties(last 32, repeat 1.1" in line and "temperature 0.6" in line
    assert "the model's general.sampling.*" in line
    assert main(["info", files["odd"], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["sampling"]
    assert data["from_model"] == ["general.sampling.temp", "general.sampling.top_k"]
    assert any("mirostat" in n for n in data["notes"])
