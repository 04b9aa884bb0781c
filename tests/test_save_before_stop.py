"""JupyterLab saves unsaved work before a stop meterhub causes (issue 15), end to end.

Real hubs, real servers, Chromium, and JupyterLab's autosave off (the user setting, written
through the server's settings API before the page opens), so that only the extension's save
(extensions/labextension/src/saver.ts) can put typed text on the disk:

- a credit warning saves a notebook with unsaved changes, in a hidden tab (the poll must go on
  while hidden);
- the meter stops an idle debug server, and the text typed into its notebook is on the disk;
- "Keep running" on the idle warning is activity: the warning goes and the idle clock restarts.

The last two use the server extension's idle status and `POST api/meterhub/saving` and
`/activity` (extensions/server.py) and the meter's idle stop; if the meter never stops the idle
server, the failure says so (something the page does by itself counted as activity). All skip
only without Chromium.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.spawner.local import disk_dirname
from meterhub.spawner.sandbox import bwrap_works

from .hubprocess import ADMIN_TOKEN, until

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct-horse-battery-staple"
STATUS_ITEM = "#meterhub-credit-status"
NOTEBOOK = "save-me.ipynb"

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)
pytestmark = needs_chromium


def sandbox() -> str:
    return "bwrap" if bwrap_works() == "" else "off"


@pytest.fixture(scope="module")
def lab(hub_factory):
    """A hub whose debug servers idle for hours: nothing but the test stops them."""
    return hub_factory({"local": {"sandbox": sandbox()}}, name="save-lab")


@pytest.fixture(scope="module")
def idle_lab(hub_factory):
    """A hub whose debug servers stop after a minute idle, warned 30 s before. Not shorter: the
    page asks for the status every 15 s, and two asks must fall between the warning and the
    stop (one could come just as the server stops)."""
    return hub_factory(
        {
            "profiles": {"debug": {"idle_minutes": 1}},
            "idle": {"warn_minutes": 0.5, "check_interval_seconds": 1},
            "billing": {"meter_interval_seconds": 1},
            "local": {"sandbox": sandbox()},
        },
        name="save-idle-lab",
    )


def sign_up(hub, name: str) -> None:
    """An account with a password and its default role (a first sign-in gives it; the server's
    token draws its scopes from it), and a running debug server."""
    hub.add_user(name, PASSWORD)
    hub.sign_in(name, PASSWORD)
    hub.spawn(name, {"profile": "debug"})


def server_api(hub, name: str, method: str, path: str, **kwargs) -> requests.Response:
    """Call `name`'s server at `path` (e.g. `api/contents/x`) with the admin token."""
    return requests.request(
        method,
        f"{hub.url}/user/{name}/{path}",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
        **kwargs,
    )


def without_autosave(hub, name: str) -> None:
    """Turn JupyterLab's autosave off for `name`: their user setting, on their disk."""
    r = server_api(
        hub,
        name,
        "PUT",
        "lab/api/settings/@jupyterlab/docmanager-extension:plugin",
        data=json.dumps({"raw": json.dumps({"autosave": False})}),
    )
    assert r.status_code == 204, r.text


def make_notebook(hub, name: str) -> Path:
    """An empty Python notebook on `name`'s disk; its path there."""
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": "",
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    r = server_api(
        hub,
        name,
        "PUT",
        f"api/contents/{NOTEBOOK}",
        data=json.dumps({"type": "notebook", "content": notebook}),
    )
    assert r.status_code in (200, 201), r.text
    path = Path(hub.data_dir) / "disks" / disk_dirname(name) / NOTEBOOK
    assert path.is_file(), f"the notebook is not on the disk at {path}"
    return path


def status(hub, name: str) -> dict:
    r = server_api(hub, name, "GET", "api/meterhub/status")
    assert r.status_code == 200, r.text
    return r.json()


def open_lab(browser, hub, name: str, path: str = ""):
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(rf".*/(hub/(spawn|home)|user/{name}/).*"))
    page.goto(f"{hub.url}/user/{name}/lab" + (f"/tree/{path}" if path else ""))
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    page.wait_for_function(
        f"document.querySelector('{STATUS_ITEM}')?.dataset.level !== undefined",
        timeout=60_000,
    )
    return page


def type_unsaved(page, text: str) -> None:
    """Type `text` into the notebook's first cell and leave it unsaved."""
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    editor.wait_for(timeout=60_000)
    editor.click()
    page.keyboard.type(text)
    page.locator(".lm-TabBar-tab.jp-mod-dirty").first.wait_for(timeout=30_000)


def hide(page) -> None:
    """Make the tab hidden as the browser does for a background tab (headless Chromium shows
    every page)."""
    page.evaluate(
        """() => {
            Object.defineProperty(document, 'hidden', { value: true, configurable: true });
            Object.defineProperty(document, 'visibilityState',
                                  { value: 'hidden', configurable: true });
            document.dispatchEvent(new Event('visibilitychange'));
        }"""
    )


def test_a_warning_saves_unsaved_work_in_a_hidden_tab(lab, browser):
    sign_up(lab, "sam")
    without_autosave(lab, "sam")
    on_disk = make_notebook(lab, "sam")
    page = open_lab(browser, lab, "sam", NOTEBOOK)
    text = "# typed before the warning, never saved by hand"
    type_unsaved(page, text)
    # JupyterLab's polls linger one more ask once hidden: the warning comes after it
    with page.expect_request(lambda r: "/api/meterhub/status" in r.url, timeout=60_000):
        hide(page)
    # autosave is off (its default interval is 120 s; nothing else writes the notebook)
    assert text not in on_disk.read_text()
    ledger = Ledger(connect(f"sqlite:///{lab.data_dir}/billing.sqlite"))
    message = "test: 10 minutes of credit left — your server will stop; your files are kept"
    assert ledger.notify("sam", "test:sam:save", "warning", message)
    until(lambda: text in on_disk.read_text(), "the warning to save the notebook", timeout=120)
    # saved by the page: JupyterLab knows it is clean
    page.locator(".lm-TabBar-tab.jp-mod-dirty").first.wait_for(state="detached", timeout=30_000)
    page.context.close()


def test_an_idle_stop_saves_the_notebook_first(idle_lab, browser):
    sign_up(idle_lab, "ida")
    without_autosave(idle_lab, "ida")
    on_disk = make_notebook(idle_lab, "ida")
    page = open_lab(browser, idle_lab, "ida", NOTEBOOK)
    text = "# typed, then left alone until the idle stop"
    type_unsaved(page, text)
    assert text not in on_disk.read_text()
    # left alone: the meter warns at 30 s idle and stops the server at 60 s
    until(
        lambda: idle_lab.server("ida") is None,
        # nothing but the page runs: if the server never stops, something JupyterLab does by
        # itself counts as activity (the hub log's PUT and POST lines to /user/ida/ say what)
        "the meter to stop ida's idle server (issue 15's meter side)",
        timeout=240,
    )
    assert text in on_disk.read_text(), "the idle stop came, but the notebook was not saved"
    page.context.close()


def test_keep_running_cancels_the_idle_stop(idle_lab, browser):
    sign_up(idle_lab, "kim")
    page = open_lab(browser, idle_lab, "kim")
    keep = page.get_by_role("button", name="Keep running").first
    keep.wait_for(timeout=120_000)
    assert re.search(r"idle: stops in", page.locator(STATUS_ITEM).inner_text())
    before = status(idle_lab, "kim")["idle"]["idle_seconds"]
    keep.click()
    keep.wait_for(state="detached", timeout=30_000)
    # the click was activity: the idle clock restarted, and the status bar says so
    after = status(idle_lab, "kim")["idle"]
    assert after["idle_seconds"] < before, (before, after)
    page.wait_for_function(
        f"!document.querySelector('{STATUS_ITEM}').textContent.includes('idle:')",
        timeout=30_000,
    )
    assert idle_lab.server("kim") is not None
    page.context.close()
