"""The wallet's ways out, in process behind the hub's real token checks: redeeming a voucher
(a user's token, another user's, a server's own token, a service's), its rate limit, the
payment provider's signed top-up hook (good, bad, stale and replayed signatures and bodies,
hub tokens in place of one), the Wallet page's forms, and pass offers only for what the
site has and the user may start."""

from __future__ import annotations

import json
import re

import pytest_asyncio

from meterhub.billing_hooks import topups
from meterhub.billing_hooks.money import MICROS, to_micros
from meterhub.billing_hooks.vouchers import new_code

from ..hubprocess import ADMIN_TOKEN
from .inprocess import FAST, eventually

pytestmark = FAST

SECRET = "s3cret-" + "k" * 40
PER_USER = 3


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hub(fast_hub_factory):
    return await fast_hub_factory(
        {
            "gpus": [{"type": "a800", "count": 2}],
            "profiles": {"a800": {"allowed_groups_by_count": {"2": ["staff"]}}},
            "billing": {
                "trial_credit": "1.00",
                "topup_secret": SECRET,
                "topup_url": "https://pay.example/meterhub?for={user}",
                "redeem_failures_per_user": PER_USER,
            },
        },
        name="credit",
    )


def voucher(hub, amount: str = "20.00") -> str:
    (made,) = hub.ledger.create_vouchers(to_micros(amount), 1, "cli:op")
    return made.code


async def server_token(hub, name: str) -> str:
    """The token `name`'s running server holds (what code in a notebook can read)."""
    r = await hub.api("POST", f"/users/{name}/server", json={"profile": "debug"})
    assert r.status_code in (201, 202), r.text
    await eventually(lambda: hub.running(name), f"{name}'s server")
    return hub.app.users[name].spawner.api_token


async def redeem(hub, token: str, code: str):
    return await hub.billing("POST", "/wallet/redeem", token, json={"code": code})


async def test_a_user_redeems_a_code_once_and_nobody_else_can(hub):
    amy, ben = await hub.user_token("amy"), await hub.user_token("ben")
    code = voucher(hub)
    r = await redeem(hub, amy, code.lower().replace("-", " "))
    assert r.status_code == 201, r.text
    entry = r.json()
    assert (entry["kind"], entry["amount"], entry["balance"], entry["actor"]) == (
        "topup",
        "20.00",
        "21.00",
        "amy",
    )
    again = await redeem(hub, amy, code)
    assert again.status_code == 200 and again.json() == entry  # a retry: the same entry
    taken = await redeem(hub, ben, code)
    assert taken.status_code == 409 and "already redeemed" in taken.json()["message"]
    assert (hub.ledger.balance("amy"), hub.ledger.balance("ben")) == (21 * MICROS, MICROS)
    assert hub.ledger.audit() == []


async def test_a_servers_token_a_service_and_no_token_redeem_nothing(hub):
    cy = await hub.user_token("cy")
    kernel = await server_token(hub, "cy")
    code = voucher(hub)
    r = await redeem(hub, kernel, code)
    assert r.status_code == 403 and "custom:meterhub:spend" in r.json()["message"], r.text
    r = await redeem(hub, ADMIN_TOKEN, code)  # the operator's service: no wallet of its own
    assert r.status_code == 400, r.text
    r = await hub.request("POST", f"{hub.billing_url}/wallet/redeem", json={"code": code})
    assert r.status_code == 403, r.text
    assert hub.ledger.balance("cy") == MICROS
    # the code is still good for its owner's own token
    assert (await redeem(hub, cy, code)).status_code == 201
    await hub.api("DELETE", "/users/cy/server")


async def test_bad_codes_are_refused_clearly_and_then_rate_limited(hub):
    dan = await hub.user_token("dan")
    good = voucher(hub)
    for body, status in (
        ({"code": 12}, 400),
        ({"code": "x" * 65}, 400),
        ({}, 400),
        # no way to name another wallet: the code goes into the token owner's, or nowhere
        ({"code": good, "user": "amy"}, 400),
        ({"code": good, "wallet": "group:staff"}, 400),
    ):
        r = await hub.billing("POST", "/wallet/redeem", dan, json=body)
        assert r.status_code == status, (body, r.text)
    r = await redeem(hub, dan, "not-a-code")  # malformed: refused, not counted
    assert r.status_code == 400 and "20 letters and digits" in r.json()["message"]
    for _i in range(PER_USER):
        r = await redeem(hub, dan, new_code())
        assert r.status_code == 404 and "No voucher has this code" in r.json()["message"]
    r = await redeem(hub, dan, good)  # even a good code waits now
    assert r.status_code == 429, r.text
    retry = int(r.headers["Retry-After"])
    assert 0 < retry <= 900 and "try again in" in r.json()["message"]
    assert hub.ledger.balance("dan") == MICROS
    # another user is not limited by dan's failures
    eve = await hub.user_token("eve")
    assert (await redeem(hub, eve, voucher(hub, "1.00"))).status_code == 201
    hub.clock.advance(retry)
    assert (await redeem(hub, dan, good)).status_code == 201
    assert hub.ledger.balance("dan") == 21 * MICROS


# ---------------------------------------------------------------------- the top-up hook


def signed(body: dict | bytes, at: int, secret: str = SECRET) -> tuple[bytes, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {
        "X-Meterhub-Timestamp": str(at),
        "X-Meterhub-Signature": topups.sign(secret.encode(), at, raw),
        "Content-Type": "application/json",
    }
    return raw, headers


async def post_topup(hub, raw: bytes, headers: dict):
    return await hub.request("POST", f"{hub.billing_url}/topups", data=raw, headers=headers)


async def test_a_signed_top_up_credits_once_per_transaction(hub):
    await hub.ensure_user("fay")
    body = {"transaction": "pay_001", "user": "fay", "amount": "30.00", "note": "Alipay"}
    raw, headers = signed(body, hub.clock())
    r = await post_topup(hub, raw, headers)
    assert r.status_code == 201, r.text
    got = r.json()
    assert (got["kind"], got["amount"], got["user"], got["transaction"]) == (
        "topup",
        "30.00",
        "fay",
        "pay_001",
    )
    assert got["actor"] == "topup-hook" and got["note"] == "top-up pay_001: Alipay"
    # the provider retries (a new timestamp and signature, the same transaction): no money
    hub.clock.advance(120)
    raw, headers = signed(body, hub.clock())
    again = await post_topup(hub, raw, headers)
    assert again.status_code == 200 and again.json() == got
    # the same transaction id for another amount or user is a conflict, loudly
    for change in ({"amount": "300.00"}, {"user": "amy"}):
        raw, headers = signed({**body, **change}, hub.clock())
        r = await post_topup(hub, raw, headers)
        assert r.status_code == 409 and "pay_001" in r.json()["message"], r.text
    assert hub.ledger.balance("fay") == 31 * MICROS
    assert hub.ledger.audit() == []


async def test_unsigned_stale_forged_or_token_only_top_ups_are_refused(hub):
    await hub.ensure_user("gus")
    body = {"transaction": "pay_002", "user": "gus", "amount": "5.00"}
    now = hub.clock()
    raw, headers = signed(body, now)
    url = f"{hub.billing_url}/topups"
    cases = {
        # a hub token, even the operator's, is no signature
        "admin token": {"Authorization": f"token {ADMIN_TOKEN}"},
        "no headers": {},
        "wrong secret": signed(body, now, secret="another-" + "k" * 40)[1],
        "stale": signed(body, now - topups.TOLERANCE_SECONDS - 1)[1],
        "from the future": signed(body, now + topups.TOLERANCE_SECONDS + 1)[1],
        "bad timestamp": {**headers, "X-Meterhub-Timestamp": "yesterday"},
        "signature of another body": {
            **headers,
            "X-Meterhub-Signature": signed({**body, "amount": "0.01"}, now)[1][
                "X-Meterhub-Signature"
            ],
        },
    }
    for why, these in cases.items():
        r = await hub.request("POST", url, data=raw, headers=these)
        assert r.status_code == 401, (why, r.status_code, r.text)
        assert "WWW-Authenticate" in r.headers, why
        assert SECRET not in r.text
    # a body changed after signing (the amount) is refused too
    tampered = raw.replace(b'"5.00"', b'"500.00"')
    assert (await post_topup(hub, tampered, headers)).status_code == 401
    assert hub.ledger.balance("gus") == MICROS
    # the signed original still goes through
    assert (await post_topup(hub, raw, headers)).status_code == 201


async def test_a_signed_but_bad_body_writes_nothing(hub):
    await hub.ensure_user("hal")
    at = hub.clock()
    for body, status, says in (
        ({"transaction": "t1", "user": "nobody-here", "amount": "5"}, 404, "No such user"),
        ({"transaction": "t2", "user": "hal", "amount": "5.001"}, 400, "two"),
        ({"transaction": "t3", "user": "hal", "amount": "10000"}, 400, "below"),
        ({"transaction": "t4", "user": "hal", "amount": "-5"}, 400, "amount"),
        ({"transaction": "t5", "user": "hal", "amount": "5", "currency": "USD"}, 400, "CNY"),
        ({"transaction": "bad id", "user": "hal", "amount": "5"}, 400, "printable ASCII"),
        ({"transaction": "t6", "user": "hal"}, 400, "amount"),
        ({"transaction": "t7", "user": "hal", "amount": "5", "extra": 1}, 400, "extra"),
        # money is a decimal string: no float, no exponent, nothing huge
        ({"transaction": "t8", "user": "hal", "amount": 12.5}, 400, "amount"),
        ({"transaction": "t9", "user": "hal", "amount": "1e3"}, 400, "amount"),
        ({"transaction": "t10", "user": "hal", "amount": "9" * 30}, 400, "amount"),
        ({"transaction": "t11", "user": "hal", "amount": "0"}, 400, "amount"),
    ):
        raw, headers = signed(body, at)
        r = await post_topup(hub, raw, headers)
        assert r.status_code == status and says in r.json()["message"], (body, r.text)
    raw, headers = signed(b"{not json", at)
    assert (await post_topup(hub, raw, headers)).status_code == 400
    assert hub.ledger.balance("hal") == MICROS
    assert hub.ledger.balance("nobody-here") is None


# ---------------------------------------------------------------------- the Wallet page


async def test_the_wallet_page_redeems_a_code_and_links_the_payment_page(hub):
    await hub.add_account("ivy")
    ivy = await hub.sign_in("ivy")
    page = f"{hub.url}/hub/wallet"
    r = await hub.request("GET", page, session=ivy)
    assert r.status_code == 200
    assert 'href="https://pay.example/meterhub?for=ivy"' in r.text
    assert 'id="meterhub-redeem"' in r.text
    code = voucher(hub, "7.50")
    form = {"code": code, "_xsrf": ivy.cookies["_xsrf"]}
    # a form posted from elsewhere (no XSRF token) is refused and writes nothing
    no_xsrf = {"code": code}
    r = await hub.request("POST", f"{page}/redeem", session=ivy, data=no_xsrf)
    assert r.status_code == 403 and hub.ledger.balance("ivy") == MICROS
    r = await hub.request("POST", f"{page}/redeem", session=ivy, data=form)
    assert r.status_code == 200, r.text[:2000]
    assert "Voucher redeemed: ¥7.50 added; your balance is ¥8.50." in r.text
    r = await hub.request("POST", f"{page}/redeem", session=ivy, data=form)
    assert r.status_code == 200 and "You redeemed this voucher on" in r.text
    r = await hub.request("POST", f"{page}/redeem", session=ivy, data={**form, "code": "nope"})
    assert r.status_code == 400 and 'id="meterhub-error"' in r.text
    assert hub.ledger.balance("ivy") == to_micros("8.50")
    # the page is limited as the API is, and says when to come back (the shared act())
    for _i in range(PER_USER):
        r = await hub.request(
            "POST", f"{page}/redeem", session=ivy, data={**form, "code": new_code()}
        )
        assert r.status_code == 404, r.text[:2000]
    r = await hub.request("POST", f"{page}/redeem", session=ivy, data=form)
    assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 900
    assert hub.ledger.balance("ivy") == to_micros("8.50")


async def test_pass_offers_are_what_the_site_has_and_the_user_may_start(hub):
    jo = await hub.user_token("jo")
    r = await hub.billing("GET", "/users/jo/passes", jo)
    offers = {(o["profile"], o["gpus"]) for o in r.json()["offers"]}
    # two A800 here, and two of them are for the staff group: one A800 for jo
    assert offers == {("a800", 1)}, offers
    # what cannot be offered cannot be bought either, whatever the credit
    hub.ledger.grant("jo", to_micros("5000"), key="jo-rich")
    for choice, status in (
        ({"profile": "a800", "gpus": 2}, 403),
        ({"profile": "h800", "gpus": 1}, 409),
    ):
        r = await hub.billing("POST", "/users/jo/passes", jo, json={**choice, "period": "daily"})
        assert r.status_code == status, (choice, r.text)
    assert hub.ledger.passes("jo") == []
    await hub.add_account("kim")
    kim = await hub.sign_in("kim")
    r = await hub.request("GET", f"{hub.url}/hub/wallet", session=kim)
    options = set(re.findall(r'<option value="([^"]+)"', r.text))
    assert options == {"a800:1:daily", "a800:1:weekly", "a800:1:monthly"}, options
    # a pass the balance cannot pay: "Top up first." links the voucher form and the payment
    # page, both on the page it answers with
    form = {"offer": "a800:1:daily", "key": "kim-pass-1", "_xsrf": kim.cookies["_xsrf"]}
    r = await hub.request("POST", f"{hub.url}/hub/wallet/passes", session=kim, data=form)
    assert r.status_code == 402 and "Top up first." in r.text, r.text[:2000]
    assert 'href="#meterhub-add-credit" id="meterhub-add-credit-link"' in r.text
    assert 'id="meterhub-add-credit"' in r.text and 'id="meterhub-redeem"' in r.text
    assert 'href="https://pay.example/meterhub?for=kim"' in r.text
    assert hub.ledger.passes("kim") == []
