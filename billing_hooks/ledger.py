"""The ledger: wallets, append-only entries and metered sessions, exact and idempotent.

Every movement of credit is an entry with a deterministic key under a UNIQUE constraint,
written in the same transaction as the wallet's cached balance (and, for a charge, the
session's metered-through time, advanced by compare-and-set). So a retry, a duplicate tick,
a second meter or a crash between statements can neither lose nor double a charge.
All methods are blocking: the hub and the meter call them off their event loops.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import and_, bindparam, case, func, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from .clock import utcnow
from .money import MICROS, accrued, format_money, window_charge
from .orm import Entry, MeteredSession, Notification, Pass, Price, Wallet


class LedgerError(Exception):
    """A ledger operation that cannot be done; the message is for people."""


class InsufficientCredit(LedgerError):
    pass


class KeyConflict(LedgerError):
    """The same idempotency key was used for a different movement: a bug, stop loudly."""


class ConcurrentUpdate(LedgerError):
    """Another writer advanced the same session first; the transaction was rolled back."""


@dataclass
class WalletView:
    """What the meter needs of a wallet after a pass: who, what is left, what pays."""

    user: str
    balance_micros: int
    paying: list
    ended_passes: list


CHARGE_COLUMNS = (
    "wallet_id",
    "kind",
    "amount_micros",
    "balance_after_micros",
    "key",
    "session_id",
    "window_start",
    "window_end",
    "note",
    "created_at",
)


def _executemany(conn, statement, names: tuple[str, ...], rows: list[tuple]) -> None:
    """Run a Core statement for many rows through the driver's own executemany.

    SQLAlchemy's per-row parameter processing costs more than the database's work for the
    meter's thousand-row writes; these columns are plain integers and strings, which need
    no processing.
    """
    compiled = statement.compile(dialect=conn.dialect)
    if conn.dialect.positional:
        order = [names.index(name) for name in compiled.positiontup]
        params = (
            rows
            if order == list(range(len(names)))
            else [tuple(row[i] for i in order) for row in rows]
        )
    else:
        params = [dict(zip(names, row, strict=True)) for row in rows]
    conn.exec_driver_sql(compiled.string, params)


@dataclass(frozen=True)
class Authorization:
    session_id: int
    balance_micros: int
    rate_micros_per_hour: int


def _no_fault(point: str) -> None:
    pass


class Ledger:
    def __init__(
        self,
        engine: Engine,
        currency: str = "CNY",
        trial_credit_micros: int = 10 * MICROS,
        overdraft_micros: int = 0,
        clock: Callable[[], int] = utcnow,
        fault: Callable[[str], None] = _no_fault,
    ):
        self.engine = engine
        self.currency = currency
        self.trial_credit_micros = trial_credit_micros
        self.overdraft_micros = overdraft_micros
        self.clock = clock
        #: called between the statements of a transaction; tests inject crashes here
        self.fault = fault
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def begin(self):
        with self._sessions.begin() as db:
            yield db

    # ------------------------------------------------------------------ wallets

    def _wallet(self, db: Session, user: str, lock: bool = False) -> Wallet | None:
        query = select(Wallet).where(Wallet.owner_kind == "user", Wallet.owner_name == user)
        if lock:
            query = query.with_for_update()
        return db.scalars(query.execution_options(populate_existing=True)).first()

    def _ensure_wallet(self, db: Session, user: str) -> Wallet:
        wallet = self._wallet(db, user, lock=True)
        if wallet is None:
            wallet = Wallet(
                owner_kind="user",
                owner_name=user,
                currency=self.currency,
                balance_micros=0,
                created_at=self.clock(),
            )
            db.add(wallet)
            db.flush()
            self.fault("wallet-created")
            if self.trial_credit_micros:
                self._post(
                    db,
                    wallet,
                    "trial",
                    self.trial_credit_micros,
                    f"trial:user:{user}",
                    note="trial credit",
                )
        return wallet

    def ensure_user(self, user: str) -> int:
        """The user's wallet, created with the trial credit exactly once; returns the balance."""
        with self.begin() as db:
            return self._ensure_wallet(db, user).balance_micros

    def balance(self, user: str) -> int | None:
        with self.begin() as db:
            wallet = self._wallet(db, user)
            return None if wallet is None else wallet.balance_micros

    def _post(
        self,
        db: Session,
        wallet: Wallet,
        kind: str,
        amount: int,
        key: str,
        note: str = "",
        **fields,
    ) -> Entry:
        """Append an entry and move the cached balance, in the caller's transaction."""
        existing = db.scalars(select(Entry).where(Entry.key == key)).first()
        if existing is not None:
            if existing.amount_micros != amount or existing.wallet_id != wallet.id:
                raise KeyConflict(
                    f"key {key!r} already moved {existing.amount_micros} on wallet"
                    f" {existing.wallet_id}; refusing {amount} on wallet {wallet.id}"
                )
            return existing
        db.execute(
            update(Wallet)
            .where(Wallet.id == wallet.id)
            .values(balance_micros=Wallet.balance_micros + amount)
        )
        self.fault("balance-updated")
        balance = db.scalar(select(Wallet.balance_micros).where(Wallet.id == wallet.id))
        entry = Entry(
            wallet_id=wallet.id,
            kind=kind,
            amount_micros=amount,
            balance_after_micros=balance,
            key=key,
            note=note,
            created_at=self.clock(),
            **fields,
        )
        db.add(entry)
        db.flush()
        self.fault("entry-written")
        wallet.balance_micros = balance
        return entry

    def grant(
        self, user: str, amount_micros: int, key: str, note: str = "", kind: str = "grant"
    ) -> Entry:
        if amount_micros <= 0:
            raise LedgerError("a grant must be positive")
        with self.begin() as db:
            wallet = self._ensure_wallet(db, user)
            return self._post(db, wallet, kind, amount_micros, key, note=note)

    # ------------------------------------------------------------------ sessions

    def open_session(
        self,
        user: str,
        server_name: str,
        profile: str,
        gpus: int,
        rate_micros_per_hour: int,
        min_seconds: int,
        label: str = "",
    ) -> Authorization:
        """Authorize a spawn and open its session, or refuse with what to do.

        The wallet must cover `min_seconds` at this rate on top of the same minimum for the
        user's other open sessions, so two concurrent spawns cannot together overspend.
        """
        now = self.clock()
        with self.begin() as db:
            wallet = self._ensure_wallet(db, user)
            # a session left open for this server (the hub died mid-spawn) cannot be running
            for stale in list(db.scalars(_open_sessions_of(user, server_name))):
                self._close(db, stale, stale.last_seen_running or stale.started_at)
            valid = db.scalars(
                select(Pass).where(
                    Pass.wallet_id == wallet.id, Pass.starts_at <= now, Pass.ends_at > now
                )
            ).all()
            open_rates = [
                other.rate_micros_per_hour
                for other in db.scalars(
                    select(MeteredSession).where(
                        MeteredSession.wallet_id == wallet.id, MeteredSession.stopped_at.is_(None)
                    )
                )
                # a server a valid pass pays for needs no credit
                if not any(p.profile == other.profile and p.gpus >= other.gpus for p in valid)
            ]
            covered_now = db.scalars(
                select(Pass.id).where(
                    Pass.wallet_id == wallet.id,
                    Pass.profile == profile,
                    Pass.gpus >= gpus,
                    Pass.starts_at <= now,
                    Pass.ends_at > now + min_seconds,
                )
            ).first()
            new_rate = 0 if covered_now else rate_micros_per_hour
            needed = sum(accrued(rate, min_seconds) for rate in [*open_rates, new_rate])
            available = wallet.balance_micros + self.overdraft_micros
            if available < needed:
                minutes = min_seconds // 60
                raise InsufficientCredit(
                    f"Your balance is {format_money(wallet.balance_micros, self.currency)}; "
                    f"{label or profile} costs {format_money(rate_micros_per_hour, self.currency)}/h"
                    f" and needs at least {minutes} minutes of credit"
                    f" ({format_money(needed, self.currency)}"
                    + (" with your running servers" if open_rates else "")
                    + "). Top up, or choose debug mode."
                )
            session = MeteredSession(
                wallet_id=wallet.id,
                user_name=user,
                server_name=server_name,
                profile=profile,
                gpus=gpus,
                rate_micros_per_hour=rate_micros_per_hour,
                started_at=now,
            )
            db.add(session)
            db.flush()
            return Authorization(session.id, wallet.balance_micros, rate_micros_per_hour)

    def mark_ready(self, session_id: int, at: int | None = None) -> None:
        """Charging starts here. Idempotent: the first ready time wins."""
        at = self.clock() if at is None else at
        with self.begin() as db:
            db.execute(
                update(MeteredSession)
                .where(
                    MeteredSession.id == session_id,
                    MeteredSession.ready_at.is_(None),
                    MeteredSession.stopped_at.is_(None),  # too late: it already stopped
                )
                .values(ready_at=at, metered_through=at, last_seen_running=at)
            )

    def charge(self, session_id: int, until: int) -> Entry | None:
        """Charge [metered_through, until) of a session; None when there is nothing to charge."""
        with self.begin() as db:
            session = self._lock_session(db, session_id)
            if session is None:
                return None
            return self._charge(db, session, until)

    def _lock_session(self, db: Session, session_id: int) -> MeteredSession | None:
        """Lock a session's wallet, then the session: every writer locks in this order."""
        wallet_id = db.scalar(
            select(MeteredSession.wallet_id).where(MeteredSession.id == session_id)
        )
        if wallet_id is None:
            return None
        db.execute(select(Wallet.id).where(Wallet.id == wallet_id).with_for_update())
        return db.get(MeteredSession, session_id, with_for_update=True, populate_existing=True)

    def _charge(self, db: Session, session: MeteredSession, until: int) -> Entry | None:
        if session.ready_at is None:
            return None
        self.fault("session-read")
        end = until if session.stopped_at is None else min(until, session.stopped_at)
        start = session.metered_through
        if end <= start:
            return None
        amount = window_amount(
            session.rate_micros_per_hour,
            session.ready_at,
            start,
            end,
            _covering_passes(db, session),
        )
        moved = db.execute(
            update(MeteredSession)
            .where(MeteredSession.id == session.id, MeteredSession.metered_through == start)
            .values(metered_through=end)
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount != 1:
            raise ConcurrentUpdate(f"session {session.id} was metered by someone else")
        session.metered_through = end
        self.fault("metered-through-advanced")
        wallet = db.get(Wallet, session.wallet_id, populate_existing=True)
        return self._post(
            db,
            wallet,
            "charge",
            amount,
            f"charge:{session.id}:{start}-{end}",
            session_id=session.id,
            window_start=start,
            window_end=end,
        )

    def close_session(self, session_id: int, at: int | None = None) -> Entry | None:
        """Stop the clock at `at` and charge the last window, in one transaction.

        A failed spawn that never got ready costs nothing.
        """
        at = self.clock() if at is None else at
        with self.begin() as db:
            session = self._lock_session(db, session_id)
            if session is None or session.stopped_at is not None:
                return None
            return self._close(db, session, at)

    def close_server(self, user: str, server_name: str, at: int | None = None) -> list[int]:
        """Close every open session of one server (the hub's post-stop hook)."""
        at = self.clock() if at is None else at
        with self.begin() as db:
            ids = list(
                db.scalars(
                    _open_sessions_of(user, server_name).with_only_columns(MeteredSession.id)
                )
            )
            closed = []
            for session_id in ids:
                session = self._lock_session(db, session_id)
                if session is not None and session.stopped_at is None:
                    self._close(db, session, at)
                    closed.append(session_id)
            return closed

    def _close(self, db: Session, session: MeteredSession, at: int) -> Entry | None:
        if session.ready_at is not None:
            at = max(at, session.metered_through)
        session.stopped_at = at
        db.flush()
        return self._charge(db, session, at)

    def charge_running(self, session_ids: list[int], now: int) -> dict[int, WalletView]:
        """Charge many running sessions up to `now` in one transaction (the meter's pass).

        Locks the wallets, then the sessions (the order every writer uses), charges each
        session's window with its passes' time excluded, notes it ready if the hub could
        not, and writes all entries, session times and balances together. Returns, per
        wallet, the balance and the sessions it pays for now (a valid pass pays for others).

        This is the meter's hot path: it selects by the id range of the batch (no long IN
        lists; open sessions in the range that were not asked for are locked, not charged),
        advances every session and every balance with one statement each, and inserts the
        charges with the driver's own executemany.
        """
        if not session_ids:
            return {}
        S, W, P, E = (t.__table__ for t in (MeteredSession, Wallet, Pass, Entry))
        wanted = set(session_ids)
        in_range = and_(S.c.id.between(min(wanted), max(wanted)), S.c.stopped_at.is_(None))
        with self.begin() as db:
            conn = db.connection()
            owners = select(S.c.wallet_id).where(in_range)
            wallets = {
                wid: [name, balance]
                for wid, name, balance in conn.execute(
                    select(W.c.id, W.c.owner_name, W.c.balance_micros)
                    .where(W.c.id.in_(owners))
                    .order_by(W.c.id)
                    .with_for_update()
                )
            }
            in_range_rows = conn.execute(
                select(
                    S.c.id,
                    S.c.wallet_id,
                    S.c.user_name,
                    S.c.server_name,
                    S.c.profile,
                    S.c.gpus,
                    S.c.rate_micros_per_hour,
                    S.c.ready_at,
                    S.c.metered_through,
                )
                .where(in_range)
                .order_by(S.c.id)
                .with_for_update()
            ).all()
            in_range_count = len(in_range_rows)
            sessions = [s for s in in_range_rows if s.id in wanted]
            passes: dict[int, list] = {}
            for held in conn.execute(select(P).where(P.c.wallet_id.in_(owners))):
                passes.setdefault(held.wallet_id, []).append(held)
            self.fault("session-read")
            views: dict[int, WalletView] = {}
            entries = []
            for session in sessions:
                wid = session.wallet_id
                ready = session.ready_at if session.ready_at is not None else now
                start = session.metered_through if session.ready_at is not None else now
                covering = [
                    p
                    for p in passes.get(wid, ())
                    if p.profile == session.profile and p.gpus >= session.gpus
                ]
                end = max(start, now)
                wallet = wallets[wid]
                if end > start:
                    intervals = [(p.starts_at, p.ends_at) for p in covering]
                    amount = window_amount(
                        session.rate_micros_per_hour, ready, start, end, intervals
                    )
                    wallet[1] += amount
                    entries.append(
                        (
                            wid,
                            "charge",
                            amount,
                            wallet[1],
                            f"charge:{session.id}:{start}-{end}",
                            session.id,
                            start,
                            end,
                            "",
                            now,
                        )
                    )
                view = views.get(wid)
                if view is None:
                    view = views[wid] = WalletView(wallet[0], 0, [], [])
                if not any(p.starts_at <= now < p.ends_at for p in covering):
                    view.paying.append(session)
                    ended = [p for p in covering if ready < p.ends_at <= now]
                    if ended:
                        view.ended_passes.append((session, max(ended, key=lambda p: p.ends_at)))
            if sessions:
                # every session read ends at `now` (or stays where it is, if the clock went
                # back): one statement for the batch, not one per session
                charged = in_range
                if len(sessions) < in_range_count:
                    charged = and_(in_range, S.c.id.in_([s.id for s in sessions]))
                conn.execute(
                    S.update()
                    .where(charged)
                    .values(
                        ready_at=func.coalesce(S.c.ready_at, now),
                        metered_through=case(
                            (or_(S.c.ready_at.is_(None), S.c.metered_through < now), now),
                            else_=S.c.metered_through,
                        ),
                        last_seen_running=now,
                    )
                )
            self.fault("metered-through-advanced")
            if entries:
                _executemany(
                    conn,
                    E.insert().values({c: bindparam(c) for c in CHARGE_COLUMNS}),
                    CHARGE_COLUMNS,
                    entries,
                )
            self.fault("entry-written")
            if entries:
                # a wallet's balance is its latest entry's balance_after (audit checks it)
                latest = (
                    select(E.c.balance_after_micros)
                    .where(E.c.wallet_id == W.c.id)
                    .order_by(E.c.id.desc())
                    .limit(1)
                    .scalar_subquery()
                )
                conn.execute(
                    W.update()
                    .where(W.c.id.in_(owners))
                    .values(balance_micros=func.coalesce(latest, W.c.balance_micros))
                )
            self.fault("balance-updated")
            for wid, view in views.items():
                view.balance_micros = wallets[wid][1]
            return views

    def sessions_with_cost(
        self,
        user: str,
        limit: int | None = None,
        newest_first: bool = False,
        open_only: bool = False,
    ) -> list[tuple[MeteredSession, int]]:
        """A user's sessions with what each has cost so far (micros), in two queries."""
        S = MeteredSession
        query = select(S).where(S.user_name == user)
        if open_only:
            query = query.where(S.stopped_at.is_(None))
        query = query.order_by(S.id.desc() if newest_first else S.id)
        if limit is not None:
            query = query.limit(limit)
        with self.begin() as db:
            sessions = list(db.scalars(query))
            costs: dict[int, int] = {}
            for session_id, amount in db.execute(
                select(Entry.session_id, Entry.amount_micros).where(
                    Entry.session_id.in_([s.id for s in sessions])
                )
            ):
                costs[session_id] = costs.get(session_id, 0) - amount
        return [(session, costs.get(session.id, 0)) for session in sessions]

    def open_session_rows(self) -> list:
        """id, user, server, started and last-seen times of every open session (light)."""
        S = MeteredSession.__table__
        with self.begin() as db:
            query = select(
                S.c.id, S.c.user_name, S.c.server_name, S.c.started_at, S.c.last_seen_running
            )
            return (
                db.connection()
                .execute(query.where(S.c.stopped_at.is_(None)).order_by(S.c.id))
                .all()
            )

    def open_sessions(self, user: str | None = None) -> list[MeteredSession]:
        query = select(MeteredSession).where(MeteredSession.stopped_at.is_(None))
        if user is not None:
            query = query.where(MeteredSession.user_name == user)
        with self.begin() as db:
            return list(db.scalars(query.order_by(MeteredSession.id)))

    # ------------------------------------------------------------------ passes

    def buy_pass(
        self,
        user: str,
        profile: str,
        gpus: int,
        period: str,
        price_micros: int,
        duration_seconds: int,
        key: str,
        label: str = "",
    ) -> Pass:
        """Buy a pass from the wallet; it starts now, or when the same pass already held ends.

        Refused without funds (the overdraft does not pay for passes).
        """
        now = self.clock()
        with self.begin() as db:
            wallet = self._ensure_wallet(db, user)
            existing = db.scalars(select(Entry).where(Entry.key == key)).first()
            if existing is not None:
                self._post(db, wallet, "pass", -price_micros, key)  # same key: same amount, or loud
                return db.scalars(select(Pass).where(Pass.entry_key == key)).one()
            if wallet.balance_micros < price_micros:
                raise InsufficientCredit(
                    f"Your balance is {format_money(wallet.balance_micros, self.currency)};"
                    f" a {period} pass for {label or profile} costs"
                    f" {format_money(price_micros, self.currency)}. Top up first."
                )
            latest_end = db.scalar(
                select(func.max(Pass.ends_at)).where(
                    Pass.wallet_id == wallet.id,
                    Pass.profile == profile,
                    Pass.gpus == gpus,
                    Pass.ends_at > now,
                )
            )
            starts = latest_end or now
            self._post(
                db, wallet, "pass", -price_micros, key, note=f"{period} pass {label or profile}"
            )
            bought = Pass(
                wallet_id=wallet.id,
                profile=profile,
                gpus=gpus,
                period=period,
                price_micros=price_micros,
                starts_at=starts,
                ends_at=starts + duration_seconds,
                entry_key=key,
            )
            db.add(bought)
            db.flush()
            return bought

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

    # ------------------------------------------------------------------ prices

    def set_price(self, profile: str, micros_per_hour: int) -> None:
        """An admin's price for new sessions of a profile (running ones keep their rate)."""
        with self.begin() as db:
            row = db.get(Price, profile)
            if row is None:
                db.add(
                    Price(profile=profile, micros_per_hour=micros_per_hour, updated_at=self.clock())
                )
            else:
                row.micros_per_hour = micros_per_hour
                row.updated_at = self.clock()

    def price_overrides(self) -> dict[str, int]:
        with self.begin() as db:
            return {row.profile: row.micros_per_hour for row in db.scalars(select(Price))}

    # ------------------------------------------------------------------ notifications

    def notify(self, user: str, key: str, kind: str, message: str) -> bool:
        """Keep a message for the user, once per key; True if it is new."""
        with self.begin() as db:
            if db.scalars(select(Notification.id).where(Notification.key == key)).first():
                return False
            db.add(
                Notification(
                    user_name=user, key=key, kind=kind, message=message, created_at=self.clock()
                )
            )
            return True

    def notifications(self, user: str, unread_only: bool = False) -> list[Notification]:
        query = select(Notification).where(Notification.user_name == user)
        if unread_only:
            query = query.where(Notification.read_at.is_(None))
        with self.begin() as db:
            return list(db.scalars(query.order_by(Notification.id)))

    # ------------------------------------------------------------------ audit

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
            for entry in db.scalars(
                select(Entry).where(Entry.kind == "charge").order_by(Entry.window_start)
            ):
                charges.setdefault(entry.session_id, []).append(entry)
            for session in db.scalars(select(MeteredSession)):
                covered = _covering_passes(db, session)
                problems += _audit_session(session, charges.get(session.id, []), now, covered)
        return problems


def uncovered(start: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) outside every covered interval."""
    pieces = [(start, end)]
    for cover_start, cover_end in covered:
        next_pieces = []
        for a, b in pieces:
            if cover_end <= a or cover_start >= b:
                next_pieces.append((a, b))
                continue
            if a < cover_start:
                next_pieces.append((a, cover_start))
            if cover_end < b:
                next_pieces.append((cover_end, b))
        pieces = next_pieces
    return pieces


def window_amount(
    rate_micros_per_hour: int, ready_at: int, start: int, end: int, covered: list[tuple[int, int]]
) -> int:
    """The (negative) charge for [start, end) of a session, passes' time excluded."""
    return -sum(
        window_charge(rate_micros_per_hour, ready_at, a, b)
        for a, b in uncovered(start, end, covered)
    )


def _covering_passes(db: Session, session: MeteredSession) -> list[tuple[int, int]]:
    """Validity intervals of the wallet's passes that cover this session's profile and GPUs."""
    return [
        (p.starts_at, p.ends_at)
        for p in db.scalars(
            select(Pass).where(
                Pass.wallet_id == session.wallet_id,
                Pass.profile == session.profile,
                Pass.gpus >= session.gpus,
            )
        )
    ]


def _open_sessions_of(user: str, server_name: str):
    return select(MeteredSession).where(
        MeteredSession.user_name == user,
        MeteredSession.server_name == server_name,
        MeteredSession.stopped_at.is_(None),
    )


def _audit_session(
    session: MeteredSession, entries: list[Entry], now: int, covered: list[tuple[int, int]]
) -> list[str]:
    where = f"session {session.id} ({session.user_name})"
    if session.ready_at is None:
        return [f"{where}: charged but never ready"] if entries else []
    problems = []
    cursor = session.ready_at
    for entry in entries:
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
    if session.metered_through > observed_end:
        problems.append(
            f"{where}: charged through {session.metered_through}, past its observed end {observed_end}"
        )
    return problems
