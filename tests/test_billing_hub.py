"""Billing through a real hub: trial credit, refusal when broke, exact charges, the CLI."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import accrued, format_money, to_micros
from meterhub.billing_hooks.orm import MeteredSession

from .clirun import run_cli
from .hubprocess import ADMIN_TOKEN, until
from .jupyter import execute

DEBUG_RATE = to_micros("3.60")  # 0.001 per second: a few seconds show up in micros


@pytest.fixture(scope="module")
def billed(hub_factory):
    return hub_factory(
        {
            "gpus": [{"type": "a800", "count": 2}],
            "profiles": {"debug": {"price_per_hour": "3.60"}},
            "billing": {"trial_credit": "1.00", "min_minutes_to_start": 10},
        },
        name="billed",
    )


def cli(hub, *args) -> subprocess.CompletedProcess:
    return run_cli([*args, "--config", str(hub.config_path)], cwd=hub.workdir)


def test_new_account_gets_trial_credit_once(billed):
    billed.ensure_user("tia")
    out = cli(billed, "credit", "show", "tia")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1.00 CNY"
    kinds = [line.split()[1] for line in out.stdout.strip().splitlines()[:-1]]
    assert kinds == ["trial"]  # granted by the hub when the account was created


def test_spawn_refused_when_credit_does_not_cover_ten_minutes(billed):
    billed.ensure_user("ray")
    r = billed.api("POST", "/users/ray/server", json={"profile": "a800", "gpus": "2"})
    assert r.status_code == 402, r.text
    message = r.json()["message"]
    assert "Your balance is ¥1.00" in message and "¥9.00/h" in message
    assert "Top up, or choose debug mode" in message
    assert billed.server("ray") is None


def test_running_time_is_charged_exactly_from_ready_to_stop(billed):
    billed.spawn("sal", {"profile": "debug"})
    time.sleep(2)  # real run time is what is charged here
    billed.stop_server("sal")
    out = cli(billed, "usage", "sal", "--csv")
    assert out.returncode == 0, out.stderr
    (row,) = list(csv.DictReader(io.StringIO(out.stdout)))
    seconds = int(row["seconds"])
    assert row["profile"] == "debug" and seconds >= 2 and row["stopped_at"]
    assert ledger_of(billed).balance("sal") == 1_000_000 - accrued(DEBUG_RATE, seconds)
    shown = cli(billed, "credit", "show", "sal").stdout.strip().splitlines()[-1]
    assert shown == format_money(1_000_000 - accrued(DEBUG_RATE, seconds), symbol=False)
    assert cli(billed, "billing", "audit").returncode == 0


def test_a_server_found_dead_is_charged_until_last_seen_running(billed):
    server = billed.spawn("dee", {"profile": "debug"})
    os.killpg(server["state"]["pid"], signal.SIGKILL)  # the OOM killer, a crash
    killed = int(time.time())
    time.sleep(2)  # the hub finds out only later: here, on the stop request below
    r = billed.api("DELETE", "/users/dee/server")
    assert r.status_code in (202, 204), r.text
    until(lambda: billed.server("dee") is None, "dee's dead server to be cleaned up")
    with ledger_of(billed).begin() as db:
        (session,) = db.query(MeteredSession).filter_by(user_name="dee").all()
        assert session.ready_at <= session.stopped_at <= killed  # not the 2 s after it died
    assert cli(billed, "billing", "audit").returncode == 0


BAD_GRANTS = [
    ("0", "must be positive"),
    ("-3", "expected an amount like"),
    ("1.001", "at most two decimals"),
    ("abc", "expected an amount like"),
    ("１２", "ASCII digits"),
    ("100000", "below"),
]


def test_bad_grants_are_refused_and_write_nothing(billed):
    billed.ensure_user("uli")
    before = cli(billed, "credit", "show", "uli").stdout
    for amount, why in BAD_GRANTS:
        out = cli(billed, "credit", "grant", "uli", amount)
        assert out.returncode == 2 and why in out.stderr and "Traceback" not in out.stderr, amount
    assert cli(billed, "credit", "show", "uli").stdout == before


def test_grant_and_unknown_user(billed):
    billed.ensure_user("vi")
    out = cli(billed, "credit", "grant", "vi", "12.50", "--note", "course lab")
    assert out.returncode == 0, out.stderr
    assert cli(billed, "credit", "show", "vi").stdout.strip().splitlines()[-1] == "13.50 CNY"
    missing = cli(billed, "credit", "grant", "nobody", "5")
    assert missing.returncode == 2 and "unknown user 'nobody'" in missing.stderr


@pytest.fixture(scope="module")
def metered(hub_factory):
    return hub_factory(
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "36.00"}},  # 0.01 per second
            "billing": {
                "trial_credit": "0.08",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
                "warn_minutes": [1],
            },
        },
        name="metered",
    )


def ledger_of(hub):
    return Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))


async def test_meter_charges_while_running_and_stops_at_zero_keeping_the_disk(metered):
    ledger = ledger_of(metered)
    metered.spawn("wyn", {"profile": "debug"})
    await execute(metered.url, "wyn", ADMIN_TOKEN, "open('work.txt','w').write('kept')")
    until(lambda: ledger.balance("wyn") < to_micros("0.08"), "a charge while running", timeout=30)
    until(lambda: metered.server("wyn") is None, "the meter to stop the server at zero", timeout=60)
    notes = ledger.notifications("wyn")
    assert [n.kind for n in notes] == ["warning", "stopped"]
    assert "your files are kept" in notes[0].message and "Your files are kept" in notes[1].message
    with ledger.begin() as db:
        (session,) = db.query(MeteredSession).filter_by(user_name="wyn").all()
    stop_latency = session.stopped_at - notes[1].created_at
    overshoot = -ledger.balance("wyn")
    rate = to_micros("36.00")
    # the documented bound, plus a second for whole-second timestamps
    assert overshoot <= accrued(rate, 1 + stop_latency + 1), (overshoot, stop_latency)
    assert ledger.audit() == []
    disk = Path(metered.data_dir) / "disks" / "wyn" / "work.txt"
    assert disk.read_text() == "kept"


def test_the_same_billing_on_postgresql(hub_factory, postgres):
    url = postgres.new_database()
    hub = hub_factory(
        {"gpus": [], "billing": {"db_url": url, "trial_credit": "0.50"}}, name="pghub"
    )
    hub.ensure_user("pam")
    r = hub.api("POST", "/users/pam/server", json={"profile": "debug"})
    assert r.status_code in (201, 202), r.text
    until(lambda: (s := hub.server("pam")) and s["ready"], "pam's server")
    hub.stop_server("pam")
    ledger = Ledger(connect(url))
    with ledger.begin() as db:
        (session,) = db.query(MeteredSession).filter_by(user_name="pam").all()
    assert session.stopped_at is not None and session.ready_at is not None
    assert ledger.balance("pam") == to_micros("0.50") - accrued(
        session.rate_micros_per_hour, session.metered_through - session.ready_at
    )
    assert ledger.audit() == []
    hub.teardown()


def test_spawn_page_shows_balance_run_time_and_refusal(billed):
    from .test_local_hub import login

    session = login(billed)
    form = session.get(f"{billed.url}/hub/spawn").content.decode()
    assert "Your balance: ¥1.00" in form
    assert "≈ 16 min at this profile" in form  # debug at ¥3.60/h
    assert "2 × A800 — ¥9.00/h · ≈ 6 min at this profile (not enough credit)" in form
    r = session.post(
        f"{billed.url}/hub/spawn",
        data={"profile": "a800", "gpus_a800": "2", "_xsrf": session.cookies.get("_xsrf")},
    )
    page = r.content.decode()
    assert "Your balance is ¥1.00" in page and "Top up, or choose debug mode" in page
    assert billed.server("admin") is None


def test_a_pass_reserves_its_gpus_for_its_holder(billed):

    billed.ensure_user("res")
    billed.ensure_user("oth")
    services = f"{billed.url}/services/billing/api/v1"
    auth = {"Authorization": f"token {ADMIN_TOKEN}"}
    r = requests.post(
        f"{services}/users/res/grants", json={"amount": "100"}, headers=auth, timeout=30
    )
    assert r.status_code == 201, r.text
    r = requests.post(
        f"{services}/users/res/passes",
        json={"profile": "a800", "gpus": "1", "period": "daily"},
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 201, r.text
    # oth has ¥1.00: enough for 10 minutes of one A800 (¥0.75), but not of two
    r = billed.api("POST", "/users/oth/server", json={"profile": "a800", "gpus": "1"})
    assert r.status_code in (201, 202), r.text
    until(lambda: (s := billed.server("oth")) and s["ready"], "oth's server")
    # the last free A800 is kept for the pass holder: another user cannot take it
    billed.ensure_user("ivo")
    r = billed.api("POST", "/users/ivo/server", json={"profile": "a800", "gpus": "1"})
    assert r.status_code == 409 and "reserved for pass holders" in r.json()["message"], r.text
    usage = requests.get(
        f"{billed.url}/services/billing/api/v1/users/ivo/usage",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert usage.json() == {"sessions": []}  # a refused spawn leaves no ¥0 session behind
    server = billed.spawn("res", {"profile": "a800", "gpus": "1"})
    assert len(server["state"]["gpu_indices"]) == 1
    billed.stop_server("res")
    billed.stop_server("oth")


def test_the_servers_status_endpoint_matches_the_wallet(billed):
    """GET /api/meterhub/status inside the user's server, with the server's own token."""

    billed.spawn("zed", {"profile": "debug"})
    try:
        token = billed.api("POST", "/users/zed/tokens", json={"note": "lab"}).json()["token"]
        auth = {"Authorization": f"token {token}"}
        ledger_of(billed).notify("zed", "test:zed:1", "warning", "10 min of credit left")
        status = requests.get(
            f"{billed.url}/user/zed/api/meterhub/status", headers=auth, timeout=30
        )
        assert status.status_code == 200, status.text
        status = status.json()
        wallet = requests.get(
            f"{billed.url}/services/billing/api/v1/users/zed/wallet",
            headers={"Authorization": f"token {ADMIN_TOKEN}"},
            timeout=30,
        ).json()
        assert status["currency"] == "CNY" and status["rate_per_hour"] == "3.60"
        assert abs(float(status["balance"]) - float(wallet["balance"])) < 0.05
        assert (status["profile"], status["gpus"]) == ("debug", 0)
        assert status["minutes_left"] is not None and status["minutes_left"] <= 17
        # the meter may add its own low-credit warning (¥1.00 at ¥3.60/h) beside ours
        assert "10 min of credit left" in [n["message"] for n in status["notifications"]]
        # the server's token reaches its own billing data, not an admin's
        env = execute_env(billed, "zed")
        assert env["token_scopes"] and "admin:users" not in env["token_scopes"]
        shown = asyncio.run(
            execute(
                billed.url,
                "zed",
                ADMIN_TOKEN,
                "from meterhub.extensions.widgets import CreditMeter\nprint(CreditMeter(interval=0).value)",
            )
        )
        # the widget shows the same answer as the status endpoint
        assert re.search(r"<b>¥\d+\.\d\d</b> · ¥3\.60/h · \d+ min left", shown), shown
        assert "10 min of credit left" in shown
    finally:
        billed.stop_server("zed")


def execute_env(hub, user: str) -> dict:
    """The server's own token, as the server sees it: what may it do?"""
    import asyncio
    import json

    out = asyncio.run(
        execute(
            hub.url,
            user,
            ADMIN_TOKEN,
            "import os, json, urllib.request\n"
            "r = urllib.request.Request(os.environ['JUPYTERHUB_API_URL'] + '/user',"
            " headers={'Authorization': 'token ' + os.environ['JUPYTERHUB_API_TOKEN']})\n"
            "print(json.dumps({'token_scopes': json.load(urllib.request.urlopen(r))['scopes']}))",
        )
    )
    return json.loads(out.strip().splitlines()[-1])
