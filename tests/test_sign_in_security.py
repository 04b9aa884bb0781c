"""Sign-in holes an attack run found, closed: hostile user names (stored XSS on the Authorize
users page), approval by GET, cookies without SameSite.

One real hub with local accounts; Debian's Chromium (Playwright) signs up and opens the admin's
page, with a `dialog` handler and a `window.__pwned` probe that any injected script would trip.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import bcrypt
import pytest
import requests

from meterhub.hub.accounts import USERNAME_RULE

from .test_pages import CHROMIUM, METERHUB, PASSWORD, admin_password, session_of, shot, sign_in

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)

TAB = "\t"
#: names an attacker signs up with; each would run script if rendered into an unquoted
#: attribute (NativeAuthenticator's `<tr id={{ user.username }}>`) or as raw HTML
HOSTILE_NAMES = [
    f"x{TAB}tabindex=1{TAB}autofocus{TAB}onfocus=alert(document.domain){TAB}x",
    # hex-escaped script: what it runs is spelled in \x escapes, past any keyword filter
    f"x{TAB}tabindex=1{TAB}autofocus{TAB}onfocus=eval('\\x77indow.__pwned\\x3d1'){TAB}x",
    # an HTML character reference, decoded by the browser inside an attribute value
    f"x{TAB}tabindex=1{TAB}autofocus{TAB}onfocus=window.__pwned&#61;1{TAB}x",
    "<script>window.__pwned=1</script>",
    '"onmouseover="window.__pwned=1',
    "<img src=x onerror=alert(1)>",
    "eve smith",
]
NOT_ALLOWED = "That user name is not allowed"


@pytest.fixture(scope="module")
def hub(hub_factory):
    hub = hub_factory({"gpus": []}, name="signin")
    add = [METERHUB, "user", "add", "vic", "--password-stdin", "--config", str(hub.config_path)]
    out = subprocess.run(add, input=PASSWORD, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return hub


@contextmanager
def hub_db(hub):
    """The running hub's own SQLite database, committed and closed on leaving."""
    db = sqlite3.connect(Path(hub.data_dir) / "jupyterhub.sqlite", timeout=30)
    try:
        with db:
            yield db
    finally:
        db.close()


def accounts(hub) -> dict[str, bool]:
    """NativeAuthenticator's accounts: {user name: approved}."""
    with hub_db(hub) as db:
        rows = db.execute("SELECT username, is_authorized FROM users_info").fetchall()
    return {name: bool(approved) for name, approved in rows}


def sign_up(hub, name: str) -> requests.Response:
    s = requests.Session()
    s.get(f"{hub.url}/hub/signup")
    return s.post(
        f"{hub.url}/hub/signup",
        data={
            "username": name,
            "signup_password": PASSWORD,
            "signup_password_confirmation": PASSWORD,
            "_xsrf": s.cookies["_xsrf"],
        },
    )


def can_sign_in(hub, name: str) -> bool:
    s = requests.Session()
    s.get(f"{hub.url}/hub/login")
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": name, "password": PASSWORD, "_xsrf": s.cookies["_xsrf"]},
        allow_redirects=False,
    )
    assert r.status_code in (302, 403), r.status_code
    return r.status_code == 302


def open_as_admin(browser, hub, path: str):
    """The admin's page at `path`, with probes for any script an attacker got into it."""
    page = sign_in(browser, hub, "admin", admin_password(hub))
    dialogs: list[str] = []

    def on_dialog(dialog):
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(f"{hub.url}{path}")
    page.wait_for_load_state("load")
    return page, dialogs


def poke(page) -> None:
    """Focus, hover and tab through everything: what would fire onfocus or onmouseover."""
    for row in page.locator("#meterhub-authorize tbody tr").all():
        row.hover()
    for _ in range(40):
        page.keyboard.press("Tab")


def assert_nothing_ran(page, dialogs: list[str]) -> None:
    assert dialogs == [], f"a dialog opened: {dialogs}"
    assert page.evaluate("window.__pwned") is None, "injected script set window.__pwned"


def test_hostile_names_are_refused_at_sign_up_and_run_nothing(hub, browser):
    before = accounts(hub)
    page = browser.new_page()
    for name in HOSTILE_NAMES:
        page.goto(f"{hub.url}/hub/signup")
        page.fill("input[name=username]", name)
        page.fill("input[name=signup_password]", PASSWORD)
        page.fill("input[name=signup_password_confirmation]", PASSWORD)
        with page.expect_navigation() as navigation:
            page.click("#signup_submit")
        assert navigation.value.status == 400, name
        message = page.locator("div.alert.alert-danger[role=alert]").inner_text()
        assert NOT_ALLOWED in message and USERNAME_RULE in message, (name, message)
    page.close()
    # what the form cannot carry (a text input drops line breaks), posted directly
    for name in ("x\ntabindex=1\nautofocus\nonfocus=alert(1)\nx", "wes\n", "a" * 65):
        r = sign_up(hub, name)
        assert r.status_code == 400 and NOT_ALLOWED in r.text, name
    assert accounts(hub) == before  # nothing was written
    # a name within the rule still signs up (upper case is lowered, as JupyterHub does)
    assert sign_up(hub, "Pia").ok and accounts(hub)["pia"] is False

    page, dialogs = open_as_admin(browser, hub, "/hub/authorize")
    assert page.locator('#meterhub-authorize tr[data-username="pia"]').count() == 1
    poke(page)
    assert_nothing_ran(page, dialogs)
    # approving is the row's small POST form
    page.click('tr[data-username="pia"] button[value=approve]')
    page.wait_for_url(re.compile(r".*/hub/authorize$"))
    assert page.locator('tr[data-username="pia"] .meterhub-approved').inner_text() == "yes"
    assert can_sign_in(hub, "pia")
    shot(page, "authorize")
    page.context.close()


def test_a_hostile_name_already_in_the_database_renders_as_text(hub, browser):
    """An old database may hold such names: the page itself must be safe, not only sign-up."""
    hostile = [*HOSTILE_NAMES, "../../api/users/vic", "x'><svg onload=alert(1)>"]
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt())
    approved = {*hostile[::2], "eve smith", "oda"}  # both kinds of row, both kinds of form
    with hub_db(hub) as db:
        db.executemany(
            "INSERT INTO users_info (username, password, is_authorized, login_email_sent,"
            " has_2fa) VALUES (?, ?, ?, 0, 0)",
            [(name, hashed, name in approved) for name in [*hostile, "oda"]],
        )
    try:
        # approved, with the right password: outside the rule it still cannot sign in
        assert accounts(hub)["eve smith"] is True and not can_sign_in(hub, "eve smith")
        assert can_sign_in(hub, "oda")  # the same row within the rule can
        page, dialogs = open_as_admin(browser, hub, "/hub/authorize")
        poke(page)
        assert_nothing_ran(page, dialogs)
        rows = page.locator("#meterhub-authorize tbody tr")
        shown = {
            rows.nth(i).get_attribute("data-username"): rows.nth(i)
            .locator(".meterhub-username")
            .text_content()
            for i in range(rows.count())
        }
        for name in hostile:
            assert shown.get(name) == name, name  # the whole name, as text, in its own row
        # every form posts under /hub/authorize/ or /hub/discard/, whatever the name
        actions = page.eval_on_selector_all(
            "#meterhub-authorize form",
            "fs => fs.map(f => new URL(f.getAttribute('action'), document.baseURI).href)",
        )
        assert actions and all(
            re.fullmatch(rf"{re.escape(hub.url)}/hub/(authorize|discard)/[^/]+", a) for a in actions
        ), actions
        page.context.close()
    finally:
        with hub_db(hub) as db:
            db.executemany(
                "DELETE FROM users_info WHERE username = ?", [(n,) for n in [*hostile, "oda"]]
            )


def test_approval_and_discard_are_xsrf_checked_posts_by_an_admin(hub):
    assert sign_up(hub, "wes").ok
    assert accounts(hub)["wes"] is False and not can_sign_in(hub, "wes")
    admin = session_of(hub, "admin", admin_password(hub))
    page = admin.get(f"{hub.url}/hub/authorize")  # also refreshes the session's _xsrf cookie
    assert 'action="/hub/authorize/wes"' in page.text
    xsrf = admin.cookies["_xsrf"]

    # a link or an image on any page the admin visits: a GET changes nothing
    for path in ("/hub/authorize/wes", "/hub/discard/wes"):
        r = admin.get(f"{hub.url}{path}", allow_redirects=False)
        assert r.status_code == 405 and r.headers["Allow"] == "POST", (path, r.status_code)
    assert accounts(hub)["wes"] is False

    # a cross-site form cannot know the _xsrf token
    r = admin.post(f"{hub.url}/hub/authorize/wes", data={"action": "approve"})
    assert r.status_code == 403 and "_xsrf" in r.text
    r = admin.post(f"{hub.url}/hub/discard/wes", allow_redirects=False)
    assert r.status_code == 403 and "_xsrf" in r.text
    assert accounts(hub)["wes"] is False

    # a user who is not an admin, with a valid token of their own
    vic = session_of(hub, "vic")
    vic.get(f"{hub.url}/hub/home")
    for path in ("/hub/authorize/wes", "/hub/discard/wes"):
        data = {"action": "approve", "_xsrf": vic.cookies["_xsrf"]}
        r = vic.post(f"{hub.url}{path}", data=data, allow_redirects=False)
        assert r.status_code == 403 and "requires any of [admin:users]" in r.text, path
    assert accounts(hub)["wes"] is False

    # approve and revoke are explicit; anything else is refused
    url = f"{hub.url}/hub/authorize/wes"
    r = admin.post(url, data={"action": "toggle", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 400 and accounts(hub)["wes"] is False
    r = admin.post(url, data={"action": "approve", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 302 and r.headers["Location"].endswith("/hub/authorize")
    assert accounts(hub)["wes"] is True and can_sign_in(hub, "wes")
    admin.post(url, data={"action": "approve", "_xsrf": xsrf})  # again: still approved
    assert accounts(hub)["wes"] is True
    # an approved account is not discarded by mistake
    r = admin.post(f"{hub.url}/hub/discard/wes", data={"_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 409 and accounts(hub)["wes"] is True
    r = admin.post(url, data={"action": "revoke", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 302 and accounts(hub)["wes"] is False and not can_sign_in(hub, "wes")

    # an admin cannot lock themselves out
    data = {"action": "revoke", "_xsrf": xsrf}
    r = admin.post(f"{hub.url}/hub/authorize/admin", data=data, allow_redirects=False)
    assert r.status_code == 400 and accounts(hub)["admin"] is True

    # a waiting sign-up is discarded by POST
    r = admin.post(f"{hub.url}/hub/discard/wes", data={"_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 302 and "wes" not in accounts(hub)
    r = admin.post(f"{hub.url}/hub/discard/nobody", data={"_xsrf": xsrf})
    assert r.status_code == 404


@pytest.mark.parametrize("name", ["x\ty", "eve smith", "<script>", "Eve", "a" * 65, "wes\n"])
def test_meterhub_user_add_applies_the_same_rule(hub, name):
    add = [METERHUB, "user", "add", name, "--password-stdin", "--config", str(hub.config_path)]
    out = subprocess.run(add, input=PASSWORD, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    assert "invalid user name" in out.stderr and USERNAME_RULE in out.stderr


def test_the_admin_api_and_login_page_apply_the_same_rule(hub):
    before = {u["name"] for u in hub.api("GET", "/users").json()}
    for name in ("x\ttabindex=1\tautofocus\tonfocus=alert(1)", "eve smith", "<script>", "a" * 65):
        r = hub.api("POST", f"/users/{quote(name, safe='')}")
        assert r.status_code == 400, (name, r.status_code, r.text)
        r = hub.api("POST", "/users", json={"usernames": [name]})
        assert r.status_code == 400 and "Invalid username" in r.text, (name, r.text)
        assert not can_sign_in(hub, name)
    assert {u["name"] for u in hub.api("GET", "/users").json()} == before
    # an e-mail-style name (OpenID Connect providers) is within the rule
    assert hub.api("POST", f"/users/{quote('ada@example.org', safe='')}").status_code == 201


def set_cookies(response: requests.Response) -> dict[str, set[str]]:
    """{cookie name: its attributes, lower-cased} from one response's Set-Cookie lines."""
    cookies = {}
    for line in response.raw.headers.getlist("Set-Cookie"):
        name_value, *attributes = line.split(";")
        cookies[name_value.split("=", 1)[0]] = {a.strip().lower() for a in attributes}
    return cookies


def test_hub_cookies_are_samesite_lax_and_secure_over_https(hub):
    s = requests.Session()
    login_page = set_cookies(s.get(f"{hub.url}/hub/login"))
    assert "samesite=lax" in login_page["_xsrf"]
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": "vic", "password": PASSWORD, "_xsrf": s.cookies["_xsrf"]},
        allow_redirects=False,
    )
    assert r.status_code == 302
    cookies = set_cookies(r)
    for name in ("jupyterhub-hub-login", "jupyterhub-session-id"):
        assert "samesite=lax" in cookies[name], cookies[name]
        assert "secure" not in cookies[name]  # plain http here: Secure would break sign-in
    # behind a TLS-terminating proxy (straight to the hub, which trusts X-Forwarded-Proto):
    # JupyterHub still adds Secure, and our SameSite is kept
    direct = f"http://127.0.0.1:{hub.site['hub']['api_port']}/hub/login"
    https = {"X-Forwarded-Proto": "https"}
    s = requests.Session()
    s.get(direct, headers=https)
    r = s.post(
        direct,
        data={"username": "vic", "password": PASSWORD, "_xsrf": s.cookies["_xsrf"]},
        headers=https,
        allow_redirects=False,
    )
    assert r.status_code == 302, r.status_code
    cookies = set_cookies(r)
    for name in ("jupyterhub-hub-login", "jupyterhub-session-id"):
        assert {"secure", "samesite=lax", "httponly"} <= cookies[name], cookies[name]


def test_an_account_the_hub_already_has_cannot_be_claimed_by_signing_up(hub):
    """An admin made `gwen` with the hub's API (no password yet) and gave her credit: a
    stranger signing up as gwen is refused, and cannot sign in as her."""
    assert hub.api("POST", "/users/gwen").status_code == 201
    r = sign_up(hub, "gwen")
    assert r.status_code == 400 and "already in use" in r.text
    assert "gwen" not in accounts(hub)
    assert not can_sign_in(hub, "gwen")
