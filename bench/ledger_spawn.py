"""The ledger's work for one spawn, in CPU, next to the same SQL through sqlite3 itself.

A spawn reads the admins' prices and the user's courses (one transaction), picks the course
that pays by default (nothing more to read for a user in no course), the group that pays by
default (no transaction when the user is in no group), opens the metered session and, once
the server answers, marks it ready. This runs those calls for N users
who have wallets (as the hub's users do after their first sign-in) on a SQLite ledger, and
then the same statements through Python's sqlite3 module, one transaction each, with
nothing between: the floor any ledger written in Python pays. CPU is this thread's
(`time.thread_time`), so the disk's flushes do not count.

    .venv/bin/python bench/ledger_spawn.py [--users 200]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from meterhub.billing_hooks.db import connect  # noqa: E402
from meterhub.billing_hooks.ledger import Ledger  # noqa: E402

RATE = 600_000  # micros per hour: the debug profile's ¥0.60
MIN_SECONDS = 600


def ledger_calls(ledger: Ledger, users: list[str]) -> dict[str, list[float]]:
    took: dict[str, list[float]] = {}

    def timed(name, call, *args):
        began = time.thread_time()
        result = call(*args)
        took.setdefault(name, []).append(time.thread_time() - began)
        return result

    sessions = []
    for user in users:
        reads = timed("spawn_reads", ledger.spawn_reads, user)
        timed(
            "default_course",
            ledger.default_course,
            user,
            "debug",
            0,
            None,
            reads.student_courses,
        )
        timed("default_group_wallets", ledger.default_group_wallets, set())
        auth = timed(
            "open_session",
            ledger.open_session,
            user,
            "",
            "debug",
            0,
            RATE,
            MIN_SECONDS,
            "Debug",
            None,
            None,
            None,
            "minimal",
        )
        sessions.append(auth.session_id)
    for session in sessions:
        timed("mark_ready", ledger.mark_ready, session)
    return took


def raw_calls(path: str, users: list[str]) -> dict[str, list[float]]:
    """The same reads and writes, by hand, through sqlite3 (no checks, no messages)."""
    db = sqlite3.connect(path, isolation_level=None)
    took: dict[str, list[float]] = {}
    now = int(time.time())

    def transaction(name, *statements):
        began = time.thread_time()
        db.execute("BEGIN IMMEDIATE")
        rows = [db.execute(sql, args).fetchall() for sql, args in statements]
        db.execute("COMMIT")
        took.setdefault(name, []).append(time.thread_time() - began)
        return rows

    sessions = []
    for user in users:
        transaction(
            "spawn_reads",
            (
                "SELECT profile, micros_per_hour FROM prices WHERE effective_from <= ?"
                " ORDER BY effective_from, id",
                (now,),
            ),
            (
                "SELECT course_name FROM course_members WHERE user_name = ? AND role = 'student'"
                " ORDER BY course_name",
                (user,),
            ),
        )
        took.setdefault("default_course", []).append(0.0)  # no course: nothing more to read
        took.setdefault("default_group_wallets", []).append(0.0)
        began = time.thread_time()
        db.execute("BEGIN IMMEDIATE")
        (wallet, _balance) = db.execute(
            "SELECT id, balance_micros FROM wallets WHERE owner_kind = 'user' AND owner_name = ?",
            (user,),
        ).fetchone()
        db.execute(
            "SELECT id FROM sessions WHERE user_name = ? AND server_name = '' AND stopped_at"
            " IS NULL",
            (user,),
        ).fetchall()
        db.execute(
            "SELECT profile, gpus, starts_at, ends_at FROM passes WHERE wallet_id = ? AND"
            " ends_at > ?",
            (wallet, now),
        ).fetchall()
        db.execute(
            "SELECT user_name, profile, gpus, rate_micros_per_hour FROM sessions WHERE"
            " wallet_id = ? AND stopped_at IS NULL",
            (wallet,),
        ).fetchall()
        cursor = db.execute(
            "INSERT INTO sessions (wallet_id, user_name, server_name, profile, gpus,"
            " rate_micros_per_hour, started_at, environment) VALUES (?, ?, '', 'debug', 0, ?,"
            " ?, 'minimal')",
            (wallet, user, RATE, now),
        )
        sessions.append(cursor.lastrowid)
        db.execute("COMMIT")
        took.setdefault("open_session", []).append(time.thread_time() - began)
    for session in sessions:
        transaction(
            "mark_ready",
            (
                "UPDATE sessions SET ready_at = ?, metered_through = ?, last_seen_running = ?"
                " WHERE id = ? AND ready_at IS NULL AND stopped_at IS NULL",
                (now, now, now, session),
            ),
        )
    db.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours_path, raw_path = f"{tmp}/ledger.sqlite", f"{tmp}/raw.sqlite"
        results = {}
        for label, path in (("meterhub", ours_path), ("raw", raw_path)):
            ledger = Ledger(connect(f"sqlite:///{path}"))
            users = [f"{label}{i}" for i in range(args.users)]
            for user in users:
                ledger.ensure_user(user)
            ledger.open_session("warm", "", "debug", 0, RATE, MIN_SECONDS)  # imports, caches
            results[label] = (
                ledger_calls(ledger, users) if label == "meterhub" else raw_calls(path, users)
            )
        print(f"{'call':24s} {'meterhub':>12s} {'sqlite3':>12s} {'ratio':>7s}   (CPU, mean)")
        totals = {"meterhub": 0.0, "raw": 0.0}
        for call in results["meterhub"]:
            ours = statistics.mean(results["meterhub"][call]) * 1e3
            raw = statistics.mean(results["raw"][call]) * 1e3
            totals["meterhub"] += ours
            totals["raw"] += raw
            ratio = f"{ours / raw:7.1f}" if raw else "      -"
            print(f"{call:24s} {ours:9.3f} ms {raw:9.3f} ms {ratio}")
        ours, raw = totals["meterhub"], totals["raw"]
        print(f"{'per spawn':24s} {ours:9.3f} ms {raw:9.3f} ms {ours / raw:7.1f}")
        print(f"a burst of {args.users}: {ours * args.users / 1e3:.2f} s of the hub's CPU")


if __name__ == "__main__":
    main()
