"""Crash safety with real processes: kill the meter mid-pass and the hub mid-session.

Afterwards the session's charges must add up to exactly floor(rate × run time): nothing
lost while a process was down, nothing doubled when it came back, and the audit clean.
"""

from __future__ import annotations

import os
import signal

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import accrued, to_micros
from meterhub.billing_hooks.orm import Entry, MeteredSession

from .hubprocess import until

RATE = to_micros("36.00")


def charges(ledger) -> int:
    with ledger.begin() as db:
        return db.query(Entry).filter(Entry.kind == "charge").count()


def test_killing_the_meter_and_the_hub_loses_and_doubles_nothing(hub_factory):
    hub = hub_factory(
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "36.00"}},
            "billing": {"trial_credit": "100.00", "meter_interval_seconds": 1},
        },
        name="crash",
    )
    ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    hub.spawn("kit", {"profile": "debug"})
    until(lambda: charges(ledger) >= 2, "the meter to charge")

    # 1. the meter dies mid-run; the hub starts it again
    (meter,) = until(lambda: hub.service_pids(b"billing", b"service"), "the billing service")
    os.kill(meter, signal.SIGKILL)
    until(
        lambda: (p := hub.service_pids(b"billing", b"service")) and p != [meter],
        "a new billing service",
    )
    seen = charges(ledger)
    until(lambda: charges(ledger) > seen + 1, "the new meter to charge")

    # 2. the hub dies without any cleanup; its meter goes with it; the server runs on
    hub.stop(signal.SIGKILL)
    until(lambda: not hub.service_pids(b"billing", b"service"), "the orphaned meter to exit")
    hub.start()
    assert hub.server("kit")["ready"], "the server kept running through the hub crash"
    seen = charges(ledger)
    until(lambda: charges(ledger) > seen, "metering to resume after the restart")

    hub.stop_server("kit")
    with ledger.begin() as db:
        (session,) = db.query(MeteredSession).filter_by(user_name="kit").all()
    assert session.stopped_at is not None
    ran = session.stopped_at - session.ready_at
    assert ran >= 3
    assert ledger.balance("kit") == to_micros("100.00") - accrued(RATE, ran)
    assert ledger.audit() == []


def test_a_database_outage_refuses_spawns_and_metering_catches_up(hub_factory):
    from .postgres import PostgresCluster

    cluster = PostgresCluster()  # its own cluster: this test takes it down
    cluster.start()
    try:
        url = cluster.new_database()
        hub = hub_factory(
            {
                "gpus": [],
                "profiles": {"debug": {"price_per_hour": "36.00"}},
                "billing": {"db_url": url, "trial_credit": "100.00", "meter_interval_seconds": 1},
            },
            name="outage",
        )
        ledger = Ledger(connect(url))
        hub.spawn("oda", {"profile": "debug"})
        until(lambda: charges(ledger) >= 1, "the meter to charge")

        cluster.pause()
        hub.ensure_user("pax")
        r = hub.api("POST", "/users/pax/server", json={"profile": "debug"})
        assert r.status_code == 503, r.text
        assert "Billing is unavailable" in r.json()["message"]
        assert "Running servers are not affected" in r.json()["message"]
        assert hub.server("oda")["ready"], "a running server is left alone"

        cluster.resume()
        ledger.engine.dispose()
        seen = charges(ledger)
        until(lambda: charges(ledger) > seen, "metering to catch up")
        hub.stop_server("oda")
        with ledger.begin() as db:
            (session,) = db.query(MeteredSession).filter_by(user_name="oda").all()
        ran = session.stopped_at - session.ready_at
        assert ledger.balance("oda") == to_micros("100.00") - accrued(RATE, ran)
        assert ledger.audit() == []
        hub.teardown()
    finally:
        cluster.stop()
