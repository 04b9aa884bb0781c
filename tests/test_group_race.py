"""Concurrent spawns on one group wallet, on SQLite and PostgreSQL: the wallet's lock makes
them authorize one after another, so together they never reserve more than the balance plus
the overdraft, nor more than a member's cap; a meter pass racing with spawns and stops
leaves the audit clean."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import CapReached, InsufficientCredit, Ledger
from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.money import MICROS, accrued, to_micros
from meterhub.billing_hooks.orm import MeteredSession

A800 = to_micros("4.50")
MIN_SECONDS = 600
#: what one spawn must be covered for: 10 minutes of an A800
RESERVE = accrued(A800, MIN_SECONDS)
MEMBERS = [f"m{i}" for i in range(8)]
SPAWNS_EACH = 3


@pytest.fixture
def ledger(ledger_url):
    engine = connect(ledger_url)
    ledger = Ledger(engine, clock=FakeClock(), overdraft_micros=to_micros("0.40"))
    ledger.create_group("vision", "root", admins=["pi"])
    yield ledger
    engine.dispose()


def spawn_all(ledger: Ledger, who: list[tuple[str, str]]) -> list:
    """Each (user, server) spawns from the vision wallet in its own thread, all at once;
    returns each one's Authorization or exception, in order."""
    for user in {user for user, _ in who}:
        # their own wallets exist (made at sign-in): see the first-spawn race below
        ledger.ensure_user(user)
    barrier = threading.Barrier(len(who))
    outcomes: list = [None] * len(who)

    def spawn(i: int, user: str, server: str) -> None:
        barrier.wait()
        try:
            outcomes[i] = ledger.open_session(
                user, server, "a800", 1, A800, MIN_SECONDS, wallet="group:vision"
            )
        except Exception as e:  # noqa: BLE001 - every outcome is looked at below
            outcomes[i] = e

    threads = [
        threading.Thread(target=spawn, args=(i, user, server))
        for i, (user, server) in enumerate(who)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def authorized(outcomes: list) -> list:
    refused = [o for o in outcomes if isinstance(o, Exception)]
    for o in refused:
        assert isinstance(o, InsufficientCredit), repr(o)
    return [o for o in outcomes if not isinstance(o, Exception)]


def test_concurrent_spawns_from_one_group_never_reserve_past_balance_and_overdraft(ledger):
    balance = 5 * RESERVE + RESERVE // 2  # with the overdraft: room for exactly 6
    ledger.grant("group:vision", balance, key="top-up")
    outcomes = spawn_all(
        ledger, [(user, f"gpu{k}") for user in MEMBERS for k in range(SPAWNS_EACH)]
    )
    ok = authorized(outcomes)
    assert len(ok) * RESERVE <= balance + ledger.overdraft_micros
    # and they were refused only when the wallet was really full
    assert len(ok) == (balance + ledger.overdraft_micros) // RESERVE == 6
    for o in outcomes:
        if isinstance(o, Exception):
            assert not isinstance(o, CapReached) and "vision group's balance" in str(o)
    with ledger.begin() as db:
        sessions = list(db.scalars(select(MeteredSession)))
    assert sorted(s.id for s in sessions) == sorted(a.session_id for a in ok)
    assert ledger.audit() == []


def test_concurrent_spawns_of_one_member_never_authorize_past_their_cap(ledger):
    ledger.grant("group:vision", 100 * MICROS, key="top-up")
    cap = 3 * RESERVE + RESERVE // 3  # room for exactly 3
    ledger.set_cap("vision", "ann", cap, "month", "pi")
    # ann spawns 12 at once while two members without a cap spawn beside her
    who = [("ann", f"gpu{k}") for k in range(12)] + [
        (user, f"gpu{k}") for user in ("bo", "cy") for k in range(4)
    ]
    outcomes = spawn_all(ledger, who)
    ok = authorized(outcomes)
    anns = [o for o, (user, _) in zip(outcomes, who, strict=True) if user == "ann"]
    ann_ok = [o for o in anns if not isinstance(o, Exception)]
    assert len(ann_ok) * RESERVE <= cap
    assert len(ann_ok) == 3
    assert all(isinstance(o, CapReached) for o in anns if isinstance(o, Exception))
    assert len(ok) == 3 + 8  # the others are not held back by ann's cap
    assert ledger.audit() == []


def test_a_meter_pass_racing_with_spawns_and_stops_leaves_the_audit_clean(ledger):
    ledger.grant("group:vision", 40 * MICROS, key="top-up")
    ledger.set_cap("vision", "m0", 2 * RESERVE, "week", "pi")
    clock = ledger.clock
    meter = Meter(ledger, hub=None, interval_seconds=60, clock=clock)
    barrier = threading.Barrier(len(MEMBERS) + 1)
    errors: list = []

    def member(user: str) -> None:
        barrier.wait()
        for k in range(SPAWNS_EACH * 2):
            try:
                auth = ledger.open_session(
                    user, f"gpu{k}", "a800", 1, A800, MIN_SECONDS, wallet="group:vision"
                )
            except InsufficientCredit:
                continue
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                continue
            try:
                ledger.mark_ready(auth.session_id)
                if k % 2:
                    ledger.close_session(auth.session_id)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    def meter_passes() -> None:
        barrier.wait()
        for _ in range(20):
            clock.advance(13)
            servers = {(r.user_name, r.server_name): True for r in ledger.open_session_rows()}
            try:
                meter.charge_pass(servers, clock.now)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    for user in MEMBERS:
        ledger.ensure_user(user)
    threads = [threading.Thread(target=member, args=(u,)) for u in MEMBERS]
    threads.append(threading.Thread(target=meter_passes))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    clock.advance(60)
    for session in ledger.open_sessions():
        ledger.close_session(session.id)
    assert ledger.audit() == []
    with ledger.begin() as db:
        sessions = list(db.scalars(select(MeteredSession)))
    spent = sum(
        accrued(s.rate_micros_per_hour, s.metered_through - s.ready_at)
        for s in sessions
        if s.ready_at is not None
    )
    assert spent > 0
    assert ledger.balance("group:vision") == 40 * MICROS - spent


def test_two_first_spawns_of_a_new_member_from_a_group_both_get_an_answer(postgres):
    """The first transaction is held right after inserting the member's wallet until the
    second one waits on it (seen in pg_stat_activity): no sleep, no luck."""
    url = postgres.new_database()
    first_inside = threading.Event()
    holder: list[int] = []

    def fault(point: str) -> None:
        if point != "wallet-created" or holder:
            return
        holder.append(threading.get_ident())
        first_inside.set()
        with engine.connect() as watcher:
            for _ in range(2000):  # until the second spawn waits on our uncommitted row
                waiting = watcher.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).scalar()
                if waiting:
                    return
                watcher.rollback()
                threading.Event().wait(0.005)
        raise AssertionError("the second spawn never waited")

    engine = connect(url)
    ledger = Ledger(engine, clock=FakeClock(), fault=fault)
    ledger.create_group("vision", "root")
    ledger.grant("group:vision", 100 * MICROS, key="top-up")
    outcomes: dict[str, object] = {}

    def spawn(server: str) -> None:
        try:
            outcomes[server] = ledger.open_session(
                "newcomer", server, "a800", 1, A800, MIN_SECONDS, wallet="group:vision"
            )
        except Exception as e:  # noqa: BLE001
            outcomes[server] = e

    first = threading.Thread(target=spawn, args=("one",))
    first.start()
    assert first_inside.wait(30)
    second = threading.Thread(target=spawn, args=("two",))
    second.start()
    first.join()
    second.join()
    engine.dispose()
    assert not any(isinstance(o, Exception) for o in outcomes.values()), outcomes
