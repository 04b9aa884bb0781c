"""Dated prices (a change adds a row; running sessions keep their rate) and the billing
service's scheduled audit (each run recorded for the admin page), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import func, select, text

from meterhub.billing_hooks import db
from meterhub.billing_hooks.ledger import Ledger, LedgerError
from meterhub.billing_hooks.money import accrued, to_micros
from meterhub.billing_hooks.orm import AUDIT_PROBLEM_LINES, AuditRun, Price
from meterhub.billing_hooks.service import audit_forever, next_audit_delay, scheduled_audit

from .billing_support import make_ledger as make_memory_ledger
from .fast.inprocess import InProcessHub

HOUR = 3600


@pytest.fixture
def make_ledger(ledger_url):
    """A factory of ledgers on a fresh database: SQLite, then PostgreSQL."""

    def make(**kwargs):
        return make_memory_ledger(engine=db.connect(ledger_url), **kwargs)

    return make


def price_rows(ledger: Ledger) -> int:
    with ledger.begin() as session:
        return session.scalar(select(func.count()).select_from(Price))


def test_a_price_change_adds_a_dated_row_and_running_sessions_keep_their_rate(make_ledger):
    ledger, clock = make_ledger()
    assert ledger.price_overrides() == {} and ledger.price_history() == []
    ledger.set_price("a800", to_micros("5.00"), "user:amy")
    assert ledger.price_overrides() == {"a800": to_micros("5.00")}
    # a session captures the price in effect when it starts (the hooks read price_overrides)
    rate = ledger.price_overrides()["a800"]
    session = ledger.open_session("bo", "", "a800", 1, rate, min_seconds=60).session_id
    ledger.mark_ready(session)
    clock.advance(60)
    ledger.set_price("a800", to_micros("6.00"), "cli:root")
    ledger.set_price("debug", to_micros("0.20"), "user:amy")
    assert ledger.price_overrides() == {"a800": to_micros("6.00"), "debug": to_micros("0.20")}
    clock.advance(HOUR)
    charge = ledger.charge(session, clock.now)
    assert charge is not None and charge.amount_micros == -accrued(to_micros("5.00"), HOUR + 60)
    assert ledger.session(session).rate_micros_per_hour == to_micros("5.00")
    assert price_rows(ledger) == 3  # nothing overwritten

    history = ledger.price_history()
    assert [(c.profile, c.previous_micros, c.micros_per_hour, c.set_by) for c in history] == [
        ("debug", None, to_micros("0.20"), "user:amy"),
        ("a800", to_micros("5.00"), to_micros("6.00"), "cli:root"),
        ("a800", None, to_micros("5.00"), "user:amy"),
    ]
    assert history[-1].effective_from == history[-1].created_at == clock.now - HOUR - 60
    assert len(ledger.price_history(limit=1)) == 1
    assert ledger.audit() == []


def test_a_price_set_for_later_takes_effect_then_and_bad_prices_write_nothing(make_ledger):
    ledger, clock = make_ledger()
    ledger.set_price("h800", to_micros("9.00"), "user:amy")
    later = clock.now + HOUR
    ledger.set_price("h800", to_micros("8.00"), "user:amy", effective_from=later)
    assert ledger.price_overrides() == {"h800": to_micros("9.00")}
    clock.advance(10)
    ledger.set_price("h800", to_micros("7.00"), "user:cy")  # now, until the one set for later
    assert ledger.price_overrides() == {"h800": to_micros("7.00")}
    assert ledger.price_overrides(at=later) == {"h800": to_micros("8.00")}
    clock.advance(HOUR)
    assert ledger.price_overrides() == {"h800": to_micros("8.00")}
    history = [(c.previous_micros, c.micros_per_hour) for c in ledger.price_history()]
    assert history == [
        (to_micros("7.00"), to_micros("8.00")),
        (to_micros("9.00"), to_micros("7.00")),
        (None, to_micros("9.00")),
    ]
    with pytest.raises(LedgerError, match="negative"):
        ledger.set_price("h800", -1, "user:amy")
    assert price_rows(ledger) == 3


def test_migration_0003_keeps_the_old_prices_as_history_and_downgrades(ledger_url):
    config = db.alembic_config(ledger_url)
    command.upgrade(config, "0002")
    engine = db.make_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO prices (profile, micros_per_hour, updated_at)"
                " VALUES ('a800', 4000000, 1700000000), ('debug', 200000, 1700000500)"
            )
        )
    db.upgrade(ledger_url)
    assert db.current_revision(engine) == db.head_revision()
    ledger, clock = make_memory_ledger(engine=db.connect(ledger_url))
    assert ledger.price_overrides() == {"a800": 4_000_000, "debug": 200_000}
    assert [(c.profile, c.set_by, c.effective_from) for c in ledger.price_history()] == [
        ("debug", "unknown", 1_700_000_500),
        ("a800", "unknown", 1_700_000_000),
    ]
    ledger.set_price("a800", 5_000_000, "user:amy")  # ids go on after the copied rows
    assert ledger.price_history()[0].previous_micros == 4_000_000
    assert ledger.latest_audit() is None

    command.downgrade(config, "0002")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT profile, micros_per_hour FROM prices ORDER BY profile"))
        assert rows.all() == [("a800", 5_000_000), ("debug", 200_000)]
    engine.dispose()


def test_the_scheduled_audit_records_one_run_and_is_due_an_interval_later(make_ledger):
    ledger, clock = make_ledger()
    ledger.ensure_user("ann")
    assert next_audit_delay(ledger, HOUR) == 0  # none yet: at once
    run = asyncio.run(scheduled_audit(ledger))
    assert (run.started_at, run.finished_at, run.problems_count, run.problems) == (
        clock.now,
        clock.now,
        0,
        "",
    )
    latest = ledger.latest_audit()
    assert latest is not None and latest.id == run.id and latest.problems_count == 0
    assert next_audit_delay(ledger, HOUR) == HOUR
    clock.advance(HOUR - 600)
    assert next_audit_delay(ledger, HOUR) == 600
    clock.advance(2 * HOUR)
    assert next_audit_delay(ledger, HOUR) == 0  # overdue (the service was down)


def test_a_tampered_ledger_records_its_violations(make_ledger):
    ledger, clock = make_ledger()
    for n in range(30):
        ledger.ensure_user(f"u{n}")
    assert asyncio.run(scheduled_audit(ledger)).problems_count == 0
    with ledger.begin() as session:
        session.execute(text("UPDATE wallets SET balance_micros = balance_micros + 1"))
    clock.advance(HOUR)
    run = asyncio.run(scheduled_audit(ledger))
    # two violations a wallet (its entries' sum, its latest entry): 60, of which 50 are kept
    assert run.problems_count == 60
    lines = run.problems.split("\n")
    assert len(lines) == AUDIT_PROBLEM_LINES and all("cached balance" in line for line in lines)
    latest = ledger.latest_audit()
    assert latest is not None and latest.id == run.id and latest.finished_at == clock.now
    with ledger.begin() as session:
        assert session.scalar(select(func.count()).select_from(AuditRun)) == 2


def test_audit_forever_audits_every_interval_and_survives_a_failed_run(make_ledger):
    ledger, clock = make_ledger()
    delays: list[float] = []
    real_audit = ledger.audit
    calls = []

    def audit(now=None):
        calls.append(now)
        if len(calls) == 2:
            raise RuntimeError("the database went away")
        return real_audit(now)

    ledger.audit = audit  # type: ignore[method-assign]

    async def sleep(seconds: float) -> None:
        if len(delays) == 4:
            raise asyncio.CancelledError
        delays.append(seconds)
        clock.advance(int(seconds))

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(audit_forever(ledger, HOUR, sleep=sleep))
    assert delays[0] == 0  # nothing recorded: the first audit is due at once
    assert all(HOUR <= d <= 1.1 * HOUR for d in delays[1:]), delays  # the interval, jittered
    assert len(calls) == 4  # the failed second run did not stop the schedule
    with ledger.begin() as session:
        assert session.scalar(select(func.count()).select_from(AuditRun)) == 3


async def test_the_admin_page_shows_price_changes_and_the_last_audit(tmp_path):
    with pytest.MonkeyPatch.context() as patch:
        hub = InProcessHub(tmp_path, {}, patch)
        await hub.start()
        try:
            ledger = hub.ledger
            ledger.ensure_user("amy")
            ledger.set_price("a800", to_micros("5.00"), "user:amy")
            password = (Path(hub.site["data_dir"]) / "admin-password").read_text().strip()
            admin = await hub.sign_in(hub.site["admin_users"][0], password)
            page = (await hub.request("GET", f"{hub.url}/hub/billing-admin", session=admin)).text
            assert "No scheduled audit has run yet" in page
            history = page[page.index('id="meterhub-price-history"') :]
            # the site config's price before it, the admin's after
            assert "¥4.50 → ¥5.00" in history and "user:amy" in history

            await asyncio.to_thread(ledger.record_audit)
            with ledger.begin() as session:
                session.execute(text("UPDATE wallets SET balance_micros = balance_micros + 1"))
            hub.clock.advance(60)
            await asyncio.to_thread(ledger.record_audit)
            page = (await hub.request("GET", f"{hub.url}/hub/billing-admin", session=admin)).text
            last = page[page.index('id="meterhub-last-audit"') :][:2000]
            assert "Last scheduled audit:" in last and "violation(s)" in last, last
            assert "cached balance" in last
        finally:
            await hub.stop()
