"""A non-editable install (the hub image) ships every module and data file the code reads."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_python_package_directory_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for top in listed:
        top_dir = ROOT / top.split(".")[0]
        for path in top_dir.rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add(".".join(path.parent.relative_to(ROOT).parts))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_data_files_are_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]
    for data in (
        "hub/site-schema.yaml",
        "hub/templates/admin.html",
        "spawner/options_form.html",
        "billing_hooks/migrations/script.py.mako",
    ):
        package, name = data.rsplit("/", 1)
        dotted = package.replace("/", ".")
        owner = next(p for p in sorted(patterns, key=len, reverse=True) if dotted.startswith(p))
        relative = str(Path(data).relative_to(owner.replace(".", "/")))
        assert any(Path(relative).match(g) for g in patterns[owner]), data
