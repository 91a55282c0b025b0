"""The wheel holds every package: pyproject lists packages by hand, and a subpackage left out
of the list installs fine in editable mode (the tests' own) but is missing from a real install."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = tool["package-dir"]  # package name -> folder
    found = set()
    for name, folder in dirs.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(base).parts
            found.add(".".join([name, *rel]))
    assert found, dirs
    assert found - listed == set(), "packages missing from pyproject's list"
    assert listed - found == set(), "pyproject lists packages that do not exist"
