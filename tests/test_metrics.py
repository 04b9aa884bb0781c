"""The billing service's Prometheus metrics without a hub: the ledger's money totals kept
exactly and incrementally (an entry still uncommitted on PostgreSQL is never lost), the GPU
states, and the exposition as prometheus_client's own parser reads it."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.metrics import (
    GAP_SECONDS,
    BillingMetrics,
    LedgerTotals,
    gpu_states,
    units,
)
from meterhub.billing_hooks.money import MICROS, accrued, to_micros
from meterhub.billing_hooks.orm import Entry, MeteredSession

from .billing_support import make_ledger
from .test_meter import FakeHub

A800 = to_micros("4.50")
DEBUG = to_micros("0.10")


def sums(ledger: Ledger) -> dict[tuple[str, str, str], int]:
    """The ground truth: the ledger's money entries summed by kind and the session's
    profile, in one query over everything (what a scrape must not do each time)."""
    with ledger.begin() as db:
        rows = db.execute(
            select(Entry.kind, MeteredSession.profile, func.sum(Entry.amount_micros))
            .join(MeteredSession, MeteredSession.id == Entry.session_id)
            .where(Entry.kind.in_(("charge", "refund")))
            .group_by(Entry.kind, MeteredSession.profile)
        ).all()
    sign = {"charge": -1, "refund": 1}
    return {(kind, profile, "CNY"): sign[kind] * int(total) for kind, profile, total in rows}


def run(ledger, hub, user, profile, gpus, rate, server=""):
    auth = ledger.open_session(user, server, profile, gpus, rate, min_seconds=60)
    ledger.mark_ready(auth.session_id)
    hub.servers[(user, server)] = True
    return auth.session_id


@pytest.fixture
def pg_ledger(postgres):
    clock = FakeClock()
    return Ledger(connect(postgres.new_database()), clock=clock), clock


def on(ledger_url):
    clock = FakeClock()
    return Ledger(connect(ledger_url), clock=clock), clock


async def test_the_totals_are_the_ledgers_sums_exactly_and_read_only_what_is_new(ledger_url):
    ledger, clock = on(ledger_url)
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, clock=clock)
    run(ledger, hub, "ann", "a800", 1, A800)
    sid = run(ledger, hub, "bob", "debug", 0, DEBUG)
    totals = LedgerTotals(ledger)
    assert totals.refresh() == {}  # trial credit only: no money entry yet
    for _ in range(7):
        clock.advance(61)  # odd windows: micros that are not round
        await meter.tick()
    ledger.refund(sid, 7, "refund:bob", "a test", "admin")
    found = totals.refresh()
    read = totals.last_rows
    assert found == sums(ledger)
    assert found[("charge", "a800", "CNY")] == accrued(A800, 427)
    assert found[("refund", "debug", "CNY")] == 7
    clock.advance(60)
    await meter.tick()
    assert totals.refresh() == sums(ledger)
    # the second refresh read the pass's two charges, not the history again
    assert totals.last_rows == 2 < read


def test_an_entry_committed_after_a_later_one_is_still_counted(pg_ledger):
    """PostgreSQL numbers an entry when it is inserted, not when it commits: a refresh
    between the two must not settle past it."""
    ledger, clock = pg_ledger
    hub = FakeHub()
    sid = run(ledger, hub, "cai", "a800", 1, A800)
    # the late entry is another user's: the charge below locks only cai's rows
    other = run(ledger, hub, "cal", "a800", 1, A800)
    clock.advance(600)
    ledger.charge(sid, clock())
    totals = LedgerTotals(ledger)
    totals.refresh()
    with ledger.begin() as slow:  # a writer whose transaction is still open
        late = Entry(
            wallet_id=ledger.wallet_id("cal"),
            kind="refund",
            amount_micros=1234,
            balance_after_micros=0,
            key="late",
            session_id=other,
            created_at=clock(),
        )
        slow.add(late)
        slow.flush()
        clock.advance(60)
        ledger.charge(sid, clock())  # a later id, committed first
        seen = totals.refresh()
        assert seen == sums(ledger)  # the open transaction's refund is not there yet
        assert totals.through < late.id
    assert totals.refresh() == sums(ledger)  # and it is, once committed
    assert totals.refresh()[("refund", "a800", "CNY")] == 1234
    assert totals.through > late.id


def test_a_rolled_back_id_is_settled_past_once_the_entry_after_it_is_old(pg_ledger):
    ledger, clock = pg_ledger
    hub = FakeHub()
    sid = run(ledger, hub, "dan", "a800", 1, A800)
    with pytest.raises(RuntimeError), ledger.begin() as doomed:
        doomed.add(
            Entry(
                wallet_id=1,
                kind="refund",
                amount_micros=1,
                balance_after_micros=0,
                key="doomed",
                session_id=sid,
                created_at=clock(),
            )
        )
        doomed.flush()
        raise RuntimeError("rolled back: its id is never used")
    clock.advance(600)
    ledger.charge(sid, clock())
    totals = LedgerTotals(ledger)
    assert totals.refresh() == sums(ledger)
    before_gap = totals.through
    clock.advance(GAP_SECONDS)
    assert totals.refresh() == sums(ledger)
    assert totals.through > before_gap  # settled: later refreshes no longer read it again


async def test_history_is_read_a_page_at_a_time_and_totals_wait_for_it():
    ledger, clock = make_ledger()
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, clock=clock)
    for user in ("eve", "fay", "gus"):
        run(ledger, hub, user, "a800", 1, A800)
    for _ in range(5):
        clock.advance(60)
        await meter.tick()
    totals = LedgerTotals(ledger, page_rows=4)
    assert totals.refresh(max_rows=8) is None  # 3 trials and 15 charges: not all read
    pauses = []
    totals.catch_up(sleep=pauses.append)
    assert totals.complete and pauses  # it let writers in between pages
    assert totals.refresh(max_rows=8) == sums(ledger)


def test_gpu_states_count_as_the_allocator_holds_back():
    in_use = {("ann", "a800"): 2, ("pia", "a800"): 1, ("stu", "rtx4090"): 1}
    passes = {"a800": {"pia": 2, "quo": 1}}
    windows = {"rtx4090": {"course:ml101": (3, ("stu", "tom"))}, "a800": {"course:x": (4, ())}}
    # 8 A800s: 3 in use; pia's pass holds 1 more, quo's 1; the class gets 8 - 3 sold = 4
    assert gpu_states({"a800": 8, "rtx4090": 2, "h800": 0}, in_use, passes, windows) == {
        "a800": {"in_use": 3, "reserved_pass": 2, "reserved_lab": 3, "free": 0},
        "h800": {"in_use": 0, "reserved_pass": 0, "reserved_lab": 0, "free": 0},
        # a class of 3 on 2 GPUs gets the 2, one of them in use by its student
        "rtx4090": {"in_use": 1, "reserved_pass": 0, "reserved_lab": 1, "free": 0},
    }
    # where meterhub cannot count the GPUs (Kubernetes): no "free", classes uncapped
    assert gpu_states(None, in_use, passes, windows)["rtx4090"] == {
        "in_use": 1,
        "reserved_pass": 0,
        "reserved_lab": 2,
    }


def scrape(metrics: BillingMetrics) -> dict[tuple[str, frozenset], float]:
    """The exposition as prometheus_client's parser reads it: {(sample, labels): value}."""
    found = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(samples, name, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


async def test_the_exposition_says_what_the_ledger_and_the_meter_know():
    ledger, clock = make_ledger(trial_credit_micros=to_micros("0.20"))
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, warn_minutes=[2], clock=clock)
    metrics = BillingMetrics(ledger, ("debug", "a800", "h800"), {"a800": 2}, meter, 3600)
    samples = scrape(metrics)
    assert value(samples, "meterhub_charged_total", profile="a800", currency="CNY") == 0
    assert value(samples, "meterhub_meter_healthy") == 1
    assert value(samples, "meterhub_audit_interval_seconds") == 3600
    assert ("meterhub_audit_problems", frozenset()) not in samples  # no audit yet
    assert ("meterhub_meter_last_pass_timestamp_seconds", frozenset()) not in samples
    ledger.grant("ann", to_micros("1.00"), "grant:ann")
    run(ledger, hub, "ann", "a800", 1, A800)  # ¥1.20 lasts 960 s at ¥4.50/h
    run(ledger, hub, "bob", "debug", 0, DEBUG)
    starting = ledger.open_session("cy", "", "a800", 1, A800, min_seconds=60)
    hub.servers[("cy", "")] = False  # the hub lists it, not ready yet
    for _ in range(17):
        clock.advance(60)
        await meter.tick()
    await meter.tick()  # ann's server is still listed: asked to stop again, one stop
    ledger.record_audit()
    samples = scrape(metrics)
    truth = sums(ledger)
    for profile in ("a800", "debug"):
        exact = units(truth[("charge", profile, "CNY")])
        assert value(samples, "meterhub_charged_total", profile=profile, currency="CNY") == exact
    assert value(samples, "meterhub_charged_total", profile="a800", currency="CNY") == 1.275
    assert value(samples, "meterhub_running_sessions", profile="a800") == 1
    assert value(samples, "meterhub_running_sessions", profile="debug") == 1
    assert value(samples, "meterhub_running_sessions", profile="h800") == 0
    assert value(samples, "meterhub_starting_sessions", profile="a800") == 1
    assert value(samples, "meterhub_wallets_at_or_below_zero", kind="user") == 1
    assert value(samples, "meterhub_wallets_at_or_below_zero", kind="group") == 0
    assert value(samples, "meterhub_stops_total", reason="credit") == 1
    assert value(samples, "meterhub_stops_total", reason="idle") == 0
    assert value(samples, "meterhub_warnings_total", reason="credit") == 1
    # ann's and the starting cy's A800s are in use (the ledger's open sessions)
    assert value(samples, "meterhub_gpus", type="a800", state="in_use") == 2
    assert value(samples, "meterhub_gpus", type="a800", state="free") == 0
    assert value(samples, "meterhub_audit_problems") == 0
    assert value(samples, "meterhub_audit_last_run_timestamp_seconds") == clock()
    assert value(samples, "meterhub_meter_last_pass_timestamp_seconds") == clock()
    assert value(samples, "meterhub_meter_pass_duration_seconds_count") == 18
    assert value(samples, "meterhub_meter_pass_failures_total") == 0
    assert starting.session_id


async def test_a_failed_pass_is_counted_and_the_meter_turns_unhealthy():
    ledger, clock = make_ledger()

    class DownHub(FakeHub):
        async def running_servers(self):
            raise ConnectionError("the hub does not answer")

    meter = Meter(ledger, DownHub(), interval_seconds=60, clock=clock)
    metrics = BillingMetrics(ledger, ("debug", "a800"), None, meter)
    for _ in range(3):
        clock.advance(60)
        with pytest.raises(ConnectionError):
            await meter.tick()
    samples = scrape(metrics)
    assert value(samples, "meterhub_meter_pass_failures_total") == 3
    assert value(samples, "meterhub_meter_pass_duration_seconds_count") == 0
    assert value(samples, "meterhub_meter_healthy") == 0
    # not the local backend: no inventory, so no free GPUs are claimed
    assert value(samples, "meterhub_gpus", type="a800", state="in_use") == 0
    assert not [key for key in samples if ("state", "free") in key[1]]


def test_money_is_summed_in_micros_and_only_divided_at_exposition():
    # 0.1 + 0.2 in floats is 0.30000000000000004; three charges of ¥0.10 are ¥0.30
    ledger, clock = make_ledger()
    hub = FakeHub()
    sid = run(ledger, hub, "ivy", "debug", 0, to_micros("36.00"))
    for _ in range(3):
        clock.advance(10)  # ¥0.10 a window
        ledger.charge(sid, clock())
    totals = LedgerTotals(ledger).refresh()
    assert totals[("charge", "debug", "CNY")] == 3 * MICROS // 10
    assert units(totals[("charge", "debug", "CNY")]) == 0.3
