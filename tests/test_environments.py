"""Environments without a hub: the catalog's list and user options, the site config, what a
backend runs (built or not), the spawn form, Kubernetes' images, the build command and its
pinned requirements. tests/test_environments_hub.py starts real servers in them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from meterhub.hub import env_cli
from meterhub.hub.config import ConfigError, apply_config, load_site_config
from meterhub.spawner.catalog import Catalog, InvalidChoice
from meterhub.spawner.environments import (
    BUILD_INFO,
    BUILTIN_ENVIRONMENTS,
    EnvironmentNotReady,
    builtin_requirements_dir,
    environment_prefix,
    merge_environments,
)
from meterhub.spawner.form import EnvironmentOption, environment_options, render_options_form
from meterhub.spawner.sandbox import SandboxSpec, bwrap_command

from .test_images import pins

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "images" / "envs"


# ------------------------------------------------------------------ the list


def test_the_built_in_environments_with_pytorch_the_default():
    environments = merge_environments(None)
    assert list(environments) == ["pytorch", "deepspeed", "vllm", "minimal"]
    assert [e.slug for e in environments.values() if e.default] == ["pytorch"]
    assert [e.slug for e in environments.values() if e.gpu_only] == ["vllm"]
    # pytorch runs from the servers' own environment; the others are built
    assert not environments["pytorch"].builds
    assert all(environments[s].builds for s in ("deepspeed", "vllm", "minimal"))


def test_a_site_list_offers_exactly_its_entries_and_overrides_built_in_fields():
    environments = merge_environments(
        [
            {"slug": "minimal", "display_name": "Lean"},
            {"slug": "vllm"},
            {"slug": "jax", "display_name": "JAX", "image": "example.org/jax:1", "default": True},
        ]
    )
    assert list(environments) == ["minimal", "vllm", "jax"]
    assert environments["minimal"].display_name == "Lean"
    assert environments["minimal"].requirements == "minimal.txt"  # kept from the built-in
    assert environments["vllm"].gpu_only  # a built-in's own flag stays unless overridden
    assert [e.slug for e in environments.values() if e.default] == ["jax"]
    # no default given: the first is
    assert merge_environments([{"slug": "minimal"}, {"slug": "pytorch"}])["minimal"].default


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        ([{"slug": "jax"}], r"environments\.0\.display_name: required"),
        ([{"slug": "jax", "display_name": "JAX"}], r"environments\.0: a new environment needs"),
        ([{"slug": "Bad_Slug"}], r"environments\.0\.slug: an environment's slug is"),
        (
            [{"slug": "minimal"}, {"slug": "minimal"}],
            r"environments\.1\.slug: 'minimal' is listed twice",
        ),
        ([{"slug": "minimal", "size": 3}], r"environments\.0\.size: unknown key"),
        (
            [{"slug": "minimal", "default": True}, {"slug": "pytorch", "default": True}],
            r"only one environment may be the default \(minimal, pytorch\)",
        ),
        ([{"slug": "vllm", "default": True}], r"the default environment 'vllm' is gpu_only"),
        (
            [{"slug": "minimal", "gpu_only": "yes"}],
            r"environments\.0\.gpu_only: expected true or false",
        ),
    ],
)
def test_a_bad_list_is_refused_naming_the_key(entries, problem):
    with pytest.raises(ValueError, match=problem):
        merge_environments(entries)


def test_the_site_config_checks_the_list_and_resolves_the_sites_own_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"environments": [{"slug": "jax", "display_name": "JAX"}]}))
    with pytest.raises(ConfigError, match=r"environments\.0: a new environment needs"):
        load_site_config(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"environments": [{"slug": "minimal", "size": 3}]}))
    with pytest.raises(ConfigError, match=r"environments\.0\.size: unknown key \(allowed here: "):
        load_site_config(unknown)
    good = tmp_path / "good.yaml"
    site = {
        "environments": [
            {"slug": "pytorch"},
            {"slug": "jax", "display_name": "JAX", "requirements": "./envs/jax.txt"},
            {"slug": "minimal", "requirements": "minimal.txt"},
        ]
    }
    good.write_text(yaml.safe_dump(site))
    loaded = load_site_config(good, cwd=str(tmp_path))
    assert loaded["environments"][1]["requirements"] == str(tmp_path / "envs" / "jax.txt")
    assert loaded["environments"][2]["requirements"] == "minimal.txt"  # meterhub's own
    assert "gpu_only" not in loaded["environments"][0]  # no schema default over a built-in's
    catalog = Catalog(config=apply_config(loaded, __import__("traitlets.config").config.Config()))
    assert list(catalog.environments_offered()) == ["pytorch", "jax", "minimal"]


# ------------------------------------------------------------------ user options


def test_user_options_name_an_environment_or_get_the_default():
    catalog = Catalog()
    plain = catalog.parse({"profile": "debug"})
    assert plain.environment is None and plain.user_options == {"profile": "debug"}
    assert catalog.environment_of(plain).slug == "pytorch"
    chosen = catalog.parse({"profile": "debug", "environment": "minimal"})
    assert chosen.environment.slug == "minimal"
    assert chosen.user_options == {"profile": "debug", "environment": "minimal"}
    assert catalog.parse(chosen.user_options) == chosen  # a restart gets the same choice
    gpu = catalog.parse({"profile": "a800", "gpus": "1", "environment": "vllm"})
    assert (
        gpu.environment.slug == "vllm"
        and gpu.rate_per_hour == catalog.choice("a800", 1).rate_per_hour
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"profile": "debug", "environment": "vllm"}, "The vLLM environment needs a GPU"),
        (
            {"profile": "debug", "environment": "nope"},
            "Unknown environment 'nope'; choose one of: pytorch, deepspeed, vllm, minimal",
        ),
        ({"profile": "debug", "environment": ["minimal"]}, "Unknown environment ['minimal']"),
        ({"profile": "debug", "environment": "../../etc"}, "Unknown environment '../../etc'"),
    ],
)
def test_a_bad_environment_is_refused_with_what_to_do(options, message):
    with pytest.raises(InvalidChoice) as refused:
        Catalog().parse(options)
    assert message in str(refused.value)


# ------------------------------------------------------------------ built or not


def _fake_build(envs_dir: Path, slug: str, name: str) -> Path:
    folder = envs_dir / ".builds" / name
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "jupyterhub-singleuser").write_text("#!/bin/sh\n")
    (folder / BUILD_INFO).write_text(json.dumps({"slug": slug}))
    link = envs_dir / slug
    if link.is_symlink():
        link.unlink()
    link.symlink_to(Path(".builds") / name)
    return folder


def test_a_server_runs_from_the_build_the_link_names_then_and_not_an_unfinished_one(tmp_path):
    minimal = BUILTIN_ENVIRONMENTS["minimal"]
    with pytest.raises(EnvironmentNotReady, match="meterhub env build minimal"):
        environment_prefix(minimal, str(tmp_path), "/srv/servers")
    first = _fake_build(tmp_path, "minimal", "minimal-1")
    assert environment_prefix(minimal, str(tmp_path), "/srv/servers") == str(first)
    second = _fake_build(tmp_path, "minimal", "minimal-2")
    assert environment_prefix(minimal, str(tmp_path), "/srv/servers") == str(second)
    (second / BUILD_INFO).unlink()  # a build that did not finish is no environment
    with pytest.raises(EnvironmentNotReady):
        environment_prefix(minimal, str(tmp_path), "/srv/servers")
    # the built-in pytorch runs from the servers' environment; a prefix must hold a server
    assert environment_prefix(BUILTIN_ENVIRONMENTS["pytorch"], str(tmp_path), "/srv/x") == "/srv/x"
    own = merge_environments([{"slug": "conda", "display_name": "Conda", "prefix": str(tmp_path)}])
    with pytest.raises(EnvironmentNotReady, match="has no jupyterhub-singleuser"):
        environment_prefix(own["conda"], str(tmp_path), "/srv/x")


def test_a_start_runs_the_prefix_its_own_check_found_and_looks_again_otherwise(tmp_path):
    """The options' check (apply_user_options) finds the choice's environment; the start
    that follows runs from that prefix without a second look, once, and only for the same
    choice: any other start resolves it again (and is refused if it is not built)."""
    import asyncio
    from types import SimpleNamespace

    from tornado import web

    from meterhub.spawner.local import LocalGPUSpawner

    ann = SimpleNamespace(name="ann", id=1, url="/user/ann/", groups=[])
    s = LocalGPUSpawner(
        user=ann, data_dir=str(tmp_path / "data"), starter_notebooks_dir="",
        envs_dir=str(tmp_path / "envs"), server_env_prefix="/srv/servers",
    )  # fmt: skip
    minimal = s.catalog.parse({"profile": "debug", "environment": "minimal"})
    pytorch = s.catalog.parse({"profile": "debug"})
    first = _fake_build(tmp_path / "envs", "minimal", "minimal-1")
    s.check_ready(minimal)
    second = _fake_build(tmp_path / "envs", "minimal", "minimal-2")
    asyncio.run(s.resolve_environment(minimal))
    assert s.env_prefix == str(first)  # what this spawn's check found
    asyncio.run(s.resolve_environment(minimal))
    assert s.env_prefix == str(second)  # a start without a check of its own looks again
    s.check_ready(minimal)
    asyncio.run(s.resolve_environment(pytorch))  # another choice than the one checked
    assert s.env_prefix == "/srv/servers"
    (second / BUILD_INFO).unlink()
    with pytest.raises(web.HTTPError) as e:
        asyncio.run(s.resolve_environment(minimal))  # the check was for the other start
    assert e.value.status_code == 409


def test_an_environment_built_inside_the_hidden_data_directory_is_bound_over_it():
    spec = SandboxSpec(
        disk="/opt/meterhub/data/disks/amy",
        disk_mount="/home/jovyan",
        pool=None,
        pool_mount="/public",
        ro_paths=("/opt/meterhub/data/envs/.builds/minimal-1",),
        hidden=("/opt/meterhub/data",),
    )
    args = bwrap_command(spec, ["jupyterhub-singleuser"])
    tmpfs = args.index("/opt/meterhub/data", args.index("--tmpfs"))
    rebound = [i for i, a in enumerate(args) if a == "/opt/meterhub/data/envs/.builds/minimal-1"]
    assert rebound and rebound[-1] > tmpfs, "the environment must be bound after the tmpfs"


# ------------------------------------------------------------------ the spawn form


def test_the_form_offers_the_environments_with_the_default_checked_and_says_what_cannot_start():
    catalog = Catalog()

    def not_ready(environment):
        return "" if environment.slug in ("pytorch", "vllm") else f"not built: {environment.slug}"

    html = render_options_form(catalog, None, environments=environment_options(catalog, not_ready))
    assert 'name="environment" value="pytorch" checked' in html
    assert re.search(
        r'data-environment="vllm" data-gpu-only>\s*<input type="radio" name="environment" value="vllm">',
        html,
    )
    assert "(GPU profiles only, not debug mode)" in html
    assert 'value="minimal" disabled' in html and "(not built: minimal)" in html
    assert "Every environment uses the same disk" in html
    # a site with one environment shows no choice at all
    one = Catalog(environments=[{"slug": "pytorch"}])
    assert 'name="environment"' not in render_options_form(one, None)
    # none startable: nothing checked
    none = [EnvironmentOption(e, "no") for e in catalog.environments_offered().values()]
    assert 'name="environment" value="pytorch" checked' not in render_options_form(
        catalog, None, environments=none
    )


def test_the_form_posts_the_environment_as_a_user_option():
    from meterhub.spawner.options import CatalogOptions

    options = CatalogOptions().options_from_form({"profile": ["debug"], "environment": ["minimal"]})
    assert options == {"profile": "debug", "environment": "minimal"}


# ------------------------------------------------------------------ Kubernetes


def test_kubernetes_profiles_offer_the_environments_as_a_profile_option():
    from meterhub.hub.render_k8s import profile_list

    site = load_site_config(None)
    site["backend"] = "kubernetes"
    profiles = {p["slug"]: p for p in profile_list(site, "amy")}
    debug = profiles["debug"]["profile_options"]["environment"]["choices"]
    assert list(debug) == ["pytorch", "deepspeed", "minimal"]  # no GPU-only one
    assert debug["pytorch"]["default"] is True
    assert "image" not in debug["pytorch"]["kubespawner_override"]  # kubernetes.image
    assert debug["minimal"]["kubespawner_override"]["image"].endswith("/singleuser-minimal:0.1.0")
    a800 = profiles["a800"]["profile_options"]
    # KubeSpawner applies the options in order: the environment's image last
    assert list(a800) == ["gpus", "environment"]
    assert "vllm" in a800["environment"]["choices"]


def test_render_k8s_runs_the_environments_image_and_refuses_one_debug_mode_cannot_run():
    run = [sys.executable, "-m", "meterhub.hub.cli", "render-k8s", "--user", "amy"]
    out = subprocess.run(
        [*run, "--profile", "a800", "--gpus", "1", "--environment", "vllm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pod = next(d for d in yaml.safe_load_all(out.stdout) if d["kind"] == "Pod")
    container = pod["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/meterhub/singleuser-vllm:0.1.0"
    assert {"name": "METERHUB_ENVIRONMENT", "value": "vllm"} in container["env"]
    refused = subprocess.run(
        [*run, "--profile", "debug", "--environment", "vllm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "needs a GPU" in refused.stderr


# ------------------------------------------------------------------ pinned requirements


def test_every_built_in_requirements_file_exists_and_pins_everything():
    assert Path(builtin_requirements_dir()) == ENVS
    for environment in BUILTIN_ENVIRONMENTS.values():
        if environment.requirements:
            path = ENVS / environment.requirements
            lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
            assert all("==" in ln or ln.startswith("-r ") for ln in lines if ln), path


def test_the_pins_agree_with_meterhubs_own_and_pytorch_txt_is_the_lab_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lab = dict(
        (re.sub(r"[-_.]+", "-", r.split("==")[0].split("[")[0].lower()), r.split("==")[1])
        for r in project["optional-dependencies"]["lab"]
    )
    hub = dict(
        (re.sub(r"[-_.]+", "-", r.split("==")[0].split("[")[0].lower()), r.split("==")[1])
        for r in project["dependencies"]
    )
    pytorch = pins(ENVS / "pytorch.txt")
    assert {k: v for k, v in pytorch.items() if k in lab} == lab
    for name in ("minimal.txt", "deepspeed.txt", "vllm.txt"):
        for package, version in pins(ENVS / name).items():
            if package in hub or (package in lab and name != "vllm.txt"):
                assert version == {**hub, **lab}[package], (name, package)
    minimal = pins(ENVS / "minimal.txt")
    assert "torch" not in minimal and {"jupyterhub", "jupyterlab", "numpy"} <= set(minimal)


# ------------------------------------------------------------------ meterhub env build


@pytest.fixture
def tiny_site(tmp_path):
    """A site whose one built environment installs one small pinned package."""
    requirements = tmp_path / "tiny.txt"
    requirements.write_text("six==1.16.0\n")
    config = tmp_path / "meterhub.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(tmp_path / "data"),
                "environments": [
                    {"slug": "pytorch"},
                    {"slug": "tiny", "display_name": "Tiny", "requirements": str(requirements)},
                ],
            }
        )
    )
    return config, requirements


def _meterhub(*args, config) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "meterhub.hub.cli", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "LANG": "C.UTF-8"},
    )


def test_env_build_installs_moves_the_link_once_done_and_removes_builds_nobody_runs(tiny_site):
    config, requirements = tiny_site
    envs = config.parent / "data" / "envs"
    listed = json.loads(_meterhub("env", "list", "--json", config=config).stdout)
    assert [r["slug"] for r in listed] == ["pytorch", "tiny"]
    assert listed[1]["state"] == "not built: meterhub env build tiny"
    first = _meterhub("env", "build", "tiny", config=config)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "tiny: built in" in first.stdout
    build1 = os.path.realpath(envs / "tiny")
    info = json.loads(Path(build1, BUILD_INFO).read_text())
    assert info["slug"] == "tiny" and info["python"] == ".".join(map(str, sys.version_info[:3]))
    python = Path(build1, "bin", "python")
    check = "import six, importlib.metadata as m; print(six.__version__, m.version('meterhub'))"
    assert (
        subprocess.run([python, "-c", check], capture_output=True, text=True).stdout
        == "1.16.0 0.1.0\n"
    )
    listed = json.loads(_meterhub("env", "list", "--json", config=config).stdout)
    assert listed[1]["state"] == "built" and listed[1]["size_bytes"] > 0
    # a changed file: still runs, said to be stale
    requirements.write_text("six==1.17.0\n")
    listed = json.loads(_meterhub("env", "list", "--json", config=config).stdout)
    assert listed[1]["state"] == "built; its requirements changed since: rebuild it"
    # a process still runs from the first build: it stays until none does
    holder = subprocess.Popen([python, "-c", "import time; time.sleep(60)"])
    try:
        second = _meterhub("env", "build", "tiny", config=config)
        assert second.returncode == 0, second.stderr
        build2 = os.path.realpath(envs / "tiny")
        assert build2 != build1 and os.path.isdir(build1)
        assert "kept the earlier build" in second.stdout
    finally:
        holder.kill()
        holder.wait()
    third = _meterhub("env", "build", "tiny", config=config)
    assert third.returncode == 0 and not os.path.exists(build1) and not os.path.exists(build2)


def test_a_failed_build_changes_nothing_and_says_why(tiny_site):
    config, requirements = tiny_site
    ok = _meterhub("env", "build", "tiny", config=config)
    assert ok.returncode == 0, ok.stderr
    envs = config.parent / "data" / "envs"
    before = os.path.realpath(envs / "tiny")
    requirements.write_text("no-such-package-meterhub-test==0.0.1\n")
    failed = _meterhub("env", "build", "tiny", config=config)
    assert failed.returncode == 2
    assert "tiny: the build failed" in failed.stderr and "nothing changed" in failed.stderr
    assert os.path.realpath(envs / "tiny") == before
    leftovers = [p for p in (envs / ".builds").iterdir() if p.is_dir() and str(p) != before]
    assert leftovers == [], "a failed build leaves no folder behind"


def test_env_build_refuses_what_it_cannot_build(tiny_site):
    config, _requirements = tiny_site
    unknown = _meterhub("env", "build", "nope", config=config)
    assert unknown.returncode == 2
    assert "unknown environment 'nope'; this site offers: pytorch, tiny" in unknown.stderr
    nothing = _meterhub("env", "build", "pytorch", config=config)
    assert nothing.returncode == 0 and "there is nothing to build" in nothing.stdout


def test_builds_in_use_are_found_by_their_processes(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", str(tmp_path / "a")]
    )
    try:
        used = env_cli.builds_in_use([str(tmp_path / "a"), str(tmp_path / "b")])
    finally:
        holder.kill()
        holder.wait()
    assert used == set()  # a path named as the last argument is not a folder's contents
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", str(tmp_path / "a" / "bin")]
    )
    try:
        used = env_cli.builds_in_use([str(tmp_path / "a"), str(tmp_path / "b")])
    finally:
        holder.kill()
        holder.wait()
    assert used == {str(tmp_path / "a")}


def test_a_slurm_job_runs_from_the_environments_build_on_the_shared_filesystem(tmp_path):
    from meterhub.hub.render_k8s import RenderError
    from meterhub.hub.render_slurm import render

    site = load_site_config(None)
    site["backend"] = "slurm"
    site["slurm"] = {**site["slurm"], "home_root": str(tmp_path / "disks")}
    site["slurm"]["envs_dir"] = str(tmp_path / "envs")
    with pytest.raises(RenderError, match="meterhub env build minimal"):
        render(site, "amy", "debug", environment="minimal")
    build = _fake_build(tmp_path / "envs", "minimal", "minimal-1")
    script = render(site, "amy", "debug", environment="minimal")
    assert f"{build}/bin/jupyterhub-singleuser" in script
    assert f"--ro-bind {build} {build}" in script
    default = render(site, "amy", "debug")
    assert f"{sys.prefix}/bin/jupyterhub-singleuser" in default and str(build) not in default


def test_a_build_removes_only_its_own_environments_earlier_builds(tmp_path):
    """`vllm-old` is another environment: building `vllm` leaves its build alone, and a
    build any link names is never removed."""
    envs = tmp_path / "envs"
    other = _fake_build(envs, "vllm-old", "vllm-old-20261201T000000")
    earlier = _fake_build(envs, "vllm", "vllm-20261201T000000")
    current = _fake_build(envs, "vllm", "vllm-20261202T000000")  # the link moves here
    env_cli.prune(str(envs), "vllm", keep=str(current), out=lambda line: None)
    assert other.is_dir() and current.is_dir() and not earlier.exists()
    assert os.path.realpath(envs / "vllm-old") == str(other)


def test_a_long_unknown_environment_is_not_echoed_whole():
    with pytest.raises(InvalidChoice) as refused:
        Catalog().parse({"profile": "debug", "environment": "x" * 10_000})
    assert len(str(refused.value)) < 200
