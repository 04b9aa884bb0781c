"""The pages people use, in a real browser: Debian's Chromium driven by Playwright.

Sign-in with an account made by `meterhub user add`, the spawn page's cards, starting debug
mode into JupyterLab, the Wallet after a stop, the admin view and its grant. Screenshots of
each page go to test-output/pages/.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger

from .hubprocess import ADMIN_TOKEN, until

METERHUB = str(Path(sys.executable).parent / "meterhub")
CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "pages"
PASSWORD = "correct-horse-battery-staple"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)


@pytest.fixture(scope="module")
def site_hub(hub_factory):
    hub = hub_factory(
        {
            "gpus": [{"type": "a800", "count": 2}, {"type": "rtx4090", "count": 1}],
            # 36.00/h is 0.01 a second: a short session shows a real cost; 2 × A800 at
            # 80.00/h is more than a new account's 10.00 covers for 10 minutes
            "profiles": {"debug": {"price_per_hour": "36.00"}, "a800": {"price_per_hour": 40}},
        },
        name="pages",
    )
    for name, admin in (("stu", False), ("vic", False)):
        add = [METERHUB, "user", "add", name, "--password-stdin", "--config", str(hub.config_path)]
        out = subprocess.run(
            add + (["--admin"] if admin else []),
            input=PASSWORD,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
    return hub


def sign_in(browser, hub, name: str, password: str = PASSWORD, **context):
    page = browser.new_context(**context).new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))
    return page


def admin_password(hub) -> str:
    return (Path(hub.data_dir) / "admin-password").read_text().strip()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def fits_a_phone(page, name: str) -> None:
    """At a phone's width nothing scrolls sideways."""
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 391
    shot(page, f"{name}-phone")


def session_of(hub, name: str, password: str = PASSWORD) -> requests.Session:
    """A signed-in session without a browser, through the login form."""
    return hub.sign_in(name, password)


def test_login_page_offers_sign_up_and_refuses_a_wrong_password(site_hub, browser):
    page = browser.new_page()
    page.goto(f"{site_hub.url}/hub/login")
    assert page.locator("#meterhub-signup a").get_attribute("href").endswith("/hub/signup")
    page.fill("input[name=username]", "stu")
    page.fill("input[name=password]", "not-the-password")
    page.click("input[type=submit]")
    page.wait_for_load_state()
    assert "/hub/login" in page.url
    assert "Invalid username or password" in page.content()
    shot(page, "login")
    page.close()


def test_spawn_page_shows_cards_prices_balance_and_reasons(site_hub, browser):
    page = sign_in(browser, site_hub, "stu")
    page.goto(f"{site_hub.url}/hub/spawn")
    cards = {
        slug: page.locator(f"#profile-{slug}") for slug in ("debug", "rtx4090", "a800", "h800")
    }
    assert cards["rtx4090"].locator(".meterhub-name").inner_text() == "RTX 4090"
    assert cards["a800"].locator(".meterhub-name").inner_text() == "A800"
    assert cards["h800"].locator(".meterhub-name").inner_text() == "H800"
    assert cards["rtx4090"].locator(".meterhub-price").inner_text() == "¥1.25/GPU-hour"
    assert cards["a800"].locator(".meterhub-price").inner_text() == "¥40.00/GPU-hour"
    assert cards["h800"].locator(".meterhub-price").inner_text() == "¥6.67/GPU-hour"
    assert "24 GB VRAM" in cards["rtx4090"].inner_text()
    assert "1 of 1 free now" in cards["rtx4090"].inner_text()
    debug = "No GPU — write and debug your code on the same disk for ¥36.00/h"
    assert debug in cards["debug"].inner_text()
    assert cards["debug"].locator(".meterhub-price").inner_text() == "¥36.00/h"
    # debug mode's card has a row of its own, as tall as its text: beside the GPU cards it
    # was stretched to their height, mostly empty
    page.set_viewport_size({"width": 1280, "height": 800})
    debug_box, rtx_box = cards["debug"].bounding_box(), cards["rtx4090"].bounding_box()
    assert debug_box["y"] + debug_box["height"] <= rtx_box["y"]
    assert debug_box["height"] < rtx_box["height"] / 2
    assert page.locator("#meterhub-form-balance").inner_text() == "Your balance: ¥10.00"
    # unavailable: no H800 here
    assert cards["h800"].locator("input[name=profile]").is_disabled()
    assert "No H800 on this machine" in cards["h800"].inner_text()
    # unaffordable: 2 × A800 is ¥80.00/h, ten minutes of it is more than ¥10.00
    two = cards["a800"].locator("input[name=gpus_a800][value='2']")
    assert two.is_disabled()
    label = cards["a800"].locator("label.meterhub-count").nth(1).inner_text()
    assert "2 × A800 — ¥80.00/h" in label and "(not enough credit)" in label
    one = cards["a800"].locator("label.meterhub-count").nth(0).inner_text()
    assert "≈ 15 min at this profile" in one  # ¥10.00 at ¥40.00/h
    assert "≈ 16 min at this profile" in cards["debug"].inner_text()  # ¥10.00 at ¥36.00/h
    # the optional limits: "stop after ¥X spent or after N hours"
    limits = page.locator("#meterhub-limits")
    assert "Stop this server automatically" in limits.inner_text()
    assert page.locator("#meterhub-max-hours").get_attribute("max") == "720"
    shot(page, "spawn")
    fits_a_phone(page, "spawn")
    page.context.close()


def test_the_environment_choice_disables_gpu_only_ones_in_debug_mode(site_hub, browser):
    # vllm "built" (its build's record and a server program: enough for the spawn page)
    build = Path(site_hub.data_dir) / "envs" / ".builds" / "vllm-1"
    (build / "bin").mkdir(parents=True, exist_ok=True)
    (build / "bin" / "jupyterhub-singleuser").write_text("#!/bin/sh\n")
    (build / "meterhub-env.json").write_text('{"slug": "vllm"}')
    link = Path(site_hub.data_dir) / "envs" / "vllm"
    if not link.is_symlink():
        link.symlink_to(Path(".builds") / "vllm-1")
    page = sign_in(browser, site_hub, "stu")
    page.goto(f"{site_hub.url}/hub/spawn")
    choice = page.locator("#meterhub-environments")
    radio = {
        slug: choice.locator(f"input[name=environment][value={slug}]")
        for slug in ("pytorch", "deepspeed", "vllm", "minimal")
    }
    assert radio["pytorch"].is_checked()
    # not built here: disabled whatever the profile, with the command that builds it
    minimal = choice.locator("[data-environment=minimal]").inner_text()
    assert radio["minimal"].is_disabled() and "meterhub env build minimal" in minimal
    assert (
        "(GPU profiles only, not debug mode)"
        in choice.locator("[data-environment=vllm]").inner_text()
    )
    # debug mode is checked first: vLLM cannot run there
    assert page.locator("#profile-debug input[name=profile]").is_checked()
    assert radio["vllm"].is_disabled()
    page.locator("#profile-rtx4090 input[name=profile]").check()
    assert radio["vllm"].is_enabled()
    radio["vllm"].check()
    page.locator("#profile-debug input[name=profile]").check()
    assert radio["vllm"].is_disabled() and radio["pytorch"].is_checked()
    shot(page, "spawn-environments")
    page.context.close()


def test_debug_mode_lands_in_jupyterlab_and_the_wallet_shows_its_cost(site_hub, browser):
    page = sign_in(browser, site_hub, "stu")
    page.goto(f"{site_hub.url}/hub/spawn")
    page.check("#profile-debug input[name=profile]")
    page.fill("#meterhub-max-cost", "7.00")  # ¥7.00 at ¥36.00/h: 700 s, longer than the test
    page.click("form#spawn_form [type=submit]")
    page.wait_for_url(re.compile(r".*/user/stu/lab.*"), timeout=120_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    # the status bar: balance, rate, time left, refreshed from /api/meterhub/status
    item = page.locator("#meterhub-credit-status")
    item.wait_for(timeout=60_000)
    page.wait_for_function(
        "document.querySelector('#meterhub-credit-status').textContent.includes('/h')",
        timeout=60_000,
    )
    # and the cap set on the spawn page, counting down
    shown = r"¥\d+\.\d\d · ¥36\.00/h · \d+ min left · cap: stops in \d+ min"
    assert re.fullmatch(shown, item.inner_text()), item.inner_text()
    # a warning from the meter reaches JupyterLab as a notification
    ledger = Ledger(connect(f"sqlite:///{site_hub.data_dir}/billing.sqlite"))
    warning = "10 minutes of credit left — your server will stop; your files are kept"
    ledger.notify("stu", "test:stu:warn", "warning", warning)
    page.get_by_text(warning).first.wait_for(timeout=60_000)
    shot(page, "jupyterlab")
    page.goto(f"{site_hub.url}/hub/wallet")  # while it runs: the live cost
    running = page.locator("#meterhub-running tbody tr").first.inner_text()
    assert "debug" in running and "¥36.00/h" in running and "¥" in running.split("/h")[-1]
    assert "stop after ¥7.00 (¥" in running  # the limit set on the spawn page, and what is left
    assert "¥36.00/h" in page.locator("#meterhub-summary").inner_text()
    r = site_hub.api("DELETE", "/users/stu/server")
    assert r.status_code in (202, 204)
    until(lambda: site_hub.server("stu") is None, "stu's server to stop")
    page.goto(f"{site_hub.url}/hub/wallet")
    out = subprocess.run(
        [METERHUB, "usage", "stu", "--csv", "--config", str(site_hub.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (session,) = list(csv.DictReader(io.StringIO(out.stdout)))
    cost = session["cost_CNY"]
    assert float(cost) > 0 and session["profile"] == "debug"
    row = page.locator("#meterhub-usage tbody tr").first.inner_text()
    assert "debug" in row and f"¥{cost}" in row and "stopped" in row
    shown = page.locator("#meterhub-balance").inner_text()
    ledger_line = (
        subprocess.run(
            [METERHUB, "credit", "show", "stu", "--config", str(site_hub.config_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert shown == "¥" + ledger_line.split()[0]
    assert page.locator("svg.meterhub-plot rect").count() >= 1  # today's debug spending
    csv_link = page.locator("#meterhub-csv").get_attribute("href")
    assert csv_link.endswith("/hub/wallet/usage.csv")
    download = page.request.get(f"{site_hub.url}{csv_link}")
    assert download.ok and download.text() == out.stdout  # the same export as the CLI
    shot(page, "wallet")
    fits_a_phone(page, "wallet")
    page.context.close()


def test_the_wallet_is_in_the_navigation_bar(site_hub, browser):
    page = sign_in(browser, site_hub, "vic")
    page.goto(f"{site_hub.url}/hub/home")
    page.click("text=Wallet")
    page.wait_for_url(re.compile(r".*/hub/wallet$"))
    assert page.locator("#meterhub-balance").inner_text() == "¥10.00"
    assert page.locator('a[href$="/hub/billing-admin"]').count() == 0  # not an admin
    page.context.close()


def test_a_non_admin_cannot_open_the_admin_view(site_hub, browser):
    page = sign_in(browser, site_hub, "vic")
    response = page.goto(f"{site_hub.url}/hub/billing-admin")
    assert response.status == 403
    assert page.locator("#meterhub-billing-admin").count() == 0
    page.context.close()


def test_a_grant_in_the_admin_view_shows_in_the_users_wallet(site_hub, browser):
    admin = sign_in(browser, site_hub, "admin", admin_password(site_hub))
    admin.goto(f"{site_hub.url}/hub/billing-admin")
    assert "runs when you ask" in admin.locator("#meterhub-audit").inner_text()
    admin.click("#meterhub-run-audit")
    assert "Sound" in admin.locator("#meterhub-audit").inner_text()
    assert "vic" in admin.locator("#meterhub-users").inner_text()
    admin.fill("#grant-user", "vic")
    admin.fill("#grant-amount", "12.50")
    admin.fill("#grant-note", "course lab 3")
    admin.click("#meterhub-grant button[type=submit]")
    admin.wait_for_load_state()
    assert "Granted ¥12.50 to vic; balance ¥22.50." in admin.content()
    assert "course lab 3" in admin.locator("#meterhub-entries").inner_text()
    shot(admin, "billing-admin")
    admin.reload()  # re-posting the same form is what a reload does: never a second grant
    user = sign_in(browser, site_hub, "vic")
    user.goto(f"{site_hub.url}/hub/wallet")
    assert user.locator("#meterhub-balance").inner_text() == "¥22.50"
    admin.context.close()
    user.context.close()


def wallet_of(hub, name: str) -> dict:
    return requests.get(
        f"{hub.url}/services/billing/api/v1/users/{name}/wallet",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    ).json()


def test_forms_without_their_xsrf_token_are_refused(site_hub):
    s = session_of(site_hub, "admin", admin_password(site_hub))
    page = s.get(f"{site_hub.url}/hub/billing-admin").text
    key = re.search(r'name="key" value="([^"]+)"', page).group(1)
    before = wallet_of(site_hub, "vic")["balance_micros"]
    for path, data in (
        ("/hub/billing-admin/grant", {"user": "vic", "amount": "1.00", "key": key}),
        ("/hub/wallet/passes", {"offer": "rtx4090:1:daily", "key": "x1"}),
        ("/hub/spawn", {"profile": "debug"}),
    ):
        r = s.post(f"{site_hub.url}{path}", data=data, allow_redirects=False)
        assert r.status_code == 403, (path, r.status_code)
    assert wallet_of(site_hub, "vic")["balance_micros"] == before  # nothing written
    assert site_hub.server("admin") is None


def test_buying_a_pass_on_the_wallet_page(site_hub):
    s = session_of(site_hub, "vic")
    page = s.get(f"{site_hub.url}/hub/wallet").text
    key = re.search(r'name="key" value="([^"]+)"', page).group(1)
    before = wallet_of(site_hub, "vic")["balance_micros"]
    # a daily 2 × A800 pass is far beyond the balance: refused with the reason, nothing paid
    r = s.post(
        f"{site_hub.url}/hub/wallet/passes",
        data={"offer": "a800:2:daily", "key": key, "_xsrf": s.cookies["_xsrf"]},
    )
    assert r.status_code == 402 and "Top up first" in r.text
    assert wallet_of(site_hub, "vic")["balance_micros"] == before
    # a daily 1 × RTX 4090 pass: ¥27.00 once the admin has granted enough
    granted = requests.post(
        f"{site_hub.url}/services/billing/api/v1/users/vic/grants",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        json={"amount": "30.00", "key": "pass-test"},
        timeout=30,
    )
    assert granted.status_code == 201, granted.text
    data = {"offer": "rtx4090:1:daily", "key": key, "_xsrf": s.cookies["_xsrf"]}
    r = s.post(f"{site_hub.url}/hub/wallet/passes", data=data)
    assert r.ok and "Bought a daily pass for 1 × RTX 4090 (¥27.00)" in r.text
    assert "daily · 1 × rtx4090" in r.text  # in the table of passes held
    paid = before + 30_000_000 - wallet_of(site_hub, "vic")["balance_micros"]
    assert paid == 27_000_000
    # the same form posted again (a reload) buys nothing more
    s.post(f"{site_hub.url}/hub/wallet/passes", data=data)
    assert wallet_of(site_hub, "vic")["balance_micros"] == before + 3_000_000


def test_a_user_cannot_read_another_users_wallet(site_hub):
    s = session_of(site_hub, "vic")
    token = site_hub.api("POST", "/users/vic/tokens", json={"note": "test"}).json()["token"]
    r = requests.get(
        f"{site_hub.url}/services/billing/api/v1/users/stu/wallet",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 403
    # the Wallet page has no user parameter: it shows the signed-in user's own wallet
    page = s.get(f"{site_hub.url}/hub/wallet?user=stu").text
    assert "No servers yet." in page  # vic's (stu has used debug mode)


def test_sign_up_waits_for_an_admin_to_approve(site_hub):
    s = requests.Session()
    s.get(f"{site_hub.url}/hub/signup")
    r = s.post(
        f"{site_hub.url}/hub/signup",
        data={
            "username": "wes",
            "signup_password": PASSWORD,
            "signup_password_confirmation": PASSWORD,
            "_xsrf": s.cookies["_xsrf"],
        },
    )
    assert r.ok and "sent to the admin" in r.text

    def sign_in_as_wes() -> int:
        return s.post(
            f"{site_hub.url}/hub/login",
            data={"username": "wes", "password": PASSWORD, "_xsrf": s.cookies["_xsrf"]},
            allow_redirects=False,
        ).status_code

    assert sign_in_as_wes() == 403  # not approved yet
    admin = session_of(site_hub, "admin", admin_password(site_hub))
    assert "wes" in admin.get(f"{site_hub.url}/hub/authorize").text
    approve = {"action": "approve", "_xsrf": admin.cookies["_xsrf"]}  # a POST from that page
    assert admin.post(f"{site_hub.url}/hub/authorize/wes", data=approve).ok
    assert sign_in_as_wes() == 302  # signed in, sent on to the spawn page
