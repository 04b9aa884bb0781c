"""Read models: what the pages, the CLI and the REST API show of the ledger.

Nothing outside billing_hooks queries the ledger's tables directly; they ask here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, cast

from sqlalchemy import and_, bindparam, func, or_, select

from .db import Direct, direct_transaction
from .orm import (
    AuditRun,
    Entry,
    MeteredSession,
    Notification,
    Pass,
    Price,
    Reconciliation,
    Wallet,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import contextmanager

    from sqlalchemy.engine import Engine, Row
    from sqlalchemy.orm import Session

    from .db import PooledConnection
    from .wallets import WalletRef

DAY = 86_400

#: built once (a spawn reads it, bench/ledger_spawn.py): every price row in effect by `at`
_PRICES_BY = Direct(
    select(Price.profile, Price.micros_per_hour)
    .where(Price.effective_from <= bindparam("at"))
    .order_by(Price.effective_from, Price.id)
)


def _prices_in_effect(connection: PooledConnection, at: int) -> dict[str, int]:
    current: dict[str, int] = {}
    for profile, micros in _PRICES_BY.rows(connection, {"at": at}):
        current[profile] = micros  # a later row replaces an earlier one
    return current


class PriceChange(NamedTuple):
    """One row of a profile's price history, with the price it replaced (None: the site
    config's price was in effect before it)."""

    id: int
    profile: str
    micros_per_hour: int
    previous_micros: int | None
    effective_from: int
    set_by: str
    created_at: int


class SpawnReads(NamedTuple):
    """What a spawn's decision reads before it opens the session, in one transaction."""

    #: `Queries.price_overrides`
    prices: dict[str, int]
    #: `Courses.student_courses` of the spawning user
    student_courses: list[str]


class Queries:
    if TYPE_CHECKING:
        # Postings provides these; Ledger puts the two together
        clock: Callable[[], int]
        engine: Engine

        def _student_courses(self, connection: PooledConnection, user: str) -> list[str]: ...

        @contextmanager
        def begin(self) -> Iterator[Session]: ...
        def _wallet(
            self, db: Session, owner: str | WalletRef, lock: bool = False
        ) -> Wallet | None: ...

    def wallet_id(self, owner) -> int | None:
        """The id of `owner`'s wallet (a user name, a reference or a WalletRef), or None."""
        with self.begin() as db:
            wallet = self._wallet(db, owner)
            return None if wallet is None else wallet.id

    def balance(self, user: str) -> int | None:
        with self.begin() as db:
            wallet = self._wallet(db, user)
            return None if wallet is None else wallet.balance_micros

    def sessions_with_cost(
        self,
        user: str,
        limit: int | None = None,
        newest_first: bool = False,
        open_only: bool = False,
        own_wallet: bool = False,
    ) -> list[tuple[MeteredSession, int]]:
        """A user's sessions with what each has cost so far (micros, net of refunds), in two
        queries. A spawn that was refused or failed before it ever ran is not usage. With
        `own_wallet`, only those their own wallet pays for (not a group's)."""
        S = MeteredSession
        query = select(S).where(S.user_name == user)
        if own_wallet:
            own = select(Wallet.id).where(Wallet.owner_kind == "user", Wallet.owner_name == user)
            query = query.where(S.wallet_id == own.scalar_subquery())
        if open_only:
            query = query.where(S.stopped_at.is_(None))
        else:
            query = query.where(or_(S.ready_at.is_not(None), S.stopped_at.is_(None)))
        query = query.order_by(S.id.desc() if newest_first else S.id)
        if limit is not None:
            query = query.limit(limit)
        with self.begin() as db:
            sessions = list(db.scalars(query))
            costs: dict[int | None, int] = {}
            for session_id, amount in db.execute(
                select(Entry.session_id, Entry.amount_micros).where(
                    Entry.session_id.in_([s.id for s in sessions])
                )
            ):
                costs[session_id] = costs.get(session_id, 0) - amount
        return [(session, costs.get(session.id, 0)) for session in sessions]

    def session(self, session_id: int) -> MeteredSession | None:
        with self.begin() as db:
            return db.get(MeteredSession, session_id)

    def open_session_rows(self) -> list[Row]:
        """id, user, server, started and last-seen times of every open session (light)."""
        S = MeteredSession.__table__
        with self.begin() as db:
            query = select(
                S.c.id, S.c.user_name, S.c.server_name, S.c.started_at, S.c.last_seen_running
            )
            rows = (
                db.connection()
                .execute(query.where(S.c.stopped_at.is_(None)).order_by(S.c.id))
                .all()
            )
            return cast("list[Row]", rows)  # Result.all() is typed Sequence; it is a list

    def open_sessions(self, user: str | None = None) -> list[MeteredSession]:
        query = select(MeteredSession).where(MeteredSession.stopped_at.is_(None))
        if user is not None:
            query = query.where(MeteredSession.user_name == user)
        with self.begin() as db:
            return list(db.scalars(query.order_by(MeteredSession.id)))

    def reservations(self, at: int | None = None) -> dict[str, dict[str, int]]:
        """{gpu type: {user: GPUs}} reserved by passes valid at `at`, for the local allocator."""
        at = self.clock() if at is None else at
        result: dict[str, dict[str, int]] = {}
        with self.begin() as db:
            rows = db.execute(
                select(Wallet.owner_name, Pass.profile, Pass.gpus)
                .join(Wallet, Wallet.id == Pass.wallet_id)
                .where(Wallet.owner_kind == "user", Pass.starts_at <= at, Pass.ends_at > at)
            )
            for user, profile, gpus in rows:
                users = result.setdefault(profile, {})
                users[user] = users.get(user, 0) + gpus
        return result

    def passes(self, user: str, valid_at: int | None = None) -> list[Pass]:
        with self.begin() as db:
            wallet = self._wallet(db, user)
            if wallet is None:
                return []
            query = select(Pass).where(Pass.wallet_id == wallet.id)
            if valid_at is not None:
                query = query.where(Pass.starts_at <= valid_at, Pass.ends_at > valid_at)
            return list(db.scalars(query.order_by(Pass.id)))

    def price_overrides(self, at: int | None = None) -> dict[str, int]:
        """{profile: micros per hour} of the admins' prices in effect at `at` (now): each
        profile's latest row effective by then. Profiles not listed use the site config."""
        at = self.clock() if at is None else at
        with direct_transaction(self.engine) as connection:
            return _prices_in_effect(connection, at)

    def spawn_reads(self, user: str, at: int | None = None) -> SpawnReads:
        """The admins' prices in effect at `at` (now) and the courses `user` is a student
        of, read in one transaction: a spawn needs both before it opens its session, and
        each transaction costs the hub (bench/ledger_spawn.py)."""
        at = self.clock() if at is None else at
        with direct_transaction(self.engine) as connection:
            return SpawnReads(
                _prices_in_effect(connection, at), self._student_courses(connection, user)
            )

    def price_history(self, limit: int = 50) -> list[PriceChange]:
        """The admins' price changes, newest (latest effective) first, each with the price it
        replaced."""
        P = Price
        previous = func.lag(P.micros_per_hour).over(
            partition_by=P.profile, order_by=(P.effective_from, P.id)
        )
        dated = select(
            P.id,
            P.profile,
            P.micros_per_hour,
            previous.label("previous_micros"),
            P.effective_from,
            P.set_by,
            P.created_at,
        ).subquery()
        query = (
            select(dated).order_by(dated.c.effective_from.desc(), dated.c.id.desc()).limit(limit)
        )
        with self.begin() as db:
            return [PriceChange(*row) for row in db.execute(query)]

    def latest_audit(self) -> AuditRun | None:
        """The last scheduled audit run (None before the first)."""
        with self.begin() as db:
            return db.scalars(select(AuditRun).order_by(AuditRun.id.desc()).limit(1)).first()

    def notifications(self, user: str, unread_only: bool = False) -> list[Notification]:
        query = select(Notification).where(Notification.user_name == user)
        if unread_only:
            query = query.where(Notification.read_at.is_(None))
        with self.begin() as db:
            return list(db.scalars(query.order_by(Notification.id)))

    def wallet_entries(self, user: str) -> list[Entry]:
        """A user's ledger entries, oldest first (`meterhub credit show`)."""
        with self.begin() as db:
            wallet = self._wallet(db, user)
            if wallet is None:
                return []
            return list(
                db.scalars(select(Entry).where(Entry.wallet_id == wallet.id).order_by(Entry.id))
            )

    def user_wallets(self) -> list[Wallet]:
        """Every user's wallet, by name (the admin view)."""
        with self.begin() as db:
            return list(
                db.scalars(
                    select(Wallet).where(Wallet.owner_kind == "user").order_by(Wallet.owner_name)
                )
            )

    def recent_entries(self, limit: int = 30) -> list[tuple[Entry, str]]:
        """The latest entries with their wallet's owner, newest first (the admin view)."""
        with self.begin() as db:
            return [
                (entry, owner)
                for entry, owner in db.execute(
                    select(Entry, Wallet.owner_name)
                    .join(Wallet, Wallet.id == Entry.wallet_id)
                    .order_by(Entry.id.desc())
                    .limit(limit)
                ).all()
            ]

    def daily_costs(self, user: str, now: int, days: int) -> list[dict]:
        """Net charges of the last `days` days, per UTC day and profile (the Wallet plot)."""
        first = (now // DAY - days + 1) * DAY
        totals: dict[tuple[int, str], int] = {}
        with self.begin() as db:
            rows = db.execute(
                select(Entry.created_at, Entry.amount_micros, MeteredSession.profile)
                .join(MeteredSession, MeteredSession.id == Entry.session_id)
                .where(
                    and_(
                        MeteredSession.user_name == user,
                        Entry.kind.in_(("charge", "refund")),
                        Entry.created_at >= first,
                    )
                )
            ).all()
        for created, amount, profile in rows:
            key = ((created - first) // DAY, profile)
            totals[key] = totals.get(key, 0) - amount
        return [
            {"day": day, "profile": profile, "micros": micros}
            for (day, profile), micros in sorted(totals.items())
            if micros > 0
        ]

    def reconciliations(self, limit: int = 50) -> list[Reconciliation]:
        """What the meter corrected against the hub's view, newest first."""
        with self.begin() as db:
            return list(
                db.scalars(select(Reconciliation).order_by(Reconciliation.id.desc()).limit(limit))
            )
