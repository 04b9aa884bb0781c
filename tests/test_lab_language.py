"""JupyterLab in the language its user reads the hub in, on a real hub with real
`jupyterhub-singleuser` servers in debug mode.

A zh-CN browser starts its server from the spawn page: JupyterLab opens with Chinese menus
(文件), meterhub's credit status in Chinese, and its settings API says the translation locale
is zh_CN (extensions/labconfig/zh_CN). A server started for an English reader says en
(extensions/labconfig/en), whatever the machine's own locale. Both have the news pop-up and
the update check off (extensions/labconfig/base).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

from meterhub.extensions.server import lab_config_path
from meterhub.spawner.sandbox import bwrap_works

from .hubprocess import ADMIN_TOKEN, HubProcess, until

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct-horse-battery-staple"
TRANSLATION = "@jupyterlab/translation-extension:plugin"
NOTIFICATION = "@jupyterlab/apputils-extension:notification"
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "pages"


def test_the_lab_config_path_puts_the_languages_defaults_before_the_base():
    here = Path(__file__).resolve().parent.parent / "extensions" / "labconfig"
    assert lab_config_path({"METERHUB_LANGUAGE": "zh_CN", "JUPYTER_CONFIG_PATH": "/etc/x"}) == (
        f"{here / 'zh_CN'}:{here / 'base'}:/etc/x"
    )
    assert lab_config_path({"METERHUB_LANGUAGE": "en"}) == f"{here / 'en'}:{here / 'base'}"
    # a language meterhub has no folder for, or a path in disguise: the base only
    for nonsense in ("fr", "../zh_CN", ""):
        assert lab_config_path({"METERHUB_LANGUAGE": nonsense}) == str(here / "base")


#: a first JupyterLab start on a loaded shared machine can take longer than JupyterHub's 60 s
START_TIMEOUT_SECONDS = 300


@pytest.fixture(scope="module")
def lab_hub(tmp_path_factory):
    site = {"local": {"sandbox": "bwrap" if bwrap_works() == "" else "off"}}
    hub = HubProcess(tmp_path_factory.mktemp("lab-language"), site)
    extra = hub.workdir / "jupyterhub_config.d"
    extra.mkdir()
    (extra / "10-patience.py").write_text(f"c.Spawner.start_timeout = {START_TIMEOUT_SECONDS}\n")
    try:
        hub.start()
        for name in ("mei", "ann"):
            hub.add_user(name, PASSWORD)
            hub.sign_in(name, PASSWORD)  # the default role, which the server's token draws on
        yield hub
    finally:
        hub.teardown()


def lab_settings(hub, user: str, plugin: str) -> dict:
    """A JupyterLab plugin's settings on `user`'s server, as the page loads them."""
    r = requests.get(
        f"{hub.url}/user/{user}/lab/api/settings/{plugin}",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


def default_of(settings: dict, key: str):
    """The value a plugin starts with: the schema's default, which the labconfig's
    default_setting_overrides.json replace (the user's own settings are empty here)."""
    assert key not in settings["settings"], settings["settings"]
    return settings["schema"]["properties"][key]["default"]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`")
def test_a_chinese_browser_gets_a_chinese_jupyterlab(lab_hub, browser):
    context = browser.new_context(locale="zh-CN", viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{lab_hub.url}/hub/login")
    page.fill("input[name=username]", "mei")
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    page.check("#profile-debug input[name=profile]")
    page.click("form#spawn_form [type=submit]")
    page.wait_for_url(re.compile(r".*/user/mei/lab.*"), timeout=START_TIMEOUT_SECONDS * 1000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    menus = page.locator("#jp-menu-panel .lm-MenuBar-itemLabel")
    menus.first.wait_for(timeout=60_000)
    page.wait_for_function(
        "[...document.querySelectorAll('#jp-menu-panel .lm-MenuBar-itemLabel')]"
        ".some(e => e.textContent === '文件')",
        timeout=60_000,
    )
    labels = menus.all_inner_texts()
    assert "文件" in labels and "编辑" in labels and "File" not in labels, labels
    # meterhub's own status bar item, through JupyterLab's translator and meterhub's catalog
    status = page.locator("#meterhub-credit-status")
    status.wait_for(timeout=60_000)
    page.wait_for_function(
        "document.querySelector('#meterhub-credit-status').textContent.includes('/小时')",
        timeout=60_000,
    )
    shown = status.inner_text()
    assert re.fullmatch(r"¥\d+\.\d\d · ¥0\.10/小时 · 还可用 \d+ 小时", shown), shown
    assert status.get_attribute("title") == "meterhub：您的余额"
    # no pop-up asking to fetch Jupyter's news (in either language)
    assert page.locator(".jp-Notification-Toast").count() == 0
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "zh-jupyterlab.png"))
    settings = lab_settings(lab_hub, "mei", TRANSLATION)
    assert default_of(settings, "locale") == "zh_CN"
    context.close()


def test_an_english_readers_server_is_in_english_and_both_skip_the_news(lab_hub):
    # the REST API, no Accept-Language: English
    r = lab_hub.api("POST", "/users/ann/server", json={"profile": "debug"})
    assert r.status_code in (201, 202), r.text
    until(
        lambda: (s := lab_hub.server("ann")) and s["ready"],
        "ann's server to be ready",
        timeout=START_TIMEOUT_SECONDS,
    )
    assert default_of(lab_settings(lab_hub, "ann", TRANSLATION), "locale") == "en"
    for user in ("ann", "mei"):
        if lab_hub.server(user) is None:
            continue  # mei's runs only where Chromium is
        news = lab_settings(lab_hub, user, NOTIFICATION)
        assert default_of(news, "fetchNews") == "false"
        assert default_of(news, "checkForUpdates") is False
    # the Chinese pack is there for the zh_CN locale to load
    packs = requests.get(
        f"{lab_hub.url}/user/ann/lab/api/translations/",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    ).json()["data"]
    assert "zh_CN" in packs, packs
    zh = requests.get(
        f"{lab_hub.url}/user/ann/lab/api/translations/zh_CN",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    ).json()["data"]
    assert zh["meterhub"]["%1/h"] == ["%1/小时"]  # meterhub's own catalog beside JupyterLab's
