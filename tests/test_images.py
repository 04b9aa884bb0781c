"""The single-user images' pinned requirements resolve together (no Docker here: pip resolves
them without installing), and they agree with meterhub's own pins."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==")
            found[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return found


def test_image_pins_agree_with_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {}
    for requirement in project["dependencies"] + project["optional-dependencies"]["lab"]:
        name, _, version = requirement.partition("==")
        declared[re.sub(r"[-_.]+", "-", name.split("[")[0].lower())] = version
    image = pins(IMAGES / "singleuser-cpu" / "requirements.txt")
    for name, version in image.items():
        if name in declared:
            assert declared[name] == version, name
    for needed in ("torch", "transformers", "peft", "jupyterlab", "jupyterhub"):
        assert needed in image
    cuda = pins(IMAGES / "singleuser-cuda" / "requirements.txt")
    assert {"bitsandbytes", "jupyterlab-nvdashboard", "jupyter-resource-usage"} <= set(cuda)


def test_image_requirements_resolve_together(tmp_path):
    """The CUDA image's requirements include the CPU image's: one resolution checks both."""
    image = "singleuser-cuda"
    report = tmp_path / "report.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "-r",
            str(IMAGES / image / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    resolved = {
        re.sub(r"[-_.]+", "-", item["metadata"]["name"].lower()): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    for name, version in pins(IMAGES / image / "requirements.txt").items():
        assert resolved[name].split("+")[0] == version, (name, resolved[name])


@pytest.mark.parametrize("image", ["singleuser-cpu", "singleuser-cuda"])
def test_images_enable_the_server_extension_and_ship_the_notebooks(image):
    dockerfile = (IMAGES / image / "Dockerfile").read_text()
    assert "jupyter_server_config.d/meterhub.json" in dockerfile
    assert "COPY images/notebooks /opt/meterhub/notebooks" in dockerfile
    assert "USER 1000" in dockerfile
    config = json.loads((IMAGES / "jupyter_server_config.json").read_text())
    assert config["ServerApp"]["jpserver_extensions"] == {"meterhub.extensions.server": True}
