"""The wheel installs one package, `meterhub`, with every module and data file the code reads;
building it, or the editable install `make` does, prints no warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
#: files the code opens at run time (not imports), as repository paths
DATA_FILES = (
    "hub/site-schema.yaml",
    "hub/templates/admin.html",
    "hub/templates/wallet.html",
    "spawner/options_form.html",
    "billing_hooks/migrations/script.py.mako",
    "images/notebooks/lora-starter.ipynb",
)


def test_every_python_package_directory_is_listed():
    folders = {folder: package for package, folder in SETUPTOOLS["package-dir"].items()}
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for folder, package in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            if not {"__pycache__", "node_modules"} & set(path.parts):
                inner = path.parent.relative_to(ROOT / folder).parts
                found.add(".".join((package, *inner)))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("meterhub-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_has_one_top_level_package(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    code = {top for top in tops if not top.endswith((".dist-info", ".data"))}
    assert code == {"meterhub"}, code
    entry_points = wheel.read(next(n for n in wheel.namelist() if n.endswith("entry_points.txt")))
    assert b"meterhub = meterhub.hub.cli:main" in entry_points
    assert b"public = meterhub.extensions.pool:PublicFileSystem" in entry_points


def test_the_wheel_carries_every_data_file_the_code_reads(wheel):
    names = set(wheel.namelist())
    folders = sorted(SETUPTOOLS["package-dir"].items(), key=lambda kv: len(kv[1]), reverse=True)
    for data in DATA_FILES:
        package, folder = next((p, f) for p, f in folders if data.startswith(f + "/"))
        inside = "/".join([*package.split("."), data[len(folder) + 1 :]])
        assert inside in names, f"{data} is not in the wheel (expected {inside})"


def test_no_generic_top_level_name_is_imported():
    """Code and tests import `meterhub.hub`, never a bare `hub` that another project owns."""
    offenders = []
    for path in ROOT.glob("**/*.py"):
        if any(part in (".venv", "node_modules", "build") for part in path.parts):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            for bare in ("hub", "spawner", "billing_hooks", "extensions"):
                if stripped.startswith((f"from {bare} ", f"from {bare}.", f"import {bare}")):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert not offenders, "\n".join(offenders)


def run_build_hook(hook: str, out: Path) -> str:
    """Call a hook of the project's build backend as a frontend (pip, uv) does: in a fresh
    interpreter in the project's folder, with every warning shown; what it printed."""
    system = PYPROJECT["build-system"]
    paths = [str(ROOT / p) for p in system.get("backend-path", [])]
    code = (
        f"import importlib, sys; sys.path[:0] = {paths!r}; "
        f"backend = importlib.import_module({system['build-backend']!r}); "
        f"print(backend.{hook}({str(out)!r}))"
    )
    # compiling is on (PYTHONDONTWRITEBYTECODE makes setuptools say it skips it): a warning
    # left is one of the build's own
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
    built = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return built.stdout + built.stderr


@pytest.mark.parametrize("hook", ["build_wheel", "build_editable"])
def test_building_prints_no_warning(hook, tmp_path):
    """No deprecated `project.license` table, no package missing from `packages`, no notice
    on the editable install: nothing of our packaging in a newcomer's console."""
    output = run_build_hook(hook, tmp_path)
    warnings = [
        line
        for line in output.splitlines()
        if re.search(r"warning|InformationOnly|deprecat", line, re.IGNORECASE)
    ]
    assert not warnings, "\n".join(warnings) + "\n\n" + output[-3000:]
    assert len(list(tmp_path.glob("meterhub-*.whl"))) == 1
