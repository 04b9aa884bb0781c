"""The wallet's ways out on a real hub: vouchers made with `meterhub voucher`, redeemed on the
Wallet page in Chromium and through the proxy with a user's token, listed with who used them;
a payment provider's signed top-up reaching the billing service through the proxy with the
secret from the hub's environment; and a pass the balance cannot buy pointing at both."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
import requests

from meterhub.billing_hooks import topups

from .clirun import run_cli
from .test_billing_api import user_token
from .test_billing_hub import ledger_of
from .test_pages import CHROMIUM, PASSWORD, shot, sign_in

SECRET = "hub-env-secret-" + "q" * 32

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Chromium is installed by `make test`"
)


@pytest.fixture(scope="module")
def credit_hub(hub_factory):
    # the secret only in the hub's environment: the managed billing service must get it
    os.environ["METERHUB_TOPUP_SECRET"] = SECRET
    try:
        hub = hub_factory(
            {
                "gpus": [{"type": "a800", "count": 1}],
                "billing": {"trial_credit": "9.99", "topup_url": "https://pay.example/?u={user}"},
            },
            name="credit",
        )
    finally:
        del os.environ["METERHUB_TOPUP_SECRET"]
    for name in ("lea", "max"):
        hub.add_user(name, PASSWORD)
    return hub


def cli(hub, *args):
    return run_cli([*args, "--config", str(hub.config_path)], cwd=hub.workdir)


def test_vouchers_from_the_cli_redeem_once_through_the_proxy_and_list_who(credit_hub):
    made = cli(credit_hub, "voucher", "create", "25.00", "--count", "2", "--note", "lab day")
    assert made.returncode == 0, made.stderr
    codes = made.stdout.split()
    assert len(codes) == 2 and all(re.fullmatch(r"([0-9A-Z]{5}-){3}[0-9A-Z]{5}", c) for c in codes)
    assert "made 2 voucher(s) of ¥25.00" in made.stderr
    url = f"{credit_hub.url}/services/billing/api/v1/wallet/redeem"
    lea = {"Authorization": f"token {user_token(credit_hub, 'lea')}"}
    r = requests.post(url, headers=lea, json={"code": codes[0]}, timeout=60)
    assert r.status_code == 201 and r.json()["balance"] == "34.99", r.text
    mine = {"Authorization": f"token {user_token(credit_hub, 'max')}"}
    r = requests.post(url, headers=mine, json={"code": codes[0]}, timeout=60)
    assert r.status_code == 409, r.text
    listed = cli(credit_hub, "voucher", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines()[1:-1]}
    used = rows[f"…{codes[0].replace('-', '')[-4:]}"]
    assert " used " in used and " lea " in used and "lab day" in used
    assert " unused " in rows[f"…{codes[1].replace('-', '')[-4:]}"]
    assert listed.stdout.splitlines()[-1].startswith("2 voucher(s): 1 unused, 1 used")
    # the second code is revoked: nobody can use it now
    (vid,) = [line.split()[0] for line in listed.stdout.splitlines() if " unused " in line]
    revoked = cli(credit_hub, "voucher", "revoke", vid)
    assert revoked.returncode == 0 and "revoked voucher" in revoked.stdout, revoked.stderr
    r = requests.post(url, headers=mine, json={"code": codes[1]}, timeout=60)
    assert r.status_code == 410 and "revoked" in r.json()["message"], r.text
    shown = cli(credit_hub, "credit", "show", "lea").stdout.splitlines()
    assert any(" topup " in line and "lab day" in line for line in shown), shown
    assert cli(credit_hub, "billing", "audit").returncode == 0


def test_a_signed_top_up_reaches_billing_through_the_proxy_and_a_token_does_not(
    credit_hub, admin_token
):
    url = f"{credit_hub.url}/services/billing/api/v1/topups"
    body = json.dumps({"transaction": "hub-pay-1", "user": "max", "amount": "40.00"}).encode()
    now = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "X-Meterhub-Timestamp": str(now),
        "X-Meterhub-Signature": topups.sign(SECRET.encode(), now, body),
    }
    r = requests.post(url, data=body, headers={"Authorization": f"token {admin_token}"}, timeout=60)
    assert r.status_code == 401, r.text
    r = requests.post(url, data=body, headers=headers, timeout=60)
    assert r.status_code == 201 and r.json()["user"] == "max", r.text
    r = requests.post(url, data=body, headers=headers, timeout=60)  # the provider's retry
    assert r.status_code == 200
    assert ledger_of(credit_hub).balance("max") == 49_990_000
    assert SECRET not in credit_hub.log_path.read_text(errors="replace")


def test_the_wallet_page_redeems_a_code_and_a_pass_it_cannot_buy_points_the_way(
    credit_hub, browser
):
    code = cli(credit_hub, "voucher", "create", "100.00").stdout.strip()
    page = sign_in(browser, credit_hub, "lea")
    page.goto(f"{credit_hub.url}/hub/wallet")
    credit = page.locator("#meterhub-add-credit")
    link = credit.locator("#meterhub-topup a")
    assert link.get_attribute("href") == "https://pay.example/?u=lea"
    # a pass dearer than the balance: refused, and the ways to add credit are right there
    before = page.locator("#meterhub-balance").inner_text()
    page.select_option("#offer", "a800:1:monthly")
    page.click("#meterhub-buy-pass button[type=submit]")
    page.wait_for_load_state()
    assert "Top up first." in page.locator("#meterhub-error").inner_text()
    page.click("#meterhub-add-credit-link")  # the refusal points at the ways to add credit
    assert page.url.endswith("#meterhub-add-credit")
    assert page.locator("#meterhub-redeem").is_visible() and link.is_visible()
    assert page.locator("#meterhub-balance").inner_text() == before
    shot(page, "wallet-pass-refused")
    # a form posted without the page's XSRF token is refused by the hub
    status = page.evaluate(
        """async (code) => (await fetch('/hub/wallet/redeem', {method: 'POST',
            headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: 'code=' + encodeURIComponent(code)})).status""",
        code,
    )
    assert status == 403
    page.fill("#voucher-code", code.lower())
    page.click("#meterhub-redeem button[type=submit]")
    page.wait_for_load_state()
    assert "Voucher redeemed: ¥100.00 added" in page.locator("[role=status]").inner_text()
    shot(page, "wallet-voucher-redeemed")
    page.fill("#voucher-code", "7KQ2M-X9D4R-0BN3S-W8TZE")
    page.click("#meterhub-redeem button[type=submit]")
    page.wait_for_load_state()
    assert "No voucher has this code" in page.locator("#meterhub-error").inner_text()
    page.close()
    assert cli(credit_hub, "billing", "audit").returncode == 0
