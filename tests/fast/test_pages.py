"""The Wallet and billing admin pages, server side, for cookie sessions made by the real
login form (NativeAuthenticator's accounts, as `meterhub user add` and the first start make
them)."""

from __future__ import annotations

import re
from pathlib import Path

from .inprocess import FAST

pytestmark = FAST


def balance_shown(html: str) -> str:
    match = re.search(r'id="meterhub-balance">([^<]*)<', html)
    assert match, html[:500]
    return match.group(1)


async def admin_session(hub):
    """The first admin signs in with the password the first start printed and kept."""
    password = (Path(hub.site["data_dir"]) / "admin-password").read_text().strip()
    return await hub.sign_in(hub.site["admin_users"][0], password)


async def test_the_wallet_page_shows_a_signed_in_users_balance_and_running_cost(fast_hub):
    r = await fast_hub.request("GET", f"{fast_hub.url}/hub/wallet")
    assert r.status_code == 302 and "/hub/login" in r.headers["Location"]
    await fast_hub.add_account("eve")
    eve = await fast_hub.sign_in("eve")
    assert "Authorization" not in eve.headers  # a cookie session, no token
    r = await fast_hub.request("GET", f"{fast_hub.url}/hub/wallet", session=eve)
    assert r.status_code == 200, r.text[:500]
    assert balance_shown(r.text) == "¥1.00"
    assert "No server running: nothing is being charged." in r.text
    r = await fast_hub.api("POST", "/users/eve/server", json={"profile": "debug"})
    assert r.status_code in (201, 202), r.text
    r = await fast_hub.request("GET", f"{fast_hub.url}/hub/wallet", session=eve)
    assert r.status_code == 200 and "¥3.60/h" in r.text, r.text[:2000]
    await fast_hub.api("DELETE", "/users/eve/server")


async def test_only_an_admin_grants_on_the_admin_page(fast_hub):
    await fast_hub.add_account("fay")
    fay = await fast_hub.sign_in("fay")
    r = await fast_hub.request("GET", f"{fast_hub.url}/hub/billing-admin", session=fay)
    assert r.status_code == 403, r.status_code
    form = {"user": "fay", "amount": "5", "key": "fast-page-1", "_xsrf": fay.cookies["_xsrf"]}
    url = f"{fast_hub.url}/hub/billing-admin/grant"
    r = await fast_hub.request("POST", url, session=fay, data=form)
    assert r.status_code == 403, r.status_code
    assert fast_hub.ledger.balance("fay") == 1_000_000

    admin = await admin_session(fast_hub)
    r = await fast_hub.request("GET", f"{fast_hub.url}/hub/billing-admin", session=admin)
    assert r.status_code == 200, r.status_code
    without_xsrf = {k: v for k, v in form.items() if k != "_xsrf"}
    r = await fast_hub.request("POST", url, session=admin, data=without_xsrf)
    assert r.status_code == 403, r.status_code  # a cross-site form post
    assert fast_hub.ledger.balance("fay") == 1_000_000
    r = await fast_hub.request(
        "POST", url, session=admin, data=form | {"_xsrf": admin.cookies["_xsrf"]}
    )
    assert r.status_code == 200 and "Granted ¥5.00 to fay" in r.text, r.text[:2000]
    assert fast_hub.ledger.balance("fay") == 6_000_000
    r = await fast_hub.request("GET", f"{fast_hub.url}/hub/wallet", session=fay)
    assert balance_shown(r.text) == "¥6.00"
