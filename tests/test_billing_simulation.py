"""A seeded simulation of the ledger under crashes, duplicate ticks and DB errors.

Each seed drives users through grants, voucher redemptions and provider top-ups (each
sometimes retried), spawns, ready, meter ticks (sometimes twice, sometimes late), stops and
crashes injected between the statements of a transaction, on a fake clock.
Some spawns pay from one or two group wallets, on which some members have a cap (week, month
or total; the clock starts a few hours before Monday 1 February 2027 00:00 UTC, where a week
and a month both begin). After every step the audit must be clean, every balance must equal
what a simple model says (trial or nothing + granted - exact per-second charges of the
sessions that wallet paid for), and every charge must be on the wallet its session captured
at spawn. A failure prints the seed.

What caps guarantee, derived from `open_session` and `Meter._check_caps` and asserted here:

- a spawn from a group is authorized only when the wallet's balance (plus the overdraft)
  covers the minimum of every open session it pays for, and, for a member with a cap, what
  is left of the cap in its period covers the minimum of every open session of theirs on it;
- a meter pass that finds a member's spend in the period at or over the cap asks to stop
  every ready session of theirs on that wallet (and stops nobody who is under their cap on a
  wallet with credit); the simulation's hub stops them a step later (the stop latency);
- so from the last pass that saw the member under the cap (P), their spend grows only by
  what their sessions already open at the stopping pass (T) run after P until they stop, and
  no new session of theirs is authorized in that period: spend <= cap + sum of rate x (T - P +
  stop latency), DESIGN's "rate x (meter interval + stop latency)", where the interval is the
  real gap between successful passes (an injected DB error makes a pass fail, as in life).

More seeds: METERHUB_SIM_SEEDS=5000 METERHUB_SIM_PG_SEEDS=200 .venv/bin/pytest tests/test_billing_simulation.py
"""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import CapReached, InsufficientCredit
from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.money import MICROS, accrued, to_micros
from meterhub.billing_hooks.orm import Entry, MeteredSession, Wallet
from meterhub.billing_hooks.vouchers import RedeemLimited, VoucherRefused
from meterhub.billing_hooks.wallets import period_start

from .billing_support import charge_totals, make_ledger

SEEDS = int(os.environ.get("METERHUB_SIM_SEEDS", "120"))
PG_SEEDS = int(os.environ.get("METERHUB_SIM_PG_SEEDS", "10"))
STEPS = 60
USERS = ("ann", "bo", "cy")
GROUPS = ("vision", "audio")
RATES = {"debug": to_micros("0.10"), "rtx4090": to_micros("1.25"), "a800": to_micros("6.67")}
MIN_SECONDS = 600
#: Monday 1 February 2027 00:00 UTC: a week and a month begin
BOUNDARY = int(datetime.datetime(2027, 2, 1, tzinfo=datetime.UTC).timestamp())
FAULT_POINTS = (
    "wallet-created",
    "balance-updated",
    "entry-written",
    "session-read",
    "metered-through-advanced",
    "voucher-claimed",
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


@dataclass
class Capped:
    """What the model knows of one member's cap on one group wallet."""

    cap: int
    period: str
    #: the last successful pass that saw them under the cap
    under_at: int | None = None
    #: (period start, stopping pass T, P) once a pass asked to stop them in that period
    stopped: tuple[int, int, int | None] | None = None


def simulate(seed: int, engine=None) -> None:
    rng = random.Random(seed)
    faults = Faults(rng)
    clock = FakeClock(BOUNDARY - rng.randrange(1, 3 * 3600))
    ledger, clock = make_ledger(fault=faults, engine=engine, clock=clock)
    meter = Meter(ledger, hub=None, interval_seconds=60, clock=clock)
    # wallet reference -> what was granted; user wallets start with the trial, groups empty
    granted = {user: 0 for user in USERS}
    members: dict[str, list[str]] = {}
    caps: dict[tuple[str, str], Capped] = {}  # (group, user)
    for group in GROUPS[: rng.choice([1, 2])]:
        ledger.create_group(group.capitalize(), "root", admins=["pi"])  # folded to lower case
        granted[f"group:{group}"] = 0
        if rng.random() < 0.8:  # some groups start with credit, others wait for a grant
            amount = rng.randrange(1, 30) * MICROS
            ledger.grant(f"group:{group}", amount, key=f"start:{group}")
            granted[f"group:{group}"] = amount
        members[group] = [u for u in USERS if rng.random() < 0.8] or [rng.choice(USERS)]
        for user in members[group]:
            if rng.random() < 0.6:
                cap = rng.randrange(30, 250) * 10_000
                period = rng.choice(["week", "month", "total"])
                ledger.set_cap(group, user, cap, period, "pi")
                caps[(group, user)] = Capped(cap, period)
    known = {ref for ref in granted if ref.startswith("group:")}
    # session id -> (user, server, wallet reference it captured)
    open_sessions: dict[int, tuple[str, str, str]] = {}
    captured: dict[int, str] = {}
    to_stop: set[int] = set()
    grant_keys: dict[str, tuple[str, int]] = {}
    # vouchers users redeem (the same code again: a retry, or someone else's) and a
    # provider's top-ups (the same transaction again: its retry)
    vouchers = {
        made.code: made.voucher.amount_micros
        for made in ledger.create_vouchers(rng.randrange(1, 20) * MICROS, 3, "cli:op")
    }
    transactions: dict[str, tuple[str, int]] = {}
    last_pass: list[int] = []

    def attempt(action, *args, **kwargs):
        faults.armed = 0.15
        try:
            return action(*args, **kwargs)
        except (Crash, OperationalError):
            return None
        finally:
            faults.armed = 0.0

    for step in range(STEPS):
        # the hub stops what the last pass asked to stop (its post-stop hook closes them)
        for session_id in sorted(to_stop):
            if attempt(ledger.close_session, session_id) is not None or _closed(ledger, session_id):
                open_sessions.pop(session_id, None)
                to_stop.discard(session_id)
        op = rng.choice(
            [
                *("grant", "grant", "spawn", "ready", "tick", "tick", "tick", "stop", "time"),
                *("voucher", "topup"),
            ]
        )
        user = rng.choice(USERS)
        if op == "grant":
            key = f"grant:{rng.randrange(6)}"  # keys repeat: retries of the same request
            if key not in grant_keys:
                owner = user
                if members and rng.random() < 0.4:
                    owner = f"group:{rng.choice(list(members))}"
                grant_keys[key] = (owner, rng.randrange(1, 500) * 10_000)
            owner, amount = grant_keys[key]
            before = ledger.balance(owner)
            if attempt(ledger.grant, owner, amount, key=key) is not None:
                known.add(owner)
                if before is None:
                    before = 10 * MICROS
                # a retried key moves nothing the second time
                if ledger.balance(owner) - before == amount:
                    granted[owner] += amount
        elif op == "voucher":
            code = rng.choice(list(vouchers))
            try:
                posted = attempt(ledger.redeem_voucher, user, code, user)
            except (VoucherRefused, RedeemLimited):
                posted = None  # used by someone else, or too many of those: nothing moved
            if posted is not None:
                known.add(user)
                if not posted.replayed:
                    granted[user] += vouchers[code]
        elif op == "topup":
            transaction = f"pay-{rng.randrange(4)}"
            if transaction not in transactions:
                transactions[transaction] = (user, rng.randrange(1, 300) * 10_000)
            owner, amount = transactions[transaction]
            posted = attempt(ledger.topup, owner, amount, transaction)
            if posted is not None:
                known.add(owner)
                if not posted.replayed:
                    granted[owner] += amount
        elif op == "spawn":
            profile = rng.choice(list(RATES))
            mine = [g for g, users in members.items() if user in users]
            wallet = f"group:{rng.choice(mine)}" if mine and rng.random() < 0.8 else user
            # some sessions carry their user's own caps ("stop after ¥X / N hours")
            max_cost = rng.choice([None, None, rng.randint(1, 300) * MICROS // 100])
            max_seconds = rng.choice([None, None, rng.randint(1, 40) * 60])
            try:
                auth = attempt(
                    ledger.open_session,
                    user,
                    str(step),
                    profile,
                    1,
                    RATES[profile],
                    MIN_SECONDS,
                    wallet=wallet,
                    max_cost_micros=max_cost,
                    max_seconds=max_seconds,
                )
            except InsufficientCredit as refused:
                auth = None
                check_refusal(ledger, caps, user, wallet, RATES[profile], refused, seed, step)
            if ledger.balance(user) is not None:
                known.add(user)
            if auth is not None:
                open_sessions[auth.session_id] = (user, str(step), wallet)
                captured[auth.session_id] = wallet
                check_authorized(ledger, caps, user, wallet, seed, step)
                if rng.random() < 0.5:  # a quick spawn: ready within the step
                    attempt(ledger.mark_ready, auth.session_id)
        elif op == "ready" and open_sessions:
            attempt(ledger.mark_ready, rng.choice(list(open_sessions)))
        elif op == "tick":
            if rng.random() < 0.5:  # the meter's pass (batched), sometimes twice
                ready = _ready(ledger)
                servers = {
                    (u, server): sid in ready for sid, (u, server, _w) in open_sessions.items()
                }
                for _ in range(rng.choice([1, 1, 2])):
                    result = attempt(meter.charge_pass, servers, clock.now)
                    if result is not None:
                        check_pass(ledger, caps, result, last_pass, clock.now, seed, step)
                        last_pass.append(clock.now)
                        stopping = set(result.to_stop)
                        to_stop |= {
                            sid for sid, (u, s, _w) in open_sessions.items() if (u, s) in stopping
                        }
            else:
                for session_id in list(open_sessions):
                    for _ in range(rng.choice([1, 1, 2])):  # duplicate ticks
                        attempt(ledger.charge, session_id, clock.now)
        elif op == "stop" and open_sessions:
            session_id = rng.choice(list(open_sessions))
            if attempt(ledger.close_session, session_id) is not None or _closed(ledger, session_id):
                open_sessions.pop(session_id)
                to_stop.discard(session_id)
        elif op == "time":
            clock.advance(rng.choice([1, 7, 59, 61, 600, 3601]))
        check(ledger, granted, known, captured, caps, clock.now, seed, step)


def _ready(ledger) -> set[int]:
    with ledger.begin() as db:
        return set(
            db.scalars(select(MeteredSession.id).where(MeteredSession.ready_at.is_not(None)))
        )


def _closed(ledger, session_id) -> bool:
    return all(s.id != session_id for s in ledger.open_sessions())


def _wallet_ids(db) -> dict[str, int]:
    return {
        (w.owner_name if w.owner_kind == "user" else f"group:{w.owner_name}"): w.id
        for w in db.scalars(select(Wallet))
    }


def _session_entries(db) -> list:
    return db.execute(
        select(
            Entry.wallet_id,
            Entry.amount_micros,
            Entry.created_at,
            Entry.kind,
            MeteredSession.user_name,
        ).join(MeteredSession, MeteredSession.id == Entry.session_id)
    ).all()


def _spent(db, wallet_id: int, user: str, since: int, rows: list | None = None) -> int:
    """A member's spend from a wallet since `since`, summed here from the entries (not with
    the ledger's member_spent, which is what is under test)."""
    return -sum(
        amount
        for wid, amount, created, kind, member in (_session_entries(db) if rows is None else rows)
        if wid == wallet_id and member == user and created >= since and kind in ("charge", "refund")
    )


def _reserved(sessions, rate: int = 0) -> int:
    return sum(accrued(s.rate_micros_per_hour, MIN_SECONDS) for s in sessions) + accrued(
        rate, MIN_SECONDS
    )


def check_authorized(ledger, caps, user, wallet, seed, step):
    """Right after a spawn was authorized: the wallet covers the minimum of every session it
    pays for, and the member's cap what they spent plus the minimum of theirs."""
    if not wallet.startswith("group:"):
        return
    group = wallet.split(":", 1)[1]
    now = ledger.clock()
    with ledger.begin() as db:
        wid = _wallet_ids(db)[wallet]
        balance = db.get(Wallet, wid).balance_micros
        paying = list(
            db.scalars(
                select(MeteredSession).where(
                    MeteredSession.wallet_id == wid, MeteredSession.stopped_at.is_(None)
                )
            )
        )
        where = f"seed {seed} step {step}: {user} on {wallet}"
        assert _reserved(paying) <= balance + ledger.overdraft_micros, where
        capped = caps.get((group, user))
        if capped is not None:
            spent = _spent(db, wid, user, period_start(capped.period, now))
            mine = [s for s in paying if s.user_name == user]
            assert spent + _reserved(mine) <= capped.cap, where


def check_refusal(ledger, caps, user, wallet, rate, refused, seed, step):
    """A refused spawn was refused for a reason that holds."""
    where = f"seed {seed} step {step}: {user} on {wallet}: {refused}"
    if not isinstance(refused, CapReached):
        return
    group = wallet.split(":", 1)[1]
    capped = caps.get((group, user))
    assert capped is not None, where
    assert f"Your {group} cap" in str(refused), where
    with ledger.begin() as db:
        wid = _wallet_ids(db)[wallet]
        mine = db.scalars(
            select(MeteredSession).where(
                MeteredSession.wallet_id == wid,
                MeteredSession.user_name == user,
                MeteredSession.stopped_at.is_(None),
            )
        )
        spent = _spent(db, wid, user, period_start(capped.period, ledger.clock()))
        assert spent + _reserved(mine, rate) > capped.cap, where


def check_pass(ledger, caps, result, last_pass, now, seed, step):
    """A successful meter pass asked to stop every ready session of each member at or over
    their cap, and of each wallet at zero, and each session at its own cap; and nobody
    else."""
    stopping = set(result.to_stop)
    own_cap = set(result.capped)
    with ledger.begin() as db:
        ids = _wallet_ids(db)
        names = {wid: ref for ref, wid in ids.items()}
        balances = {w.id: w.balance_micros for w in db.scalars(select(Wallet))}
        running = list(
            db.scalars(
                select(MeteredSession).where(
                    MeteredSession.stopped_at.is_(None), MeteredSession.ready_at.is_not(None)
                )
            )
        )
        over = set()
        rows = _session_entries(db) if caps else []
        for (group, user), capped in caps.items():
            wid = ids[f"group:{group}"]
            spent = _spent(db, wid, user, period_start(capped.period, now), rows)
            if spent < capped.cap:
                capped.under_at = now
                continue
            over.add((wid, user))
            mine = [s for s in running if s.wallet_id == wid and s.user_name == user]
            for session in mine:
                where = (
                    f"seed {seed} step {step}: {user} over the {group} cap, session {session.id}"
                )
                assert (user, session.server_name) in stopping, where
            ps = period_start(capped.period, now)
            if mine and (capped.stopped is None or capped.stopped[0] != ps):
                capped.stopped = (ps, now, capped.under_at)
    for session in running:
        at_zero = balances[session.wallet_id] + ledger.overdraft_micros <= 0
        if (session.user_name, session.server_name) in stopping:
            mine = (session.user_name, session.server_name) in own_cap
            assert at_zero or mine or (session.wallet_id, session.user_name) in over, (
                f"seed {seed} step {step}: {names[session.wallet_id]} session {session.id}"
                " stopped without a reason"
            )
        elif at_zero:
            raise AssertionError(f"seed {seed} step {step}: session {session.id} runs at zero")


def check(ledger, granted, known, captured, caps, now, seed, step):
    problems = ledger.audit()
    assert problems == [], f"seed {seed} step {step}: {problems}"
    with ledger.begin() as db:
        sessions = list(db.scalars(select(MeteredSession)))
        ids = _wallet_ids(db)
        balances = {w.id: w.balance_micros for w in db.scalars(select(Wallet))}
        charges = db.execute(
            select(Entry.session_id, Entry.wallet_id).where(Entry.kind == "charge")
        ).all()
        by_id = {s.id: s for s in sessions}
        # every session is on the wallet it captured at spawn, and so is every charge
        for session in sessions:
            assert session.wallet_id == ids[captured[session.id]], f"seed {seed} step {step}"
        for session_id, wallet_id in charges:
            assert wallet_id == by_id[session_id].wallet_id, f"seed {seed} step {step}"
        # a session's own caps are never passed: not its money, not its hours
        spent = charge_totals(db, [s.id for s in sessions])
        for s in sessions:
            where = f"seed {seed} step {step}: session {s.id}'s own cap"
            if s.max_cost_micros is not None:
                assert spent.get(s.id, 0) <= s.max_cost_micros, where
            if s.max_seconds is not None and s.ready_at is not None:
                assert s.metered_through - s.ready_at <= s.max_seconds, where
        for ref in known:
            charged = sum(
                accrued(s.rate_micros_per_hour, s.metered_through - s.ready_at)
                for s in sessions
                if s.wallet_id == ids[ref] and s.ready_at is not None
            )
            start = 0 if ref.startswith("group:") else 10 * MICROS
            expected = start + granted[ref] - charged
            assert balances[ids[ref]] == expected, f"seed {seed} step {step}: {ref}"
        rows = _session_entries(db) if any(c.stopped for c in caps.values()) else []
        for (group, user), capped in caps.items():
            if capped.stopped is None:
                continue
            ps, stopped_at, under_at = capped.stopped
            if period_start(capped.period, now) != ps:
                continue  # a new period: the spend starts again from nothing
            wid = ids[f"group:{group}"]
            since = under_at if under_at is not None else 0
            mine = [s for s in sessions if s.wallet_id == wid and s.user_name == user]
            where = f"seed {seed} step {step}: {user} on the {group} cap"
            # nothing of theirs on this wallet was authorized after the stopping pass
            assert all(s.started_at <= stopped_at for s in mine), where
            bound = capped.cap
            for s in mine:
                if s.ready_at is None or (s.stopped_at is not None and s.stopped_at <= since):
                    continue
                end = min(now, s.stopped_at if s.stopped_at is not None else now)
                # + 1: each window is rounded down from the session's ready time
                bound += accrued(s.rate_micros_per_hour, max(0, end - max(since, s.ready_at))) + 1
            assert _spent(db, wid, user, ps, rows) <= bound, where


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
