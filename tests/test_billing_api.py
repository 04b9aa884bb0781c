"""The billing REST API on a real hub: own data only, admin grants, clear 4xx, OpenAPI."""

from __future__ import annotations

import pytest
import requests

from .hubprocess import ADMIN_TOKEN


@pytest.fixture(scope="module")
def api_hub(hub_factory):
    hub = hub_factory({"gpus": [], "billing": {"trial_credit": "10.00"}}, name="api")
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
    assert again.status_code == 201 and again.json()["balance"] == "22.50"  # a retry
    conflict = billing(
        api_hub, "POST", "/users/ben/grants", ADMIN_TOKEN, json={**grant, "amount": "13"}
    )
    assert conflict.status_code == 409
    for body, why in [
        (b"{not json", "Malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"amount": "-1"}', "positive"),
        (b'{"amount": "1.001"}', "decimals"),
        (b'{"amount": 1.5}', "number"),
        (b'{"amount": "1e9"}', "below"),
        (b'{"amount": "5", "key": 7}', "key must be a string"),
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
        ({"profile": "a800", "gpus": "3", "period": "daily"}, "must be one of"),
        ({"profile": "a800", "gpus": "1", "period": "yearly"}, "Unknown period"),
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
    assert (
        billing(api_hub, "POST", "/users/amy/passes", amy, json=cheap).status_code == 201
    )  # retry
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
