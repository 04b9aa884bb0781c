"""The credit status in JupyterLab, end to end, and the server extension behind it.

A hub of its own, whose site warns at 60 and 20 minutes (`billing.warn_minutes`), and a debug
server at ¥36.00/h, so a new account's ¥10.00 lasts 16 minutes. In Chromium: the status bar
item's `data-level` and colour follow the site's thresholds, and a warning shows once, is
marked read in the billing service, and does not show again after a reload. Without a
browser: `POST /api/meterhub/notifications/read` refuses bad bodies with a 400 that says why,
needs the XSRF token with a cookie, and marks only the server's own user's notifications.

The server runs in the bwrap sandbox where bubblewrap works, so the extension is shown to load
there from the environment's `etc/jupyter` (no command-line switch enables it any more).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
from tornado import web

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.extensions.server import MAX_READ_IDS, read_ids
from meterhub.spawner.sandbox import bwrap_works

from .hubprocess import ADMIN_TOKEN, until

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct-horse-battery-staple"
STATUS_ITEM = "#meterhub-credit-status"

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)


# ---------------------------------------------------------------- the body, without a server


@pytest.mark.parametrize(
    "body, says",
    [
        (b"{not json", "Malformed JSON"),
        (b"[1, 2]", "No ids"),
        (b"{}", "No ids"),
        (b'{"ids": 3}', "ids is not a list"),
        (json.dumps({"ids": list(range(1, MAX_READ_IDS + 2))}).encode(), "101 ids are too many"),
        (b'{"ids": [1, 0]}', "0 is not an id"),
        (b'{"ids": [-4]}', "-4 is not an id"),
        (b'{"ids": ["7"]}', '"7" is not an id'),
        (b'{"ids": [1.5]}', "1.5 is not an id"),
        (b'{"ids": [true]}', "true is not an id"),
        (b'{"ids": [1], "all": true}', "Unknown key 'all'"),
    ],
)
def test_a_bad_mark_read_body_is_a_400_that_says_why(body, says):
    with pytest.raises(web.HTTPError) as refused:
        read_ids(body)
    assert refused.value.status_code == 400
    assert says in refused.value.log_message
    assert "at most 100 positive integers" in refused.value.log_message


def test_a_good_mark_read_body_gives_its_ids():
    assert read_ids(b'{"ids": [3, 1, 2]}') == [3, 1, 2]
    assert read_ids(b'{"ids": []}') == []
    assert read_ids(json.dumps({"ids": list(range(1, MAX_READ_IDS + 1))}).encode())


# ---------------------------------------------------------------- a real hub and server


@pytest.fixture(scope="module")
def lab(hub_factory):
    hub = hub_factory(
        {
            "profiles": {"debug": {"price_per_hour": "36.00"}},
            "billing": {"warn_minutes": [60, 20]},
            "local": {"sandbox": "bwrap" if bwrap_works() == "" else "off"},
        },
        name="lab-status",
    )
    for name in ("stu", "vic"):
        hub.add_user(name, PASSWORD)
    # a first sign-in gives the account its default role, which its server's token draws its
    # scopes from (`meterhub user add` writes the user without one)
    hub.sign_in("stu", PASSWORD)
    hub.spawn("stu", {"profile": "debug"})
    return hub


def ledger(hub) -> Ledger:
    return Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))


def notify(hub, user: str, key: str, message: str) -> int:
    """A warning for `user`, as the meter writes them; its id."""
    assert ledger(hub).notify(user, key, "warning", message)
    (note,) = [n for n in ledger(hub).notifications(user) if n.message == message]
    return note.id


def billing_notes(hub, user: str) -> dict[str, dict]:
    """`user`'s notifications as the billing API lists them, by message."""
    r = requests.get(
        f"{hub.url}/services/billing/api/v1/users/{user}/notifications",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return {n["message"]: n for n in r.json()["notifications"]}


def mark_read(hub, body, user: str = "stu", **kwargs) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return requests.post(
        f"{hub.url}/user/{user}/api/meterhub/notifications/read",
        data=data,
        headers={"Authorization": f"token {ADMIN_TOKEN}", **kwargs.pop("headers", {})},
        timeout=30,
        **kwargs,
    )


def test_the_status_passes_on_the_sites_thresholds(lab):
    r = requests.get(
        f"{lab.url}/user/stu/api/meterhub/status",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["warn_minutes"] == [60, 20]


def test_the_server_refuses_a_bad_body_and_marks_only_its_users_notifications(lab):
    refused = mark_read(lab, {"ids": [1, "2"]})
    assert refused.status_code == 400
    assert '"2" is not an id' in refused.json()["message"]
    assert mark_read(lab, b"[]").status_code == 400
    nothing = mark_read(lab, {"ids": []})
    assert nothing.status_code == 200 and nothing.json() == {"marked": 0}
    own = notify(lab, "stu", "test:stu:api", "stu's own warning")
    other = notify(lab, "vic", "test:vic:api", "vic's warning")
    marked = mark_read(lab, {"ids": [own, other]})
    assert marked.status_code == 200, marked.text
    assert marked.json() == {"marked": 1}
    assert billing_notes(lab, "stu")["stu's own warning"]["read"]
    assert billing_notes(lab, "vic")["vic's warning"]["read"] is None


def open_lab(browser, hub, name: str):
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    # signed in: the hub sends a user whose server runs on to it
    page.wait_for_url(re.compile(rf".*/(hub/(spawn|home)|user/{name}/).*"))
    page.goto(f"{hub.url}/user/{name}/lab")
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    wait_for_level(page, "ok", "warning", "critical")
    return page


def wait_for_level(page, *levels: str) -> str:
    page.wait_for_function(
        f"{json.dumps(list(levels))}.includes("
        f"document.querySelector('{STATUS_ITEM}')?.dataset.level)",
        timeout=60_000,
    )
    return page.locator(STATUS_ITEM).get_attribute("data-level")


def colours(page) -> tuple[str, str, str]:
    """The item's colour, and what JupyterLab's theme makes of its error and font colours."""
    return page.locator(STATUS_ITEM).evaluate(
        """item => {
            const probe = name => {
                const span = document.createElement('span');
                span.style.color = `var(${name})`;
                document.body.appendChild(span);
                const colour = getComputedStyle(span).color;
                span.remove();
                return colour;
            };
            return [getComputedStyle(item).color, probe('--jp-error-color1'),
                    probe('--jp-warn-color1')];
        }"""
    )


@needs_chromium
def test_the_status_bar_level_follows_the_sites_thresholds(lab, browser):
    page = open_lab(browser, lab, "stu")
    text = page.locator(STATUS_ITEM).inner_text()
    assert re.fullmatch(r"¥\d+\.\d\d · ¥36\.00/h · 1\d min left", text), text
    # 16 minutes left: at or below the site's second threshold (20), so critical — at the
    # old hard-coded 30/10 it would only have been a warning
    assert wait_for_level(page, "critical") == "critical"
    item, error, warn = colours(page)
    assert item == error and error != warn  # style/index.css, through JupyterLab's theme
    # a grant: ¥30 lasts 50 minutes, at or below 60 only
    r = requests.post(
        f"{lab.url}/services/billing/api/v1/users/stu/grants",
        json={"amount": "20.00"},
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    assert wait_for_level(page, "warning") == "warning"
    item, error, warn = colours(page)
    assert item == warn
    page.context.close()


@needs_chromium
def test_a_warning_shows_once_is_marked_read_and_not_shown_after_a_reload(lab, browser):
    page = open_lab(browser, lab, "stu")
    first = "test: 15 minutes of credit left — your server will stop; your files are kept"
    notify(lab, "stu", "test:stu:first", first)
    page.get_by_text(first).first.wait_for(timeout=60_000)
    assert page.get_by_text(first).count() == 1
    until(lambda: billing_notes(lab, "stu")[first]["read"], "the warning to be marked read")
    page.reload()
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    wait_for_level(page, "ok", "warning", "critical")
    # a newer warning shows after the reload: the page has polled since, and the first did not
    # come back with it
    second = "test: 5 minutes of credit left — your server will stop; your files are kept"
    notify(lab, "stu", "test:stu:second", second)
    page.get_by_text(second).first.wait_for(timeout=60_000)
    assert page.get_by_text(first).count() == 0
    until(lambda: billing_notes(lab, "stu")[second]["read"], "the second to be marked read")
    page.context.close()


@needs_chromium
def test_marking_read_from_the_browser_needs_the_xsrf_token(lab, browser):
    page = open_lab(browser, lab, "stu")
    url = f"{lab.url}/user/stu/api/meterhub/notifications/read"
    # the browser's cookie alone, as a forged cross-site form would send it
    forged = page.request.post(url, data={"ids": []})
    assert forged.status == 403, forged.text()
    xsrf = next(c["value"] for c in page.context.cookies(url) if c["name"] == "_xsrf")
    sent = page.request.post(url, data={"ids": []}, headers={"X-XSRFToken": xsrf})
    assert sent.status == 200 and sent.json() == {"marked": 0}, sent.text()
    page.context.close()
