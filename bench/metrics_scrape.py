"""Metrics scrape: a scrape of /services/billing/metrics over a large ledger vs one SUM.

Fills a ledger with N charge entries (1,000 running sessions of 1,000 users, a 60 s window
each per pass, as a year of metering at that size writes them), then alternates, on the same
database: one meter-sized batch of new charges (1,000 entries) followed by a scrape
(`BillingMetrics.exposition()`: the money totals advanced by the new entries, running
sessions, wallets at zero, GPUs, the audit), and the naive alternative, one
`SUM(amount) ... GROUP BY profile` over every entry (what summing the ledger at each scrape
costs). Reports the medians and their ratio, and the one-time catch-up at start (reading the
whole history a page at a time), on SQLite (WAL) and a throwaway PostgreSQL cluster.

    .venv/bin/python bench/metrics_scrape.py [--entries 1000000] [--rounds 7] [--no-postgres]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, insert, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from meterhub.billing_hooks.clock import FakeClock  # noqa: E402
from meterhub.billing_hooks.db import connect  # noqa: E402
from meterhub.billing_hooks.ledger import Ledger  # noqa: E402
from meterhub.billing_hooks.metrics import BillingMetrics  # noqa: E402
from meterhub.billing_hooks.money import to_micros  # noqa: E402
from meterhub.billing_hooks.orm import Entry, MeteredSession, Wallet  # noqa: E402

RATE = to_micros("4.50")
WINDOW = 60
CHARGE = RATE * WINDOW // 3600
SESSIONS = 1000
CHUNK = 50_000


def populate(ledger: Ledger, entries: int) -> int:
    """Wallets, sessions and `entries` charges, written directly (the totals only read
    them); returns the next window's start."""
    now = ledger.clock()
    with ledger.begin() as db:
        db.execute(
            insert(Wallet),
            [
                {
                    "owner_kind": "user",
                    "owner_name": f"u{i}",
                    "currency": "CNY",
                    "balance_micros": 10**12,
                    "created_at": now,
                }
                for i in range(SESSIONS)
            ],
        )
        db.execute(
            insert(MeteredSession),
            [
                {
                    "wallet_id": i + 1,
                    "user_name": f"u{i}",
                    "server_name": "",
                    "profile": "a800" if i % 2 else "rtx4090",
                    "gpus": 1,
                    "rate_micros_per_hour": RATE,
                    "started_at": now,
                    "ready_at": now,
                    "metered_through": now,
                    "last_seen_running": now,
                }
                for i in range(SESSIONS)
            ],
        )
    start = now
    written = 0
    while written < entries:
        rows = []
        for n in range(written, min(entries, written + CHUNK)):
            window = n // SESSIONS
            rows.append(charge_row(n % SESSIONS, now + window * WINDOW, n))
        with ledger.begin() as db:
            db.execute(insert(Entry), rows)
        written += len(rows)
        start = now + (written // SESSIONS) * WINDOW
    return start


def charge_row(session: int, at: int, n: int) -> dict:
    return {
        "wallet_id": session + 1,
        "kind": "charge",
        "amount_micros": -CHARGE,
        "balance_after_micros": 0,
        "key": f"bench:{n}",
        "session_id": session + 1,
        "window_start": at,
        "window_end": at + WINDOW,
        "note": "",
        "created_at": at,
    }


def one_batch(ledger: Ledger, at: int, first: int) -> None:
    with ledger.begin() as db:
        db.execute(insert(Entry), [charge_row(i, at, first + i) for i in range(SESSIONS)])


def naive_sum(ledger: Ledger) -> float:
    start = time.perf_counter()
    with ledger.begin() as db:
        db.execute(
            select(MeteredSession.profile, func.sum(Entry.amount_micros))
            .join(MeteredSession, MeteredSession.id == Entry.session_id)
            .where(Entry.kind == "charge")
            .group_by(MeteredSession.profile)
        ).all()
    return time.perf_counter() - start


def run(backend: str, url: str, entries: int, rounds: int) -> None:
    clock = FakeClock()
    ledger = Ledger(connect(url), clock=clock)
    print(f"{backend}: writing {entries:,} charge entries …", flush=True)
    at = populate(ledger, entries)
    metrics = BillingMetrics(ledger, ("debug", "rtx4090", "a800"), {"a800": 8, "rtx4090": 8})
    started = time.perf_counter()
    metrics.totals.catch_up(pause_seconds=0)
    catch_up = time.perf_counter() - started
    scrapes, sums = [], []
    n = entries
    for _ in range(rounds):
        clock.now = at
        one_batch(ledger, at, n)
        n += SESSIONS
        at += WINDOW
        started = time.perf_counter()
        body = metrics.exposition()
        scrapes.append(time.perf_counter() - started)
        assert metrics.totals.last_rows == SESSIONS, metrics.totals.last_rows
        sums.append(naive_sum(ledger))
    expected = n * CHARGE
    total = sum(v for (kind, _p, _c), v in metrics.totals.refresh().items() if kind == "charge")
    assert total == expected, (total, expected)
    assert b"meterhub_charged_total" in body
    scrape, naive = statistics.median(scrapes), statistics.median(sums)
    print(
        f"{backend}: {n:,} entries; catch-up at start {catch_up:.2f} s; scrape after"
        f" {SESSIONS:,} new entries {scrape * 1000:.1f} ms (median of {rounds});"
        f" one SUM over the ledger {naive * 1000:.1f} ms; ratio {scrape / naive:.3f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run("sqlite", f"sqlite:///{tmp}/ledger.sqlite", args.entries, args.rounds)
    if args.no_postgres:
        return
    from tests.postgres import PostgresCluster

    cluster = PostgresCluster()
    cluster.start()
    try:
        run("postgresql", cluster.new_database(), args.entries, args.rounds)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
