"""The audit: every invariant of the ledger checked from its rows, on demand.

`meterhub billing audit` (and the admin page, when asked) run it; the billing service runs
it on a schedule and keeps each run's result (`record_audit`, its only write: the
audit_runs table); the tests run it after every step of the seeded simulation. What the
meter corrected against the hub's view is not a violation: `reconciliation_report` lists
it apart.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from .orm import AUDIT_PROBLEM_LINES, AuditRun, Entry, MeteredSession, Reconciliation, Wallet
from .postings import covering_passes, window_amount
from .vouchers import voucher_problems

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import contextmanager

    from sqlalchemy.orm import Session


class Audit:
    if TYPE_CHECKING:
        # Postings and Queries provide these; Ledger puts them together
        clock: Callable[[], int]

        @contextmanager
        def begin(self) -> Iterator[Session]: ...
        def reconciliations(self, limit: int = 50) -> list[Reconciliation]: ...

    def audit(self, now: int | None = None) -> list[str]:
        """Every violation of the ledger's invariants, as readable lines; [] when sound."""
        now = self.clock() if now is None else now
        problems: list[str] = []
        with self.begin() as db:
            sums = dict(
                db.execute(
                    select(Entry.wallet_id, func.sum(Entry.amount_micros)).group_by(Entry.wallet_id)
                ).all()
            )
            latest = dict(
                db.execute(
                    select(Entry.wallet_id, Entry.balance_after_micros).where(
                        Entry.id.in_(select(func.max(Entry.id)).group_by(Entry.wallet_id))
                    )
                ).all()
            )
            for wallet in db.scalars(select(Wallet)):
                total = int(sums.get(wallet.id) or 0)
                if total != wallet.balance_micros:
                    problems.append(
                        f"wallet {wallet.id} ({wallet.owner_name}): entries sum to {total},"
                        f" cached balance is {wallet.balance_micros}"
                    )
                last = latest.get(wallet.id, wallet.balance_micros if not total else None)
                if last != wallet.balance_micros:
                    problems.append(
                        f"wallet {wallet.id} ({wallet.owner_name}): latest entry says the"
                        f" balance is {last}, cached balance is {wallet.balance_micros}"
                    )
            charges: dict[int, list[Entry]] = {}
            refunds: dict[int, int] = {}
            for entry in db.scalars(
                select(Entry)
                .where(Entry.kind.in_(("charge", "refund")))
                .order_by(Entry.window_start, Entry.id)
            ):
                if entry.session_id is None:
                    problems.append(f"{entry.kind} entry {entry.id} names no session")
                elif entry.kind == "charge":
                    charges.setdefault(entry.session_id, []).append(entry)
                else:
                    refunds[entry.session_id] = (
                        refunds.get(entry.session_id, 0) + entry.amount_micros
                    )
            # an allowance move is a pair, the course's and the student's: they cancel out
            moved: dict[str, list[int]] = {}
            for key, amount in db.execute(
                select(Entry.key, Entry.amount_micros).where(Entry.kind == "allowance")
            ):
                moved.setdefault(key.rpartition(":")[0], []).append(amount)
            for base, amounts in moved.items():
                if len(amounts) != 2 or sum(amounts) != 0:
                    problems.append(f"allowance move {base}: entries {amounts} are not a pair")
            for session in db.scalars(select(MeteredSession)):
                covered = covering_passes(db, session)
                session_charges = charges.get(session.id, [])
                problems += _audit_session(session, session_charges, now, covered)
                charged = -sum(e.amount_micros for e in session_charges)
                if refunds.get(session.id, 0) > charged:
                    problems.append(
                        f"session {session.id} ({session.user_name}): refunded"
                        f" {refunds[session.id]}, more than the {charged} it was charged"
                    )
            problems += voucher_problems(db)
        return problems

    def record_audit(self) -> AuditRun:
        """Run the audit now and keep its result (the first AUDIT_PROBLEM_LINES violations
        and their count) for the admin page; the scheduled audit of the billing service."""
        started = self.clock()
        problems = self.audit(started)
        run = AuditRun(
            started_at=started,
            finished_at=self.clock(),
            problems_count=len(problems),
            problems="\n".join(p.replace("\n", " ") for p in problems[:AUDIT_PROBLEM_LINES]),
        )
        with self.begin() as db:
            db.add(run)
            db.flush()
        return run

    def reconciliation_report(self, limit: int = 50) -> list[str]:
        """The meter's latest corrections against the hub's view, newest first, one line each."""
        lines = []
        for r in self.reconciliations(limit):
            at = datetime.datetime.fromtimestamp(r.created_at, datetime.UTC)
            server = f"{r.user_name}/{r.server_name}" if r.server_name else r.user_name
            session = f" session {r.session_id}" if r.session_id is not None else ""
            lines.append(f"{at:%Y-%m-%d %H:%M:%S}Z {r.kind} {server}{session}: {r.detail}")
        return lines


def _audit_session(
    session: MeteredSession, entries: list[Entry], now: int, covered: list[tuple[int, int]]
) -> list[str]:
    where = f"session {session.id} ({session.user_name})"
    if session.ready_at is None:
        return [f"{where}: charged but never ready"] if entries else []
    problems = []
    cursor = session.ready_at
    for entry in entries:
        if entry.window_start is None or entry.window_end is None:
            problems.append(f"{where}: charge entry {entry.id} names no window")
            continue
        if entry.window_start != cursor:
            kind = "overlapping" if entry.window_start < cursor else "gapped"
            problems.append(
                f"{where}: {kind} window [{entry.window_start}, {entry.window_end}) after {cursor}"
            )
        expected = window_amount(
            session.rate_micros_per_hour,
            session.ready_at,
            entry.window_start,
            entry.window_end,
            covered,
        )
        if entry.amount_micros != expected:
            problems.append(
                f"{where}: window [{entry.window_start}, {entry.window_end}) charged {entry.amount_micros}, expected {expected}"
            )
        if entry.key != f"charge:{session.id}:{entry.window_start}-{entry.window_end}":
            problems.append(f"{where}: charge key {entry.key!r} does not name its window")
        cursor = entry.window_end
    if cursor != session.metered_through:
        problems.append(
            f"{where}: windows end at {cursor}, metered through {session.metered_through}"
        )
    observed_end = session.stopped_at if session.stopped_at is not None else now
    if session.metered_through is not None and session.metered_through > observed_end:
        problems.append(
            f"{where}: charged through {session.metered_through}, past its observed end {observed_end}"
        )
    return problems
