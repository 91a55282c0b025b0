"""`localspec info`: what a GGUF target or drafter is, and whether a drafter pairs."""

from __future__ import annotations

import json

from localspec.cli import main
from localspec.files.fileinfo import describe, format_info

from helpers import tinymodels as tm


def test_describe_target(models) -> None:
    info = describe(models["target"])
    assert info["kind"] == "target" and info["architecture"] == "llama"
    assert info["block_count"] == 4 and info["embedding_length"] == 64
    assert info["vocab_size"] == tm.N_VOCAB and info["chat_template"]
    assert info["taps_via"] == "staging API"
    assert info["tensor_types"] == {"F32": 4 * 9 + 3}


def test_info_says_how_a_target_is_tapped(tmp_path) -> None:
    q2 = tm.write_target(str(tmp_path / "q2.gguf"), tm.TargetShape(arch="qwen2"))
    assert describe(q2)["taps_via"] == "graph callback"
    mamba = tm.write_mamba_target(str(tmp_path / "m.gguf"))
    assert describe(mamba)["taps_via"] == "graph callback"  # recurrent graphs name l_out too
    assert "through the graph's eval callback" in format_info(describe(mamba))
    assert "eval callback" in format_info(describe(q2))


def test_describe_drafter(models, tmp_path) -> None:
    path = tm.write_drafter(
        str(tmp_path / "d.gguf"),
        models["target"],
        tm.DrafterShape(fc_norm=True, norm_output=True, draft_vocab=64),
    )
    d = describe(path)["drafter"]
    assert d["variant"] == "EAGLE-3.1" and d["fc_norm"] and d["norm_output"]
    assert d["taps"] == [1, 2, 3] and d["target_hidden_size"] == 64
    assert d["draft_vocab"] == 64 and d["own_output"] and not d["own_token_embd"]
    assert d["made_for"]["block_count"] == 4 and d["made_for"]["architecture"] == "llama"


def test_cli_info_text_and_pairing(models, capsys) -> None:
    assert main(["info", models["draft31"], "--target", models["target"]]) == 0
    out = capsys.readouterr().out
    assert "EAGLE-3.1 (fc_norm, norm_output)" in out
    assert "inputs of target layers [1, 2, 3]" in out
    assert "pairs with" in out and ": yes" in out


def test_cli_info_reports_a_mismatch(models, tmp_path, capsys) -> None:
    wide = tm.write_target(str(tmp_path / "wide.gguf"), tm.TargetShape(n_embd=96))
    # exit 1 with --json too: scripts that check the status must see the mismatch
    assert main(["info", models["draft"], "--target", wide, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["pairs_with"]["ok"] is False
    assert "hidden size" in data["pairs_with"]["problem"]
    assert main(["info", models["draft"], "--target", wide]) == 1
    assert "NO: drafter" in capsys.readouterr().out
    assert main(["info", models["draft"], "--target", models["target"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs_with"]["ok"] is True


def test_cli_info_bad_file(tmp_path, capsys) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + b"\x00" * 10)
    assert main(["info", str(p)]) == 1
    assert capsys.readouterr().err.startswith("localspec: error:")
