"""The billing REST API on a real hub: own data only, admin grants, clear 4xx, OpenAPI."""

from __future__ import annotations

import pytest
import requests

from .hubprocess import ADMIN_TOKEN


@pytest.fixture(scope="module")
def api_hub(hub_factory):
    # declared GPUs (never spawned here): passes are sold only for what the site has
    gpus = [{"type": "a800", "count": 1}, {"type": "rtx4090", "count": 2}]
    hub = hub_factory({"gpus": gpus, "billing": {"trial_credit": "10.00"}}, name="api")
    for name in ("amy", "ben"):
        hub.ensure_user(name)
    return hub


def user_token(hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"note": "test"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def billing(hub, method, path, token, **kwargs) -> requests.Response:
    return requests.request(
        method,
        f"{hub.url}/services/billing/api/v1{path}",
        headers={"Authorization": f"token {token}"},
        allow_redirects=False,
        timeout=30,
        **kwargs,
    )


def test_a_user_reads_their_own_wallet_and_nobody_elses(api_hub):
    amy = user_token(api_hub, "amy")
    r = billing(api_hub, "GET", "/wallet", amy)
    assert r.status_code == 200, r.text
    wallet = r.json()
    assert (wallet["user"], wallet["balance"], wallet["currency"]) == ("amy", "10.00", "CNY")
    assert wallet["balance_micros"] == 10_000_000 and wallet["running"] == []
    assert billing(api_hub, "GET", "/users/amy/usage", amy).json() == {"sessions": []}
    for path in ("/users/ben/wallet", "/users/ben/usage", "/users/ben/notifications"):
        r = billing(api_hub, "GET", path, amy)
        assert r.status_code == 403 and "own wallet" in r.json()["message"], path
    r = billing(api_hub, "POST", "/users/amy/grants", amy, json={"amount": "100"})
    assert r.status_code == 403 and "admin:users" in r.json()["message"]
    assert billing(api_hub, "GET", "/wallet", amy).json()["balance"] == "10.00"


def test_admin_grants_idempotently_and_bad_input_gets_4xx(api_hub):
    grant = {"amount": "12.50", "note": "lab", "key": "req-1"}
    r = billing(api_hub, "POST", "/users/ben/grants", ADMIN_TOKEN, json=grant)
    assert r.status_code == 201, r.text
    assert r.json()["balance"] == "22.50"
    again = billing(api_hub, "POST", "/users/ben/grants", ADMIN_TOKEN, json=grant)
    assert again.status_code == 200 and again.json() == r.json()  # a retry: the same entry
    conflict = billing(
        api_hub, "POST", "/users/ben/grants", ADMIN_TOKEN, json={**grant, "amount": "13"}
    )
    assert conflict.status_code == 409
    for body, why in [
        (b"{not json", "Malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"amount": "-1"}', "amount: expected an amount"),
        (b'{"amount": "0"}', "amount: must be positive"),
        (b'{"amount": "1.001"}', "at most two"),
        (b'{"amount": 1.5}', "amount: 1.5 is not of type 'string'"),
        (b'{"amount": "1e9"}', "amount: expected"),
        (b'{"amount": "1000000"}', "amount: must be below"),
        (b'{"amount": "5", "key": 7}', "key: 7 is not of type"),
        (b'{"amount": "5", "tip": 1}', "Additional properties"),
        (b"{}", "'amount' is a required property"),
    ]:
        r = billing(api_hub, "POST", "/users/ben/grants", ADMIN_TOKEN, data=body)
        assert r.status_code == 400 and why in r.json()["message"], (body, r.text)
    r = billing(api_hub, "POST", "/users/nobody/grants", ADMIN_TOKEN, json={"amount": "5"})
    assert r.status_code == 404
    wallet = billing(api_hub, "GET", "/users/ben/wallet", ADMIN_TOKEN).json()
    assert wallet["balance"] == "22.50"


def test_no_token_no_data_and_openapi_is_served(api_hub):
    r = billing(api_hub, "GET", "/users/amy/wallet", "not-a-token")
    assert r.status_code in (302, 401, 403)
    assert "balance" not in r.text
    spec = requests.get(f"{api_hub.url}/services/billing/api/v1/openapi.json", timeout=30).json()
    assert spec["openapi"].startswith("3.") and "/users/{name}/grants" in spec["paths"]


def test_buying_a_pass_from_the_wallet(api_hub):
    amy = user_token(api_hub, "amy")
    r = billing(api_hub, "GET", "/users/amy/passes", amy)
    assert r.status_code == 200
    offers = {(o["profile"], o["gpus"], o["period"]): o["price"] for o in r.json()["offers"]}
    assert (
        offers[("a800", 1, "daily")] == "97.20" and offers[("rtx4090", 2, "monthly")] == "1116.00"
    )
    broke = billing(
        api_hub,
        "POST",
        "/users/amy/passes",
        amy,
        json={"profile": "a800", "gpus": "1", "period": "daily"},
    )
    assert broke.status_code == 402 and "Top up first" in broke.json()["message"]
    for body, why in [
        ({"profile": "debug", "gpus": "1", "period": "daily"}, "no GPUs"),
        ({"profile": "a800", "gpus": "3", "period": "daily"}, "gpus:"),
        ({"profile": "a800", "gpus": "1", "period": "yearly"}, "period: 'yearly' is not one of"),
    ]:
        r = billing(api_hub, "POST", "/users/amy/passes", amy, json=body)
        assert r.status_code == 400 and why in r.json()["message"], r.text
    cheap = {"profile": "rtx4090", "gpus": "1", "period": "daily", "key": "k1"}
    assert billing(api_hub, "POST", "/users/ben/passes", amy, json=cheap).status_code == 403
    billing(
        api_hub, "POST", "/users/amy/grants", ADMIN_TOKEN, json={"amount": "20", "key": "g-amy"}
    )
    r = billing(api_hub, "POST", "/users/amy/passes", amy, json=cheap)
    assert r.status_code == 201, r.text
    assert r.json()["price"] == "27.00" and r.json()["period"] == "daily"
    assert billing(api_hub, "GET", "/wallet", amy).json()["balance"] == "3.00"
    retry = billing(api_hub, "POST", "/users/amy/passes", amy, json=cheap)
    assert retry.status_code == 200 and retry.json() == r.json()
    assert billing(api_hub, "GET", "/wallet", amy).json()["balance"] == "3.00"
    assert len(billing(api_hub, "GET", "/users/amy/passes", amy).json()["passes"]) == 1


def test_admins_set_prices_for_new_sessions(api_hub):
    amy = user_token(api_hub, "amy")
    prices = billing(api_hub, "GET", "/prices", amy).json()["prices"]
    assert prices["a800"] == {"price_per_hour": "4.50", "per": "GPU-hour", "set_by_admin": False}
    r = billing(api_hub, "PUT", "/prices/a800", amy, json={"price_per_hour": "5.00"})
    assert r.status_code == 403
    assert (
        billing(
            api_hub, "PUT", "/prices/a100", ADMIN_TOKEN, json={"price_per_hour": "1"}
        ).status_code
        == 404
    )
    bad = billing(api_hub, "PUT", "/prices/a800", ADMIN_TOKEN, json={"price_per_hour": "4.555"})
    assert bad.status_code == 400 and "decimals" in bad.json()["message"]
    r = billing(api_hub, "PUT", "/prices/debug", ADMIN_TOKEN, json={"price_per_hour": "0.20"})
    assert r.status_code == 200
    prices = billing(api_hub, "GET", "/prices", amy).json()["prices"]
    assert prices["debug"] == {"price_per_hour": "0.20", "per": "hour", "set_by_admin": True}
    # a new session captures the new price
    api_hub.spawn("amy", {"profile": "debug"})
    running = billing(api_hub, "GET", "/wallet", amy).json()["running"]
    assert [s["rate_per_hour"] for s in running] == ["0.20"]
    api_hub.stop_server("amy")


def wallet_count(hub) -> set[str]:
    from .test_billing_hub import ledger_of

    return {w.owner_name for w in ledger_of(hub).user_wallets()}


def test_every_bad_shape_is_a_4xx_that_names_the_field_and_writes_nothing(api_hub):
    before = billing(api_hub, "GET", "/users/ben/wallet", ADMIN_TOKEN).json()["balance"]
    grants = "/users/ben/grants"
    for body, status, why in [
        (b'{"amount": ' + b"1" * 5000 + b"}", 400, "Malformed JSON"),
        (b'{"amount": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 413, "larger than"),
        (b'{"amount": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", 400, "Malformed JSON"),
        (b'{"amount": NaN}', 400, "Malformed JSON"),
        (b'{"amount": "5", "note": "' + b"x" * 70_000 + b'"}', 413, "larger than"),
    ]:
        r = billing(api_hub, "POST", grants, ADMIN_TOKEN, data=body)
        assert r.status_code == status and why in r.json()["message"], (body[:40], r.text[:300])
    for amount in ("١٢", "１２", "1_000", "+5", " 5 ", "1e1", "5.", ".5", "05", "-0", "Infinity"):
        r = billing(api_hub, "POST", grants, ADMIN_TOKEN, json={"amount": amount})
        assert r.status_code == 400 and "amount:" in r.json()["message"], (amount, r.text)
    for body, why in [
        ({"profile": "a800", "gpus": 1, "period": ["daily"]}, "period:"),
        ({}, "'profile' is a required property"),
        ({"profile": ["a800"], "gpus": 1, "period": "daily"}, "profile:"),
    ]:
        r = billing(api_hub, "POST", "/users/ben/passes", ADMIN_TOKEN, json=body)
        assert r.status_code == 400 and why in r.json()["message"], (body, r.text)
    # a bad idempotency key is refused before the balance is looked at (ben could not pay)
    for key in ("", "x" * 121, "tab\there", "ключ".encode()):
        r = requests.post(
            f"{api_hub.url}/services/billing/api/v1/users/ben/passes",
            headers={"Authorization": f"token {ADMIN_TOKEN}", "Idempotency-Key": key},
            json={"profile": "a800", "gpus": 1, "period": "monthly"},
            timeout=30,
        )
        assert r.status_code == 400 and "idempotency key" in r.json()["message"], (key, r.text)
    assert billing(api_hub, "GET", "/users/ben/wallet", ADMIN_TOKEN).json()["balance"] == before


def test_methods_answer_405_with_allow_and_prices_are_readable_by_users(api_hub):
    amy = user_token(api_hub, "amy")
    r = billing(api_hub, "DELETE", "/users/amy/wallet", amy)
    assert r.status_code == 405 and r.headers["Allow"] == "GET"
    r = billing(api_hub, "PATCH", "/prices/a800", ADMIN_TOKEN)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, PUT"
    r = billing(api_hub, "GET", "/prices/a800", amy)
    assert r.status_code == 200 and r.json()["profile"] == "a800"
    assert billing(api_hub, "GET", "/prices/a100", amy).status_code == 404


def test_money_routes_refuse_users_the_hub_does_not_have(api_hub):
    before = wallet_count(api_hub)
    for name in ("ghost%0Auser", "ghost", "x" * 300):
        for method, path, body in [
            ("GET", "wallet", None),
            ("GET", "usage", None),
            ("GET", "notifications", None),
            ("GET", "passes", None),
            ("POST", "passes", {"profile": "a800", "gpus": 1, "period": "daily"}),
            ("POST", "grants", {"amount": "5"}),
            ("POST", "adjustments", {"amount": "5", "reason": "x"}),
        ]:
            r = billing(api_hub, method, f"/users/{name}/{path}", ADMIN_TOKEN, json=body)
            assert r.status_code == 404, (name, path, r.status_code, r.text)
    assert wallet_count(api_hub) == before  # no wallet, no trial credit for nobody


def test_idempotency_keys_adjustments_and_refunds_record_who_did_it(api_hub):
    from .test_billing_hub import ledger_of

    headers = {"Authorization": f"token {ADMIN_TOKEN}", "Idempotency-Key": "adj-1"}
    url = f"{api_hub.url}/services/billing/api/v1/users/amy/adjustments"
    first = requests.post(url, headers=headers, json={"amount": "-1.50", "reason": "typo"})
    assert first.status_code == 201, first.text
    entry = first.json()
    assert (entry["kind"], entry["amount"], entry["actor"]) == (
        "adjustment",
        "-1.50",
        "service:meterhub-admin",
    )
    again = requests.post(url, headers=headers, json={"amount": "-1.50", "reason": "typo"})
    assert again.status_code == 200 and again.json() == entry
    other = requests.post(url, headers=headers, json={"amount": "-1.51", "reason": "typo"})
    assert other.status_code == 409
    for body, why in [
        ({"amount": "0", "reason": "x"}, "non-zero"),
        ({"amount": "1", "reason": ""}, "reason:"),
        ({"amount": "1"}, "'reason' is a required property"),
    ]:
        r = billing(api_hub, "POST", "/users/amy/adjustments", ADMIN_TOKEN, json=body)
        assert r.status_code == 400 and why in r.json()["message"], (body, r.text)
    amy = user_token(api_hub, "amy")
    r = billing(api_hub, "POST", "/users/amy/adjustments", amy, json={"amount": "9", "reason": "x"})
    assert r.status_code == 403
    # a refund: never more than the session was charged
    ledger = ledger_of(api_hub)
    auth = ledger.open_session("amy", "r", "debug", 0, 3_600_000, min_seconds=0)
    ledger.mark_ready(auth.session_id, at=ledger.clock() - 3600)
    ledger.close_session(auth.session_id, ledger.clock())
    refunds = f"/sessions/{auth.session_id}/refunds"
    too_much = billing(api_hub, "POST", refunds, ADMIN_TOKEN, json={"amount": "99", "reason": "x"})
    assert too_much.status_code == 409 and "at most" in too_much.json()["message"]
    part = billing(api_hub, "POST", refunds, ADMIN_TOKEN, json={"amount": "1.00", "reason": "slow"})
    assert part.status_code == 201 and part.json()["session"] == auth.session_id
    rest = billing(api_hub, "POST", refunds, ADMIN_TOKEN, json={"reason": "outage"})
    assert rest.status_code == 201 and rest.json()["amount"] == "2.60"
    assert billing(api_hub, "POST", refunds, ADMIN_TOKEN, json={"reason": "x"}).status_code == 409
    assert (
        billing(
            api_hub, "POST", "/sessions/99999/refunds", ADMIN_TOKEN, json={"reason": "x"}
        ).status_code
        == 404
    )
    assert ledger.audit() == []


def test_passes_fit_the_inventory_beside_other_passes(api_hub):
    offers = billing(api_hub, "GET", "/users/ben/passes", ADMIN_TOKEN).json()["offers"]
    assert {(o["profile"], o["gpus"]) for o in offers} == {
        ("a800", 1),
        ("rtx4090", 1),
        ("rtx4090", 2),
    }
    for who in ("amy", "ben"):
        billing(api_hub, "POST", f"/users/{who}/grants", ADMIN_TOKEN, json={"amount": "500"})
    big = {"profile": "a800", "gpus": 8, "period": "daily"}
    r = billing(api_hub, "POST", "/users/ben/passes", ADMIN_TOKEN, json=big)
    assert r.status_code == 409 and "cannot be sold" in r.json()["message"], r.text
    one = {"profile": "a800", "gpus": 1, "period": "daily"}
    assert billing(api_hub, "POST", "/users/ben/passes", ADMIN_TOKEN, json=one).status_code == 201
    r = billing(api_hub, "POST", "/users/amy/passes", ADMIN_TOKEN, json=one)
    assert r.status_code == 409 and "0 left" in r.json()["message"], r.text


def test_holes_found_by_the_attack_stay_closed(api_hub):
    """Each case once got through: a duplicate key chose the larger amount, a lone
    surrogate was a 500, a non-ASCII digit named a session, a key served two kinds of
    request, a revoked token kept moving money, a body over 1 MiB was the proxy's 503."""
    grants = "/users/ben/grants"
    before = billing(api_hub, "GET", "/users/ben/wallet", ADMIN_TOKEN).json()["balance"]
    for body, why in [
        (b'{"amount": "1.00", "amount": "99999.00"}', "appears twice"),
        (b'{"amount": "1.00", "note": "\\ud800"}', "lone surrogate"),
        (b'{"amount": "1.00", "note": "nul\\u0000"}', "control characters"),
    ]:
        r = billing(api_hub, "POST", grants, ADMIN_TOKEN, data=body)
        assert r.status_code == 400 and why in r.json()["message"], (body, r.text)
    for session in ("%C2%B9", "%D9%A1", "0", "-1"):
        r = billing(
            api_hub, "POST", f"/sessions/{session}/refunds", ADMIN_TOKEN, json={"reason": "x"}
        )
        assert r.status_code == 404, (session, r.text)
    r = requests.post(
        f"{api_hub.url}/services/billing/api/v1{grants}",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        data=b'{"amount": "1.00", "note": "' + b"x" * (2 * 1024 * 1024) + b'"}',
        timeout=60,
    )
    assert r.status_code == 413, r.text[:200]
    assert billing(api_hub, "GET", "/users/ben/wallet", ADMIN_TOKEN).json()["balance"] == before
    # one key, one request, whatever its kind
    headers = {"Authorization": f"token {ADMIN_TOKEN}", "Idempotency-Key": "one-key"}
    base = f"{api_hub.url}/services/billing/api/v1/users/ben"
    assert (
        requests.post(f"{base}/grants", headers=headers, json={"amount": "1.00"}).status_code == 201
    )
    r = requests.post(
        f"{base}/adjustments", headers=headers, json={"amount": "1.00", "reason": "x"}
    )
    assert r.status_code == 409, r.text
    # a revoked token stops at once, though billing has seen it a moment ago
    r = api_hub.api("POST", "/users/admin/tokens", json={"note": "revoked"})
    token, token_id = r.json()["token"], r.json()["id"]
    assert billing(api_hub, "GET", "/users/ben/wallet", token).status_code == 200
    assert api_hub.api("DELETE", f"/users/admin/tokens/{token_id}").status_code == 204
    r = billing(api_hub, "POST", grants, token, json={"amount": "7.77"})
    assert r.status_code == 403, r.text
