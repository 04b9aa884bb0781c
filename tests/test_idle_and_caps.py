"""Idle shutdown and session caps in the meter, against a fake hub and a fake clock: the
idle timeout per profile, the warning before and its cancellation by activity, the fall
back to debug mode (queued for the hub, paid by the same wallet), and a session's own cap
("stop after ¥X / N hours") charged exactly, never past."""

from __future__ import annotations

import json

import pytest

from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.money import MICROS, accrued, to_micros
from meterhub.billing_hooks.restarts import wallet_option
from meterhub.spawner.catalog import Catalog

from .billing_support import make_ledger
from .test_groups_ledger import FakeHub

A800 = to_micros("4.50")
DEBUG = to_micros("0.10")


def catalog(**policy) -> Catalog:
    """30 minutes on a GPU (a800 as given), 4 hours in debug mode, warned 5 minutes before."""
    return Catalog(idle_policy={"a800": {"idle_seconds": 1800, **policy}}, idle_warn_seconds=300)


def setup(credit: str = "100.00", **policy):
    ledger, clock = make_ledger(trial_credit_micros=to_micros(credit))
    hub = FakeHub()
    meter = Meter(
        ledger, hub, interval_seconds=60, warn_minutes=[30, 10, 2], clock=clock,
        catalog=catalog(**policy),
    )  # fmt: skip
    return ledger, clock, hub, meter


def start(ledger, hub, user, profile="a800", gpus=1, rate=A800, **caps):
    auth = ledger.open_session(user, "", profile, gpus, rate, min_seconds=60, **caps)
    ledger.mark_ready(auth.session_id)
    hub.servers[(user, "")] = True
    return auth.session_id


async def run(clock, meter, seconds: int, step: int = 60):
    for _ in range(seconds // step):
        clock.advance(step)
        await meter.tick()


# ---------------------------------------------------------------- idle


async def test_an_idle_gpu_server_is_warned_then_stopped_at_its_timeout():
    ledger, clock, hub, meter = setup()
    start(ledger, hub, "ann")
    await run(clock, meter, 24 * 60)
    assert hub.stop_requests == [] and ledger.notifications("ann") == []
    await run(clock, meter, 60)  # 25 minutes idle: 5 before the stop
    (note,) = ledger.notifications("ann")
    assert note.kind == "idle-warning" and "stops in 5 min" in note.message, note.message
    await run(clock, meter, 4 * 60)
    assert hub.stop_requests == []
    await run(clock, meter, 60)  # 30 minutes: stopped
    assert hub.stop_requests == [("ann", "")]
    assert ledger.notifications("ann")[-1].kind == "stopped"
    assert "idle for 30 min" in ledger.notifications("ann")[-1].message
    assert ledger.restarts("ann") == []


async def test_activity_cancels_the_idle_stop_and_a_later_idle_period_warns_again():
    ledger, clock, hub, meter = setup()
    start(ledger, hub, "bo")
    await run(clock, meter, 26 * 60)
    assert [n.kind for n in ledger.notifications("bo")] == ["idle-warning"]
    hub.last_activity[("bo", "")] = clock.now  # a cell ran, or the GPU got busy
    await run(clock, meter, 10 * 60)
    assert hub.stop_requests == []
    await run(clock, meter, 16 * 60)  # 26 minutes after the activity: warned again
    assert [n.kind for n in ledger.notifications("bo")] == ["idle-warning"] * 2
    await run(clock, meter, 4 * 60)
    assert hub.stop_requests == [("bo", "")]


async def test_idle_debug_falls_back_to_debug_mode_paid_by_the_same_wallet():
    ledger, clock, hub, meter = setup(on_idle="debug")
    session = start(ledger, hub, "cy")
    await run(clock, meter, 30 * 60)
    assert hub.stop_requests == [("cy", "")]
    (restart,) = ledger.restarts("cy")
    assert (restart.reason, restart.session_id) == ("idle", session)
    assert json.loads(restart.options) == {"profile": "debug", "wallet": "user:cy"}
    note = ledger.notifications("cy")[-1]
    assert note.kind == "restarted" and "restarted in debug mode" in note.message
    assert "¥0.10/h" in note.message and "you stop paying ¥4.50/h" in note.message
    # a pass that sees it again before the hub has stopped it queues nothing more
    hub.servers[("cy", "")] = True
    await run(clock, meter, 60)
    assert len(ledger.restarts("cy")) == 1


async def test_a_debug_mode_restart_asks_for_the_environment_the_server_ran():
    """The hub then starts it in that environment where debug mode can run it
    (hub/restarts.py's debug_options: a GPU-only one falls back to the default)."""
    from meterhub.hub.restarts import debug_options

    ledger, clock, hub, meter = setup(on_idle="debug")
    start(ledger, hub, "dee", environment="minimal")
    start(ledger, hub, "eli", environment="vllm")
    await run(clock, meter, 30 * 60)
    (minimal,) = ledger.restarts("dee")
    assert json.loads(minimal.options)["environment"] == "minimal"
    (vllm,) = ledger.restarts("eli")
    assert json.loads(vllm.options)["environment"] == "vllm"
    spawner = type("Spawner", (), {"catalog": Catalog(), "_log_name": "eli"})()
    assert json.loads(debug_options(spawner, minimal.options))["environment"] == "minimal"
    assert json.loads(debug_options(spawner, vllm.options)) == {
        "profile": "debug",
        "wallet": "user:eli",
    }
    gone = type(
        "Spawner", (), {"catalog": Catalog(environments=[{"slug": "pytorch"}]), "_log_name": "dee"}
    )()
    assert "environment" not in json.loads(debug_options(gone, minimal.options))


async def test_debug_mode_idles_on_its_own_timeout_and_never_falls_back():
    ledger, clock, hub, meter = setup(on_idle="debug")
    start(ledger, hub, "di", profile="debug", gpus=0, rate=DEBUG)
    await run(clock, meter, 235 * 60, step=300)
    assert hub.stop_requests == []
    assert [n.kind for n in ledger.notifications("di")] == ["idle-warning"]
    await run(clock, meter, 5 * 60, step=300)
    assert hub.stop_requests == [("di", "")] and ledger.restarts("di") == []


async def test_idle_zero_never_stops_and_the_hubs_activity_counts_from_ready():
    ledger, clock, hub, meter = setup(idle_seconds=0)
    start(ledger, hub, "ed")
    hub.last_activity[("ed", "")] = clock.now - 86_400  # activity older than the session
    await run(clock, meter, 10 * 3600, step=600)
    assert hub.stop_requests == [] and ledger.notifications("ed") == []


async def test_a_group_or_course_paid_server_falls_back_on_the_same_wallet():
    assert wallet_option("group", "vision") == "group:vision"
    assert wallet_option("allowance", "ml101/amy") == "course:ml101"
    assert wallet_option("user", "amy") == "user:amy"


# ---------------------------------------------------------------- session caps


async def run_until_stop(clock, meter, hub, step: int, limit: int = 3 * 3600):
    for _ in range(limit // step):
        clock.advance(step)
        await meter.tick()
        if hub.stop_requests:
            return


@pytest.mark.parametrize("step", [60, 7, 3600])
@pytest.mark.parametrize("latency", [1, 90])
async def test_a_cost_cap_stops_the_server_a_pass_ahead_and_is_never_passed(step, latency):
    ledger, clock, hub, meter = setup()
    session = start(ledger, hub, "fa", max_cost_micros=to_micros("1.00"))
    ready = ledger.session(session).ready_at
    # ¥1.00 at ¥4.50/h is 800 s exactly: the stop is asked for at the last pass before
    await run_until_stop(clock, meter, hub, step)
    assert hub.stop_requests == [("fa", "")]
    assert clock.now - ready >= 800 - meter.interval_seconds
    stops = [n for n in ledger.notifications("fa") if n.kind == "stopped"]
    assert "stop after ¥1.00" in stops[0].message
    assert "you never pay more than your limit" in stops[0].message
    # the server takes `latency` to stop: charged to the stop, never past the cap
    ledger.close_session(session, at=clock.now + latency)
    spent = to_micros("100.00") - ledger.balance("fa")
    assert spent == min(to_micros("1.00"), accrued(A800, clock.now + latency - ready))
    assert spent >= to_micros("1.00") - accrued(A800, meter.interval_seconds)
    assert ledger.audit() == []


async def test_a_cost_cap_that_buys_no_whole_second_stops_under_it():
    ledger, clock, hub, meter = setup()
    rate = to_micros("7.00")  # ¥0.01 is 5.14 s: the cap buys 5 whole seconds
    start(ledger, hub, "gu", rate=rate, max_cost_micros=to_micros("0.01"))
    await run(clock, meter, 600)
    spent = to_micros("100.00") - ledger.balance("gu")
    assert spent == accrued(rate, 5) <= to_micros("0.01")


async def test_a_time_cap_charges_exactly_its_hours_and_warns_before():
    ledger, clock, hub, meter = setup()
    session = start(ledger, hub, "ha", max_seconds=3600)
    hub.last_activity[("ha", "")] = clock.now + 3 * 3600  # busy throughout: never idle
    await run(clock, meter, 30 * 60)
    assert [n.kind for n in ledger.notifications("ha")] == ["cap-warning"]  # 30 minutes left
    await run_until_stop(clock, meter, hub, 60)
    assert hub.stop_requests == [("ha", "")]
    ledger.close_session(session, at=clock.now + 120)  # a slow stop: the hour, no more
    assert ledger.balance("ha") == to_micros("100.00") - accrued(A800, 3600)
    assert [n.kind for n in ledger.notifications("ha")][-1] == "stopped"


async def test_a_cap_with_on_cap_debug_restarts_in_debug_mode():
    ledger, clock, hub, meter = setup(on_cap="debug")
    start(ledger, hub, "io", max_seconds=3600)
    hub.last_activity[("io", "")] = clock.now + 3 * 3600  # busy throughout: never idle
    await run(clock, meter, 3600)
    (restart,) = ledger.restarts("io")
    assert restart.reason == "cap"
    assert ledger.notifications("io")[-1].kind == "restarted"


async def test_the_close_at_a_stop_never_charges_past_the_cap():
    ledger, clock, hub, meter = setup()
    session = start(ledger, hub, "ju", max_cost_micros=to_micros("2.00"))
    clock.advance(3 * 3600)  # no pass at all: the stop settles everything
    ledger.close_session(session)
    assert ledger.balance("ju") == to_micros("98.00")
    assert ledger.audit() == []


async def test_caps_on_pass_covered_time_cost_nothing_and_keep_running():
    ledger, clock, hub, meter = setup()
    ledger.grant("ka", to_micros("200.00"), "grant:ka", "test")
    ledger.buy_pass("ka", "a800", 1, "daily", to_micros("97.20"), 86_400, "pass:ka")
    start(ledger, hub, "ka", max_cost_micros=to_micros("1.00"))
    hub.last_activity[("ka", "")] = clock.now + 86_400
    before = ledger.balance("ka")
    await run(clock, meter, 3 * 3600, step=600)
    assert ledger.balance("ka") == before and hub.stop_requests == []


def test_the_wallet_answer_shows_each_servers_cap_and_what_is_left():
    from meterhub.billing_hooks.api import wallet_json

    ledger, clock = make_ledger(trial_credit_micros=10 * MICROS)
    auth = ledger.open_session(
        "lu", "", "a800", 1, A800, min_seconds=60, max_cost_micros=to_micros("1.00"),
        max_seconds=7200,
    )  # fmt: skip
    ledger.mark_ready(auth.session_id)
    clock.advance(400)
    ledger.charge(auth.session_id, clock.now)
    (server,) = wallet_json(ledger, "lu")["servers"]
    assert server["cap"] == {
        "max_cost": "1.00",
        "max_hours": 2,
        "cost_left": "0.50",
        "left_seconds": 400,
        "summary": "stop after ¥1.00 (¥0.50 left) or 2 h",
    }


async def test_the_batch_caps_sessions_on_sqlite_files_and_postgresql(ledger_url):
    """The meter's batch writes capped sessions apart from the others, in both dialects."""
    from meterhub.billing_hooks.db import connect

    ledger, clock = make_ledger(engine=connect(ledger_url), trial_credit_micros=100 * MICROS)
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, clock=clock, catalog=catalog(idle_seconds=0))
    for user in ("ma", "ne", "ol"):
        ledger.ensure_user(user)
    capped = start(ledger, hub, "ma", max_cost_micros=to_micros("1.00"))
    plain = start(ledger, hub, "ne")
    timed = start(ledger, hub, "ol", max_seconds=3600)
    await run(clock, meter, 2 * 3600, step=600)
    assert ledger.balance("ma") == to_micros("99.00")
    assert ledger.balance("ne") == 100 * MICROS - accrued(A800, 2 * 3600)
    assert ledger.balance("ol") == 100 * MICROS - accrued(A800, 3600)
    assert set(hub.stop_requests) == {("ma", ""), ("ol", "")}
    assert ledger.session(plain).metered_through == clock.now
    assert ledger.session(capped).metered_through < clock.now
    assert ledger.session(timed).metered_through == ledger.session(timed).ready_at + 3600
    assert ledger.audit() == []
