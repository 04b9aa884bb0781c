"""The escape hatch: `jupyterhub_config.d/*.py` beside the site config, run last with `c`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests
from traitlets.config import Config

from meterhub.hub.config import ConfigError, apply_config, apply_config_d, load_site_config

from .hubprocess import HubProcess


def config_d(tmp_path: Path, files: dict[str, str]) -> Path:
    """A site config in tmp_path and `files` in the jupyterhub_config.d folder beside it."""
    site = tmp_path / "meterhub.yaml"
    site.write_text("{}\n")
    folder = tmp_path / "jupyterhub_config.d"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return site


def test_files_run_in_sorted_order_after_meterhubs_config(tmp_path):
    site = config_d(
        tmp_path,
        {
            "20-later.py": "c.JupyterHub.template_vars['order'].append('20')\n",
            "10-first.py": (
                "c.Spawner.start_timeout = 123\n"
                "c.JupyterHub.template_vars['order'] = ['10']\n"
                "c.Catalog.prices = {**c.Catalog.prices, 'a800': '3.90'}\n"
            ),
            "9-last.py": "c.JupyterHub.template_vars['order'].append('9')\n",
            "notes.txt": "not python: ignored",
        },
    )
    c = apply_config(load_site_config(site, cwd=str(tmp_path)), Config())
    c.JupyterHub.template_vars = {"meterhub_signup": True}  # as `meterhub serve` sets them
    applied = apply_config_d(site, c)
    assert [p.name for p in applied] == ["10-first.py", "20-later.py", "9-last.py"]
    assert c.Spawner.start_timeout == 123
    assert c.JupyterHub.template_vars == {"meterhub_signup": True, "order": ["10", "20", "9"]}
    # meterhub's own values were there to read and change, not replaced by a fresh config
    assert c.Catalog.prices == {"a800": "3.90"}
    assert c.JupyterHub.spawner_class == "meterhub.spawner.local.LocalGPUSpawner"


def test_nothing_to_run_without_a_folder_or_a_config_file(tmp_path):
    site = tmp_path / "meterhub.yaml"
    site.write_text("{}\n")
    c = Config()
    assert apply_config_d(site, c) == [] and apply_config_d(None, c) == []
    assert c == Config()


@pytest.mark.parametrize(
    "text, named",
    [
        ("c.Spawner.start_timeout = 5\nx = 1 / 0\n", "line 2: ZeroDivisionError: division by zero"),
        ("c.Spawner.start_timeout = (\n", "line 1: SyntaxError"),
        ("import not_a_module_here\n", "line 1: ModuleNotFoundError"),
    ],
)
def test_an_error_names_the_file_and_line(tmp_path, text, named):
    site = config_d(tmp_path, {"10-ok.py": "c.Spawner.start_timeout = 1\n", "50-bad.py": text})
    with pytest.raises(ConfigError) as e:
        apply_config_d(site, Config())
    assert f"{tmp_path / 'jupyterhub_config.d' / '50-bad.py'}, {named}" in str(e.value)


def test_serve_refuses_a_broken_file_with_one_readable_line(tmp_path):
    site = config_d(tmp_path, {"50-bad.py": "c.JupyterHub.nope = undefined_name\n"})
    meterhub = str(Path(sys.executable).parent / "meterhub")
    out = subprocess.run(
        [meterhub, "serve", "--config", str(site), "--port", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "50-bad.py, line 1: NameError: name 'undefined_name' is not defined" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_real_hub_applies_the_folder_last(tmp_path):
    hub = HubProcess(tmp_path / "hub", {"gpus": []})
    folder = hub.config_path.parent / "jupyterhub_config.d"
    folder.mkdir()
    # update meterhub's template variables rather than replace them
    (folder / "50-announce.py").write_text(
        "c.JupyterHub.template_vars['announcement_login'] = 'Maintenance at 18:00'\n"
    )
    try:
        hub.start()
        page = requests.get(f"{hub.url}/hub/login", timeout=30).text
        assert "Maintenance at 18:00" in page
        assert 'id="meterhub-signup"' in page  # meterhub's own template variables stay
    finally:
        hub.teardown()
