"""Prometheus metrics through a real hub: the billing service's /services/billing/metrics and
the hub's /hub/metrics scraped through the proxy with a read:metrics token, while a real
server runs, is metered and is stopped at zero; parsed with prometheus_client's parser."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.metrics import units
from meterhub.billing_hooks.orm import Entry, MeteredSession

from .hubprocess import until


@pytest.fixture(scope="module")
def metered(hub_factory):
    hub = hub_factory(
        {
            "gpus": [{"type": "a800", "count": 1}],
            "profiles": {"debug": {"price_per_hour": "36.00"}},  # ¥0.01 a second
            "billing": {
                "trial_credit": "0.10",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
                "warn_minutes": [1],
            },
        },
        name="metrics",
    )
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    # a Prometheus token: the admin's, narrowed to the one scope a scraper needs
    r = hub.api(
        "POST", "/users/admin/tokens", json={"note": "prometheus", "scopes": ["read:metrics"]}
    )
    assert r.status_code == 201, r.text
    hub.scraper = r.json()["token"]
    return hub


def scrape(hub, path: str, token: str | None) -> requests.Response:
    # as Prometheus sends it (authorization: type Bearer)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{hub.url}{path}", headers=headers, allow_redirects=False, timeout=60)


def samples(hub, path: str = "/services/billing/metrics") -> dict[tuple[str, frozenset], float]:
    r = scrape(hub, path, hub.scraper)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found, name, **labels):
    return found.get((name, frozenset(labels.items())))


def charged_micros(ledger: Ledger, profile: str) -> int:
    """What the ledger's charge entries took for sessions of `profile` (positive micros)."""
    with ledger.begin() as db:
        total = db.execute(
            select(func.sum(Entry.amount_micros))
            .join(MeteredSession, MeteredSession.id == Entry.session_id)
            .where(Entry.kind == "charge", MeteredSession.profile == profile)
        ).scalar()
    return -int(total or 0)


def test_only_a_token_with_read_metrics_scrapes_the_billing_service(metered):
    assert scrape(metered, "/services/billing/metrics", None).status_code == 403
    metered.ensure_user("una")
    r = metered.api("POST", "/users/una/tokens", json={"note": "no metrics"})
    user_token = r.json()["token"]
    refused = scrape(metered, "/services/billing/metrics", user_token)
    assert refused.status_code == 403 and "read:metrics" in refused.json()["message"]
    # the scraper's token reaches nothing else of billing: not even a wallet
    r = scrape(metered, "/services/billing/api/v1/users/una/wallet", metered.scraper)
    assert r.status_code == 403
    assert scrape(metered, "/services/billing/metrics", metered.scraper).status_code == 200


def test_a_metered_server_its_stop_at_zero_and_a_refusal_in_the_metrics(metered):
    hub, ledger = metered, metered.ledger
    before = samples(hub)
    assert value(before, "meterhub_gpus", type="a800", state="free") == 1
    until(lambda: value(samples(hub), "meterhub_audit_problems") == 0, "the first audit")
    hub.spawn("wes", {"profile": "debug"})  # ¥0.10 at ¥0.01 a second: ten seconds
    running = until(
        lambda: (
            (s := samples(hub))
            and value(s, "meterhub_running_sessions", profile="debug") == 1
            and s
        ),
        "the running server in the metrics",
    )
    assert value(running, "meterhub_meter_healthy") == 1
    until(lambda: hub.server("wes") is None, "the meter to stop wes's server at zero", timeout=90)
    until(
        lambda: ledger.open_sessions("wes") == [],
        "wes's session to close",
    )
    # wes, at zero, asks again: refused by the hub, and counted on /hub/metrics
    refused_before = value(
        samples(hub, "/hub/metrics"), "meterhub_spawns_refused_total", reason="credit"
    )
    r = hub.api("POST", "/users/wes/server", json={"profile": "debug"})
    assert r.status_code == 402, r.text
    hub_metrics = samples(hub, "/hub/metrics")
    assert (
        value(hub_metrics, "meterhub_spawns_refused_total", reason="credit") == refused_before + 1
    )
    after = samples(hub)
    # the charged total is the ledger's charge entries, exactly
    exact = units(charged_micros(ledger, "debug"))
    assert exact > 0
    assert value(after, "meterhub_charged_total", profile="debug", currency="CNY") == exact
    assert value(after, "meterhub_running_sessions", profile="debug") == 0
    assert value(after, "meterhub_stops_total", reason="credit") == 1
    assert value(after, "meterhub_warnings_total", reason="credit") >= 1
    assert value(after, "meterhub_wallets_at_or_below_zero", kind="user") >= 1
    passes = value(after, "meterhub_meter_pass_duration_seconds_count")
    assert passes > value(before, "meterhub_meter_pass_duration_seconds_count")
    assert value(after, "meterhub_meter_pass_failures_total") == 0
    assert value(after, "meterhub_audit_problems") == 0
    assert ledger.audit() == []
