"""The images (no Docker here: every check is static). Their pinned requirements resolve together
(pip resolves them without installing) and agree with meterhub's own pins and the chart's; each
Dockerfile builds from a clean checkout: what it copies is in git or made by an earlier stage."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
#: the JupyterHub each zero-to-jupyterhub release runs in its hub image (its
#: images/hub/requirements.txt; z2jh's changelog: 4.3.3 "jupyterhub 5.4.4"). The hub image
#: keeps it (images/README.md says why); bumping the chart means adding its line here.
Z2JH_JUPYTERHUB = {"4.3.3": "5.4.4"}


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==")
            found[re.sub(r"[-_.]+", "-", name.split("[")[0].strip().lower())] = version.strip()
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


@pytest.mark.parametrize(
    "requirements",
    [
        # the CUDA image's include the CPU image's: one resolution checks both
        "singleuser-cuda/requirements.txt",
        "hub/requirements.txt",
        # the environments `meterhub env build` makes and their images install (deepspeed:
        # pytorch.txt, the lab extra, and DeepSpeed's source package; vllm: its own PyTorch)
        "envs/minimal.txt",
        "envs/deepspeed.txt",
        "envs/vllm.txt",
    ],
)
def test_image_requirements_resolve_together(requirements):
    """Resolved as `make` and `meterhub env build` install them: by uv (metadata only,
    seconds, not pip's minutes), with this machine's pip configuration passed on."""
    from meterhub.hub import pyinstall

    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    options, env = pyinstall.uv_arguments(pyinstall.pip_settings(sys.executable))
    out = subprocess.run(
        [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate"]
        + ["--python-version", "3.11", *options, str(IMAGES / requirements)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    resolved = {}
    for line in out.stdout.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            resolved[re.sub(r"[-_.]+", "-", name.split("[")[0].strip().lower())] = version.strip()
    for name, version in pins(IMAGES / requirements).items():
        assert resolved[name].split("+")[0] == version, (name, resolved[name])


@pytest.mark.parametrize("image", ["singleuser-cpu", "singleuser-cuda", "singleuser-envs"])
def test_images_install_meterhub_and_ship_the_notebooks(image):
    dockerfile = (IMAGES / image / "Dockerfile").read_text()
    assert "RUN pip install --no-deps /tmp/meterhub" in dockerfile
    assert "COPY images/notebooks /opt/meterhub/notebooks" in dockerfile
    # stamped for the image's Python, after meterhub is installed (JupyterLab opens them clean)
    stamp = "RUN python -m meterhub.spawner.starters /opt/meterhub/notebooks"
    assert dockerfile.index("RUN pip install --no-deps /tmp/meterhub") < dockerfile.index(stamp)
    assert "USER 1000" in dockerfile
    # the server extension is switched on by installing meterhub, not by a file of the image's own
    assert "jupyter_server_config" not in dockerfile


def build_context(dockerfile: Path, into: Path) -> Path:
    """What the Dockerfile's COPY lines put under /tmp/meterhub, from the repository (as
    .dockerignore does: no node_modules, no __pycache__)."""
    ignore = shutil.ignore_patterns("node_modules", "__pycache__")
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or not words[-1].startswith("/tmp/meterhub"):
            continue
        *sources, target = words[1:]
        if sources[0].startswith("--from="):
            # the extension stage's output (tested apart): a stand-in of the same shape
            stand_in = into / target.removeprefix("/tmp/meterhub").strip("/")
            (stand_in / "static").mkdir(parents=True)
            (stand_in / "package.json").write_text('{"name": "@meterhub/credit-status"}')
            (stand_in / "static" / "remoteEntry.js").write_text("")
            continue
        for source in sources:
            for path in sorted(ROOT.glob(source)):  # a plain path, or extensions/*.py
                destination = into / target.removeprefix("/tmp/meterhub").strip("/")
                if target.endswith("/"):
                    destination = destination / path.name
                destination.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir():
                    shutil.copytree(path, destination, ignore=ignore)
                else:
                    shutil.copy(path, destination)
    return into


@pytest.mark.parametrize("image", ["singleuser-cpu", "singleuser-cuda"])
def test_installing_meterhub_in_an_image_enables_the_server_extension(image, tmp_path):
    """The wheel built from what the image copies carries the config file that switches the
    server extension on, for {prefix}/etc/jupyter, where every jupyter_server looks."""
    context = build_context(IMAGES / image / "Dockerfile", tmp_path / "meterhub")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(tmp_path / "wheel"), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("meterhub-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        name = "meterhub-0.1.0.data/data/etc/jupyter/jupyter_server_config.d/meterhub.json"
        config = json.loads(archive.read(name))
    assert config["ServerApp"]["jpserver_extensions"] == {"meterhub.extensions.server": True}


# -- Dockerfiles build from a clean checkout ---------------------------------------------------


def instructions(text: str) -> list[tuple[str, list[str]]]:
    """A Dockerfile's instructions as (KEYWORD, words), continuation lines joined and comments
    dropped; the JSON form of COPY/ADD (`COPY ["a", "b"]`) is read as its words."""
    found, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        rest = rest.strip()
        if keyword.upper() in ("COPY", "ADD") and "[" in rest:
            flags, _, array = rest.partition("[")
            words = flags.split() + json.loads("[" + array)
        else:
            words = rest.split()
        found.append((keyword.upper(), words))
        pending = ""
    return found


def is_tracked(source: str, tracked: list[str]) -> bool:
    """Whether a COPY source is in a clean checkout: a tracked file, a folder holding one, or a
    glob matching one (not a git-ignored path such as extensions/lab or .venv)."""
    source = posixpath.normpath(source.removeprefix("./"))
    if source == ".":
        return bool(tracked)
    return any(
        path == source or path.startswith(source + "/") or fnmatch.fnmatchcase(path, source)
        for path in tracked
    )


def dockerfile_problems(text: str, tracked: list[str], needed: list[str] = ()) -> list[str]:
    """What stops `docker build` from a clean checkout: a COPY/ADD source that git does not
    track, a `--from=` or `FROM` naming no earlier stage, and a file of `needed` (repository
    paths that `pip install /tmp/meterhub` reads) that reaches /tmp/meterhub neither from git
    nor from an earlier stage."""
    problems, stages, reached, built = [], [], set(), []
    for keyword, words in instructions(text):
        if keyword == "FROM":
            image = next(w for w in words if not w.startswith("--"))
            if "AS" in (w.upper() for w in words):
                stages.append(words[-1].lower())
            elif (
                not {":", "/", "@", "$"} & set(image)  # `$`: an ARG names an outside image
                and image.lower() not in stages
            ):
                problems.append(f"FROM {image}: no such stage above")
            continue
        if keyword not in ("COPY", "ADD"):
            continue
        flags = [w for w in words if w.startswith("--")]
        *sources, target = [w for w in words if not w.startswith("--")]
        stage = next((f.partition("=")[2] for f in flags if f.startswith("--from=")), None)
        for source in sources:
            if stage is not None:
                if stage.lower() not in stages:
                    problems.append(f"COPY --from={stage} {source}: no stage {stage} above")
                elif target.startswith("/tmp/meterhub"):
                    built.append(target.removeprefix("/tmp/meterhub").strip("/"))
            elif not is_tracked(source, tracked):
                problems.append(f"{keyword} {source}: not in a clean checkout (git-ignored?)")
            elif target.startswith("/tmp/meterhub"):
                inside = target.removeprefix("/tmp/meterhub").strip("/")
                for path in tracked:
                    if path == source or fnmatch.fnmatchcase(path, source):
                        into = posixpath.join(inside, posixpath.basename(path))
                        reached.add(into if target.endswith("/") else inside)
                    elif path.startswith(source.rstrip("/") + "/"):
                        reached.add(posixpath.join(inside, path[len(source.rstrip("/")) + 1 :]))
    for path in needed:
        if path not in reached and not any(path.startswith(out + "/") for out in built):
            problems.append(
                f"{path}: pip needs it in /tmp/meterhub; neither git nor a stage has it"
            )
    return problems


def git_tracked() -> list[str]:
    """The files of a clean checkout: git's, and new ones not yet committed but not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def wheel_data_files() -> list[str]:
    """The data files pip reads from /tmp/meterhub, glob patterns expanded to one example."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return [
        path.replace("*", "remoteEntry.js")
        for paths in data["data-files"].values()
        for path in paths
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.parent.name)
def test_dockerfile_builds_from_a_clean_checkout(dockerfile):
    text = dockerfile.read_text()
    needed = wheel_data_files() if "/tmp/meterhub" in text else []
    assert dockerfile_problems(text, git_tracked(), needed) == []


def test_the_check_finds_what_broke_the_build():
    """The shape the images had: extensions/lab (git-ignored, built by `make`) reached pip only
    through `COPY extensions`, so a clean clone could not build them."""
    tracked = ["pyproject.toml", "extensions/server.py", "extensions/labextension/package.json"]
    needed = ["extensions/lab/package.json"]
    old = "FROM python:3.11-slim\nCOPY extensions /tmp/meterhub/extensions\n"
    assert dockerfile_problems(old, tracked, needed) == [
        "extensions/lab/package.json: pip needs it in /tmp/meterhub; neither git nor a stage has it"
    ]
    ignored = "FROM python:3.11-slim\nCOPY extensions/lab .venv /tmp/meterhub/\n"
    assert dockerfile_problems(ignored, tracked) == [
        "COPY extensions/lab: not in a clean checkout (git-ignored?)",
        "COPY .venv: not in a clean checkout (git-ignored?)",
    ]
    misnamed = (
        "FROM node:22 AS labextension\nRUN npm run build\nFROM python:3.11-slim\n"
        "COPY --from=lab /src/extensions/lab /tmp/meterhub/extensions/lab\nFROM builder\n"
    )
    assert dockerfile_problems(misnamed, tracked, needed) == [
        "COPY --from=lab /src/extensions/lab: no stage lab above",
        "FROM builder: no such stage above",
        "extensions/lab/package.json: pip needs it in /tmp/meterhub; neither git nor a stage has it",
    ]
    fixed = (
        "FROM node:22 AS labextension\nCOPY extensions/labextension ./\nRUN npm run build\n"
        "FROM python:3.11-slim\nCOPY extensions/*.py /tmp/meterhub/extensions/\n"
        "COPY --from=labextension /src/extensions/lab /tmp/meterhub/extensions/lab\n"
    )
    assert dockerfile_problems(fixed, tracked, needed) == []


def stage(text: str, name: str) -> str:
    """The lines of one build stage, `FROM ... AS name` to the next FROM."""
    found = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM )", text, re.M | re.S)
    assert found, f"no stage {name}"
    return found.group(0)


def test_every_image_builds_the_lab_extension_the_same_way():
    stages = {path.parent.name: stage(path.read_text(), "labextension") for path in DOCKERFILES}
    assert len(set(stages.values())) == 1, "the labextension stages differ"
    lab = next(iter(stages.values()))
    # npm ci from the lock file, then the package's own build script, as the Makefile does
    assert "RUN npm ci " in lab and "RUN npm run build" in lab
    package = json.loads((ROOT / "extensions/labextension/package.json").read_text())
    assert "jupyter-builder build" in package["scripts"]["build"]
    # JupyterLab's Python builder at the images' JupyterLab
    jupyterlab = pins(IMAGES / "singleuser-cpu" / "requirements.txt")["jupyterlab"]
    assert f"jupyterlab=={jupyterlab}" in lab
    # what the later stages copy is where the build writes it (package.json's outputDir)
    workdir = re.search(r"^WORKDIR (\S+)", lab, re.M).group(1)
    output = posixpath.normpath(posixpath.join(workdir, package["jupyterlab"]["outputDir"]))
    for path in DOCKERFILES:
        copied = re.findall(r"^COPY --from=labextension (\S+) (\S+)", path.read_text(), re.M)
        assert copied == [(output, "/tmp/meterhub/extensions/lab")], path


@pytest.mark.parametrize("image", ["singleuser-cpu", "singleuser-cuda"])
def test_singleuser_images_have_meterhubs_extensions(image):
    text = (IMAGES / image / "Dockerfile").read_text()
    assert "COPY --from=labextension" in text  # the JupyterLab extension
    assert "COPY extensions/*.py /tmp/meterhub/extensions/" in text  # widgets, public://, server
    copies = [" ".join(words) for keyword, words in instructions(text) if keyword == "COPY"]
    assert len(copies) == len(set(copies)), "a COPY line is repeated"


def test_the_cuda_image_has_cuda():
    text = (IMAGES / "singleuser-cuda" / "Dockerfile").read_text()
    assert re.search(r"^FROM nvidia/cuda:12\.8\.\d+-cudnn-runtime-\S+$", text, re.M)
    assert "--extra-index-url https://download.pytorch.org/whl/cu128" in text


def test_the_hub_image_runs_the_charts_jupyterhub():
    """The hub image keeps the JupyterHub of the z2jh release the chart pins (no z2jh release
    runs JupyterHub 6), and otherwise meterhub's own hub-side pins."""
    chart = yaml.safe_load((ROOT / "helm" / "meterhub" / "Chart.yaml").read_text())
    (z2jh,) = chart["dependencies"]
    assert z2jh["version"] in Z2JH_JUPYTERHUB, "new z2jh chart: which JupyterHub does it run?"
    hub = pins(IMAGES / "hub" / "requirements.txt")
    assert hub["jupyterhub"] == Z2JH_JUPYTERHUB[z2jh["version"]]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {}
    for requirement in project["dependencies"]:
        name, _, version = requirement.partition("==")
        declared[re.sub(r"[-_.]+", "-", name.split("[")[0].lower())] = version
    del declared["jupyterhub"]
    del hub["jupyterhub"]
    assert hub == declared
    text = (IMAGES / "hub" / "Dockerfile").read_text()
    assert f"FROM quay.io/jupyterhub/k8s-hub:{z2jh['version']}" in text
    # meterhub's own `jupyterhub==6.x` must not reach pip: it would replace the chart's
    assert "pip install --no-cache-dir -r /tmp/req/hub/requirements.txt" in text
    assert "pip install --no-cache-dir --no-deps /tmp/meterhub" in text


def test_every_built_in_environments_image_is_built_by_the_environments_dockerfile():
    """One Dockerfile for the environments other than pytorch, chosen by `--build-arg ENV`:
    each built-in environment with an image of its own has its build command there and its
    branch in install-env, and installs its own pinned file."""
    from meterhub.spawner.environments import BUILTIN_ENVIRONMENTS

    dockerfile = (IMAGES / "singleuser-envs" / "Dockerfile").read_text()
    install = (IMAGES / "singleuser-envs" / "install-env").read_text()
    branches = re.search(r"^case .*?^esac", install, re.M | re.S).group(0)
    imaged = [e for e in BUILTIN_ENVIRONMENTS.values() if e.image]
    assert {e.slug for e in imaged} == {"minimal", "deepspeed", "vllm"}
    for environment in imaged:
        name = environment.image.rsplit("/", 1)[1]  # singleuser-vllm:0.1.0
        assert f"--build-arg ENV={environment.slug}" in dockerfile
        assert f"meterhub/{name} ." in dockerfile, name
        assert re.search(rf"(^|[ |]){environment.slug}[|)]", branches, re.M), environment.slug
        assert (IMAGES / "envs" / environment.requirements).exists()
    # an environment install-env does not know is refused, not built as another
    refused = subprocess.run(
        ["sh", str(IMAGES / "singleuser-envs" / "install-env"), "jax"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "no image for the environment jax" in refused.stderr
