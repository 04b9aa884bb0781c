"""The meter, against a fake hub and a fake clock: charges, vanished servers, stop at zero."""

from __future__ import annotations

import pytest

from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.money import MICROS, accrued, to_micros

from .billing_support import make_ledger

A800 = to_micros("4.50")


class FakeHub:
    """Answers like the hub API: which servers run and whether they are ready."""

    def __init__(self):
        self.servers: dict[tuple[str, str], bool] = {}
        self.stop_requests: list[tuple[str, str]] = []

    #: the servers' last activity as the hub tells it: none reported
    last_activity: dict = {}

    async def running_servers(self):
        return dict(self.servers)

    async def user_servers(self, user):
        mine = {name: ready for (owner, name), ready in self.servers.items() if owner == user}
        return mine or None

    async def stop_server(self, user, server_name):
        self.stop_requests.append((user, server_name))


def setup(**ledger_kwargs):
    ledger, clock = make_ledger(**ledger_kwargs)
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, warn_minutes=[30, 10, 2], clock=clock)
    return ledger, clock, hub, meter


def start(ledger, hub, user, rate, server=""):
    auth = ledger.open_session(user, server, "a800", 1, rate, min_seconds=60)
    ledger.mark_ready(auth.session_id)
    hub.servers[(user, server)] = True
    return auth.session_id


async def test_each_pass_charges_running_servers_exactly(tmp_path):
    ledger, clock, hub, meter = setup()
    start(ledger, hub, "ann", A800)
    for _ in range(5):
        clock.advance(60)
        await meter.tick()
    await meter.tick()  # a duplicate pass at the same instant charges nothing more
    assert ledger.balance("ann") == 10 * MICROS - accrued(A800, 300)
    assert ledger.audit() == []


async def test_a_starting_server_is_free_and_a_vanished_one_is_charged_until_last_seen():
    ledger, clock, hub, meter = setup()
    auth = ledger.open_session("bo", "", "a800", 1, A800, min_seconds=60)
    hub.servers[("bo", "")] = False  # spawn pending
    clock.advance(120)
    await meter.tick()
    assert ledger.balance("bo") == 10 * MICROS
    hub.servers[("bo", "")] = True  # ready; the hub restarted before noting it
    await meter.tick()
    ready = clock.now
    clock.advance(60)
    await meter.tick()
    last_seen = clock.now
    del hub.servers[("bo", "")]  # vanished: the hub lost it while the meter was not looking
    clock.advance(600)
    result = await meter.tick()
    assert result.closed == [auth.session_id]
    assert ledger.balance("bo") == 10 * MICROS - accrued(A800, last_seen - ready)
    assert ledger.open_sessions() == []


async def test_warnings_once_per_threshold_then_stop_at_zero():
    ledger, clock, hub, meter = setup(trial_credit_micros=to_micros("3.00"))
    start(ledger, hub, "cy", to_micros("36.00"))  # 0.01 per second: 300 s of credit
    clock.advance(60)
    await meter.tick()  # 240 s left: warned at 30 and 10 minutes (both crossed)
    clock.advance(60)
    await meter.tick()  # 180 s left: nothing new
    clock.advance(90)
    await meter.tick()  # 90 s left: the 2-minute warning
    kinds = [(n.kind, n.key.rsplit(":", 1)[1]) for n in ledger.notifications("cy")]
    assert kinds == [("warning", "30"), ("warning", "10"), ("warning", "2")]
    assert "credit left" in ledger.notifications("cy")[-1].message
    assert "your files are kept" in ledger.notifications("cy")[-1].message
    clock.advance(90)
    result = await meter.tick()  # zero: stop, files kept
    assert result.to_stop == [("cy", "")] and hub.stop_requests == [("cy", "")]
    assert ledger.notifications("cy")[-1].kind == "stopped"


@pytest.mark.parametrize("offset", [0, 1, 17, 59])
@pytest.mark.parametrize("stop_latency", [0, 3, 20])
async def test_overshoot_is_at_most_rate_times_interval_plus_stop_latency(offset, stop_latency):
    ledger, clock, hub, meter = setup(trial_credit_micros=to_micros("1.00"))
    rate = to_micros("36.00")
    session = start(ledger, hub, "di", rate)
    clock.advance(offset)
    while not hub.stop_requests:
        clock.advance(meter.interval_seconds)
        await meter.tick()
    clock.advance(stop_latency)  # the server takes this long to stop
    del hub.servers[("di", "")]
    ledger.close_session(session)  # the hub's post-stop hook
    overshoot = -ledger.balance("di")
    assert 0 <= overshoot <= accrued(rate, meter.interval_seconds + stop_latency)
    assert ledger.audit() == []


async def test_a_pass_holder_is_not_stopped_until_the_pass_ends():
    ledger, clock, hub, meter = setup(trial_credit_micros=to_micros("97.20"))
    ledger.buy_pass("eve", "a800", 1, "daily", to_micros("97.20"), 86_400, key="p:1")
    assert ledger.balance("eve") == 0
    start(ledger, hub, "eve", A800)
    for _ in range(3):
        clock.advance(3600)
        assert (await meter.tick()).to_stop == []
    clock.advance(86_400)  # the pass ended 75,600 s ago into this window: now it costs
    result = await meter.tick()
    assert result.to_stop == [("eve", "")]
    kinds = [n.kind for n in ledger.notifications("eve")]
    assert kinds[0] == "pass-ended" and kinds[-1] == "stopped"
    assert ledger.audit() == []


async def test_one_pass_charges_two_servers_of_a_wallet_in_order_as_the_meter():
    ledger, clock, hub, meter = setup()
    start(ledger, hub, "fu", A800)
    start(ledger, hub, "fu", 2 * A800, server="gpu2")
    clock.advance(60)
    result = await meter.tick()
    assert result.charged == 2
    charges = [e for e in ledger.wallet_entries("fu") if e.kind == "charge"]
    assert [e.amount_micros for e in charges] == [-accrued(A800, 60), -accrued(2 * A800, 60)]
    assert [e.balance_after_micros for e in charges] == [
        10 * MICROS - accrued(A800, 60),
        10 * MICROS - accrued(A800, 60) - accrued(2 * A800, 60),
    ]
    assert {e.actor for e in charges} == {"meter"}
    assert ledger.balance("fu") == charges[-1].balance_after_micros
    assert ledger.audit() == []
