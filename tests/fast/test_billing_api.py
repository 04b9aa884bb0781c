"""The billing REST API in process, behind the hub's real token checks: a user's token
reads its own wallet and cannot grant; the admin's token can."""

from __future__ import annotations

from ..hubprocess import ADMIN_TOKEN
from .inprocess import FAST

pytestmark = FAST


async def test_a_users_token_reads_its_own_wallet_and_cannot_grant(fast_hub):
    amy = await fast_hub.user_token("amy")
    await fast_hub.ensure_user("ben")
    r = await fast_hub.billing("GET", "/wallet", amy)
    assert r.status_code == 200, r.text
    wallet = r.json()
    assert (wallet["user"], wallet["balance"], wallet["currency"]) == ("amy", "1.00", "CNY")
    r = await fast_hub.billing("GET", "/users/ben/wallet", amy)
    assert r.status_code == 403 and "own wallet" in r.json()["message"], r.text
    for who in ("amy", "ben"):
        r = await fast_hub.billing("POST", f"/users/{who}/grants", amy, json={"amount": "100"})
        assert r.status_code == 403 and "admin:users" in r.json()["message"], r.text
    assert [e.kind for e in fast_hub.ledger.wallet_entries("amy")] == ["trial"]
    assert [e.kind for e in fast_hub.ledger.wallet_entries("ben")] == ["trial"]


async def test_the_admins_token_grants_once_per_key(fast_hub):
    await fast_hub.ensure_user("cat")
    grant = {"amount": "2.50", "note": "lab", "key": "fast-grant-1"}
    r = await fast_hub.billing("POST", "/users/cat/grants", ADMIN_TOKEN, json=grant)
    assert r.status_code == 201, r.text
    assert r.json()["balance"] == "3.50"
    again = await fast_hub.billing("POST", "/users/cat/grants", ADMIN_TOKEN, json=grant)
    assert again.status_code == 200 and again.json() == r.json()  # a retry: the same entry
    assert fast_hub.ledger.balance("cat") == 3_500_000
    (entry,) = [e for e in fast_hub.ledger.wallet_entries("cat") if e.kind == "grant"]
    assert (entry.amount_micros, entry.actor) == (2_500_000, "service:meterhub-admin")


async def test_no_token_and_unknown_users_are_refused(fast_hub):
    r = await fast_hub.billing("GET", "/wallet", "not-a-token")
    assert r.status_code == 403, r.text
    # the billing service asks the hub (with its own token) whether the user exists
    r = await fast_hub.billing("POST", "/users/nobody/grants", ADMIN_TOKEN, json={"amount": "5"})
    assert r.status_code == 404, r.text
    assert fast_hub.ledger.balance("nobody") is None
