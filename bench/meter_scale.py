"""Meter scale: one meter pass over 5,000 users / 1,000 running sessions vs a plain bulk insert.

The baseline writes the same number of charge rows in one transaction with executemany,
which is the least any meter must do. Both run side by side on the same database, on
SQLite (WAL) and on a throwaway PostgreSQL cluster, alternating, and the ratio of medians
is reported. Goal: ≤ 2×.

    .venv/bin/python bench/meter_scale.py [--users 5000] [--sessions 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from billing_hooks.clock import FakeClock  # noqa: E402
from billing_hooks.db import connect  # noqa: E402
from billing_hooks.ledger import Ledger  # noqa: E402
from billing_hooks.meter import Meter  # noqa: E402
from billing_hooks.money import to_micros  # noqa: E402
from billing_hooks.orm import Entry, MeteredSession, Wallet  # noqa: E402

RATE = to_micros("4.50")


def populate(ledger: Ledger, users: int, sessions: int) -> dict[tuple[str, str], bool]:
    now = ledger.clock()
    with ledger.begin() as db:
        db.execute(
            insert(Wallet),
            [
                {
                    "owner_kind": "user",
                    "owner_name": f"u{i}",
                    "currency": "CNY",
                    "balance_micros": 10**9,
                    "created_at": now,
                }
                for i in range(users)
            ],
        )
        db.execute(
            insert(MeteredSession),
            [
                {
                    "wallet_id": i + 1,
                    "user_name": f"u{i}",
                    "server_name": "",
                    "profile": "a800",
                    "gpus": 1,
                    "rate_micros_per_hour": RATE,
                    "started_at": now,
                    "ready_at": now,
                    "metered_through": now,
                    "last_seen_running": now,
                }
                for i in range(sessions)
            ],
        )
        # the cached balances must match entries: one opening entry per wallet
        db.execute(
            insert(Entry),
            [
                {
                    "wallet_id": i + 1,
                    "kind": "grant",
                    "amount_micros": 10**9,
                    "balance_after_micros": 10**9,
                    "key": f"open:{i}",
                    "note": "",
                    "created_at": now,
                }
                for i in range(users)
            ],
        )
    return {(f"u{i}", ""): True for i in range(sessions)}


def bulk_insert(ledger: Ledger, sessions: int, round_no: int) -> float:
    now = ledger.clock()
    rows = [
        {
            "wallet_id": i + 1,
            "kind": "adjustment",
            "amount_micros": 0,
            "balance_after_micros": 10**9,
            "key": f"bulk:{round_no}:{i}",
            "note": "",
            "created_at": now,
        }
        for i in range(sessions)
    ]
    start = time.perf_counter()
    with ledger.begin() as db:
        db.execute(insert(Entry), rows)
    return time.perf_counter() - start


def meter_pass(meter: Meter, servers, clock: FakeClock) -> float:
    clock.advance(60)
    start = time.perf_counter()
    meter.charge_pass(servers, clock.now)
    return time.perf_counter() - start


def run(name: str, url: str, users: int, sessions: int, rounds: int) -> None:
    clock = FakeClock()
    ledger = Ledger(connect(url), clock=clock)
    servers = populate(ledger, users, sessions)
    meter = Meter(ledger, hub=None, interval_seconds=60, clock=clock)
    ours, base = [], []
    for i in range(rounds):
        ours.append(meter_pass(meter, servers, clock))
        base.append(bulk_insert(ledger, sessions, i))
    assert ledger.audit() == [], "the benchmark's ledger must stay sound"
    a, b = statistics.median(ours), statistics.median(base)
    print(
        f"{name}: meter pass {a * 1000:.1f} ms, bulk insert {b * 1000:.1f} ms,"
        f" ratio {a / b:.2f} ({users} users, {sessions} running, {rounds} rounds)"
    )
    ledger.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run("sqlite", f"sqlite:///{tmp}/ledger.sqlite", args.users, args.sessions, args.rounds)
    from tests.postgres import PostgresCluster

    cluster = PostgresCluster()
    cluster.start()
    try:
        run("postgresql", cluster.new_database(), args.users, args.sessions, args.rounds)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
