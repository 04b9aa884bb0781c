"""A seeded simulation of the ledger under crashes, duplicate ticks and DB errors.

Each seed drives users through grants, spawns, ready, meter ticks (sometimes twice, sometimes
late), stops and crashes injected between the statements of a transaction, on a fake clock.
After every step the audit must be clean and every balance must equal what a simple model
says: trial + granted - exact per-second charges. A failure prints the seed.

More seeds: METERHUB_SIM_SEEDS=5000 METERHUB_SIM_PG_SEEDS=200 .venv/bin/pytest tests/test_billing_simulation.py
"""

from __future__ import annotations

import os
import random

import pytest
from sqlalchemy.exc import OperationalError

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import InsufficientCredit
from meterhub.billing_hooks.money import MICROS, accrued, to_micros

from .billing_support import make_ledger

SEEDS = int(os.environ.get("METERHUB_SIM_SEEDS", "120"))
PG_SEEDS = int(os.environ.get("METERHUB_SIM_PG_SEEDS", "10"))
STEPS = 60
USERS = ("ann", "bo", "cy")
RATES = {"debug": to_micros("0.10"), "rtx4090": to_micros("1.25"), "a800": to_micros("6.67")}
FAULT_POINTS = (
    "wallet-created",
    "balance-updated",
    "entry-written",
    "session-read",
    "metered-through-advanced",
)


class Crash(Exception):
    """The process died mid-transaction: nothing of the transaction survives."""


class Faults:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.armed = 0.0

    def __call__(self, point: str) -> None:
        if point in FAULT_POINTS and self.rng.random() < self.armed:
            if self.rng.random() < 0.5:
                raise Crash(point)
            raise OperationalError("UPDATE ...", {}, Exception(f"database went away at {point}"))


def simulate(seed: int, engine=None) -> None:
    rng = random.Random(seed)
    faults = Faults(rng)
    ledger, clock = make_ledger(fault=faults, engine=engine)
    granted = {user: 0 for user in USERS}
    known = set()
    open_sessions: dict[int, str] = {}
    grant_keys: dict[str, tuple[str, int]] = {}

    def attempt(action, *args, **kwargs):
        faults.armed = 0.15
        try:
            return action(*args, **kwargs)
        except (Crash, OperationalError):
            return None
        finally:
            faults.armed = 0.0

    for step in range(STEPS):
        op = rng.choice(
            ["grant", "grant", "spawn", "ready", "tick", "tick", "tick", "stop", "time"]
        )
        user = rng.choice(USERS)
        if op == "grant":
            key = f"grant:{rng.randrange(6)}"  # keys repeat: retries of the same request
            if key not in grant_keys:
                grant_keys[key] = (user, rng.randrange(1, 500) * 10_000)
            owner, amount = grant_keys[key]
            before = ledger.balance(owner)
            if attempt(ledger.grant, owner, amount, key=key) is not None:
                known.add(owner)
                if before is None:
                    before = 10 * MICROS
                # a retried key moves nothing the second time
                if ledger.balance(owner) - before == amount:
                    granted[owner] += amount
        elif op == "spawn":
            profile = rng.choice(list(RATES))
            try:
                auth = attempt(
                    ledger.open_session, user, str(step), profile, 1, RATES[profile], 600
                )
            except InsufficientCredit:
                auth = None
            if ledger.balance(user) is not None:
                known.add(user)
            if auth is not None:
                open_sessions[auth.session_id] = user
        elif op == "ready" and open_sessions:
            attempt(ledger.mark_ready, rng.choice(list(open_sessions)))
        elif op == "tick":
            if rng.random() < 0.5:  # the meter's batched pass, sometimes twice
                ready = [sid for sid in open_sessions if _is_ready(ledger, sid)]
                for _ in range(rng.choice([1, 1, 2])):
                    attempt(ledger.charge_running, ready, clock.now)
            else:
                for session_id in list(open_sessions):
                    for _ in range(rng.choice([1, 1, 2])):  # duplicate ticks
                        attempt(ledger.charge, session_id, clock.now)
        elif op == "stop" and open_sessions:
            session_id = rng.choice(list(open_sessions))
            if attempt(ledger.close_session, session_id) is not None or _closed(ledger, session_id):
                open_sessions.pop(session_id)
        elif op == "time":
            clock.advance(rng.choice([1, 7, 59, 61, 600, 3601]))
        check(ledger, granted, known, seed, step)


def _is_ready(ledger, session_id) -> bool:
    from meterhub.billing_hooks.orm import MeteredSession

    with ledger.begin() as db:
        return db.get(MeteredSession, session_id).ready_at is not None


def _closed(ledger, session_id) -> bool:
    return all(s.id != session_id for s in ledger.open_sessions())


def check(ledger, granted, known, seed, step):
    from meterhub.billing_hooks.orm import MeteredSession

    problems = ledger.audit()
    assert problems == [], f"seed {seed} step {step}: {problems}"
    with ledger.begin() as db:
        sessions = list(db.query(MeteredSession))
    for user in known:
        charged = sum(
            accrued(s.rate_micros_per_hour, s.metered_through - s.ready_at)
            for s in sessions
            if s.user_name == user and s.ready_at is not None
        )
        expected = 10 * MICROS + granted[user] - charged
        assert ledger.balance(user) == expected, f"seed {seed} step {step}: {user}"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seeded_simulation(seed):
    simulate(seed)


@pytest.mark.parametrize("seed", range(PG_SEEDS))
def test_seeded_simulation_on_postgresql(seed, postgres):
    engine = connect(postgres.new_database())
    try:
        simulate(seed, engine=engine)
    finally:
        engine.dispose()
