"""Research groups through a real hub: paying from a group wallet, caps, removal, PI powers.

The CLI makes the group and queues membership; the hub applies it (and the PI's role) in
its own process within `groups.sync_interval_seconds`. Servers are real debug servers; the
meter runs every second.
"""

from __future__ import annotations

import csv
import io

import pytest
import requests

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import to_micros

from .clirun import run_cli
from .hubprocess import until

GROUP = "vision"
MEMBERS = ("ann", "bob")


@pytest.fixture(scope="module")
def lab(hub_factory):
    hub = hub_factory(
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "36.00"}},  # 0.01 per second
            "billing": {
                "trial_credit": "0.50",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
                "warn_minutes": [1],
            },
            "groups": {"sync_interval_seconds": 1},
        },
        name="groups",
    )
    for name in ("pia", "eve", *MEMBERS):
        hub.ensure_user(name)
    ok(cli(hub, "group", "create", "Vision", "--admin", "pia"))
    ok(cli(hub, "group", "add", GROUP, *MEMBERS))
    ok(cli(hub, "credit", "grant", f"group:{GROUP}", "20.00", "--key", "lab-1"))
    until(lambda: members(hub) == set(MEMBERS), "the hub to apply the membership")
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))

    def token(name):
        r = hub.api("POST", f"/users/{name}/tokens", json={"note": "groups"})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    hub.tokens = {name: token(name) for name in ("pia", "eve", *MEMBERS)}
    return hub


def cli(hub, *args):
    return run_cli([*args, "--config", str(hub.config_path)], cwd=hub.workdir)


def ok(out):
    assert out.returncode == 0, out.stderr
    return out.stdout


def members(hub) -> set[str]:
    r = hub.api("GET", f"/groups/{GROUP}")
    return set(r.json()["users"]) if r.status_code == 200 else set()


def billing(hub, method, path, who, **kwargs) -> requests.Response:
    return requests.request(
        method,
        f"{hub.url}/services/billing/api/v1{path}",
        headers={"Authorization": f"token {hub.tokens[who]}"},
        timeout=60,
        **kwargs,
    )


def group_balance(hub) -> int:
    return hub.ledger.balance(f"group:{GROUP}")


def test_a_member_pays_from_the_group_and_others_cannot(lab):
    ann_before = lab.ledger.balance("ann")
    before = group_balance(lab)
    lab.spawn("ann", {"profile": "debug", "wallet": f"group:{GROUP}"})
    (session,) = lab.ledger.open_sessions("ann")
    until(lambda: group_balance(lab) < before, "a charge to the group", timeout=30)
    lab.stop_server("ann")
    assert lab.ledger.balance("ann") == ann_before  # her own wallet paid nothing
    paid = lab.ledger.group_sessions(GROUP)
    assert [(s.id, s.user_name) for s, _cost in paid] == [(session.id, "ann")]
    assert before - group_balance(lab) == paid[0][1] > 0
    # who may not pay from it, and what is malformed
    refusals = {
        "eve": ({"profile": "debug", "wallet": "group:vision"}, 403, "not a member"),
        "bob": ({"profile": "debug", "wallet": "user:ann"}, 403, "your own wallet"),
        "ann": ({"profile": "debug", "wallet": "group:"}, 400, "invalid group name"),
    }
    for user, (options, status, words) in refusals.items():
        r = lab.api("POST", f"/users/{user}/server", json=options)
        assert r.status_code == status, r.text
        assert words in r.json()["message"]
    r = lab.api("POST", "/users/bob/server", json={"profile": "debug", "wallet": "group:nope"})
    assert r.status_code == 403  # not a member of a group that does not exist either
    assert lab.ledger.open_sessions() == [] and lab.ledger.audit() == []


def test_the_meter_stops_a_member_at_the_cap_as_at_zero(lab):
    ok(cli(lab, "group", "cap", GROUP, "bob", "0.04"))  # four seconds of debug this month
    lab.spawn("bob", {"profile": "debug", "wallet": f"group:{GROUP}"})
    until(lambda: lab.server("bob") is None, "the meter to stop bob at his cap", timeout=60)
    notes = [n.message for n in lab.ledger.notifications("bob")]
    assert any("Your vision cap for this month (¥0.04) is used up" in n for n in notes), notes
    allowance = lab.ledger.member_allowance(GROUP, "bob")
    # the documented bound: the cap plus the rate × (meter interval + stop latency)
    assert to_micros("0.04") <= allowance.spent_micros <= to_micros("0.04") + to_micros("0.10")
    r = lab.api("POST", "/users/bob/server", json={"profile": "debug", "wallet": "group:vision"})
    assert r.status_code == 402 and "Your vision cap for this month" in r.json()["message"]
    lab.spawn("bob", {"profile": "debug"})  # his own money still buys what he may start
    lab.stop_server("bob")
    ok(cli(lab, "group", "cap", GROUP, "bob", "none"))
    assert lab.ledger.audit() == []


def test_a_removed_member_keeps_the_running_session_but_cannot_start_another(lab):
    lab.spawn("ann", {"profile": "debug", "wallet": f"group:{GROUP}"})
    (session,) = lab.ledger.open_sessions("ann")
    ok(cli(lab, "group", "remove", GROUP, "ann"))
    until(lambda: "ann" not in members(lab), "the hub to apply the removal")
    charged = group_balance(lab)
    until(lambda: group_balance(lab) < charged, "the group to keep paying", timeout=30)
    assert lab.server("ann")["ready"]  # not stopped by the removal
    # the PI still caps what the group pays for her, and the group still shows it to him
    r = billing(lab, "PUT", f"/groups/{GROUP}/caps/ann", "pia", json={"amount": "9.00"})
    assert r.status_code == 200, r.text
    ok(cli(lab, "group", "cap", GROUP, "ann", "none"))
    # and she no longer reads the group: group reads ask the hub afresh, not a cached answer
    assert billing(lab, "GET", f"/groups/{GROUP}", "ann").status_code == 403
    lab.stop_server("ann")
    assert lab.ledger.session(session.id).wallet_id == session.wallet_id
    r = lab.api("POST", "/users/ann/server", json={"profile": "debug", "wallet": "group:vision"})
    assert r.status_code == 403 and "not a member" in r.json()["message"]
    ok(cli(lab, "group", "add", GROUP, "ann"))
    until(lambda: "ann" in members(lab), "the hub to add ann back")


def test_the_group_admin_manages_the_group_without_being_an_admin(lab):
    lab.spawn("ann", {"profile": "debug", "wallet": f"group:{GROUP}"})
    try:
        r = billing(lab, "GET", f"/groups/{GROUP}", "pia")
        assert r.status_code == 200, r.text
        view = r.json()
        assert view["administered"] and view["admins"] == ["pia"]
        assert {m["name"] for m in view["members"]} >= set(MEMBERS)
        assert [(s["member"], s["profile"]) for s in view["running"]] == [("ann", "debug")]
        # caps: for members only
        r = billing(lab, "PUT", f"/groups/{GROUP}/caps/ann", "pia", json={"amount": "3.00"})
        assert r.status_code == 200 and r.json()["cap"] == "3.00", r.text
        r = billing(lab, "PUT", f"/groups/{GROUP}/caps/eve", "pia", json={"amount": "3.00"})
        assert r.status_code == 404
        r = billing(lab, "PUT", f"/groups/{GROUP}/caps/ann", "pia", json={"amount": "-1"})
        assert r.status_code == 400
        # statements
        r = billing(lab, "GET", f"/groups/{GROUP}/usage?format=csv", "pia")
        assert r.status_code == 200
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert {row["member"] for row in rows} >= {"ann", "bob"}
        # never money from nothing, never another's personal wallet
        r = billing(lab, "POST", f"/groups/{GROUP}/grants", "pia", json={"amount": "1.00"})
        assert r.status_code == 403
        assert billing(lab, "GET", "/users/ann/wallet", "pia").status_code == 403
        # the hub's own API: stop a member's server, never start or open one
        headers = {"Authorization": f"token {lab.tokens['pia']}"}
        r = requests.get(f"{lab.url}/user/ann/api/contents", headers=headers, timeout=60)
        assert r.status_code in (403, 302), r.status_code
        r = lab.api("POST", "/users/bob/server", token=lab.tokens["pia"])
        assert r.status_code in (403, 404) and lab.server("bob") is None
        assert lab.api("DELETE", "/users/eve/server", token=lab.tokens["pia"]).status_code in (
            403,
            404,
        )
        assert lab.api("DELETE", "/users/ann/server", token=lab.tokens["pia"]).status_code in (
            202,
            204,
        )
        until(lambda: lab.server("ann") is None, "the PI's stop")
    finally:
        if lab.server("ann"):
            lab.stop_server("ann")


def test_members_read_the_group_others_do_not_and_members_set_nothing(lab):
    r = billing(lab, "GET", f"/groups/{GROUP}", "bob")
    assert r.status_code == 200 and r.json()["administered"] is False
    assert billing(lab, "GET", f"/groups/{GROUP}", "eve").status_code == 403
    assert billing(lab, "GET", "/groups/VISION", "bob").status_code == 200  # case-insensitive
    r = billing(lab, "PUT", f"/groups/{GROUP}/caps/bob", "bob", json={"amount": "99.00"})
    assert r.status_code == 403
    assert billing(lab, "GET", f"/groups/{GROUP}/usage", "bob").status_code == 403
    assert billing(lab, "GET", "/groups/nope", "pia").status_code == 403


def test_default_for_members_pays_without_naming_the_wallet(lab):
    ok(cli(lab, "group", "set", GROUP, "--default-for-members", "yes"))
    try:
        lab.spawn("bob", {"profile": "debug"})
        (session,) = lab.ledger.open_sessions("bob")
        assert lab.ledger.group_view(GROUP, ()).wallet_id == session.wallet_id
        lab.stop_server("bob")
        lab.spawn("bob", {"profile": "debug", "wallet": "user:bob"})  # naming his own wins
        (session,) = lab.ledger.open_sessions("bob")
        assert lab.ledger.group_view(GROUP, ()).wallet_id != session.wallet_id
        lab.stop_server("bob")
    finally:
        ok(cli(lab, "group", "set", GROUP, "--default-for-members", "no"))


def test_the_spawn_page_offers_pay_from_with_what_each_leaves(lab):
    from .test_pages import PASSWORD, session_of

    ok(
        run_cli(
            ["user", "add", "cyd", "--password-stdin", "--config", str(lab.config_path)],
            cwd=lab.workdir,
            stdin=PASSWORD,
        )
    )
    ok(cli(lab, "group", "add", GROUP, "cyd"))
    until(lambda: "cyd" in members(lab), "cyd to join")
    ok(cli(lab, "group", "cap", GROUP, "cyd", "2.00", "--period", "week"))
    session = session_of(lab, "cyd")
    page = session.get(f"{lab.url}/hub/spawn/cyd", timeout=60).content.decode()
    assert 'name="wallet" value="user:cyd"' in page
    assert 'name="wallet" value="group:vision"' in page
    assert "your cap for this week leaves ¥2.00" in page
