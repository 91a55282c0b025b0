"""The range checks the API and the command line both apply (localspec/options.py), the
model-path check (localspec/files/model_path.py), and the names that left options.py."""

from __future__ import annotations

import pytest

from localspec.errors import InvalidParameterError, ModelFileError
from localspec.files.model_path import check_model_file
from localspec.options import check_int, check_max_tokens


def test_max_tokens_one_rule_for_the_api_and_for_commands() -> None:
    """The API takes max_tokens=0 (it only reads the prompt); a command wants at least 1."""
    assert check_max_tokens(0) == 0
    assert check_max_tokens(1, least=1) == 1
    with pytest.raises(InvalidParameterError, match=r"^max_tokens must be .* \[1, ") as exc:
        check_max_tokens(0, least=1)
    assert exc.value.parameter == "max_tokens"


def test_invalid_parameters_name_their_parameter() -> None:
    with pytest.raises(InvalidParameterError) as exc:
        check_int("n_ctx", -1, 0, 10)
    assert exc.value.parameter == "n_ctx" and str(exc.value).startswith("n_ctx must")
    assert InvalidParameterError("x").parameter is None


def test_a_folder_given_as_a_model_is_named_as_one(tmp_path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "m.eagle3.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelFileError) as exc:
        check_model_file(str(tmp_path), "target")
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path} is a folder, not a GGUF file: give the target's .gguf")
    assert "m.eagle3.gguf, m.gguf" in msg and "no such file" not in msg
    with pytest.raises(ModelFileError, match="^no such file: "):
        check_model_file(str(tmp_path / "absent.gguf"), "drafter")
    check_model_file(str(tmp_path / "m.gguf"), "target")  # a file passes


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        *(
            ("localspec.options", name, "localspec.rules")
            for name in (
                "API_SPELLING",
                "Drafting",
                "Spelling",
                "check_source_shape",
                "draft_mode",
                "loads_drafter",
                "no_drafter_note",
            )
        ),
        ("localspec.options", "EngineConfig", "localspec.config"),
        ("localspec.options", "check_model_file", "localspec.files.model_path"),
    ],
)
def test_names_that_moved_keep_working_with_a_warning(old: str, name: str, new: str) -> None:
    import importlib

    shim, moved = importlib.import_module(old), importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}"):
        got = getattr(shim, name)
    assert got is getattr(moved, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        shim.no_such_name  # noqa: B018
