"""The group page in a real browser: a member's view, the PI's powers (stop, caps,
statements) and their limits, on a real hub whose group was made with `meterhub group`.

amy is a member of lab and runs a debug server paid by the group; pia is lab's admin (a PI,
not a hub admin, not a member); ben is in no group. The screenshot goes to
test-output/pages/group-page.png.
"""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from .clirun import run_cli
from .hubprocess import ADMIN_TOKEN, until
from .test_pages import CHROMIUM, PASSWORD, admin_password, fits_a_phone, session_of, shot

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)

GROUP = "lab"
# 36.00/h is 0.01 a second: a few seconds show a real cost
DEBUG_RATE = "36.00"


def meterhub(hub, *argv: str, stdin: str | None = None) -> str:
    out = run_cli([*argv, "--config", str(hub.config_path)], stdin=stdin)
    assert out.returncode == 0, (argv, out.stdout, out.stderr)
    return out.stdout


def sign_in(browser, hub, name: str):
    """test_pages.sign_in, landing on the Wallet page: amy's running server would take her
    sign-in on to JupyterLab."""
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login?next=%2Fhub%2Fwallet")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r".*/hub/wallet$"))
    return page


def xsrf(session) -> dict:
    """The hub's XSRF token for a signed-in session, as a form field."""
    return {"_xsrf": next(c.value for c in session.cookies if c.name == "_xsrf")}


def group_wallet(hub) -> dict:
    r = requests.get(
        f"{hub.url}/services/billing/api/v1/groups/{GROUP}",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def group_hub(hub_factory):
    hub = hub_factory(
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": DEBUG_RATE}},
            "billing": {"meter_interval_seconds": 1},
            "groups": {"sync_interval_seconds": 1},
        },
        name="group-page",
    )
    for name in ("amy", "pia", "ben"):
        meterhub(hub, "user", "add", name, "--password-stdin", stdin=PASSWORD)
    meterhub(hub, "group", "create", GROUP, "--admin", "pia")
    meterhub(hub, "group", "add", GROUP, "amy")
    meterhub(hub, "credit", "grant", f"group:{GROUP}", "20")

    def synced() -> bool:
        r = hub.api("GET", f"/groups/{GROUP}")
        pia = hub.api("GET", "/users/pia").json()
        return (
            r.status_code == 200
            and r.json()["users"] == ["amy"]
            and f"meterhub-group-admin-{GROUP}" in pia["roles"]
        )

    until(synced, "the hub to apply lab's membership and pia's role")
    meterhub(hub, "group", "cap", GROUP, "amy", "10")  # a member now (caps are for members)
    # amy's debug server, paid by the group, charged at least once
    hub.spawn("amy", {"profile": "debug", "wallet": f"group:{GROUP}"})
    until(
        lambda: group_wallet(hub)["balance"] != "20.00",
        "the meter to charge the group for amy's server",
    )
    yield hub
    if hub.server("amy") is not None:
        hub.stop_server("amy")


def test_a_member_sees_the_wallet_members_caps_plot_and_no_forms(group_hub, browser):
    page = sign_in(browser, group_hub, "amy")
    link = page.locator("#meterhub-groups a")
    assert link.inner_text() == GROUP
    link.click()
    page.wait_for_url(re.compile(rf".*/hub/groups/{GROUP}$"))
    wallet = group_wallet(group_hub)
    assert page.locator("#meterhub-group-balance").inner_text().startswith("¥")
    assert re.fullmatch(
        r"(≈ \d+ (days|h)|more than a year) left at the last 7 days' spending",
        page.locator("#meterhub-runway").inner_text(),
    )
    row = page.locator('#meterhub-members tr[data-member="amy"]').inner_text()
    assert "¥10.00 / month" in row and "this month" in row
    # the meter charges amy every second, so the page and the API are read at different
    # moments: each must add up to the cap, spent + left, to the fen (36.00/h charges whole
    # fen a second, so no rounding splits a fen between the two)
    spent, left = re.fullmatch(
        r"amy\t¥(\d+\.\d\d) this month\t¥10\.00 / month\t¥(\d+\.\d\d)", row
    ).groups()
    assert Decimal(spent) + Decimal(left) == Decimal("10.00") and Decimal(spent) > 0
    (amy,) = wallet["members"]
    assert Decimal(amy["spent"]) + Decimal(amy["left"]) == Decimal("10.00")
    assert page.locator("svg.meterhub-plot rect").count() >= 1  # today's spending by amy
    assert "amy" in page.locator("#meterhub-legend").inner_text()
    running = page.locator('#meterhub-group-running tr[data-member="amy"]').inner_text()
    assert "debug" in running and "¥36.00/h" in running
    # a member, not an admin: no Stop buttons, no cap forms, no statements
    assert page.locator("form.meterhub-stop-form").count() == 0
    assert page.locator("form.meterhub-cap-form").count() == 0
    assert page.locator("#meterhub-statements").count() == 0
    assert page.request.get(f"{group_hub.url}/hub/groups/{GROUP}/statement.csv").status == 403
    page.context.close()


def test_the_pi_stops_a_members_server_sets_a_cap_and_downloads_the_statement(group_hub, browser):
    page = sign_in(browser, group_hub, "pia")
    page.locator("#meterhub-groups a", has_text=GROUP).click()
    page.wait_for_url(re.compile(rf".*/hub/groups/{GROUP}$"))
    running = page.locator('#meterhub-group-running tr[data-member="amy"]')
    assert "debug" in running.inner_text()
    shot(page, "group-page")
    # Stop: the hub stops amy's server; the ledger closes the session
    running.locator("button", has_text="Stop").click()
    page.wait_for_load_state()
    assert (
        "Stopped amy's server; its files are kept."
        in page.locator("#meterhub-message").inner_text()
    )
    assert group_hub.server("amy") is None
    assert group_wallet(group_hub)["running"] == []
    assert page.locator("#meterhub-group-running").count() == 0
    # a cap with the form
    form = page.locator('#meterhub-members tr[data-member="amy"] form.meterhub-cap-form')
    form.locator("input[name=amount]").fill("7.50")
    form.locator("select[name=period]").select_option("week")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert "amy may spend ¥7.50 a week from lab." in page.locator("#meterhub-message").inner_text()
    row = page.locator('#meterhub-members tr[data-member="amy"]').inner_text()
    assert "¥7.50 / week" in row
    (amy,) = group_wallet(group_hub)["members"]
    assert (amy["cap"], amy["period"]) == ("7.50", "week")
    # a refused cap says why and changes nothing
    form = page.locator('#meterhub-members tr[data-member="amy"] form.meterhub-cap-form')
    form.locator("input[name=amount]").fill("-1")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert page.locator("#meterhub-error").count() == 1
    assert group_wallet(group_hub)["members"][0]["cap"] == "7.50"
    # statements: this month's (amy's session) and all
    months = page.locator("#meterhub-statements a").all_inner_texts()
    assert months[-1] == "all" and re.fullmatch(r"\d{4}-\d{2}", months[0])
    for link in (months[0], "all"):
        href = page.locator("#meterhub-statements a", has_text=link).get_attribute("href")
        download = page.request.get(f"{group_hub.url}{href}")
        assert download.ok and download.headers["content-type"].startswith("text/csv")
        (session,) = list(csv.DictReader(io.StringIO(download.text())))
        assert session["member"] == "amy" and session["profile"] == "debug"
        assert float(session["cost_CNY"]) > 0
    bad = page.request.get(f"{group_hub.url}/hub/groups/{GROUP}/statement.csv?month=2026-13")
    assert bad.status == 400
    fits_a_phone(page, "group-page")
    page.context.close()


def test_someone_in_no_group_gets_403_and_an_unknown_group_404(group_hub, browser):
    page = sign_in(browser, group_hub, "ben")
    assert page.locator("#meterhub-groups").count() == 0  # no "Your groups" on the Wallet
    assert page.goto(f"{group_hub.url}/hub/groups/{GROUP}").status == 403
    assert page.locator("#meterhub-group").count() == 0
    page.context.close()
    admin = session_of(group_hub, "admin", admin_password(group_hub))
    assert admin.get(f"{group_hub.url}/hub/groups/{GROUP}").status_code == 200  # billing admin
    assert admin.get(f"{group_hub.url}/hub/groups/nolab").status_code == 404


def test_forms_without_their_xsrf_token_are_refused(group_hub):
    s = session_of(group_hub, "pia")
    before = group_wallet(group_hub)["members"]
    for path, data in (
        ("caps", {"user": "amy", "amount": "1.00", "period": "month"}),
        ("stop", {"user": "amy", "server": ""}),
    ):
        r = s.post(f"{group_hub.url}/hub/groups/{GROUP}/{path}", data=data, allow_redirects=False)
        assert r.status_code == 403, (path, r.status_code)
    assert group_wallet(group_hub)["members"] == before


def test_the_pi_cannot_stop_a_non_members_server_nor_a_member_set_caps(group_hub):
    group_hub.spawn("ben", {"profile": "debug"})  # his own wallet; not in the group
    try:
        pia = session_of(group_hub, "pia")
        r = pia.post(
            f"{group_hub.url}/hub/groups/{GROUP}/stop",
            data={"user": "ben", "server": ""} | xsrf(pia),
        )
        assert r.status_code == 404 and "not a member of lab" in r.text
        assert group_hub.server("ben") is not None
        r = pia.post(
            f"{group_hub.url}/hub/groups/{GROUP}/caps",
            data={"user": "ben", "amount": "1", "period": "month"} | xsrf(pia),
        )
        assert r.status_code == 404
        amy = session_of(group_hub, "amy")
        for path, data in (
            ("caps", {"user": "amy", "amount": "100", "period": "total"}),
            ("stop", {"user": "ben", "server": ""}),
        ):
            r = amy.post(
                f"{group_hub.url}/hub/groups/{GROUP}/{path}",
                data=data | xsrf(amy),
            )
            assert r.status_code == 403, (path, r.status_code)
        assert group_hub.server("ben") is not None
        assert group_wallet(group_hub)["members"][0]["cap"] != "100.00"
    finally:
        group_hub.stop_server("ben")


def test_the_pi_stops_what_the_group_pays_for_a_member_removed_since(group_hub, browser):
    group_hub.spawn("amy", {"profile": "debug", "wallet": f"group:{GROUP}"})
    meterhub(group_hub, "group", "remove", GROUP, "amy")
    until(
        lambda: group_hub.api("GET", f"/groups/{GROUP}").json()["users"] == [],
        "the hub to apply the removal",
    )
    page = sign_in(browser, group_hub, "pia")
    page.goto(f"{group_hub.url}/hub/groups/{GROUP}")
    running = page.locator('#meterhub-group-running tr[data-member="amy"]')
    running.locator("button", has_text="Stop").click()
    page.wait_for_load_state()
    assert "Stopped amy's server" in page.locator("#meterhub-message").inner_text()
    assert group_hub.server("amy") is None
    meterhub(group_hub, "group", "add", GROUP, "amy")
