"""The project's habits, checked: pre-commit's hooks can run, and the billing code type-checks."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RUFF_HOOKS = "https://github.com/astral-sh/ruff-pre-commit"


def _pre_commit() -> dict:
    return yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())


def _local_hooks() -> dict[str, dict]:
    return {
        hook["id"]: hook
        for repo in _pre_commit()["repos"]
        if repo["repo"] == "local"
        for hook in repo["hooks"]
    }


def test_pre_commit_runs_the_ruff_that_the_project_pins():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = [p for p in pins["optional-dependencies"]["test"] if p.startswith("ruff==")]
    (ruff,) = [repo for repo in _pre_commit()["repos"] if repo["repo"] == RUFF_HOOKS]
    assert pinned == [f"ruff=={version('ruff')}"]
    assert ruff["rev"] == f"v{version('ruff')}"
    assert [hook["id"] for hook in ruff["hooks"]] == ["ruff-check", "ruff-format"]


def test_every_local_hook_names_something_that_exists():
    hooks = _local_hooks()
    assert set(hooks) == {"generate", "i18n", "prettier"}
    for hook in hooks.values():
        assert hook["language"] == "system"
        program = shlex.split(hook["entry"])[0]
        assert (ROOT / program).exists() or shutil.which(program), hook["entry"]
        # every file the hook concerns is one of ours
        assert any(
            re.search(hook["files"], path)
            for path in subprocess.run(
                ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.splitlines()
        ), hook["id"]

    generate = shlex.split(hooks["generate"]["entry"])
    assert generate[1:3] == ["-m", "tools.generate"]
    assert (ROOT / "tools" / "generate.py").exists()

    assert shlex.split(hooks["i18n"]["entry"])[1:] == ["-m", "tools.i18n"]
    files = re.compile(hooks["i18n"]["files"])
    assert files.search("hub/templates/wallet.html") and files.search("billing_hooks/meter.py")
    assert files.search("extensions/labextension/src/status.ts")

    prettier = shlex.split(hooks["prettier"]["entry"])
    assert prettier[:3] == ["npm", "--prefix", "extensions/labextension"]
    scripts = json.loads((ROOT / "extensions/labextension/package.json").read_text())["scripts"]
    assert prettier[-1] in scripts
    assert "prettier" in scripts[prettier[-1]]


def test_the_generate_hook_runs_when_a_source_or_an_output_changes():
    from tools import generate, helm_schema

    files = re.compile(_local_hooks()["generate"]["files"])
    sources = [ROOT / "hub" / "site-schema.yaml", helm_schema.VALUES_SCHEMA]
    for path in [*sources, *generate.outputs()]:
        relative = path.relative_to(ROOT).as_posix()
        assert files.search(relative), relative
    assert not files.search("billing_hooks/api.py")


def test_mypy_is_clean_on_billing():
    if find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "billing_hooks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
