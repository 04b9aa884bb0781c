"""Meter scale: one meter pass over 5,000 users / 1,000 running sessions vs a plain bulk insert.

The baseline writes the same number of charge rows in one transaction with executemany,
which is the least any meter must do. Both run side by side on the same database, on
SQLite (WAL) and on a throwaway PostgreSQL cluster, alternating, and the ratio of medians
is reported. Goal: ≤ 2×.

With --groups G the running sessions are paid by G group wallets instead, every member
with a monthly cap, so each pass also reads caps and budget-alert facts: it reports that
pass beside the plain one (user wallets), same database, alternating, as a ratio.

With --hub it also starts a real meterhub with the same 5,000 users and measures the p95
of a hub API request (GET /hub/api/users/NAME) while meter passes run back to back (each
lists every user from that hub, then charges the ledger) against the p95 while idle,
alternating phases. Goal: ≤ 1.1×.

    .venv/bin/python bench/meter_scale.py [--users 5000] [--sessions 1000] [--rounds 5]
        [--groups 10] [--hub]
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
from meterhub.billing_hooks.clock import FakeClock  # noqa: E402
from meterhub.billing_hooks.db import connect  # noqa: E402
from meterhub.billing_hooks.ledger import Ledger  # noqa: E402
from meterhub.billing_hooks.meter import Meter  # noqa: E402
from meterhub.billing_hooks.money import to_micros  # noqa: E402
from meterhub.billing_hooks.orm import Entry, MeteredSession, Wallet  # noqa: E402

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
    # wallets with no running session, so the baseline's rows keep the ledger sound
    rows = [
        {
            "wallet_id": sessions + i + 1,
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


def group_paid(url: str, users: int, sessions: int, groups: int, clock: FakeClock):
    """A second ledger like populate's, its running sessions paid by `groups` group wallets,
    each member capped (far above what a pass charges)."""
    from sqlalchemy import update

    ledger = Ledger(connect(url), clock=clock)
    servers = populate(ledger, users, sessions)
    group_wallets = []
    for g in range(groups):
        ledger.create_group(f"g{g}", "bench", admins=[f"u{g}"])
        ledger.grant(f"group:g{g}", 10**12, f"bench:g{g}")
        group_wallets.append(ledger.group_view(f"g{g}", ()).wallet_id)
    with ledger.begin() as db:
        for i in range(sessions):
            db.execute(
                update(MeteredSession)
                .where(MeteredSession.id == i + 1)
                .values(wallet_id=group_wallets[i % groups])
            )
    for i in range(sessions):
        ledger.set_cap(f"g{i % groups}", f"u{i}", 10**11, "month", "bench")
    return ledger, servers


def run_groups(url_a: str, url_b: str, users: int, sessions: int, rounds: int, groups: int):
    """The meter pass over user wallets vs over group wallets with caps, side by side."""
    clock_a, clock_b = FakeClock(), FakeClock()
    plain = Ledger(connect(url_a), clock=clock_a)
    plain_servers = populate(plain, users, sessions)
    grouped, grouped_servers = group_paid(url_b, users, sessions, groups, clock_b)
    meters = (
        Meter(plain, hub=None, interval_seconds=60, clock=clock_a),
        Meter(grouped, hub=None, interval_seconds=60, clock=clock_b),
    )
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        times[0].append(meter_pass(meters[0], plain_servers, clock_a))
        times[1].append(meter_pass(meters[1], grouped_servers, clock_b))
    assert plain.audit() == [] and grouped.audit() == []
    a, b = statistics.median(times[0]), statistics.median(times[1])
    print(
        f"groups: meter pass over user wallets {a * 1000:.1f} ms, over {groups} group wallets"
        f" with {sessions} capped members {b * 1000:.1f} ms, ratio {b / a:.2f}"
    )


def run_idle(url_a: str, url_b: str, users: int, sessions: int, rounds: int) -> None:
    """The meter pass without idle checks and session caps vs with both, side by side: the
    idle policy checked for every running session (the catalog's), and a tenth of them
    capped by their users ("stop after ¥X", far above what a pass charges)."""
    from sqlalchemy import update

    from meterhub.billing_hooks.orm import MeteredSession
    from meterhub.spawner.catalog import Catalog

    clock_a, clock_b = FakeClock(), FakeClock()
    plain, idle = Ledger(connect(url_a), clock=clock_a), Ledger(connect(url_b), clock=clock_b)
    plain_servers = populate(plain, users, sessions)
    idle_servers = populate(idle, users, sessions)
    with idle.begin() as db:
        db.execute(
            update(MeteredSession)
            .where(MeteredSession.id % 10 == 0)
            .values(max_cost_micros=10**11, max_seconds=720 * 3600)
        )
    meters = (
        Meter(plain, hub=None, interval_seconds=60, clock=clock_a),
        Meter(idle, hub=None, interval_seconds=60, clock=clock_b, catalog=Catalog()),
    )
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        times[0].append(meter_pass(meters[0], plain_servers, clock_a))
        times[1].append(meter_pass(meters[1], idle_servers, clock_b))
    assert plain.audit() == [] and idle.audit() == []
    a, b = statistics.median(times[0]), statistics.median(times[1])
    print(
        f"idle: meter pass without idle checks or caps {a * 1000:.1f} ms, with the idle check"
        f" of {sessions} sessions and {sessions // 10} capped {b * 1000:.1f} ms,"
        f" ratio {b / a:.2f}"
    )


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


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hub_latency(users: int, sessions: int, phases: int, seconds: float) -> None:
    import asyncio
    import threading

    import requests

    from meterhub.billing_hooks.meter import HubClient
    from tests.hubprocess import ADMIN_TOKEN, HubProcess

    class Hub(HubClient):
        """The real hub's listing, plus the benchmark's synthetic running sessions."""

        def __init__(self, *args, synthetic, **kwargs):
            super().__init__(*args, **kwargs)
            self.synthetic = synthetic

        #: the servers' last activity as the hub tells it: none reported
        last_activity: dict = {}

        async def running_servers(self):
            return {**await super().running_servers(), **self.synthetic}

    with tempfile.TemporaryDirectory() as tmp:
        hub = HubProcess(
            Path(tmp) / "hub", {"gpus": [], "billing": {"meter_interval_seconds": 3600}}
        )
        hub.start()
        try:
            names = [f"u{i}" for i in range(users)]
            for i in range(0, users, 500):
                reply = hub.api("POST", "/users", json={"usernames": names[i : i + 500]})
                assert reply.status_code == 201, reply.text
            clock = FakeClock()
            ledger = Ledger(connect(f"sqlite:///{tmp}/bench-ledger.sqlite"), clock=clock)
            synthetic = populate(ledger, users, sessions)
            client = Hub(f"{hub.url}/hub/api", ADMIN_TOKEN, synthetic=synthetic)
            meter = Meter(ledger, hub=client, interval_seconds=60, clock=clock)
            url = f"{hub.url}/hub/api/users/u7"
            headers = {"Authorization": f"token {ADMIN_TOKEN}"}
            session = requests.Session()

            def probe(until_at: float) -> list[float]:
                samples = []
                while time.monotonic() < until_at:
                    start = time.perf_counter()
                    assert session.get(url, headers=headers, timeout=30).status_code == 200
                    samples.append(time.perf_counter() - start)
                    time.sleep(0.01)
                return samples

            def meter_loop(stop: threading.Event, passes: list[float]) -> None:
                while not stop.is_set():
                    clock.advance(60)
                    start = time.perf_counter()
                    asyncio.run(meter.tick())
                    passes.append(time.perf_counter() - start)

            idle, busy, passes = [], [], []
            probe(time.monotonic() + 2)  # warm up
            for _ in range(phases):
                idle += probe(time.monotonic() + seconds)
                stop = threading.Event()
                worker = threading.Thread(target=meter_loop, args=(stop, passes))
                worker.start()
                busy += probe(time.monotonic() + seconds)
                stop.set()
                worker.join()
            assert ledger.audit() == [], "the benchmark's ledger must stay sound"
            a, b = percentile(busy, 0.95), percentile(idle, 0.95)
            print(
                f"hub API p95: during meter passes {a * 1000:.1f} ms ({len(busy)} requests,"
                f" {len(passes)} passes of median {statistics.median(passes) * 1000:.0f} ms),"
                f" idle {b * 1000:.1f} ms ({len(idle)} requests), ratio {a / b:.2f}"
            )
            ledger.engine.dispose()
        finally:
            hub.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hub", action="store_true", help="also measure the hub API's p95")
    parser.add_argument("--groups", type=int, default=0, help="also: group wallets with caps")
    parser.add_argument(
        "--idle", action="store_true", help="also: idle checks and session caps, side by side"
    )
    parser.add_argument("--phases", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    args = parser.parse_args()
    if args.users < 2 * args.sessions:
        parser.error(
            "--users must be at least twice --sessions (the baseline writes to idle wallets)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        run("sqlite", f"sqlite:///{tmp}/ledger.sqlite", args.users, args.sessions, args.rounds)
        if args.groups:
            a, b = f"sqlite:///{tmp}/plain.sqlite", f"sqlite:///{tmp}/groups.sqlite"
            run_groups(a, b, args.users, args.sessions, args.rounds, args.groups)
        if args.idle:
            a, b = f"sqlite:///{tmp}/plain-idle.sqlite", f"sqlite:///{tmp}/idle.sqlite"
            run_idle(a, b, args.users, args.sessions, args.rounds)
    from tests.postgres import PostgresCluster

    cluster = PostgresCluster()
    cluster.start()
    try:
        run("postgresql", cluster.new_database(), args.users, args.sessions, args.rounds)
    finally:
        cluster.stop()
    if args.hub:
        hub_latency(args.users, args.sessions, args.phases, args.seconds)


if __name__ == "__main__":
    main()
