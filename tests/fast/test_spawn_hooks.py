"""Billing's spawn hooks in the in-process hub: a session at the catalog's rate, a 402
that writes nothing, a stop that settles exactly by billing's clock."""

from __future__ import annotations

import asyncio

from meterhub.billing_hooks.money import accrued, to_micros
from meterhub.billing_hooks.orm import Entry, MeteredSession
from meterhub.billing_hooks.settings import priced_catalog

from .inprocess import FAST, eventually

pytestmark = FAST


def rate_of(hub, options: dict) -> int:
    """The catalog's rate for a choice, in micros per hour (the hub's own catalog)."""
    choice = priced_catalog(hub.config, hub.ledger).parse(options)
    return to_micros(choice.rate_per_hour)


def sessions_of(hub, name: str) -> list[MeteredSession]:
    with hub.ledger.begin() as db:
        rows = db.query(MeteredSession).filter_by(user_name=name).all()
        db.expunge_all()
        return rows


def entries_of(hub, name: str) -> list[tuple[str, int]]:
    return [(e.kind, e.amount_micros) for e in hub.ledger.wallet_entries(name)]


async def test_a_spawn_opens_a_session_at_the_catalogs_rate(fast_hub):
    await fast_hub.ensure_user("ada")
    options = {"profile": "rtx4090", "gpus": "1"}
    r = await fast_hub.api("POST", "/users/ada/server", json=options)
    assert r.status_code in (201, 202), r.text
    ready = await eventually(
        lambda: [s for s in sessions_of(fast_hub, "ada") if s.ready_at is not None],
        "ada's session to be marked ready",
    )
    (session,) = ready
    assert (session.profile, session.gpus, session.server_name) == ("rtx4090", 1, "")
    assert session.rate_micros_per_hour == rate_of(fast_hub, options) > 0
    assert session.stopped_at is None
    assert fast_hub.running("ada") and "/user/ada/" in fast_hub.app.proxy.routes
    assert len(fast_hub.app.users["ada"].spawner.gpu_indices) == 1  # allocated exclusively
    # the only RTX 4090 is taken: a second user's spawn is refused by the allocator (409),
    # after billing opened a session that the failed spawn's stop closes at no cost
    await fast_hub.ensure_user("bob")
    r = await fast_hub.api("POST", "/users/bob/server", json=options)
    assert r.status_code == 409, r.text
    assert "All 1 RTX 4090 GPUs are in use" in r.json()["message"]
    assert not fast_hub.running("bob")
    (failed,) = await eventually(
        lambda: [s for s in sessions_of(fast_hub, "bob") if s.stopped_at], "bob's stop"
    )
    assert failed.ready_at is None and entries_of(fast_hub, "bob") == [("trial", 1_000_000)]


async def test_a_spawn_without_credit_is_refused_with_402_and_writes_nothing(fast_hub):
    await fast_hub.ensure_user("cy")
    before = entries_of(fast_hub, "cy")
    # 2 × A800 at ¥4.50 per GPU-hour needs ¥1.50 for ten minutes; the trial is ¥1.00
    r = await fast_hub.api("POST", "/users/cy/server", json={"profile": "a800", "gpus": "2"})
    assert r.status_code == 402, r.text
    message = r.json()["message"]
    assert "Your balance is ¥1.00" in message and "¥9.00/h" in message, message
    assert "Top up, or choose debug mode" in message
    assert before == [("trial", 1_000_000)] and entries_of(fast_hub, "cy") == before
    assert sessions_of(fast_hub, "cy") == []
    assert not fast_hub.running("cy")
    assert fast_hub.app.proxy.routes.keys() & {"/user/cy/"} == set()
    # no GPU was allocated for the refused spawn: both A800s are free for the next user
    local = fast_hub.app.users["cy"].spawner
    availability = await asyncio.to_thread(local.allocator.availability, "cy", {})
    assert availability["a800"] == (2, 2), availability


async def test_a_stop_settles_the_session_by_billings_clock(fast_hub):
    await fast_hub.ensure_user("dot")
    r = await fast_hub.api("POST", "/users/dot/server", json={"profile": "debug"})
    assert r.status_code in (201, 202), r.text
    (session,) = await eventually(
        lambda: [s for s in sessions_of(fast_hub, "dot") if s.ready_at is not None],
        "dot's session to be marked ready",
    )
    fast_hub.clock.advance(90)
    r = await fast_hub.api("DELETE", "/users/dot/server")
    assert r.status_code in (202, 204), r.text
    await eventually(lambda: not fast_hub.running("dot"), "dot's server to stop")
    (settled,) = sessions_of(fast_hub, "dot")
    assert settled.stopped_at - settled.ready_at == 90
    cost = accrued(to_micros("3.60"), 90)
    assert cost == 90_000  # ¥3.60/h is ¥0.001 a second
    assert entries_of(fast_hub, "dot") == [("trial", 1_000_000), ("charge", -cost)]
    assert fast_hub.ledger.balance("dot") == 1_000_000 - cost
    with fast_hub.ledger.begin() as db:
        (charge,) = db.query(Entry).filter_by(kind="charge", session_id=settled.id).all()
        assert (charge.window_start, charge.window_end) == (settled.ready_at, settled.stopped_at)
