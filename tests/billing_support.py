"""Helpers for billing tests: a fresh ledger on a throwaway SQLite database."""

from __future__ import annotations

from sqlalchemy import create_engine, event
from sqlalchemy.pool import StaticPool

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.orm import Base


def memory_engine():
    """One shared in-memory SQLite connection with the ledger schema (fast, for many seeds)."""
    engine = create_engine(
        "sqlite://",
        connect_args={"check_same_thread": False, "isolation_level": None},
        poolclass=StaticPool,
    )

    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    Base.metadata.create_all(engine)
    return engine


def make_ledger(**kwargs) -> tuple[Ledger, FakeClock]:
    clock = kwargs.pop("clock", None) or FakeClock()
    return Ledger(kwargs.pop("engine", None) or memory_engine(), clock=clock, **kwargs), clock


def charge_totals(db, session_ids) -> dict[int, int]:
    """What each session's charge entries took (positive micros), read from the entries
    themselves: the ground truth the meter's derived costs are checked against."""
    from sqlalchemy import func, select

    from meterhub.billing_hooks.orm import Entry

    rows = db.execute(
        select(Entry.session_id, func.sum(Entry.amount_micros))
        .where(Entry.session_id.in_(list(session_ids)), Entry.kind == "charge")
        .group_by(Entry.session_id)
    )
    return {sid: -int(total) for sid, total in rows}
