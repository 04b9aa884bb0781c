"""The ledger: trial credit once, idempotent entries, authorized sessions, exact windows, audit."""

import threading

import pytest
from sqlalchemy import event, text

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.db import SchemaMismatch, connect, current_revision, head_revision
from meterhub.billing_hooks.ledger import ConcurrentUpdate, InsufficientCredit, KeyConflict, Ledger
from meterhub.billing_hooks.money import MICROS, accrued, to_micros

from .billing_support import make_ledger as make_memory_ledger

A800 = to_micros("4.50")


@pytest.fixture
def make_ledger(ledger_url):
    """A factory of ledgers on a fresh database: SQLite, then PostgreSQL."""

    def make(**kwargs):
        return make_memory_ledger(engine=connect(ledger_url), **kwargs)

    return make


def test_trial_credit_exactly_once(make_ledger):
    ledger, _ = make_ledger()
    assert ledger.ensure_user("ann") == 10 * MICROS
    assert ledger.ensure_user("ann") == 10 * MICROS
    assert ledger.balance("ann") == 10 * MICROS
    assert ledger.balance("nobody") is None
    assert ledger.audit() == []


def test_grants_are_idempotent_by_key_and_conflicts_are_loud(make_ledger):
    ledger, _ = make_ledger()
    first = ledger.grant("bo", 5 * MICROS, key="grant:req-1", note="top-up", actor="ann")
    again = ledger.grant("bo", 5 * MICROS, key="grant:req-1", note="top-up", actor="ann")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.value.id == first.value.id and first.value.actor == "ann"
    assert ledger.balance("bo") == 15 * MICROS
    # the same key for another request is refused, whatever differs
    for amount, note in ((6 * MICROS, "top-up"), (5 * MICROS, "retry")):
        with pytest.raises(KeyConflict):
            ledger.grant("bo", amount, key="grant:req-1", note=note)
    assert ledger.balance("bo") == 15 * MICROS


def test_spawn_is_refused_without_minimum_minutes_and_says_what_to_do(make_ledger):
    ledger, _ = make_ledger(trial_credit_micros=to_micros("0.50"))
    with pytest.raises(InsufficientCredit) as e:
        ledger.open_session("cy", "", "a800", 1, A800, min_seconds=600, label="1 × A800")
    message = str(e.value)
    assert "Your balance is ¥0.50" in message and "¥4.50/h" in message
    assert "10 minutes" in message and "Top up, or choose debug mode" in message
    assert ledger.open_sessions() == []
    # debug mode fits
    ledger.open_session("cy", "", "debug", 0, to_micros("0.10"), min_seconds=600)


def test_concurrent_spawns_cannot_together_overspend(make_ledger):
    ledger, _ = make_ledger(trial_credit_micros=to_micros("1.00"))
    ledger.open_session("di", "", "a800", 1, A800, min_seconds=600)  # needs 0.75
    with pytest.raises(InsufficientCredit, match="with your running servers"):
        ledger.open_session("di", "gpu2", "a800", 1, A800, min_seconds=600)  # 1.50 > 1.00


def test_a_stale_session_a_spawn_closes_is_charged_before_its_credit_check(make_ledger):
    """A session the hub left open for this server (it died mid-spawn) is closed, and its
    last window charged, by the next spawn of the server in the same transaction: that
    charge is no longer credit, for the check and for the balance the spawn reports."""
    ledger, clock = make_ledger(trial_credit_micros=to_micros("1.00"))
    auth = ledger.open_session("sol", "", "a800", 1, A800, min_seconds=600)
    ledger.mark_ready(auth.session_id)
    clock.advance(3600)
    with ledger.begin() as db:  # seen running for an hour, none of it charged yet
        db.execute(text("UPDATE sessions SET last_seen_running = :t"), {"t": clock.now})
    with pytest.raises(InsufficientCredit):  # ¥1.00 - ¥4.50: nothing left for debug mode
        ledger.open_session("sol", "", "debug", 0, to_micros("0.10"), min_seconds=600)
    assert [s.id for s in ledger.open_sessions()] == [auth.session_id]  # rolled back
    ledger.grant("sol", 10 * MICROS, key="grant:sol")
    again = ledger.open_session("sol", "", "debug", 0, to_micros("0.10"), min_seconds=600)
    assert again.balance_micros == ledger.balance("sol") == 11 * MICROS - accrued(A800, 3600)
    assert [s.id for s in ledger.open_sessions()] == [again.session_id]
    assert ledger.audit() == []


def test_the_spawns_transactions_begin_as_sqlite_should(tmp_path):
    """As SQLite runs them (its own trace of every statement, those that bypass SQLAlchemy
    too): mark_ready and the ORM's transactions begin with BEGIN IMMEDIATE (the write lock
    at once: a read-then-write never deadlocks); the direct reads (a spawn's, the prices, a
    student's courses) begin with BEGIN (no lock against writers); each commits."""
    engine = connect(f"sqlite:///{tmp_path}/ledger.sqlite")
    statements: list[str] = []

    @event.listens_for(engine, "connect")
    def _trace(dbapi_connection, _record):
        dbapi_connection.set_trace_callback(statements.append)

    engine.dispose()  # the pool's connections from before the listener
    ledger = Ledger(engine, clock=FakeClock())
    auth = ledger.open_session("tia", "", "debug", 0, to_micros("0.10"), min_seconds=60)

    def run(call, *args):
        statements.clear()
        call(*args)
        return [s.split()[0] if not s.startswith("BEGIN") else s for s in statements]

    assert run(ledger.mark_ready, auth.session_id) == ["BEGIN IMMEDIATE", "UPDATE", "COMMIT"]
    assert ledger.open_sessions()[0].ready_at is not None
    assert run(ledger.spawn_reads, "tia") == ["BEGIN", "SELECT", "SELECT", "COMMIT"]
    assert run(ledger.price_overrides) == ["BEGIN", "SELECT", "COMMIT"]
    assert run(ledger.student_courses, "tia") == ["BEGIN", "SELECT", "COMMIT"]
    assert run(ledger.balance, "tia") == ["BEGIN IMMEDIATE", "SELECT", "COMMIT"]  # the ORM's
    opened = run(ledger.open_session, "tia", "two", "debug", 0, to_micros("0.10"), 60)
    assert opened[0] == "BEGIN IMMEDIATE" and opened[-1] == "COMMIT" and "INSERT" in opened


def test_charges_from_ready_to_stop_per_second_and_exactly(make_ledger):
    ledger, clock = make_ledger()
    auth = ledger.open_session("ed", "", "a800", 2, 2 * A800, min_seconds=600)
    clock.advance(30)  # spawning is free
    ledger.mark_ready(auth.session_id)
    ready = clock.now
    clock.advance(61)
    first = ledger.charge(auth.session_id, clock.now)
    assert first.amount_micros == -accrued(2 * A800, 61)
    assert ledger.charge(auth.session_id, clock.now) is None  # a duplicate tick charges nothing
    clock.advance(3600)
    ledger.charge(auth.session_id, clock.now)
    clock.advance(17)
    ledger.close_session(auth.session_id)
    total = 10 * MICROS - ledger.balance("ed")
    assert total == accrued(2 * A800, clock.now - ready) == 9 * MICROS * 3678 // 3600
    assert ledger.audit() == []


def test_a_failed_spawn_costs_nothing(make_ledger):
    ledger, clock = make_ledger()
    auth = ledger.open_session("fi", "", "a800", 1, A800, min_seconds=600)
    clock.advance(300)
    assert ledger.close_session(auth.session_id) is None
    assert ledger.balance("fi") == 10 * MICROS
    assert ledger.open_sessions() == []


@pytest.mark.parametrize("batched", [False, True], ids=["per-session", "batched"])
def test_two_meters_racing_on_one_database_double_nothing(ledger_url, batched):
    url = ledger_url
    clock = FakeClock()
    meters = [Ledger(connect(url), clock=clock) for _ in range(2)]
    sessions = []
    for user in ("ja", "ki", "lu"):
        auth = meters[0].open_session(user, "", "a800", 1, A800, min_seconds=60)
        meters[0].mark_ready(auth.session_id)
        sessions.append(auth.session_id)
    ready = clock.now
    errors = []

    def run(meter):
        for tick in range(1, 41):
            if batched:  # the meter's pass: all sessions in one transaction
                try:
                    meter.charge_running(sessions, ready + tick * 7)
                except Exception as e:  # noqa: BLE001 - anything fails the test
                    errors.append(e)
                continue
            for session_id in sessions:
                try:
                    meter.charge(session_id, ready + tick * 7)
                except ConcurrentUpdate:
                    pass
                except Exception as e:  # noqa: BLE001 - anything else fails the test
                    errors.append(e)

    threads = [threading.Thread(target=run, args=(m,)) for m in meters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clock.advance(280)
    assert errors == []
    assert meters[0].audit() == []
    for user in ("ja", "ki", "lu"):
        assert meters[1].balance(user) == 10 * MICROS - accrued(A800, 280)


def test_audit_finds_tampering(make_ledger):
    ledger, clock = make_ledger()
    auth = ledger.open_session("hu", "", "a800", 1, A800, min_seconds=60)
    ledger.mark_ready(auth.session_id)
    clock.advance(120)
    ledger.charge(auth.session_id, clock.now)
    clock.advance(120)
    ledger.charge(auth.session_id, clock.now)
    assert ledger.audit() == []
    with ledger.begin() as db:
        db.execute(text("UPDATE wallets SET balance_micros = balance_micros + 1"))
    assert any("cached balance" in p for p in ledger.audit())
    with ledger.begin() as db:
        db.execute(text("UPDATE wallets SET balance_micros = balance_micros - 1"))
    assert ledger.audit() == []
    with ledger.begin() as db:  # the meter's pass relies on balance_after being the balance
        db.execute(
            text(
                "UPDATE entries SET balance_after_micros = balance_after_micros + 7"
                " WHERE id = (SELECT max(id) FROM entries)"
            )
        )
    assert any("latest entry says" in p for p in ledger.audit())
    with ledger.begin() as db:
        db.execute(
            text(
                "UPDATE entries SET balance_after_micros = balance_after_micros - 7"
                " WHERE id = (SELECT max(id) FROM entries)"
            )
        )
        db.execute(
            text(
                "UPDATE entries SET window_start = window_start + 5 WHERE kind = 'charge' AND id = (SELECT max(id) FROM entries)"
            )
        )
    problems = ledger.audit()
    assert any("gapped window" in p for p in problems), problems
    with ledger.begin() as db:
        db.execute(text("UPDATE sessions SET metered_through = 4000000000"))
    assert any("past its observed end" in p for p in ledger.audit())


def test_migrations_create_the_schema_and_mismatch_is_refused(ledger_url):
    url = ledger_url
    engine = connect(url)
    assert current_revision(engine) == head_revision()
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00'"))
    with pytest.raises(SchemaMismatch, match="meterhub billing upgrade-db"):
        connect(url)


DAY = 86_400


def test_passes_cover_their_gpus_and_expire_into_the_hourly_rate(make_ledger):
    ledger, clock = make_ledger(trial_credit_micros=to_micros("100.00"))
    price = to_micros("97.20")
    with pytest.raises(InsufficientCredit, match="a daily pass for 2 × A800 costs ¥194.40"):
        ledger.buy_pass("pia", "a800", 2, "daily", 2 * price, DAY, key="pass:1", label="2 × A800")
    bought = ledger.buy_pass("pia", "a800", 1, "daily", price, DAY, key="pass:2")
    assert (
        ledger.buy_pass("pia", "a800", 1, "daily", price, DAY, key="pass:2").value.id
        == bought.value.id
    )
    assert ledger.balance("pia") == to_micros("2.80")
    # ¥2.80 would not cover 10 minutes of two A800s, but the pass pays for one
    auth = ledger.open_session("pia", "", "a800", 1, A800, min_seconds=600)
    ledger.mark_ready(auth.session_id)
    clock.advance(DAY - 100)
    ledger.charge(auth.session_id, clock.now)
    assert ledger.balance("pia") == to_micros("2.80")  # covered: free
    clock.advance(400)  # the pass ends 100 s into this window
    ledger.charge(auth.session_id, clock.now)
    assert ledger.balance("pia") == to_micros("2.80") - (
        accrued(A800, DAY + 300) - accrued(A800, DAY)
    )
    assert ledger.audit() == []
    # debug mode is never covered by a GPU pass, and a pass does not cover more GPUs
    with pytest.raises(InsufficientCredit):
        ledger.open_session("pia", "big", "a800", 2, 2 * A800, min_seconds=3600)


def test_a_second_pass_starts_when_the_first_ends(make_ledger):
    ledger, clock = make_ledger(trial_credit_micros=to_micros("300.00"))
    first = ledger.buy_pass("qi", "a800", 1, "daily", to_micros("97.20"), DAY, key="p:1").value
    clock.advance(3600)
    second = ledger.buy_pass("qi", "a800", 1, "daily", to_micros("97.20"), DAY, key="p:2").value
    assert second.starts_at == first.ends_at and second.ends_at == first.ends_at + DAY
    assert [p.id for p in ledger.passes("qi", valid_at=clock.now)] == [first.id]
    # a retry is the same purchase even if the price changed meanwhile; another pass is not
    assert ledger.buy_pass("qi", "a800", 1, "daily", to_micros("1.00"), DAY, key="p:1").replayed
    with pytest.raises(KeyConflict):
        ledger.buy_pass("qi", "a800", 2, "daily", to_micros("194.40"), DAY, key="p:1")


def test_a_server_a_pass_pays_for_needs_no_credit_beside_a_new_spawn(make_ledger):
    ledger, clock = make_ledger(trial_credit_micros=to_micros("97.50"))
    ledger.buy_pass("ro", "a800", 1, "daily", to_micros("97.20"), DAY, key="p:ro")
    auth = ledger.open_session("ro", "", "a800", 1, A800, min_seconds=600)
    ledger.mark_ready(auth.session_id)
    # ¥0.30 left covers 10 minutes of debug (¥0.02), whatever the covered A800 would cost
    ledger.open_session("ro", "dbg", "debug", 0, to_micros("0.10"), min_seconds=600)


def test_a_returning_users_spawn_does_not_make_their_wallet_again(make_ledger, monkeypatch):
    """The first spawn makes the wallet (with the trial credit) in a transaction of its own;
    later ones skip that transaction: wallets are never deleted."""
    ledger, _ = make_ledger()
    made = []
    ensure_user = Ledger.ensure_user
    monkeypatch.setattr(
        Ledger, "ensure_user", lambda self, user: made.append(user) or ensure_user(self, user)
    )
    first = ledger.open_session("rue", "", "debug", 0, to_micros("0.10"), min_seconds=60)
    assert made == ["rue"] and ledger.balance("rue") == ledger.trial_credit_micros
    ledger.close_server("rue", "", None)
    ledger.open_session("rue", "", "debug", 0, to_micros("0.10"), min_seconds=60)
    ledger.open_session("rue", "gpu", "debug", 0, to_micros("0.10"), min_seconds=60)
    assert made == ["rue"], "a known wallet is not made again"
    assert first.session_id


def test_a_pass_covers_a_spawn_only_if_it_lasts_the_minimum_minutes(make_ledger):
    """A valid pass that ends within the minimum minutes does not stand in for credit."""
    ledger, _ = make_ledger(trial_credit_micros=to_micros("1.00"))
    rate = to_micros("20.00")  # ten minutes: ¥3.33, more than the ¥0.90 left after the pass
    ledger.buy_pass("ivy", "a800", 1, "daily", to_micros("0.10"), 300, key="p:ivy")
    with pytest.raises(InsufficientCredit):
        ledger.open_session("ivy", "", "a800", 1, rate, min_seconds=600)
    ledger.buy_pass("jo", "a800", 1, "daily", to_micros("0.10"), 3600, key="p:jo")
    assert ledger.open_session("jo", "", "a800", 1, rate, min_seconds=600).session_id
    with pytest.raises(InsufficientCredit):  # the pass is for one GPU
        ledger.open_session("jo", "two", "a800", 2, rate, min_seconds=600)


def test_a_spawns_reads_are_the_prices_in_effect_and_the_students_courses(make_ledger):
    from meterhub.billing_hooks.courses import RosterLine

    ledger, clock = make_ledger()
    ledger.set_price("a800", to_micros("5.00"), actor="root")
    ledger.set_price("h800", to_micros("9.00"), actor="root", effective_from=clock() + 60)
    for course in ("ml201", "ml101", "cv1"):
        ledger.create_course(course, "root", instructors=["prof"])
    ledger.import_roster("ml201", [RosterLine("amy")], "root")
    ledger.import_roster("ml101", [RosterLine("amy"), RosterLine("bo")], "root")
    ledger.import_roster("cv1", [RosterLine("amy", "ta")], "root")  # staff, not a student
    reads = ledger.spawn_reads("amy")
    assert reads.prices == ledger.price_overrides() == {"a800": to_micros("5.00")}
    assert reads.student_courses == ledger.student_courses("amy") == ["ml101", "ml201"]
    assert ledger.spawn_reads("bo").student_courses == ["ml101"]
    assert ledger.spawn_reads("cy") == ({"a800": to_micros("5.00")}, [])
    clock.advance(60)
    assert ledger.spawn_reads("cy").prices["h800"] == to_micros("9.00")


def test_a_direct_statements_database_errors_are_sqlalchemys(make_ledger):
    """What the pre-spawn hook catches (DBAPIError: billing unavailable, HTTP 503) is raised
    by the spawn's statements that bypass SQLAlchemy's execution too."""
    from sqlalchemy import column, select, table
    from sqlalchemy.exc import DBAPIError

    from meterhub.billing_hooks.db import Direct, direct_transaction

    ledger, _ = make_ledger()
    missing = Direct(select(column("x")).select_from(table("no_such_table")))
    with pytest.raises(DBAPIError), ledger.engine.begin() as connection:
        missing.rows(connection, {})
    for write in (False, True):
        with pytest.raises(DBAPIError), direct_transaction(ledger.engine, write) as pooled:
            missing.rows(pooled, {})
    # the connections it used (rolled back) are fine for the next
    assert ledger.spawn_reads("amy").student_courses == []
    auth = ledger.open_session("amy", "", "debug", 0, to_micros("0.10"), min_seconds=60)
    ledger.mark_ready(auth.session_id)
    assert ledger.open_sessions()[0].ready_at is not None


def test_a_lost_connection_is_sqlalchemys_error_and_never_goes_back_to_the_pool(tmp_path):
    from sqlalchemy import select
    from sqlalchemy.exc import DBAPIError

    from meterhub.billing_hooks.db import Direct, direct_transaction
    from meterhub.billing_hooks.orm import Price

    engine = connect(f"sqlite:///{tmp_path}/ledger.sqlite")
    ledger = Ledger(engine, clock=FakeClock())
    prices = Direct(select(Price.profile))
    for write in (False, True):
        with pytest.raises(DBAPIError) as e, direct_transaction(engine, write) as pooled:
            pooled.connection.driver_connection.close()  # the database's end goes away
            prices.rows(pooled, {})
        assert e.value.connection_invalidated
    # the pool gave a new connection, not the dead one
    assert ledger.spawn_reads("amy") == ({}, [])
    auth = ledger.open_session("amy", "", "debug", 0, to_micros("0.10"), min_seconds=60)
    ledger.mark_ready(auth.session_id)
    assert ledger.open_sessions()[0].ready_at is not None


def test_direct_refuses_what_it_cannot_run_and_inserts_without_returning(tmp_path):
    """A statement whose values need converting, or that expands a parameter, is refused
    when first compiled; on a database without INSERT ... RETURNING (SQLite before 3.35)
    a session's id comes from the cursor."""
    from sqlalchemy import bindparam, select

    from meterhub.billing_hooks.db import Direct
    from meterhub.billing_hooks.orm import GroupSettings, Price

    engine = connect(f"sqlite:///{tmp_path}/ledger.sqlite")
    refused = (
        Direct(select(GroupSettings.default_for_members)),  # a Boolean: SQLite's 0/1
        Direct(select(Price.profile).where(Price.profile.in_(bindparam("p", expanding=True)))),
    )
    with engine.begin() as connection:
        for statement in refused:
            with pytest.raises(ValueError, match="Direct cannot run"):
                statement.rows(connection, {"p": ["a800"]})
    engine.dialect.insert_returning = False
    ledger = Ledger(engine, clock=FakeClock())
    ids = [
        ledger.open_session(user, "", "debug", 0, to_micros("0.10"), min_seconds=60).session_id
        for user in ("amy", "bo", "cy")
    ]
    assert ids == [s.id for s in ledger.open_sessions()] and len(set(ids)) == 3
    from meterhub.billing_hooks.postings import _NEW_SESSION

    assert "RETURNING" not in _NEW_SESSION._sql(engine.dialect)[0]  # the cursor's id it was
